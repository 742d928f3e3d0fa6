"""Faults on a real 3-broker KRaft cluster (ops/kafka/start.sh --nodes 3; topics RF 3, min.insync.replicas 2).

The cluster runs on its own ports (19092, 19094, 19096) and data dir, started and wiped by this module.
"""
import json
import os
import pathlib
import signal
import subprocess
import threading
import time

import pytest

from hilo.consumer.config import SiteConfig
from hilo.log import updates_topic
from hilo.producer.producer import HiLoProducer
from hilo.replay.history import check, log_versions, read_history
from tests.conftest import new_run, producer_config, publish_random, small_model
from tests.helpers import site_of, wait_until, with_log

pytestmark = [pytest.mark.kafka, pytest.mark.slow,
              pytest.mark.xdist_group("cluster")]  # one worker: the module's cluster and ports 19092-19097, 19192-19193
ROOT = pathlib.Path(__file__).resolve().parents[2]
PORT = 19092


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(bootstrap URL, env for ops/kafka scripts) of a fresh 3-node cluster; stopped and wiped afterwards."""
    env = dict(os.environ, HILO_KAFKA_PORT=str(PORT), HILO_KAFKA_DIR=str(tmp_path_factory.mktemp("kafka3")))
    subprocess.run([str(ROOT / "ops/kafka/start.sh"), "--nodes", "3"], env=env, check=True, timeout=300)
    yield f"kafka://127.0.0.1:{PORT},127.0.0.1:{PORT + 2},127.0.0.1:{PORT + 4}", env
    subprocess.run([str(ROOT / "ops/kafka/stop.sh"), "--wipe"], env=env, check=False, timeout=300)


def java_hash(text: str) -> int:
    """Java's String.hashCode, which Kafka uses to place a transactional id."""
    h = 0
    for ch in text:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def transaction_coordinator(log, transactional_id: str) -> int:
    """The node that coordinates `transactional_id`: the leader of its __transaction_state partition
    (Kafka: Utils.abs(id.hashCode) % partitions)."""
    parts = log.admin.describe_topics(["__transaction_state"])[0]["partitions"]
    h = java_hash(transactional_id)
    index = 0 if h == -(1 << 31) else abs(h) % len(parts)
    return next(p["leader_id"] for p in parts if p["partition_index"] == index)


@pytest.mark.parametrize("victim", ["updates-leader", "txn-coordinator"])
def test_the_updates_leader_sigkilled_mid_run_loses_nothing(cluster, tmp_path, victim, logs):
    """SIGKILL the node that leads RUN.updates, or the one that coordinates the trainer's transactions (another
    node where the placement allows), mid-run: the trainer's stall on the next version is printed (docs/benchmarks.md:
    "Kills and broker faults"); nothing acknowledged is lost and every site ends at the trainer's digest."""
    url, env = cluster
    run, hist = new_run("leader"), tmp_path / "history"
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=url, history=str(hist / "trainer.jsonl")))
    publish_random(producer, 5)
    log = logs(url)
    part = log.admin.describe_topics([updates_topic(run)])[0]["partitions"][0]
    assert sorted(part["replica_nodes"]) == [1, 2, 3] and len(part["isr_nodes"]) == 3  # RF 3, all in sync
    live = site_of(SiteConfig(log=url, run=run, site="live", state_dir=str(tmp_path / "live"), until_version=13,
                              export_adapters=False,
                           history=str(hist / "live.jsonl")))
    follower = threading.Thread(target=live.run, kwargs={"progress": False}, daemon=True)
    follower.start()
    coordinator = transaction_coordinator(log, f"hilo.{run}")
    leader = part["leader_id"] if victim == "updates-leader" else coordinator
    os.kill(int((pathlib.Path(env["HILO_KAFKA_DIR"]) / f"node-{leader}" / "pid").read_text()), signal.SIGKILL)
    t0 = time.monotonic()
    publish_random(producer, 1, seed=1)  # rides through the election (acks=all, idempotent retries)
    stall = time.monotonic() - t0
    publish_random(producer, 4, seed=2)
    # the node comes back
    subprocess.run([str(ROOT / "ops/kafka/start.sh"), "--nodes", "3"], env=env, check=True, timeout=300)
    publish_random(producer, 3, seed=3)
    follower.join(timeout=300)
    assert not follower.is_alive() and live.follower.replica.version == 13
    assert live.follower.replica.digest == producer.replica.digest  # every acknowledged version, in order, no fork
    late = site_of(SiteConfig(log=url, run=run, site="late", state_dir=str(tmp_path / "late"), until_version=13,
                              export_adapters=False,
                           history=str(hist / "late.jsonl")))
    late.run(progress=False)
    assert late.follower.replica.digest == producer.replica.digest
    report = check(read_history(str(hist / "trainer.jsonl")),
                   {s: read_history(str(hist / f"{s}.jsonl")) for s in ("live", "late")},
                   with_log(url, lambda log: log_versions(log, run)))  # read afresh
    print(f"\n{victim} node {leader} SIGKILLed (updates leader {part['leader_id']}, transaction coordinator "
          f"{coordinator}): trainer stalled {stall:.1f}s on the next version\n{report.summary()}")
    assert report.ok
    producer.close()


def _whole_cluster_restart(url, env, nodes, tmp_path):
    """Stop every broker mid-run (SIGTERM, as an operator's restart) while the trainer publishes, start them
    again: the blocked publish completes, nothing acknowledged is lost, a live site ends at the trainer's digest."""
    run, hist = new_run(f"restart{nodes}"), tmp_path / "history"
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=url, history=str(hist / "trainer.jsonl")))
    publish_random(producer, 4)
    live = site_of(SiteConfig(log=url, run=run, site="live", state_dir=str(tmp_path / "live"), until_version=10,
                           export_adapters=False, history=str(hist / "live.jsonl")))
    follower = threading.Thread(target=live.run, kwargs={"progress": False}, daemon=True)
    follower.start()
    subprocess.run([str(ROOT / "ops/kafka/stop.sh")], env=env, check=True, timeout=300)  # every node down
    t0 = time.monotonic()
    publisher = threading.Thread(target=publish_random, args=(producer, 1), kwargs={"seed": 1})
    publisher.start()  # blocks: no broker to take it
    subprocess.run([str(ROOT / "ops/kafka/start.sh"), "--nodes", str(nodes)], env=env, check=True, timeout=300)
    publisher.join(timeout=300)
    stall = time.monotonic() - t0
    assert not publisher.is_alive() and producer.version == 5
    publish_random(producer, 5, seed=2)
    follower.join(timeout=300)
    assert not follower.is_alive() and live.follower.replica.digest == producer.replica.digest
    report = check(read_history(str(hist / "trainer.jsonl")), {"live": read_history(str(hist / "live.jsonl"))},
                   with_log(url, lambda log: log_versions(log, run)))
    print(
        f"\n{nodes}-node cluster stopped and restarted: the trainer's publish waited {stall:.1f}s\n{report.summary()}")
    assert report.ok
    producer.close()


def test_the_whole_cluster_restarted_mid_run_loses_nothing(cluster, tmp_path):
    url, env = cluster
    _whole_cluster_restart(url, env, 3, tmp_path)


def test_a_single_broker_restarted_mid_run_loses_nothing(tmp_path_factory, tmp_path):
    env = dict(os.environ, HILO_KAFKA_PORT=str(PORT + 100), HILO_KAFKA_DIR=str(tmp_path_factory.mktemp("kafka1")))
    subprocess.run([str(ROOT / "ops/kafka/start.sh")], env=env, check=True, timeout=300)
    try:
        _whole_cluster_restart(f"kafka://127.0.0.1:{PORT + 100}", env, 1, tmp_path)
    finally:
        subprocess.run([str(ROOT / "ops/kafka/stop.sh"), "--wipe"], env=env, check=False, timeout=300)


def test_the_group_coordinator_down_for_45s_never_stops_a_site(cluster, tmp_path, logs):
    """The broker coordinating the sites' consumer groups SIGKILLed and kept down 45 s while the trainer publishes
    and sites apply and commit: sites keep applying (the group commit is advisory, retried), nothing is lost.
    (Tried before the fix: both sites exited with NotCoordinatorError / NodeNotReadyError from the commit.)"""
    url, env = cluster
    run, hist = new_run("coord"), tmp_path / "history"
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=url, history=str(hist / "trainer.jsonl")))
    publish_random(producer, 3)
    sites = {name: site_of(SiteConfig(log=url, run=run, site=name, state_dir=str(tmp_path / name),
                                   export_adapters=False, history=str(hist / f"{name}.jsonl"))) for name in ("a", "b")}
    threads = [threading.Thread(target=s.run, kwargs={"progress": False}, daemon=True) for s in sites.values()]
    for t in threads:
        t.start()
    wait_until(lambda: all(s.committer and s.committer.committed
                           and json.loads(s.committer.committed[1])["version"] == 3
                           for s in sites.values()), 120, "both sites committed v3 (the offsets topic then exists)")
    offsets = logs(url).admin.describe_topics(["__consumer_offsets"])  # one partition here (start.sh)
    coordinator = offsets[0]["partitions"][0]["leader_id"]
    os.kill(int((pathlib.Path(env["HILO_KAFKA_DIR"]) / f"node-{coordinator}" / "pid").read_text()), signal.SIGKILL)
    down_at = time.monotonic()
    while time.monotonic() - down_at < 45:  # the outage: the trainer keeps publishing, sites keep applying
        publish_random(producer, 1, seed=producer.version)
    at_end = producer.version  # with the coordinator still down, every site must reach what the trainer published
    wait_until(lambda: all(s.follower.replica.version >= at_end for s in sites.values()), 60,
               f"both sites applied v{at_end} with the group coordinator down")
    applied_while_down = {n: s.follower.replica.version for n, s in sites.items()}
    subprocess.run([str(ROOT / "ops/kafka/start.sh"), "--nodes", "3"], env=env, check=True, timeout=300)
    publish_random(producer, 2, seed=99)
    final = producer.version
    wait_until(lambda: all(s.follower.replica.version >= final for s in sites.values()), 300,
               f"both sites applied v{final}")
    for s in sites.values():
        s.stopping = True  # as SIGTERM does: stop between versions
    for t in threads:
        t.join(timeout=300)
    assert all(not t.is_alive() for t in threads)
    assert all(s.follower.replica.digest == producer.replica.digest for s in sites.values())
    # applied while it was down
    assert all(v == at_end for v in applied_while_down.values()), (at_end, applied_while_down)
    report = check(read_history(str(hist / "trainer.jsonl")),
                   {n: read_history(str(hist / f"{n}.jsonl")) for n in sites},
                   with_log(url, lambda log: log_versions(log, run)))
    print(f"\ncoordinator node {coordinator} down 45 s: the trainer published up to v{at_end} meanwhile, the sites "
          f"applied {applied_while_down} with it still down\n{report.summary()}")
    assert report.ok
    producer.close()


def test_a_rolling_restart_of_every_node_while_publishing_loses_nothing(cluster, tmp_path):
    """Each node in turn stopped (SIGTERM, as a rolling upgrade does) and started again while the trainer publishes
    without pause and a site follows: no publish fails, nothing acknowledged is lost, the site ends at the trainer's
    digest."""
    url, env = cluster
    run, hist = new_run("rolling"), tmp_path / "history"
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=url, history=str(hist / "trainer.jsonl")))
    publish_random(producer, 2)
    live = site_of(SiteConfig(log=url, run=run, site="live", state_dir=str(tmp_path / "live"), export_adapters=False,
                                history=str(hist / "live.jsonl")))
    follower = threading.Thread(target=live.run, kwargs={"progress": False}, daemon=True)
    follower.start()
    rolled, errors = threading.Event(), []

    def publish():
        try:
            while not rolled.is_set():
                publish_random(producer, 1, seed=producer.version)
        except Exception as e:  # noqa: BLE001  (any failure is the test's finding)
            errors.append(e)
    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        for node in (1, 2, 3):
            pid = int((pathlib.Path(env["HILO_KAFKA_DIR"]) / f"node-{node}" / "pid").read_text())
            os.kill(pid, signal.SIGTERM)
            wait_until(lambda pid=pid: not pathlib.Path(f"/proc/{pid}").exists(), 120, f"node {node} stops")
            subprocess.run([str(ROOT / "ops/kafka/start.sh"), "--nodes", "3"], env=env, check=True, timeout=300)
    finally:
        rolled.set()
        publisher.join(timeout=900)
    assert not errors and not publisher.is_alive(), errors
    publish_random(producer, 1, seed=999)
    final = producer.version
    wait_until(lambda: live.follower.replica.version >= final, 300, f"the site applies v{final}")
    live.stopping = True
    follower.join(timeout=300)
    assert live.follower.replica.digest == producer.replica.digest
    report = check(read_history(str(hist / "trainer.jsonl")), {"live": read_history(str(hist / "live.jsonl"))},
                   with_log(url, lambda log: log_versions(log, run)))
    print(f"\nrolling restart of 3 nodes: the trainer published up to v{final} meanwhile\n{report.summary()}")
    assert report.ok
    producer.close()


def test_a_resumed_zombie_trainer_is_fenced_on_three_brokers(cluster, tmp_path):
    """The zombie of test_faults.py on the 3-node cluster: A SIGSTOPped, B runs, A SIGCONTed and fenced."""
    from tests.scenarios import zombie
    zombie(cluster[0], tmp_path)
