"""Retention edges on the real broker: records expire (Kafka's DeleteRecords moves the log start, as retention does).

A run's history must never fork silently: a trainer without the history refuses to start a second one
under the same name unless told to; one with its snapshot continues it; a site never moves backwards or
onto another history.
"""
import logging
import time

import pytest
from kafka import TopicPartition

from hilo.log import checkpoints_topic, open_log
from hilo.log.tail import head
from hilo.producer.producer import HiLoProducer
from hilo.schemas.errors import LogError
from tests.conftest import KAFKA_URL, new_run, producer_config, publish_random, small_model
from tests.helpers import open_site, with_log

pytestmark = pytest.mark.kafka


def expire(run, topics=("updates", "checkpoints")):
    """Delete every record of the run's topics so far, as retention would."""
    log = open_log(KAFKA_URL)
    for t in topics:
        topic = f"{run}.{t}"
        log.admin.delete_records({TopicPartition(topic, 0): log.end_offset(topic)})
        assert log.begin_offset(topic) == log.end_offset(topic) > 0
    log.close()


def newest_checkpoint(run) -> int:
    """The version of the newest checkpoint of `run` on the log."""
    return with_log(KAFKA_URL, lambda log: head(log, checkpoints_topic(run), run)).version


def site(run, tmp_path, **kw):
    return open_site(KAFKA_URL, run, tmp_path, "s", export_adapters=False, **kw)


def _a_site_follows_from_the_fresh_checkpoint(producer, run, tmp_path):
    """One more version, then a site bootstraps from the trainer's fresh v5 checkpoint and reaches its digest."""
    publish_random(producer, 1, seed=2)
    s = site(run, tmp_path, until_version=6)
    assert s.follower.replica.version == 5
    s.run(progress=False)
    assert s.follower.replica.digest == producer.replica.digest
    producer.close()


def test_all_records_expired_refuses_a_silent_second_history_and_sites_refuse_the_new_one(tmp_path, caplog):
    run = new_run("expired")
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=KAFKA_URL))
    publish_random(producer, 5)
    site(run, tmp_path, until_version=5).run(progress=False)
    producer.close()
    expire(run)
    with pytest.raises(LogError, match=r"held a history of the run .* whose records have all expired.*--new-history"):
        HiLoProducer.open(small_model(), producer_config(run=run, log=KAFKA_URL))
    # loud, explicit; from the same initial weights (same seed): still another history (was: the same genesis digest)
    fresh = HiLoProducer.open(small_model(), producer_config(run=run, log=KAFKA_URL, new_history=True))
    assert fresh.version == 0 and fresh.replica.genesis != producer.replica.genesis
    # said, loudly
    assert any(r.levelno >= logging.WARNING and r.name.startswith("hilo.producer") for r in caplog.records)
    publish_random(fresh, 2)
    with pytest.raises(LogError,
                       match=r"site s: its snapshot v5 is of history [0-9a-f]{12}, the log's checkpoints are of "
                             r"history [0-9a-f]{12} \(another history: the run was started again"):
        site(run, tmp_path, until_version=2)  # was: rolled back from v5 to v2 with a warning
    fresh.close()


def test_a_trainer_with_its_snapshot_continues_an_expired_run_and_sites_follow(tmp_path):
    run = new_run("continue")
    cfg = producer_config(run=run, log=KAFKA_URL, state_dir=str(tmp_path / "trainer"), checkpoint_every=4)
    producer = HiLoProducer.open(small_model(), cfg)
    publish_random(producer, 4)
    site(run, tmp_path, until_version=2).run(progress=False)
    publish_random(producer, 1, seed=1)
    producer.close()  # a clean stop saves the trainer's snapshot at v5
    expire(run)
    again = HiLoProducer.open(small_model(), cfg)
    assert again.version == 5
    _a_site_follows_from_the_fresh_checkpoint(again, run, tmp_path)  # its snapshot (v2) fell out of retention


def test_updates_after_the_newest_checkpoint_expired(tmp_path):
    run = new_run("gap")
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=KAFKA_URL, checkpoint_every=3))
    publish_random(producer, 5)
    producer.close()
    expire(run, topics=("updates",))
    with pytest.raises(LogError, match=r"the updates after checkpoint v3 \(offsets \d+..\d+\) have expired; the "
                                       r"versions after v3 cannot be rebuilt without a trainer snapshot"):
        HiLoProducer.open(small_model(), producer_config(run=run, log=KAFKA_URL, checkpoint_every=3))


def test_a_trainer_snapshot_at_the_head_republishes_a_checkpoint_when_its_updates_expired(tmp_path):
    run = new_run("headsnap")
    cfg = producer_config(run=run, log=KAFKA_URL, checkpoint_every=4, state_dir=str(tmp_path / "trainer"))
    producer = HiLoProducer.open(small_model(), cfg)
    publish_random(producer, 5)
    producer.close()  # snapshot at v5
    expire(run, topics=("updates",))
    again = HiLoProducer.open(small_model(), cfg)
    assert again.version == 5 and newest_checkpoint(run) == 5  # a fresh one: the log held v0 and v4
    _a_site_follows_from_the_fresh_checkpoint(again, run, tmp_path)  # a new site: not from the orphaned v4


def test_the_checkpoints_topic_keeps_the_newest_k(tmp_path, logs):
    """Bounded storage: checkpoint K+1 deletes the oldest (was: every checkpoint kept forever)."""
    run = new_run("keep")
    producer = HiLoProducer.open(small_model(),
                                 producer_config(run=run, log=KAFKA_URL, checkpoint_every=2, keep_checkpoints=2))
    publish_random(producer, 8)  # checkpoints v0, v2, v4, v6, v8
    log = logs(KAFKA_URL)
    topic = f"{run}.checkpoints"
    versions = sorted({r.parsed.version for r in log.read(topic, log.begin_offset(topic), timeout_s=5)})
    assert versions == [6, 8]
    s = site(run, tmp_path, until_version=8)  # a new site bootstraps from the newest, as before
    assert s.follower.replica.version == 8
    s.close()
    producer.close()


def test_a_running_trainer_checkpoints_before_the_updates_a_new_site_needs_expire(tmp_path, logs):
    """Real retention (20 s, segments rolled every 0.2 s, the broker checking every second): a trainer that only
    checkpoints every 10**6 versions still publishes one before the updates after its newest checkpoint expire,
    so a site that joins after records expired bootstraps and follows (was: refused until the next checkpoint).
    The site must then read its updates within the retention, after the trainer stopped: at 6 s a site slowed by a
    busy machine saw them expire first (CI), which is retention working, not this test's point."""
    from kafka.admin import ConfigResource, ConfigResourceType
    run, retention_ms = new_run("joinable"), 20_000
    log = logs(KAFKA_URL)
    log.create_topics(run, retention_ms=retention_ms)
    log.admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, f"{run}.{t}", configs={"segment.ms": "200"})
                             for t in ("updates", "checkpoints")])
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=KAFKA_URL, checkpoint_every=10**6))
    updates, deadline = f"{run}.updates", time.monotonic() + 120
    while log.begin_offset(updates) == 0 or producer.version < 30:  # train until retention really deleted updates
        assert time.monotonic() < deadline, "retention never deleted a record"
        publish_random(producer, 1, seed=producer.version)
        time.sleep(0.3)  # a training step's compute: what lets records age
    s = site(run, tmp_path, until_version=producer.version)
    assert 0 < s.follower.replica.version  # bootstrapped from a checkpoint the retention guard published (not v0)
    s.run(progress=False)
    assert s.follower.replica.digest == producer.replica.digest
    producer.close()


@pytest.mark.parametrize("metrics", [False, True], ids=["plain", "metrics-port"])
def test_a_site_frozen_past_retention_bootstraps_again_by_itself(tmp_path, metrics):
    """A `hilo consume` SIGSTOPped until the versions after its own were deleted, then SIGCONTed: it says so in one
    line, bootstraps again from the newest checkpoint and reaches the trainer's digest. (It used to stop on "gap:
    ... missing", and with --metrics-port it stayed up, not ready, for good: no supervisor restarted it.)"""
    import os
    import signal
    from tests.helpers import hilo, wait_for_line
    run = new_run("frozen")
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=KAFKA_URL, checkpoint_every=4))
    publish_random(producer, 3)
    extra = ["--metrics-port", "0", "--metrics-host", "127.0.0.1"] if metrics else []
    p = hilo("consume", "--log", KAFKA_URL, "--run", run, "--site", "s", "--state-dir", str(tmp_path / "s"),
             "--no-export",
             "--until-version", "10", "--no-progress", *extra)
    try:
        wait_for_line(p, r"site s: v3 digest")
        os.kill(p.pid, signal.SIGSTOP)
        publish_random(producer, 5, seed=1)  # v4..v8; checkpoints at v4 and v8
        # every update so far deleted, as retention does; checkpoint v8 needs none of them
        expire(run, topics=("updates",))
        os.kill(p.pid, signal.SIGCONT)
        publish_random(producer, 2, seed=2)  # v9, v10
        line = wait_for_line(p, r"bootstrapping again from the newest checkpoint")
        assert "has expired: the log now begins at offset" in line
        wait_for_line(p, r"bootstrapped again at v8 \(from v[34]\)")
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0 and f"s: v10 digest {producer.replica.digest.hex()}" in out
    producer.close()
