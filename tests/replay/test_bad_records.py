"""One bad record must not stop a run: sites and the trainer skip what cannot be a valid message of the run, on
both backends, and stop only when a later version shows the skipped record was needed."""
import json
import os
import struct

import pytest
import torch

from hilo.log import open_log, updates_topic
from hilo.producer.producer import HiLoProducer
from hilo.replay.follower import Follower, bootstrap_from_log
from hilo.schemas.chunks import split
from hilo.schemas.errors import Gap
from hilo.schemas.limits import Limits
from hilo.schemas.records import UpdateMessage
from tests.conftest import new_run, producer_config, publish_random, small_model
from tests.helpers import open_site, wait_until

ADAMW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}


def _update(producer, run=None, fill=b"\x00\x00\x00\x00"):
    """The next update of `producer`'s run (or of `run`), every gradient element the float32 `fill`."""
    r = producer.replica
    return UpdateMessage(run or r.run, r.version + 1, r.digest, b"\x07" * 16, r.manifest.manifest_id, "dense", {},
                         "adamw",
                         ADAMW, [{"i": i, "g": fill * b.numel} for i, b in enumerate(r.manifest.blocks)]).to_bytes()


def _bad_record(kind, producer, run):
    """(records to append, the reason a follower gives) for one kind of bad record claiming the next version."""
    v = producer.version + 1
    if kind == "noise":
        return [(None, os.urandom(300), {})], "foreign"
    if kind == "noise-with-headers":
        return split(os.urandom(300), run, "update", v), "malformed"
    if kind == "another-run":
        return split(_update(producer, run="intruder"), run, "update", v), "other-run"
    if kind == "zstd-bomb":  # a genuine-looking frame whose declared decompressed size is 1 TiB
        data = bytearray(_update(producer))
        data[8:16] = (1 << 40).to_bytes(8, "little")
        return split(bytes(data), run, "update", v), "limit"
    if kind == "absurd-size":
        recs = split(_update(producer), run, "update", v)
        return [(k, val, h | {"hilo-size": str(1 << 61)}) for k, val, h in recs], "limit"
    if kind == "non-finite":  # the right chain, finite gradients whose square overflows Adam's second moment
        return split(_update(producer, fill=struct.pack("<f", 3e38)), run, "update", v), "non-finite"
    raise AssertionError(kind)


def _finite(replica) -> bool:
    return all(bool(torch.isfinite(t).all())
               for t in replica.state.params + [t for ts in replica.state.slots.values() for t in ts])


@pytest.mark.parametrize("kind",
                         ["noise", "noise-with-headers", "another-run", "zstd-bomb", "absurd-size", "non-finite"])
def test_a_bad_record_is_skipped_by_sites_and_the_trainer(log_url, tmp_path, kind, logs):
    run = new_run("bad")
    cfg = producer_config(run=run, log=log_url)
    producer = HiLoProducer.open(small_model(), cfg)
    publish_random(producer, 3)
    live = open_site(log_url, run, tmp_path, "live", export_adapters=False, until_version=3,
                     history=str(tmp_path / "live.jsonl"))
    live.run(progress=False)
    records, reason = _bad_record(kind, producer, run)
    at = logs(log_url).append(updates_topic(run), records)[0]
    publish_random(producer, 2, seed=1)  # the trainer publishes v4, v5 after it
    # a site restarted after the record, and a new one, both skip it and reach the trainer
    live = open_site(log_url, run, tmp_path, "live", until_version=5, history=str(tmp_path / "live.jsonl"))
    live.run(progress=False)
    fresh = open_site(log_url, run, tmp_path, "fresh", export_adapters=False, until_version=5)
    fresh.run(progress=False)
    for s in (live, fresh):
        assert s.follower.replica.digest == producer.replica.digest and dict(s.follower.skips) == {reason: 1}
        assert _finite(s.follower.replica)
    skips = [e for e in map(json.loads, (tmp_path / "live.jsonl").read_text().splitlines()) if "skip" in e]
    assert [(e["skip"], e["reason"]) for e in skips] == [(at, reason)]
    # a trainer restarted after the record resumes past it
    producer.close()
    restarted = HiLoProducer.open(small_model(), cfg)
    assert restarted.replica.digest == live.follower.replica.digest
    publish_random(restarted, 1, seed=2)
    live = open_site(log_url, run, tmp_path, "live", until_version=6)
    live.run(progress=False)
    assert live.follower.replica.digest == restarted.replica.digest and _finite(live.follower.replica)
    for adapter in (tmp_path / "live" / "adapters").iterdir():  # what vLLM would load
        from safetensors.torch import load_file
        assert all(bool(torch.isfinite(t.float()).all())
                   for t in load_file(adapter / "adapter_model.safetensors").values())
    restarted.close()


def visible(log, producer):
    """Wait until a reader's log end covers what the trainer published: Kafka acknowledges a commit before the
    transaction markers that make it readable (read_committed) are written."""
    topic = updates_topic(producer.config.run)
    end = producer.ledger.next_offset
    wait_until(lambda: log.end_offset(topic) >= end, 30, f"{topic} readable up to offset {end}")


def test_a_skip_that_was_wrong_stops_at_the_next_version_naming_the_skipped_record(log_url, tmp_path, logs):
    """A site whose limit is set too low for a genuine version skips it, then stops at the next version with the
    line that names the skipped record."""
    run = new_run("lowlimit")
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=log_url, codec="dense"))
    publish_random(producer, 3)
    log = logs(log_url)
    replica, position = bootstrap_from_log(log, run, max_version=0)
    follower = Follower(log, run, replica, position)
    assert follower.catch_up_all() == 3
    at = log.end_offset(updates_topic(run))
    publish_random(producer, 1, seed=1)
    visible(log, producer)
    limits, replica.limits = replica.limits, Limits(max_decompressed_bytes=1024)  # far below this genuine v4
    assert follower.catch_up_all() == 0 and dict(follower.skips) == {"limit": 1}
    replica.limits = limits  # v5 fits: it shows that v4 was needed
    publish_random(producer, 1, seed=2)
    visible(log, producer)
    with pytest.raises(Gap, match=rf"gap: message is version 5, replica is at 3 .*the record skipped at offset "
                                  rf"{at}.* \(limit: .*was probably the missing version"):
        follower.catch_up_all()
    assert (replica.version, replica.digest, dict(follower.skips)) == (3, follower.replica.digest, {"limit": 1})
    producer.close()


def test_on_bad_record_is_an_enum_that_configs_coerce_from_text():
    """"skip" and "stop" (the CLI's choices, older callers) become OnBadRecord; a bad value names the field."""
    from hilo.consumer.config import SiteConfig
    from hilo.producer.config import ProducerConfig
    from hilo.replay.bad_records import OnBadRecord
    from hilo.schemas.errors import ConfigError
    assert OnBadRecord.of("stop") is OnBadRecord.STOP and OnBadRecord.of(OnBadRecord.SKIP) is OnBadRecord.SKIP
    assert OnBadRecord.SKIP == "skip"  # str-valued: the CLI's text compares equal
    assert ProducerConfig(run="r", on_bad_record="stop").on_bad_record is OnBadRecord.STOP
    site = {"log": "file:///tmp/log", "run": "r", "site": "s", "state_dir": "/tmp/s"}
    assert SiteConfig(**site).on_bad_record is OnBadRecord.SKIP
    assert SiteConfig(**site, on_bad_record="stop").on_bad_record is OnBadRecord.STOP
    with pytest.raises(ConfigError,
                       match=r"^ProducerConfig\.on_bad_record = 'ignore': expected one of \['skip', 'stop'\]"):
        ProducerConfig(run="r", on_bad_record="ignore")
    with pytest.raises(ConfigError, match=r"^SiteConfig\.on_bad_record = 'STOP'"):
        SiteConfig(**site, on_bad_record="STOP")


def test_the_follower_takes_the_enum_its_config_converted(tmp_path, manifest):
    """The string is converted once, where it was configured (SiteConfig, ProducerConfig: OnBadRecord.of)."""
    from hilo.replay.bad_records import OnBadRecord
    from hilo.schemas.position import Position
    from tests.conftest import genesis
    replica = genesis(manifest)
    log = open_log(f"file://{tmp_path}/log")
    log.create_topics(replica.run)
    assert Follower(log, replica.run, replica, Position(0)).on_bad_record is OnBadRecord.SKIP
    assert Follower(log, replica.run, replica, Position(0), OnBadRecord.STOP).on_bad_record is OnBadRecord.STOP
    with pytest.raises(TypeError, match="on_bad_record = 'stop': an OnBadRecord"):
        Follower(log, replica.run, replica, Position(0), "stop")
