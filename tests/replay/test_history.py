"""The history checker: each anomaly it exists for is caught, and a real run with restarts passes it."""
import pytest

from hilo.consumer.config import SiteConfig
from hilo.producer.producer import HiLoProducer
from hilo.replay.history import HistoryWriter, check, log_versions, read_history
from tests.conftest import new_run, producer_config, publish_random, small_model
from tests.helpers import site_of

TRAINER = [{"s": "t", "v": 0, "d": "a0", "o": 0, "start": True}] + [{"s": "t", "v": v, "d": f"a{v}", "o": v}
                                                                    for v in range(1, 6)]


def site(entries):
    """Site entries from (session, version, digest) with the first of each session a start."""
    out, seen = [], set()
    for s, v, d in entries:
        out.append({"s": s, "v": v, "d": d, "o": v} | ({} if s in seen else {"start": True}))
        seen.add(s)
    return out


@pytest.mark.parametrize("entries, anomaly", [
    ([("1", 0, "a0"), ("1", 1, "a1"), ("1", 3, "a3")], "v1 then v3 in session 1 (gap)"),
    ([("1", 0, "a0"), ("1", 1, "a1"), ("1", 1, "a1")], "v1 then v1 in session 1 (duplicate)"),
    ([("1", 0, "a0"), ("1", 1, "a1"), ("1", 2, "zz")], "v2 digest zz != trainer's a2 (fork)"),
    ([("1", 3, "a3"), ("1", 4, "a4"), ("2", 6, "a6")], "started at v6, which the trainer never acknowledged"),
])
def test_each_anomaly_is_reported(entries, anomaly):
    report = check(TRAINER, {"s": site(entries)})
    assert not report.ok and any(anomaly in a for a in report.anomalies), report.anomalies


def test_a_restart_that_replays_versions_is_not_an_anomaly_but_a_lost_version_is():
    ok = site([("1", 0, "a0"), ("1", 1, "a1"), ("1", 2, "a2"), ("2", 1, "a1"), ("2", 2, "a2"), ("2", 3, "a3")])
    assert check(TRAINER, {"s": ok}).ok
    lost = check(TRAINER, {"s": ok}, log_versions={v: f"a{v}" for v in range(0, 5)})  # v5 acknowledged, not on the log
    assert lost.anomalies == ["log: acknowledged v5 (a5) is missing on the log"]


def test_a_real_run_with_a_restarted_site_and_trainer_passes(log_url, tmp_path, logs):
    run, folder = new_run("hist"), tmp_path / "h"
    cfg = producer_config(run=run, log=log_url, checkpoint_every=3, history=str(folder / "trainer.jsonl"))
    producer = HiLoProducer.open(small_model(), cfg)
    publish_random(producer, 4)
    first = site_of(SiteConfig(log=log_url, run=run, site="s", state_dir=str(tmp_path / "s"), until_version=4,
                            export_adapters=False, snapshot_every=3, history=str(folder / "s.jsonl")))
    first.run(progress=False)
    producer.close()
    producer = HiLoProducer.open(small_model(), cfg)  # a second trainer session, resumed at v4
    publish_random(producer, 3, seed=1)
    again = site_of(SiteConfig(log=log_url, run=run, site="s", state_dir=str(tmp_path / "s"), until_version=7,
                            export_adapters=False, history=str(folder / "s.jsonl")))
    again.run(progress=False)
    report = check(read_history(str(folder / "trainer.jsonl")), {"s": read_history(str(folder / "s.jsonl"))},
                   log_versions(logs(log_url), run))
    assert report.ok, report.summary()
    # from checkpoint v3, then its snapshot
    assert report.trainer_versions == 8 and report.sites["s"] == {"entries": 4, "sessions": 2, "last_version": 7}
    producer.close()


def test_a_torn_last_line_is_dropped(tmp_path):
    w = HistoryWriter(str(tmp_path / "h.jsonl"))
    w.record(0, bytes(16), 0, start=True)
    w.close()
    with open(tmp_path / "h.jsonl", "a") as f:
        f.write('{"s": "x", "v": 1')  # a SIGKILL mid-write
    assert [e["v"] for e in read_history(str(tmp_path / "h.jsonl"))] == [0]
