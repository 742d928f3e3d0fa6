"""Fault injection on the real broker: SIGKILLed consumers and trainers, then digests compared."""
import random
import re
import signal
import subprocess
import sys
import time

import pytest

from hilo.consumer.site import Site, SiteConfig
from hilo.log import open_log
from hilo.ops.lag import lag_rows
from hilo.producer.producer import HiLoProducer
from hilo.replay.history import log_versions
from tests.conftest import KAFKA_URL, new_run, producer_config, publish_random, small_model

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _hilo(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "hilo.ops.cli", *args], stderr=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, **kw)


def _wait_for_line(proc, pattern, timeout_s=120):
    """Read the process's stderr until a line matches (the process is then known to be past startup)."""
    deadline = time.monotonic() + timeout_s
    for line in proc.stderr:
        if re.search(pattern, line):
            return line
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"process never printed {pattern!r} (exit {proc.poll()})")


def test_consumer_sigkilled_at_20_random_moments_reaches_trainer_digest(tmp_path):
    rng = random.Random(20)
    run = new_run("kill")
    producer = HiLoProducer(small_model(hidden=256, layers=4, rank=32),
                            producer_config(run=run, log=KAFKA_URL, codec="dense", checkpoint_every=1000, chunk_bytes=512 << 10))
    publish_random(producer, 2)
    state = str(tmp_path / "victim")
    log = open_log(KAFKA_URL)
    behind_at_kill = 0
    for round_ in range(20):
        before = producer.version
        publish_random(producer, 6, seed=round_)
        # Kill right after a random version inside this round's work (the site replays to it from its last
        # snapshot), plus a random slice of time: the kill lands mid-fetch, mid-apply, mid-export or mid-snapshot.
        target = rng.randint(before + 1, producer.version - 3)
        p = _hilo("--log-level", "DEBUG", "consume", "--log", KAFKA_URL, "--run", run, "--site", "victim", "--state-dir", state,
                  "--snapshot-every", "2", "--until-version", str(producer.version), "--no-progress")
        _wait_for_line(p, f"site victim: applied v{target} ")
        time.sleep(rng.uniform(0.0, 0.1))  # fault injection at a random instant, not synchronisation
        p.send_signal(signal.SIGKILL)
        p.wait()
        rows = [r for r in lag_rows(log, run) if r["site"] == "victim"]
        behind_at_kill += bool(rows and rows[0]["applied_version"] < producer.version)
    final = Site.open(SiteConfig(log=KAFKA_URL, run=run, site="victim", state_dir=state, until_version=producer.version))
    final.run(progress=False)
    assert final.follower.replica.digest == producer.replica.digest
    assert behind_at_kill >= 10, f"only {behind_at_kill}/20 kills landed while the site had work left"
    producer.close()


def test_trainer_sigkilled_mid_run_and_restarted_keeps_every_site_consistent(tmp_path):
    run = new_run("trainer-kill")
    common = ["--log", KAFKA_URL, "--run", run, "--codec", "dense", "--checkpoint-every", "7"]
    first = _hilo("produce", *common, "--steps", "200")
    for line in first.stdout:
        if line.startswith("v5 "):
            break
    time.sleep(random.Random(5).uniform(0.0, 0.5))  # fault injection at a random instant
    first.send_signal(signal.SIGKILL)
    first.wait()
    second = _hilo("produce", *common, "--steps", "8")
    out, err = second.communicate(timeout=600)
    assert second.returncode == 0, err[-3000:]
    resumed = re.search(r"resumed at v(\d+)", err)
    done = re.search(r"done: v(\d+) digest ([0-9a-f]{32})", out)
    assert resumed and done and int(done.group(1)) == int(resumed.group(1)) + 8
    for name in ("a", "b"):
        s = Site.open(SiteConfig(log=KAFKA_URL, run=run, site=name, state_dir=str(tmp_path / name),
                            until_version=int(done.group(1)), export_adapters=False))
        s.run(progress=False)
        assert s.follower.replica.digest.hex() == done.group(2)


@pytest.mark.parametrize("log_kind", ["file"])
def test_sigterm_stops_between_versions_and_saves_the_position(tmp_path, log_kind):
    url, run = f"file://{tmp_path}/log", new_run("term")
    producer = HiLoProducer(small_model(), producer_config(run=run, log=url))
    publish_random(producer, 5)
    p = _hilo("consume", "--log", url, "--run", run, "--site", "t", "--state-dir", str(tmp_path / "t"), "--no-progress",
              "--snapshot-every", "1000")
    _wait_for_line(p, r"site t: v5 ")  # caught up, now idle-following
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0 and f"t: v5 digest {producer.replica.digest.hex()}" in out
    import json
    pos = json.loads((tmp_path / "t" / "snapshot" / "position.json").read_text())
    assert (pos["version"], pos["next_offset"]) == (5, 5)


def _check_histories(url, run, folder, trainers, sites):
    """The history check of replay/history.py over the files a fault test's processes wrote; prints its report."""
    from hilo.replay.history import check, read_history
    trainer = [e for t in trainers for e in read_history(str(folder / f"{t}.jsonl"))]
    report = check(trainer, {s: read_history(str(folder / f"{s}.jsonl")) for s in sites}, log_versions(open_log(url), run))
    print("\n" + report.summary())
    assert report.ok, report.summary()
    return report


def test_a_resumed_zombie_trainer_is_fenced_and_no_site_stops(tmp_path):
    zombie(KAFKA_URL, tmp_path)


def zombie(url, tmp_path):
    """Trainer A SIGSTOPped mid-run, trainer B started on the same run, then A SIGCONTed: A is fenced (its
    next write fails, it exits with one line), publishes nothing more; the live site never stops and every
    site ends at B's digest. (Before transactional publishing, A republished and every site stopped on a fork.)"""
    run, hist = new_run("zombie"), tmp_path / "history"
    common = ["--log", url, "--run", run, "--codec", "dense", "--checkpoint-every", "4"]
    a = _hilo("produce", *common, "--steps", "500", "--history", str(hist / "trainer-a.jsonl"))
    live = _hilo("consume", "--log", url, "--run", run, "--site", "live", "--state-dir", str(tmp_path / "live"),
                 "--no-progress", "--no-export", "--history", str(hist / "live.jsonl"))
    for line in a.stdout:
        if line.startswith("v6 "):
            break
    a.send_signal(signal.SIGSTOP)
    b = _hilo("produce", *common, "--steps", "6", "--history", str(hist / "trainer-b.jsonl"))
    out, err = b.communicate(timeout=600)
    assert b.returncode == 0, err[-3000:]
    done = re.search(r"done: v(\d+) digest ([0-9a-f]{32})", out)
    final, digest = int(done.group(1)), done.group(2)
    t0 = time.monotonic()
    a.send_signal(signal.SIGCONT)
    _, a_err = a.communicate(timeout=300)
    fenced_after = time.monotonic() - t0
    errors = [line for line in a_err.splitlines() if "error:" in line]
    assert a.returncode == 1 and len(errors) == 1 and "was fenced" in errors[0] and "Traceback" not in a_err, a_err[-3000:]
    log = open_log(url)
    assert max(log_versions(log, run)) == final  # A added nothing
    _wait_for_line(live, rf"site live: v{final} ")
    assert live.poll() is None  # never stopped
    live.send_signal(signal.SIGTERM)
    live_out, _ = live.communicate(timeout=120)
    assert live.returncode == 0 and f"live: v{final} digest {digest}" in live_out
    late = Site.open(SiteConfig(log=url, run=run, site="late", state_dir=str(tmp_path / "late"), until_version=final,
                           export_adapters=False, history=str(hist / "late.jsonl")))
    late.run(progress=False)
    assert late.follower.replica.digest.hex() == digest
    _check_histories(url, run, hist, ["trainer-a", "trainer-b"], ["live", "late"])
    print(f"zombie fenced {fenced_after:.1f}s after SIGCONT: {errors[0]}")


def test_every_named_crash_point_loses_nothing(tmp_path):
    """`hilo bench faults` at CI size: every trainer point once, every site point once (plus random instants);
    each kill is a real SIGKILL of a real process (HILO_CRASH_AT), then the history check over every session."""
    import json
    from hilo.log.crashpoints import SITE_POINTS, TRAINER_POINTS
    from hilo.ops.bench.faults import main
    kills = len(SITE_POINTS) + len(SITE_POINTS) // 3 + 1  # one in four launches is a random-instant kill
    assert main(False, KAFKA_URL, kills, len(TRAINER_POINTS), str(tmp_path)) == 0
    res = json.loads((tmp_path / "faults.json").read_text())
    assert all(res["trainer_kills"][p] == 1 for p in TRAINER_POINTS), res["trainer_kills"]
    assert all(res["site_kills"][p] >= 1 for p in SITE_POINTS), res["site_kills"]
    assert res["anomalies"] == [] and res["divergent_digests"] == 0
    print(f"\nkills: trainer {res['trainer_kills']}, sites {res['site_kills']}; 0 anomalies, 0 divergent")
