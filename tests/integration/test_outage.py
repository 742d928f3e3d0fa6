"""A single broker stopped mid-run (no wipe) and started again: the trainer and two sites, real `hilo produce` and
`hilo consume` processes, ride through it. Every acknowledged version is on the log exactly once, both sites end at
the trainer's digest, no process prints a traceback, and /readyz is 503 during the outage and 200 after.

The outage lasts 45 s (HILO_OUTAGE_S=180 tries the 3-minute one: about 4 minutes in all, not run in CI).
"""
import os
import pathlib
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from hilo.log import open_log, updates_topic
from hilo.log.tail import records
from tests.conftest import new_run
from tests.helpers import hilo, wait_until

# One worker for the module (its broker is on port 19292), except the `hilo rl` test, which runs on the worker of every
# test of the vLLM server, with a broker of its own on 19294: the two sets run at once without sharing a port
pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.xdist_group("outage")]
ROOT = pathlib.Path(__file__).resolve().parents[2]
PORT = 19292
RL_PORT = 19294  # each broker takes its port and the next (the controller)
OUTAGE_S = float(os.environ.get("HILO_OUTAGE_S", "45"))
STEPS = 24


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple:
    """(status, body) of a GET; (None, why) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return None, str(e)


def applied(base: str) -> int:
    """The site's applied version, from its /metrics (-1 while it does not answer)."""
    status, body = get(base + "/metrics")
    m = re.search(r"^hilo_site_applied_version\{[^}]*\} (\S+)$", body, re.M) if status == 200 else None
    return int(float(m.group(1))) if m else -1


def _own_broker(tmp_path_factory, port: int):
    """(URL, env for ops/kafka scripts) of a single broker of its own on `port`; stopped and wiped afterwards."""
    env = dict(os.environ, HILO_KAFKA_PORT=str(port), HILO_KAFKA_DIR=str(tmp_path_factory.mktemp("kafka-outage")))
    subprocess.run([str(ROOT / "ops/kafka/start.sh")], env=env, check=True, timeout=300)
    yield f"kafka://127.0.0.1:{port}", env
    subprocess.run([str(ROOT / "ops/kafka/stop.sh"), "--wipe"], env=env, check=False, timeout=300)


@pytest.fixture
def broker(tmp_path_factory):
    """The module's broker (this module's worker)."""
    yield from _own_broker(tmp_path_factory, PORT)


@pytest.fixture
def rl_broker(tmp_path_factory):
    """The `hilo rl` test's broker (the vLLM tests' worker)."""
    yield from _own_broker(tmp_path_factory, RL_PORT)


def test_a_broker_restart_mid_run_stops_neither_the_trainer_nor_the_sites(broker, tmp_path):
    url, env = broker
    run = new_run("outage")
    out = {name: open(tmp_path / f"{name}.out", "w+") for name in ("trainer", "a", "b")}
    err = {name: open(tmp_path / f"{name}.err", "w+") for name in out}
    trainer = hilo("produce", "--log", url, "--run", run, "--steps", str(STEPS), "--history",
                   str(tmp_path / "trainer.jsonl"), stdout=out["trainer"], stderr=err["trainer"])
    sites, bases = {}, {}
    for name in ("a", "b"):
        port = free_port()
        bases[name] = f"http://127.0.0.1:{port}"
        sites[name] = hilo("consume", "--log", url, "--run", run, "--site", name, "--state-dir", str(tmp_path / name),
                           "--no-export", "--no-progress", "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
                           "--wait-checkpoint", "120", stdout=out[name], stderr=err[name])
    procs = [trainer, *sites.values()]
    try:
        wait_until(lambda: min(applied(b) for b in bases.values()) >= 3, 180, "both sites apply v3")
        subprocess.run([str(ROOT / "ops/kafka/stop.sh")], env=env, check=True, timeout=300)  # no --wipe: a restart
        down_at = time.monotonic()
        wait_until(lambda: all(get(b + "/readyz")[0] == 503 for b in bases.values()), OUTAGE_S + 60,
                   "both sites answer /readyz 503 while the broker is down")
        during = {n: get(b + "/readyz")[1] for n, b in bases.items()}
        assert all(p.poll() is None for p in procs), "a process exited during the outage"
        # the outage's length: the fault, not a wait on anything
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        subprocess.run([str(ROOT / "ops/kafka/start.sh")], env=env, check=True, timeout=300)
        assert trainer.wait(timeout=600) == 0
        wait_until(lambda: all(applied(b) == STEPS and get(b + "/readyz")[0] == 200 for b in bases.values()), 300,
                   f"both sites apply v{STEPS} and are ready again")
        for p in sites.values():
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=120) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = {n: (f.seek(0), f.read())[1] for n, f in err.items()}
    stdout = {n: (f.seek(0), f.read())[1] for n, f in out.items()}
    for f in [*out.values(), *err.values()]:
        f.close()
    for name, t in text.items():
        assert "Traceback" not in t, f"{name} printed a traceback:\n{t[-3000:]}"
    assert all("unreachable" in r for r in during.values()), during
    # said when the log went and when it came back (a broker that flaps while starting is two outages)
    for name in sites:
        gone, back = text[name].count("the log is unreachable ("), text[name].count("the log is back after")
        assert 1 <= gone == back, text[name][-3000:]
    digest = re.search(r"done: v(\d+) digest ([0-9a-f]+)", stdout["trainer"])
    assert digest and int(digest.group(1)) == STEPS
    for name in sites:
        assert f"{name}: v{STEPS} digest {digest.group(2)}" in stdout[name]
    log = open_log(url)
    firsts = [r.parsed.version for r in records(log, updates_topic(run)) if r.parsed.first_chunk]
    log.close()
    assert firsts == list(range(1, STEPS + 1)), firsts  # every acknowledged version once, in order


@pytest.mark.parametrize("scenario", ["outage", "outage_pipelined"])
def test_a_broker_outage_during_a_multi_rank_step_stops_every_rank_with_the_same_outcome(broker, tmp_path, scenario):
    """A 2-rank torchrun job on this broker; before its second step the broker stops. The publishing rank's publish
    fails past publish_deadline_s, and both ranks stop with the same NotPublished line and the same `in_doubt`
    (pipelined: every rank adopted v2 while it was published, and the next step raises its failure on every rank,
    back at v1); after the restart the job resumes the run: every version once, in order, both ranks at the replica."""
    from tests.producer.test_distributed import assert_ranks_hold_the_replica, torchrun
    url, env = broker
    run = new_run("ranks-outage")
    rc, out, (r0, r1) = torchrun(scenario, url, run, tmp_path, 3, HILO_KAFKA_PORT=env["HILO_KAFKA_PORT"],
                                 HILO_KAFKA_DIR=env["HILO_KAFKA_DIR"])
    assert rc != 0
    assert r0 and r1, out[-6000:]  # each rank wrote its report (one killed by torchrun writes none)
    assert r0["stopped"] == r1["stopped"] and r0["in_doubt"] == r1["in_doubt"], (r0, r1)
    assert r0["stopped"].startswith("NotPublished: ") and "\n" not in r0["stopped"], r0["stopped"]
    subprocess.run([str(ROOT / "ops/kafka/start.sh")], env=env, check=True, timeout=300)
    rc, out, (r0, r1) = torchrun("train", url, run, tmp_path, 2)
    assert rc == 0, out[-4000:]
    assert r0["start_version"] in (1, 2)  # v2 may have reached the log before the broker stopped answering (in doubt)
    assert_ranks_hold_the_replica(r0, r1, r0["start_version"] + 2)
    log = open_log(url)
    firsts = [r.parsed.version for r in records(log, updates_topic(run)) if r.parsed.first_chunk]
    log.close()
    assert firsts == list(range(1, r0["start_version"] + 3)), firsts  # no version twice, none missing


def test_a_prompt_group_member_that_must_rewind_in_an_outage_reads_its_prompts_again_after_it(broker):
    """A generating site's member of the prompt group releases its lease while the broker is stopped: its committed
    offsets cannot be read, so it leaves the group. Each take during the outage is LogUnavailable (waited out), and
    after the restart it reads the same prompts again and settles each exactly once. Before, it kept its closed
    consumer, whose next poll raised IllegalStateError, and the site exited (seen in CI: hilo rl's site-1)."""
    from hilo.log.base import prompts_topic
    from hilo.schemas import headers as H
    from hilo.schemas.errors import LeaseLost, LogUnavailable
    url, env = broker
    run, n = new_run("rejoin"), 3
    log = open_log(url)
    log.create_topics(run)
    log.create_rollout_topics(run, 1)
    for i in range(n):
        log.append(prompts_topic(run), [(f"p{i}".encode(), b"prompt", {H.RUN: run, H.PROMPT: f"p{i}"})], 0)
    q = log.prompt_queue(run, "a", 60.0)
    leases = []
    try:
        wait_until(lambda: leases.append(q.take(n, timeout_s=0.5)) or len(leases[-1].records) == n, 120,
                   "the prompts taken")
        subprocess.run([str(ROOT / "ops/kafka/stop.sh")], env=env, check=True, timeout=300)
        try:
            q.release(leases[-1])  # rewind: the committed offsets cannot be read now
        except LogUnavailable:
            pass
        with pytest.raises(LogUnavailable):
            q.take(n, timeout_s=0.5)
        subprocess.run([str(ROOT / "ops/kafka/start.sh")], env=env, check=True, timeout=300)
        settled = []

        def again():  # what a site's generator does: an outage's error is waited out, a failed settle reads again
            try:
                lease = q.take(n, timeout_s=0.5)
                if lease.records:
                    q.settle(lease,
                             [(r.key, b"answer", {H.PROMPT: r.key.decode(), H.SITE: "a"}) for r in lease.records])
                    settled.extend(r.key.decode() for r in lease.records)
            except (LogUnavailable, LeaseLost):
                return False
            return len(settled) >= n
        wait_until(again, 180, "the prompts read again and settled after the restart", every_s=0)
    finally:
        q.close()
        log.close()
    assert sorted(settled) == [f"p{i}" for i in range(n)]


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm")
def test_hilo_rl_and_generating_sites_ride_through_a_broker_restart(rl_broker, vllm, tmp_path):
    """`hilo rl` (the trainer and two generating sites, real processes, a real vLLM) with its broker stopped for the
    outage mid-run: it finishes, every site at the trainer's digest, and every prompt answered exactly once
    (check_return_path, from the log alone)."""
    import json
    from hilo.replay.history import check_return_path
    url, env = rl_broker
    vllm_url, _ = vllm
    run = new_run("rl-outage")
    p = hilo("rl", "--vllm", vllm_url, "--log", url, "--run", run, "--steps", "4", "--sites", "2", "--batch-prompts",
             "2",
             "--samples", "2", "--staleness", "0", "--json", stdout=subprocess.PIPE,
             stderr=open(tmp_path / "rl.err", "w"))
    try:
        wait_until(lambda: re.search(r"^step\s+2 ", (tmp_path / "rl.err").read_text(), re.M) or p.poll() is not None,
                   600,
                   "hilo rl publishes step 2")
        assert p.poll() is None, (tmp_path / "rl.err").read_text()[-3000:]
        subprocess.run([str(ROOT / "ops/kafka/stop.sh")], env=env, check=True, timeout=300)
        time.sleep(OUTAGE_S)  # the outage's length: the fault, not a wait on anything
        subprocess.run([str(ROOT / "ops/kafka/start.sh")], env=env, check=True, timeout=300)
        out, _ = p.communicate(timeout=900)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    err = (tmp_path / "rl.err").read_text()
    assert p.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert " exited (" not in err, err[-3000:]  # no generating site died of the outage (hilo rl says so once per site)
    res = json.loads(out)
    assert res["ok"] and [r["step"] for r in res["steps"]] == [1, 2, 3, 4]
    log = open_log(url)
    report = check_return_path(log, run)
    log.close()
    assert report.ok, report.summary()
