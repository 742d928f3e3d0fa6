"""Sites in another region read a mirror: two real single-node clusters and a real MirrorMaker 2
(ops/kafka/mirror.sh). The trainer writes to cluster A (the tests' broker); the mirror B holds the same records at
other offsets (transaction markers are not copied), so every site there finds its place by version."""
import json
import os
import pathlib
import subprocess
import time

import pytest
from kafka import KafkaProducer

from hilo.log import updates_topic
from hilo.log.tail import head, records
from hilo.producer.producer import HiLoProducer
from hilo.replay.history import log_versions
from hilo.schemas import headers as H
from tests.conftest import KAFKA_URL, new_run, producer_config, publish_random, small_model
from tests.helpers import hilo, open_site, opened, wait_until

# one worker: cluster B, port 19392
pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.xdist_group("mirror")]
ROOT = pathlib.Path(__file__).resolve().parents[2]
PORT_B = int(os.environ.get("HILO_KAFKA_MIRROR_PORT", "19392"))
MIRROR_S = 120  # MirrorMaker picks a new run's topics up within seconds (refresh.topics.interval 2 s), then copies


@pytest.fixture(scope="module")
def cluster_b(tmp_path_factory):
    """(kafka:// URL of cluster B, env of the ops scripts); stopped and wiped afterwards."""
    env = dict(os.environ, HILO_KAFKA_PORT=str(PORT_B), HILO_KAFKA_DIR=str(tmp_path_factory.mktemp("kafka-b")),
               HILO_KAFKA_HEAP="-Xms128m -Xmx512m", HILO_MIRROR_DIR=str(tmp_path_factory.mktemp("mirror")))
    subprocess.run([str(ROOT / "ops/kafka/start.sh")], env=env, check=True, timeout=300)
    yield f"kafka://127.0.0.1:{PORT_B}", env
    subprocess.run([str(ROOT / "ops/kafka/stop.sh"), "--wipe"], env=env, check=False, timeout=300)


def _mirror(action, env, run=None):
    """ops/kafka/mirror.sh start (this run's topics only: the tests' broker holds every earlier test's) or stop."""
    args = ["start", "--source", KAFKA_URL.removeprefix("kafka://"), "--target", f"127.0.0.1:{PORT_B}", "--run", run] \
        if action == "start" else [action]
    subprocess.run([str(ROOT / "ops/kafka/mirror.sh"), *args], env=env, check=True, timeout=600)


@pytest.fixture
def mirror(cluster_b, request):
    """(URL of B, env, run): MirrorMaker 2 copying a new run A -> B (its rollouts back) for this test."""
    url, env = cluster_b
    run = new_run("mirror")
    _mirror("start", env, run)
    yield url, env, run
    _mirror("stop", env)


def _newest(url, run) -> int:
    """The newest version of `run` on the cluster at `url` (-1 before its topic exists)."""
    with opened(url) as log:
        try:
            h = head(log, updates_topic(run), run)
        except Exception:  # noqa: BLE001 - the topic is not there yet
            return -1
    return (h.version or 0) if h else 0


def _lag(run, mirror) -> dict:
    """`hilo lag --mirror` as JSON."""
    p = hilo("lag", "--log", KAFKA_URL, "--run", run, "--mirror", mirror, "--json")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return json.loads(out)


def _zombie_aborts(run, version):
    """Another transactional writer sends a record that claims `version` of `run`, then aborts."""
    p = KafkaProducer(bootstrap_servers=KAFKA_URL.removeprefix("kafka://"), transactional_id=f"zombie-{run}")
    p.init_transactions()
    p.begin_transaction()
    p.send(updates_topic(run), key=str(version).encode(), value=b"zombie" * 100,
           headers=[(H.RUN, run.encode()), (H.KIND, b"update"), (H.VERSION, str(version).encode()), (H.CHUNK, b"0/1")])
    p.flush()
    p.abort_transaction()
    p.close()


def test_sites_on_a_mirror_reach_the_trainers_digest_and_never_see_aborted_records(mirror, tmp_path, logs):
    mirror, _, run = mirror
    producer = HiLoProducer.open(small_model(),
                                 producer_config(run=run, log=KAFKA_URL, codec="dense", checkpoint_every=3))
    publish_random(producer, 4)
    _zombie_aborts(run, 5)
    publish_random(producer, 3, seed=1)
    wait_until(lambda: _newest(mirror, run) == 7, MIRROR_S, "the mirror holds v7")
    a, b = logs(KAFKA_URL), logs(mirror)
    topic = updates_topic(run)
    assert not any(r.value.startswith(b"zombie") for r in records(b, topic))  # read_committed: the abort stayed on A
    assert b.end_offset(topic) < a.end_offset(topic)                         # no transaction markers on the mirror

    site = open_site(mirror, run, tmp_path, name="b1", idle_exit_s=1.0)    # bootstraps from v0's mirrored checkpoint
    assert site.run(progress=False) == 7 and site.follower.replica.digest == producer.replica.digest
    late = open_site(mirror, run, tmp_path, name="b2", idle_exit_s=1.0, wait_checkpoint_s=30)
    assert late.run(progress=False) == 7 and late.follower.replica.digest == producer.replica.digest
    lag = _lag(run, mirror)
    assert [(m["cluster"], m["lag"], m["lag_s"]) for m in lag["mirrors"]] == [(mirror, 0, 0.0)]
    assert {(r["cluster"], r["site"], r["lag_vs_source"]) for r in lag["sites"]} == {(mirror, "b1", 0),
                                                                                     (mirror, "b2", 0)}

    publish_random(producer, 2, seed=2)                                      # b1 fails over to A and continues
    site = open_site(KAFKA_URL, run, tmp_path, name="b1", idle_exit_s=1.0)
    assert site.run(progress=False) == 9 and site.follower.replica.digest == producer.replica.digest
    publish_random(producer, 2, seed=3)                                      # and back to B
    wait_until(lambda: _newest(mirror, run) == 11, MIRROR_S, "the mirror holds v11")
    site = open_site(mirror, run, tmp_path, name="b1", idle_exit_s=1.0)
    assert site.run(progress=False) == 11 and site.follower.replica.digest == producer.replica.digest
    assert sum(site.follower.skips.values()) == 0
    producer.close()


def test_a_mirror_stopped_for_a_minute_then_restarted_loses_and_repeats_nothing(mirror, tmp_path, logs):
    mirror, env, run = mirror
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=KAFKA_URL, codec="dense"))
    publish_random(producer, 3)
    wait_until(lambda: _newest(mirror, run) == 3, MIRROR_S, "the mirror holds v3")
    site = open_site(mirror, run, tmp_path, name="b", idle_exit_s=1.0)
    assert site.run(progress=False) == 3
    _mirror("stop", env)
    outage_end = time.monotonic() + 60  # the outage the issue names, not a synchronisation
    publish_random(producer, 4, seed=1)
    site = open_site(mirror, run, tmp_path, name="b", idle_exit_s=1.0)
    assert site.run(progress=False) == 3                                 # the region is cut off: no progress, no error
    wait_until(lambda: _newest(KAFKA_URL, run) == 7, 30, "the source holds v7")
    (m,) = _lag(run, mirror)["mirrors"]
    # v4 has waited on the source since it was written
    assert m["lag"] == 4 and m["lag_s"] > 0
    time.sleep(max(0.0, outage_end - time.monotonic()))
    _mirror("start", env, run)
    wait_until(lambda: _newest(mirror, run) == 7, MIRROR_S, "the mirror holds v7 again")
    site = open_site(mirror, run, tmp_path, name="b", idle_exit_s=1.0)
    assert site.run(progress=False) == 7 and site.follower.replica.digest == producer.replica.digest
    assert log_versions(logs(mirror), run) == log_versions(logs(KAFKA_URL), run)  # every version, once
    assert len([r for r in records(logs(mirror), updates_topic(run)) if r.headers.get(H.RUN) == run]) == 7
    producer.close()


def test_bench_fanout_quick_splits_sites_over_the_mirror_and_the_source_serves_one_copy_for_them(cluster_b, tmp_path):
    """What CI runs of `hilo bench fanout`: 1 and 2 sites on the source, then 1 + 1 over source and mirror."""
    mirror, _ = cluster_b
    p = hilo("bench", "fanout", "--log", KAFKA_URL, "--mirror", mirror, "--sites", "1,2", "--versions", "3",
             "--interval", "0.5", "--json", "--out", str(tmp_path / "out"))
    out, err = p.communicate(timeout=900)
    assert p.returncode == 0, err[-3000:]
    res = json.loads(out)
    assert json.loads((tmp_path / "out" / "fanout.json").read_text()) == res
    rows = {(r["sites_source"], r["sites_mirror"]): r for r in res["rows"]}
    assert sorted(rows) == [(1, 0), (1, 1), (2, 0)]
    for r in rows.values():  # every site reached the trainer's digest (the bench raises otherwise); figures plausible
        assert 0 < r["freshness_median_s"] <= r["freshness_p90_s"] <= r["freshness_max_s"] < 60
    msg = rows[1, 0]["message_record_bytes"]
    # spar4 at 1.6% of a 524 KB adapter, and headers
    assert 1_000 < msg < 40_000
    near = lambda got, want: abs(got - want) <= 0.01 * want  # noqa: E731 - runs differ only in header digits
    assert near(rows[1, 0]["egress_source_per_version"], msg)
    assert near(rows[2, 0]["egress_source_per_version"], 2 * msg)       # each site reads each version once
    # split: the source serves its site and MirrorMaker's one copy; the mirror serves the other site
    assert near(rows[1, 1]["egress_source_per_version"], 2 * msg)
    assert near(rows[1, 1]["egress_mirror_per_version"], msg)
    assert rows[1, 1]["mirror_freshness_median_s"] > 0
    assert res["ratio_sites"] == [2, 1] and res["freshness_ratio_most_to_one"] > 0
