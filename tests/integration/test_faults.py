"""Fault injection on the real broker: SIGKILLed consumers and trainers, then digests compared."""
import random
import re
import signal
import time

import pytest

from hilo.consumer.config import SiteConfig
from hilo.ops.lag import lag_rows
from hilo.producer.producer import HiLoProducer
from tests.conftest import KAFKA_URL, new_run, producer_config, publish_random, small_model
from tests.helpers import hilo, opened, site_of, wait_for_line
from tests.scenarios import zombie

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_consumer_sigkilled_at_3_random_moments_reaches_trainer_digest(tmp_path):
    # 3 kills, each a fresh process (most of the test's time); `hilo bench faults` kills many more times
    rng, kills = random.Random(20), 3
    run = new_run("kill")
    producer = HiLoProducer.open(small_model(hidden=256, layers=4, rank=32),
                            producer_config(run=run, log=KAFKA_URL, codec="dense", checkpoint_every=1000,
                                            chunk_bytes=512 << 10))
    publish_random(producer, 2)
    state = str(tmp_path / "victim")
    behind_at_kill = 0
    with opened(KAFKA_URL) as log:
        for round_ in range(kills):
            before = producer.version
            publish_random(producer, 6, seed=round_)
            # Kill right after a random version inside this round's work (the site replays to it from its last
            # snapshot), plus a random slice of time: the kill lands mid-fetch, mid-apply, mid-export or mid-snapshot.
            target = rng.randint(before + 1, producer.version - 3)
            p = hilo("--log-level", "DEBUG", "consume", "--log", KAFKA_URL, "--run", run, "--site", "victim",
                     "--state-dir", state,
                     "--snapshot-every", "2", "--until-version", str(producer.version), "--no-progress")
            wait_for_line(p, f"site victim: applied v{target} ")
            time.sleep(rng.uniform(0.0, 0.1))  # fault injection at a random instant, not synchronisation
            p.send_signal(signal.SIGKILL)
            p.wait()
            rows = [r for r in lag_rows(log, run) if r["site"] == "victim"]
            behind_at_kill += bool(rows and rows[0]["applied_version"] < producer.version)
    final = site_of(SiteConfig(log=KAFKA_URL, run=run, site="victim", state_dir=state, until_version=producer.version))
    final.run(progress=False)
    assert final.follower.replica.digest == producer.replica.digest
    assert behind_at_kill >= kills // 2, f"only {behind_at_kill}/{kills} kills landed while the site had work left"
    producer.close()


def test_trainer_sigkilled_mid_run_and_restarted_keeps_every_site_consistent(tmp_path):
    run = new_run("trainer-kill")
    common = ["--log", KAFKA_URL, "--run", run, "--codec", "dense", "--checkpoint-every", "7"]
    first = hilo("produce", *common, "--steps", "200")
    for line in first.stdout:
        if line.startswith("v5 "):
            break
    time.sleep(random.Random(5).uniform(0.0, 0.5))  # fault injection at a random instant
    first.send_signal(signal.SIGKILL)
    first.wait()
    second = hilo("produce", *common, "--steps", "8")
    out, err = second.communicate(timeout=600)
    assert second.returncode == 0, err[-3000:]
    resumed = re.search(r"resumed at v(\d+)", err)
    done = re.search(r"done: v(\d+) digest ([0-9a-f]{32})", out)
    assert resumed and done and int(done.group(1)) == int(resumed.group(1)) + 8
    for name in ("a", "b"):
        s = site_of(SiteConfig(log=KAFKA_URL, run=run, site=name, state_dir=str(tmp_path / name),
                               until_version=int(done.group(1)), export_adapters=False))
        s.run(progress=False)
        assert s.follower.replica.digest.hex() == done.group(2)


@pytest.mark.parametrize("log_kind", ["file"])
def test_sigterm_stops_between_versions_and_saves_the_position(tmp_path, log_kind):
    url, run = f"file://{tmp_path}/log", new_run("term")
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=url))
    publish_random(producer, 5)
    p = hilo("consume", "--log", url, "--run", run, "--site", "t", "--state-dir", str(tmp_path / "t"), "--no-progress",
              "--snapshot-every", "1000")
    wait_for_line(p, r"site t: v5 ")  # caught up, now idle-following
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0 and f"t: v5 digest {producer.replica.digest.hex()}" in out
    import json
    pos = json.loads((tmp_path / "t" / "snapshot" / "position.json").read_text())
    assert (pos["version"], pos["next_offset"]) == (5, 5)
    producer.close()


def test_a_resumed_zombie_trainer_is_fenced_and_no_site_stops(tmp_path):
    zombie(KAFKA_URL, tmp_path)


def test_every_named_crash_point_loses_nothing(tmp_path):
    """`hilo bench faults` at CI size: every trainer point once, every site point once (plus random instants);
    each kill is a real SIGKILL of a real process (HILO_CRASH_AT), then the history check over every session."""
    import json
    from hilo.schemas.crash_points import SITE_POINTS, TRAINER_POINTS
    from hilo.ops.bench.faults import main
    kills = len(SITE_POINTS) + len(SITE_POINTS) // 3 + 1  # one in four launches is a random-instant kill
    assert main(False, KAFKA_URL, kills, len(TRAINER_POINTS), str(tmp_path)) == 0
    res = json.loads((tmp_path / "faults.json").read_text())
    assert all(res["trainer_kills"][p] == 1 for p in TRAINER_POINTS), res["trainer_kills"]
    assert all(res["site_kills"][p] >= 1 for p in SITE_POINTS), res["site_kills"]
    assert res["anomalies"] == [] and res["divergent_digests"] == 0
    print(f"\nkills: trainer {res['trainer_kills']}, sites {res['site_kills']}; 0 anomalies, 0 divergent")
