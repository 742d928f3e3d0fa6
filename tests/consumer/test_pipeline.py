"""Producer -> log -> sites, on both backends: digests, chunking, bootstrap, restarts, bad input, lag."""
import json
import logging
import re

import pytest
import torch

from hilo.consumer.config import SiteConfig
from hilo.consumer.site import Site
from hilo.log import checkpoints_topic, updates_topic
from hilo.ops.lag import lag_rows
from hilo.producer.producer import HiLoProducer
from hilo.replay.history import read_history
from hilo.schemas.chunks import split
from hilo.schemas.errors import ChainError, ConfigError, DivergenceError, LogError, MalformedMessage
from hilo.schemas.records import UpdateMessage
from tests.conftest import KAFKA_URL, new_run, producer_config, publish_random, small_model
from tests.helpers import open_site


def site(log_url, run, tmp_path, name="s1", **kw):
    return open_site(log_url, run, tmp_path, name, **kw)


def test_site_matches_trainer_and_exports_a_loadable_adapter(log_url, tmp_path):
    from peft import PeftModel

    from hilo.producer.lora_params import lora_parameters
    from hilo.ops.tiny_trainer import build_base
    run = new_run()
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=log_url))
    publish_random(producer, 12)
    s = site(log_url, run, tmp_path, until_version=9, snapshot_every=4)
    assert s.run(progress=False) == 9
    adapters = tmp_path / "s1" / "adapters"
    assert sorted(p.name for p in adapters.iterdir()) == ["v00000009"]  # caught up: the newest only, no backlog
    for v in (10, 11, 12):  # a site that follows version by version keeps the newest keep_adapters=3
        s = site(log_url, run, tmp_path, until_version=v, snapshot_every=4)
        assert s.run(progress=False) == v
    assert s.follower.replica.digest == producer.replica.digest
    # The exported directory is a PEFT adapter holding exactly the replica's params (bf16).
    out = tmp_path / "s1" / "adapters" / "v00000012"
    model = PeftModel.from_pretrained(build_base(seed=0, hidden=64, layers=2), str(out))
    _, params = lora_parameters(model)
    for p, ref in zip(params, producer.replica.state.params):
        assert torch.equal(p.detach().to(torch.bfloat16), ref.to(torch.bfloat16))
    assert sorted(p.name for p in adapters.iterdir()) == ["v00000010", "v00000011", "v00000012"]
    producer.close()


def test_large_messages_are_chunked_and_reassembled(log_url, tmp_path):
    run = new_run()
    producer = HiLoProducer.open(small_model(hidden=256, layers=4, rank=32),
                                 producer_config(run=run, log=log_url, codec="dense"))
    publish_random(producer, 3)
    assert producer.last_step["bytes"] > 1 << 20 and producer.last_step["chunks"] >= 2
    s = site(log_url, run, tmp_path, until_version=3, export_adapters=False)
    s.run(progress=False)
    assert s.follower.replica.digest == producer.replica.digest
    producer.close()


def test_trainer_dead_mid_chunk_sequence_then_restarted(log_url, tmp_path, logs):
    run = new_run()
    cfg = producer_config(run=run, log=log_url, codec="dense", chunk_bytes=64 << 10)
    producer = HiLoProducer.open(small_model(), cfg)
    publish_random(producer, 3)
    # A trainer that died after sending 2 of the 5 chunks of its v4.
    log = logs(log_url)
    doomed = split(b"\x01" * (150 << 10), run, "update", 4, 64 << 10)  # 3 chunks, under the adapter's update bound
    log.append(updates_topic(run), doomed[:2])
    producer.close()
    restarted = HiLoProducer.open(small_model(), cfg)
    assert restarted.version == 3
    publish_random(restarted, 3, seed=1)
    s = site(log_url, run, tmp_path, until_version=6, export_adapters=False)
    s.run(progress=False)
    assert s.follower.replica.digest == restarted.replica.digest
    assert s.follower.reassembler.discarded == 1
    restarted.close()


def test_late_site_bootstraps_from_newest_checkpoint(log_url, tmp_path):
    run = new_run()
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=log_url, checkpoint_every=10))
    publish_random(producer, 55)
    s = site(log_url, run, tmp_path, until_version=55, export_adapters=False)
    assert s.follower.replica.version == 50  # did not replay from genesis
    s.run(progress=False)
    assert s.follower.replica.digest == producer.replica.digest
    # --from-version ignores the snapshot and replays from the newest checkpoint at or before it.
    again = site(log_url, run, tmp_path, until_version=55, export_adapters=False, from_version=47)
    assert again.follower.replica.version == 40
    again.run(progress=False)
    assert again.follower.replica.digest == producer.replica.digest
    producer.close()


def test_restarted_trainer_resumes_at_head_and_refuses_another_model(log_url, tmp_path):
    run = new_run()
    cfg = producer_config(run=run, log=log_url, checkpoint_every=4)
    producer = HiLoProducer.open(small_model(), cfg)
    publish_random(producer, 6)
    head = producer.replica.digest
    producer.close()
    model = small_model()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # whatever the trainer process holds, the log's state wins
    again = HiLoProducer.open(model, cfg)
    assert again.version == 6 and again.replica.digest == head
    assert all(torch.equal(p.detach(), r) for p, r in zip(again.params, again.replica.state.params))
    with pytest.raises(LogError, match="does not match the run's manifest .*rank 4"):
        HiLoProducer.open(small_model(rank=4), cfg)
    again.close()


def _forge(producer, version=None, parent=None, run=None):
    r = producer.replica
    return UpdateMessage(run or r.run, version or r.version + 1, parent or r.digest, b"\x07" * 16,
                         r.manifest.manifest_id,
                         "dense", {}, "adamw",
                         {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0},
                         [{"i": i, "g": bytes(4 * b.numel)} for i, b in enumerate(r.manifest.blocks)]).to_bytes()


@pytest.mark.parametrize("stray", ["foreign", "other-run"])
def test_stray_records_are_skipped_loudly_and_the_run_goes_on(log_url, tmp_path, caplog, stray, logs):
    """A record that is not this run's cannot move the policy: sites and a restarting trainer skip it with a warning."""
    run = new_run()
    cfg = producer_config(run=run, log=log_url)
    producer = HiLoProducer.open(small_model(), cfg)
    publish_random(producer, 4)
    log = logs(log_url)
    if stray == "foreign":
        at = log.append(updates_topic(run), [(None, b"hello", {"source": "someone else"})])[0]
    else:
        at = log.append(updates_topic(run), split(_forge(producer, run="intruder"), "intruder", "update", 5))[0]
    producer.close()
    # was: "resumed at v4 but the log head is ..." and no way to resume
    restarted = HiLoProducer.open(small_model(), cfg)
    assert restarted.version == 4
    publish_random(restarted, 2, seed=3)
    s = site(log_url, run, tmp_path, export_adapters=False, until_version=6, history=str(tmp_path / "s1.jsonl"))
    s.run(progress=False)
    assert s.follower.replica.digest == restarted.replica.digest and s.follower.foreign == 1
    assert [(e["skip"], e["reason"]) for e in read_history(str(tmp_path / "s1.jsonl"))
            if "skip" in e] == [(at, "foreign")]
    assert s.metrics.registry.get_sample_value("hilo_site_records_refused_total",
                                               {"run": run, "site": "s1", "reason": "foreign"}) == 1
    assert any(r.levelno == logging.WARNING for r in caplog.records)  # loudly: a warning (its words are the operator's)
    restarted.close()


def test_a_restarting_trainer_skips_a_replayed_old_version_and_stops_on_a_fork(log_url, tmp_path, logs):
    run = new_run()
    cfg = producer_config(run=run, log=log_url)
    producer = HiLoProducer.open(small_model(), cfg)
    publish_random(producer, 3)
    log = logs(log_url)
    first = log.read(updates_topic(run), 0, timeout_s=5)[0]  # v1, replayed (a retrying client, a mirror, an operator)
    log.append(updates_topic(run), [(first.key, first.value, first.headers)])
    producer.close()
    again = HiLoProducer.open(small_model(), cfg)
    assert again.version == 3
    publish_random(again, 1, seed=4)
    again.close()
    log.append(updates_topic(run), split(_forge(again, version=3, parent=bytes(16)), run, "update", 3))  # another v3
    with pytest.raises(ChainError, match=r"fork at version 3"):
        HiLoProducer.open(small_model(), cfg)


@pytest.mark.parametrize("bad,error", [
    ("gap", r"offset {at} \(v6\): gap: message is version 6, replica is at 4"),
    ("fork", r"offset {at} \(v5\): fork: version 5 starts from 0{{32}}"),
    ("divergent", r"offset {at} \(v5\): version 5 produced digest [0-9a-f]{{32}}, message promises (07){{16}}"),
])
def test_bad_records_stop_the_site_at_the_last_good_version(log_url, tmp_path, bad, error, logs):
    run = new_run()
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=log_url))
    publish_random(producer, 4)
    log = logs(log_url)
    t = updates_topic(run)
    if bad == "gap":
        at = log.append(t, split(_forge(producer, version=6), run, "update", 6))[0]
    elif bad == "fork":
        at = log.append(t, split(_forge(producer, parent=bytes(16)), run, "update", 5))[0]
    else:  # the right chain, but applying it does not give the digest it promises
        at = log.append(t, split(_forge(producer), run, "update", 5))[0]
    s = site(log_url, run, tmp_path, export_adapters=False, idle_exit_s=30)
    with pytest.raises((ChainError, DivergenceError), match=error.format(at=at)):
        s.run(progress=False)
    # untouched in memory
    assert (s.follower.replica.version, s.follower.replica.digest) == (4, producer.replica.digest)
    pos = json.loads((tmp_path / "s1" / "snapshot" / "position.json").read_text())
    # resumes just past v4 (Kafka: before or after v4's transaction marker), never past the bad record
    assert pos["version"] == 4 and pos["digest"] == producer.replica.digest.hex()
    assert producer.ledger.next_offset <= pos["next_offset"] <= at
    producer.close()


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(log_url, tmp_path, caplog, logs):
    run = new_run()
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=log_url, checkpoint_every=3))
    publish_random(producer, 4)
    log = logs(log_url)
    good = producer.replica.checkpoint().to_bytes()
    bad = good[:-40] + bytes(40)  # whole record, valid chunk headers, damaged zstd frame
    extra = {"hilo-updates-offset": str(producer.ledger.next_offset)}
    at = log.append(checkpoints_topic(run), split(bad, run, "checkpoint", 4, extra=extra))[0]
    s = site(log_url, run, tmp_path, until_version=4, export_adapters=False)
    assert s.follower.replica.version == 3  # the v3 checkpoint before the corrupt v4 one
    assert re.search(rf"{run}.checkpoints offset {at} \(checkpoint v4\).*falling back to the previous checkpoint",
                     caplog.text)
    s.run(progress=False)
    assert s.follower.replica.digest == producer.replica.digest
    producer.close()


def test_only_corrupt_checkpoints_is_a_named_error(log_url, tmp_path, logs):
    run = new_run()
    log = logs(log_url)
    log.create_topics(run)
    producer_model = small_model()
    from hilo.producer.lora_params import lora_parameters
    from hilo.replica.replica import PolicyReplica
    manifest, params = lora_parameters(producer_model)
    data = PolicyReplica.genesis(run, manifest, [p.detach() for p in params], "adamw").checkpoint().to_bytes()
    log.append(checkpoints_topic(run),
               split(data[:-40] + bytes(40), run, "checkpoint", 0, extra={"hilo-updates-offset": "0"}))
    with pytest.raises(MalformedMessage, match=rf"{run}.checkpoints offset 0 \(checkpoint v0\)"):
        site(log_url, run, tmp_path)


def test_missing_checkpoint_is_a_clear_error(log_url, tmp_path, logs):
    run = new_run()
    logs(log_url).create_topics(run)
    with pytest.raises(LogError, match=f"no checkpoint on {run}.checkpoints"):
        site(log_url, run, tmp_path, wait_checkpoint_s=0.5)


def test_lag_reports_the_known_state(log_url, tmp_path, logs):
    run = new_run()
    history = tmp_path / "trainer.jsonl"
    producer = HiLoProducer.open(small_model(),
                                 producer_config(run=run, log=log_url, codec="topk", history=str(history)))
    sizes = publish_random(producer, 10)
    # each version's last offset (one record per message here)
    last = {e["v"]: e["o"] for e in read_history(str(history))}
    for name, v in (("a", 4), ("b", 7)):
        site(log_url, run, tmp_path, name=name, until_version=v, export_adapters=False).run(progress=False)
    rows = {r["site"]: r for r in lag_rows(logs(log_url), run, now=0)}
    assert set(rows) == {"a", "b"}
    for name, v in (("a", 4), ("b", 7)):
        r = rows[name]
        assert (r["applied_version"], r["head_version"], r["lag"]) == (v, 10, 10 - v)
        assert r["lag_bytes"] == sum(sizes[v:])
        # just past v's record (on Kafka, before or after its transaction's marker), at most at v+1's
        assert last[v] + 1 <= r["current_offset"] <= last[v + 1] and r["log_end_offset"] == producer.log.end_offset(
            f"{run}.updates")
    producer.close()


@pytest.mark.kafka
def test_kafka_honours_a_chunk_size_above_the_broker_default(tmp_path):
    """Bug B: chunk_bytes reached neither the producer nor the topics; a 6 MiB record failed with a raw traceback."""
    run = new_run()
    cfg = producer_config(run=run, log=KAFKA_URL, codec="dense", chunk_bytes=8 << 20)
    producer = HiLoProducer.open(small_model(hidden=256, layers=4, rank=128), cfg)
    publish_random(producer, 2)
    assert producer.last_step["chunks"] == 1 and producer.last_step["bytes"] > 5 << 20  # one record over 4 MiB
    s = site(KAFKA_URL, run, tmp_path, until_version=2, export_adapters=False)  # a reader that was told nothing
    s.run(progress=False)
    assert s.follower.replica.digest == producer.replica.digest
    producer.close()


@pytest.mark.kafka
def test_kafka_refuses_a_chunk_size_the_topic_cannot_take(logs):
    run = new_run()
    log = logs(KAFKA_URL)
    for t in (updates_topic(run), f"{run}.checkpoints"):  # made by an operator with Kafka's default record limit
        log.admin.create_topics({t: {"num_partitions": 1, "replication_factor": 1,
                                     "configs": {"max.message.bytes": str(1 << 20)}}})
    with pytest.raises(LogError,
                       match=rf"topic '{run}.updates' takes records of at most 1048576 bytes \(max.message.bytes\), "
                             r"chunk_bytes 2097152 needs 2162688; lower chunk_bytes"):
        HiLoProducer.open(small_model(), producer_config(run=run, log=KAFKA_URL, chunk_bytes=2 << 20))
    log.close()


class FailingCommits:
    """The real log, except that group commits fail while `fail` is set (a coordinator moving, a broker down)."""

    def __init__(self, log):
        self.log, self.fail = log, True

    def commit(self, *a, **kw):
        if self.fail:
            raise LogError("simulated: NotCoordinatorError")
        return self.log.commit(*a, **kw)

    def __getattr__(self, name):
        return getattr(self.log, name)


def test_a_failing_group_commit_never_stops_a_site(log_url, tmp_path, caplog, logs):
    """The snapshot is the site's truth; the group commit is advisory (was: the site exited with the commit's error)."""
    run = new_run()
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=log_url))
    publish_random(producer, 5)
    log = FailingCommits(logs(log_url))
    s = Site.open(SiteConfig(log=log_url, run=run, site="s1", state_dir=str(tmp_path / "s1"), until_version=5,
                             export_adapters=False),
             log_backend=log)
    assert s.run(progress=False) == 5 and s.follower.replica.digest == producer.replica.digest
    said = [r for r in caplog.records if r.name == "hilo.consumer.group_commit" and r.levelno == logging.WARNING]
    assert len(said) == 1  # reported once, not per version
    assert lag_rows(logs(log_url), run) == []  # nothing committed while it failed
    log.fail = False
    publish_random(producer, 1, seed=2)
    s = Site.open(SiteConfig(log=log_url, run=run, site="s1", state_dir=str(tmp_path / "s1"), until_version=6,
                             export_adapters=False),
             log_backend=log)
    s.run(progress=False)
    assert [r["applied_version"] for r in lag_rows(logs(log_url), run)] == [6]
    producer.close()


def test_a_state_dir_of_another_run_is_named_as_such(log_url, tmp_path):
    first, second = new_run(), new_run()
    for run in (first, second):
        producer = HiLoProducer.open(small_model(), producer_config(run=run, log=log_url))
        publish_random(producer, 1)
        producer.close()
    site(log_url, first, tmp_path, name="shared", export_adapters=False, until_version=1).run(progress=False)
    with pytest.raises(ConfigError, match=rf"holds a snapshot of run '{first}', not of run '{second}'"):
        site(log_url, second, tmp_path, name="shared", export_adapters=False)


def test_sites_on_either_apply_path_reach_the_trainers_digest(tmp_path):
    run, url = new_run(), f"file://{tmp_path}/log"
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=url))
    publish_random(producer, 5)
    for mode in ("kernel", "reference", "kernel-only"):
        s = site(url, run, tmp_path, name=f"s-{mode}", until_version=5, export_adapters=False, apply=mode)
        assert s.follower.replica.apply_mode == mode
        assert s.run(progress=False) == 5
        assert s.follower.replica.digest == producer.replica.digest
    producer.close()
    with pytest.raises(ConfigError, match=r"SiteConfig.apply = 'fast'"):
        SiteConfig(log=url, run=run, site="x", state_dir=str(tmp_path / "x"), apply="fast")


def test_kernel_only_refuses_a_run_whose_optimizer_has_no_kernel(tmp_path):
    run, url = new_run(), f"file://{tmp_path}/log"
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=url, optimizer="muon"))
    publish_random(producer, 1)
    producer.close()
    with pytest.raises(ConfigError, match="kernel-only.*muon"):
        site(url, run, tmp_path, export_adapters=False, apply="kernel-only")
