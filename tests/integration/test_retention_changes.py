"""A run stays joinable as its topics' retention changes, and `--until-version N` ends at exactly N.

Real broker, real trainers and sites: retention is a few seconds, segments roll every 0.2 s and the broker checks
retention every second (ops/kafka/start.sh), so what a limit deletes is gone within about a second of expiring.
"""
import logging
import os
import threading
import time

import pytest
from kafka.admin import ConfigResource, ConfigResourceType

from hilo.log import checkpoints_topic, updates_topic
from hilo.log.tail import head
from hilo.ops.cli import main
from hilo.ops.describe import describe_run
from hilo.producer.producer import HiLoProducer
from hilo.schemas.errors import Expired, PastVersion
from tests.conftest import KAFKA_URL, new_run, producer_config, publish_random, small_model
from tests.helpers import hilo, open_site, reaped, wait_until, with_log

RETENTION_MS = 12_000  # short, so 5 periods fit in a minute; a joining site still has half of it to read what it needs


def _alter(log, topic: str, configs: dict) -> None:
    """Set topic configs as an operator would (kafka-configs --alter --add-config: incremental)."""
    log.admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic,
                                            configs={k: str(v) for k, v in configs.items()})])


class _Training:
    """A trainer stepping in a thread of its own, as a training loop does whatever else happens: {version: digest}."""

    def __init__(self, run: str):
        self.run, self.stop, self.error = run, threading.Event(), None
        self.producer = HiLoProducer.open(small_model(),
                                          producer_config(run=run, log=KAFKA_URL, checkpoint_every=10**6))
        self.digests = {0: self.producer.replica.digest}
        self.thread = threading.Thread(target=self._loop, name=f"train-{run}")
        self.thread.start()

    def _loop(self):
        p = self.producer
        try:
            while not self.stop.wait(0.3):  # a training step's compute: what lets records age
                publish_random(p, 1, seed=p.version)
                self.digests[p.version] = p.replica.digest
        except BaseException as e:  # noqa: BLE001  (re-raised by close, in the test)
            self.error = e

    def joinable_gauge(self) -> float:
        """What the trainer's /metrics say now."""
        return self.producer.metrics.registry.get_sample_value("hilo_trainer_joinable", {"run": self.run})

    def close(self):
        self.stop.set()
        self.thread.join()
        self.producer.close()
        if self.error is not None:
            raise self.error


def _join(t: _Training, tmp_path, name: str) -> None:
    """A new site (a state dir of its own) joins now and reaches the trainer's newest version and its digest."""
    version = max(t.digests)
    s = open_site(KAFKA_URL, t.run, tmp_path, name, until_version=version, export_adapters=False, prefetch=False)
    assert s.run(progress=False) == version
    assert s.follower.replica.digest == t.digests[version], name


@pytest.mark.slow
@pytest.mark.kafka
def test_a_run_stays_joinable_when_retention_is_lowered_or_set_on_the_checkpoints_topic(tmp_path, logs, caplog):
    """Two runs, trained together (one window of wall time for both). `lowered`: topics kept forever until, a few
    versions in, an operator lowers both topics' retention.ms to R. `ckpts`: R on RUN.checkpoints alone, set before
    the trainer starts. Both trainers checkpoint only every 10**6 versions: only the retention guard keeps them
    joinable. The trainer logs each change; from 2R after the change, for 3R, new sites join one after another and
    reach the trainer's digest, and `topics describe` and /metrics say a site can join. (Was: the guard read
    RUN.updates' limits once, at start: both runs' only checkpoint expired, nothing was logged, new sites were
    refused.)"""
    caplog.set_level(logging.INFO, "hilo.producer")
    log = logs(KAFKA_URL)
    lowered, ckpts = new_run("lowered"), new_run("ckptret")
    for run in (lowered, ckpts):
        log.create_topics(run)
        for topic in (updates_topic(run), checkpoints_topic(run)):
            _alter(log, topic, {"segment.ms": 200})
    _alter(log, checkpoints_topic(ckpts), {"retention.ms": RETENTION_MS})
    period = RETENTION_MS / 1e3
    windows = {ckpts: time.monotonic() + 2 * period}
    trainers = []
    try:
        trainers += [_Training(lowered), _Training(ckpts)]
        wait_until(lambda: max(trainers[0].digests) >= 3, 60, "three versions of the first run")
        for topic in (updates_topic(lowered), checkpoints_topic(lowered)):
            _alter(log, topic, {"retention.ms": RETENTION_MS})
        windows[lowered] = time.monotonic() + 2 * period
        joins, end = {run: 0 for run in windows}, windows[lowered] + 3 * period

        def open_windows():
            return [t for t in trainers if windows[t.run] <= time.monotonic() < windows[t.run] + 3 * period]
        while time.monotonic() < end:
            wait_until(lambda: open_windows() or time.monotonic() >= end, end - time.monotonic() + 1,
                       "a window to join in")
            for t in open_windows():
                _join(t, tmp_path, f"{t.run}-{joins[t.run]}")
                joins[t.run] += 1
                assert t.joinable_gauge() == 1, t.run
                said = describe_run(log, t.run)[1]["joinable"]
                assert said["now"] and said["until"] > time.time(), (t.run, said)
        assert min(joins.values()) >= 5, joins
        # expired
        assert log.begin_offset(checkpoints_topic(lowered)) > 0 and log.begin_offset(checkpoints_topic(ckpts)) > 0
    finally:
        for t in trainers:
            t.close()
    said = [r.getMessage() for r in caplog.records if "the retention guard follows it" in r.getMessage()]
    for topic in (updates_topic(lowered), checkpoints_topic(lowered)):
        assert sum(f"{topic} retention.ms unlimited -> {RETENTION_MS}" in m for m in said) == 1, said
    assert not any(ckpts in m for m in said), said  # set before it started: nothing changed while it ran


@pytest.mark.kafka
def test_retention_bytes_below_one_checkpoint_is_one_line_at_start_and_in_describe(tmp_path, logs, caplog, capsys):
    """retention.bytes on RUN.checkpoints below one checkpoint: Kafka can keep no checkpoint whole. The trainer says so
    in one line at start (not again with each checkpoint), and `hilo topics describe` in one line (was: silent)."""
    caplog.set_level(logging.INFO, "hilo.producer")
    run, log = new_run("nockpt"), logs(KAFKA_URL)
    log.create_topics(run)
    _alter(log, checkpoints_topic(run), {"retention.bytes": 1000})
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=KAFKA_URL, checkpoint_every=2))
    publish_random(producer, 4)  # two more checkpoints
    producer.close()
    said = [r.getMessage() for r in caplog.records if "below one checkpoint" in r.getMessage()]
    assert len(said) == 1 and f"{checkpoints_topic(run)} retention.bytes 1000 is below one checkpoint (" in said[
        0], said
    capsys.readouterr()
    assert main(["topics", "describe", "--log", KAFKA_URL, "--run", run]) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("new sites:")] == \
        [line for line in out.splitlines()
         if "new sites: cannot join: retention.bytes 1000 is below one checkpoint" in line]


def _ten_versions(url: str, run: str) -> dict:
    """v1..v10 with checkpoints v0, v4, v8; {version: digest hex} as the trainer published them."""
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=url, checkpoint_every=4))
    digests = {}
    for _ in range(10):
        publish_random(producer, 1, seed=producer.version)
        digests[producer.version] = producer.replica.digest.hex()
    producer.close()
    return digests


def _consume(url: str, run: str, state_dir, until: int):
    """`hilo consume --until-version UNTIL`: (exit code, stdout, stderr)."""
    p = hilo("consume", "--log", url, "--run", run, "--site", "s", "--state-dir", str(state_dir), "--no-export",
             "--until-version", str(until), "--no-progress", "--wait-checkpoint", "5")
    with reaped(p):
        out, err = p.communicate(timeout=120)
    return p.returncode, out, err


def test_until_version_ends_at_exactly_n_with_newer_checkpoints_on_the_log(tmp_path, log_url):
    """A fresh site told --until-version 5 bootstraps from checkpoint v4 (not v8, the newest) and ends at v5 with
    the trainer's v5 digest; the Python API the same. (Was: bootstrapped from v8 and printed v8, exit 0.)"""
    run = new_run("until")
    digests = _ten_versions(log_url, run)
    rc, out, err = _consume(log_url, run, tmp_path / "cli", 5)
    assert rc == 0 and out.strip() == f"s: v5 digest {digests[5]}", err[-2000:]
    s = open_site(log_url, run, tmp_path, "api", until_version=5, export_adapters=False)
    assert s.follower.replica.version == 4
    assert s.run(progress=False) == 5 and s.follower.replica.digest.hex() == digests[5]


def _files(path) -> dict:
    """{relative path: (bytes, mtime_ns)} of every file under `path`."""
    return {os.path.relpath(os.path.join(d, f), path): (open(os.path.join(d, f), "rb").read(),
                                                        os.stat(os.path.join(d, f)).st_mtime_ns)
            for d, _, fs in os.walk(path) for f in fs}


@pytest.mark.kafka
def test_until_version_refuses_in_one_line_what_it_cannot_end_at(tmp_path):
    """Updates after checkpoint v4 expired: --until-version 5 on a fresh site is one line naming v8, the oldest version
    the log can still give, exit 1, no state dir made; --until-version 9 still works (from v8). A snapshot at v10 told
    --until-version 5: one line, exit 3, the snapshot untouched. The Python API raises the same."""
    run = new_run("untilx")
    _ten_versions(KAFKA_URL, run)

    def expire_before_v8(log):
        log.trim(updates_topic(run), head(log, checkpoints_topic(run), run).updates_offset)
    with_log(KAFKA_URL, expire_before_v8)
    rc, _, err = _consume(KAFKA_URL, run, tmp_path / "fresh", 5)
    assert rc == 1 and "the oldest version this log can still give is v8" in err, err[-2000:]
    assert [line for line in err.splitlines() if "error:" in line] == [line for line in err.splitlines()
                                                                       if "cannot be rebuilt" in line]
    assert not (tmp_path / "fresh").exists()
    with pytest.raises(Expired,
                       match=r"v5 of run .* cannot be rebuilt .*the updates after checkpoint v4 .* have expired.*"
                             r"the oldest version this log can still give is v8"):
        open_site(KAFKA_URL, run, tmp_path, "fresh", until_version=5, export_adapters=False)
    assert not (tmp_path / "fresh").exists()
    assert open_site(KAFKA_URL, run, tmp_path, "past", until_version=9, export_adapters=False).run(progress=False) == 9
    assert open_site(KAFKA_URL, run, tmp_path, "past", until_version=10,
                     export_adapters=False).run(progress=False) == 10
    before = _files(tmp_path / "past")
    rc, _, err = _consume(KAFKA_URL, run, tmp_path / "past", 5)
    assert rc == 3 and "its snapshot in" in err and "is at v10, past --until-version 5" in err, err[-2000:]
    assert [line for line in err.splitlines() if "error:" in line] == [line for line in err.splitlines()
                                                                       if "past --until" in line]
    with pytest.raises(PastVersion, match="is at v10, past --until-version 5"):
        open_site(KAFKA_URL, run, tmp_path, "past", until_version=5, export_adapters=False)
    assert _files(tmp_path / "past") == before
