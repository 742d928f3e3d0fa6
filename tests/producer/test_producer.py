"""HiLoProducer's own guarantees: propose, then commit; a publish with an unknown outcome never forks or
skips a version; config errors name the field."""
import dataclasses

import pytest
import torch

from hilo.consumer.config import SiteConfig
from hilo.log import open_log
from hilo.log.base import Transaction
from hilo.producer.config import ProducerConfig
from hilo.producer.lora_params import lora_weights
from hilo.producer import trainer_open
from hilo.producer.producer import HiLoProducer
from hilo.replica.state import ReplicaState
from hilo.schemas.errors import HiloError, LogError
from tests.conftest import new_run, producer_config, publish_random, small_model
from tests.helpers import site_of, with_log


class FlakyLog:
    """The real file log, except that while `down` is set every call touching the updates topic raises.

    stored_then_down: the next append is stored, then the log goes down before the ack reaches the trainer
    (the broker has the message; the trainer cannot tell).
    """

    def __init__(self, log):
        self.log, self.down, self.stored_then_down = log, False, False

    def _check(self, topic):
        if self.down and topic.endswith(".updates"):
            raise LogError("simulated outage: connection refused")

    def append(self, topic, records, partition=0):
        self._check(topic)
        if self.stored_then_down and topic.endswith(".updates"):
            self.log.append(topic, records, partition)
            self.stored_then_down, self.down = False, True
            raise LogError("simulated outage: ack lost")
        return self.log.append(topic, records, partition)

    def transaction(self):
        return Transaction(self)  # appends go through this wrapper's append

    def read(self, topic, *a, **kw):
        self._check(topic)
        return self.log.read(topic, *a, **kw)

    def end_offset(self, topic, partition=0):
        self._check(topic)
        return self.log.end_offset(topic, partition)

    def begin_offset(self, topic):
        self._check(topic)
        return self.log.begin_offset(topic)

    def __getattr__(self, name):
        return getattr(self.log, name)


def _grads(version, salt=0):
    """The gradients of one step (seeded by version): the same on the faulty run and on the reference."""
    return torch.Generator().manual_seed(1000 * salt + version)


def _step(producer, gen):
    for p in producer.params:
        p.grad = torch.randn(p.shape, generator=gen) * 0.01
    return producer.step(lr=1e-3)


def _reference(tmp_path, gens):
    """A producer that saw no fault, fed `gens` in order: the digest the faulty run must reach."""
    ref = HiLoProducer.open(small_model(), producer_config(run="ref", log=f"file://{tmp_path}/ref"))
    for g in gens:
        _step(ref, g)
    return ref.replica.digest


def _site_digest(url, run, tmp_path, version):
    s = site_of(SiteConfig(log=url, run=run, site="s", state_dir=str(tmp_path / "s"), until_version=version,
                           export_adapters=False))
    s.run(progress=False)
    return s.follower.replica.digest


def _at_v2(tmp_path):
    """(url, flaky log, producer) after two clean versions."""
    url = f"file://{tmp_path}/log"
    log = FlakyLog(open_log(url))
    producer = HiLoProducer.open(small_model(), producer_config(run="r", log=url, publish_deadline_s=1),
                                 log_backend=log)
    for v in (1, 2):
        _step(producer, _grads(v))
    return url, log, producer


def test_log_down_during_step_leaves_the_trainer_uncommitted_and_the_run_continues_without_a_gap(tmp_path):
    """Bug A: publish and head() both fail; the old code kept the unpublished version and published v+2 next."""
    url, log, producer = _at_v2(tmp_path)
    digest = producer.replica.digest
    log.down = True
    with pytest.raises(LogError, match="connection refused"):
        _step(producer, _grads(3))
    assert (producer.version, producer.replica.digest) == (2, digest)
    assert producer.params[0].grad is not None  # the caller's gradients are still there to retry with
    with pytest.raises(LogError, match="connection refused"):  # still down: the resync fails too, nothing moves
        _step(producer, _grads(3))
    assert producer.version == 2
    log.down = False
    assert _step(producer, _grads(3, salt=1)) == 3 and _step(producer, _grads(4)) == 4
    assert _site_digest(url, "r", tmp_path, 4) == producer.replica.digest
    assert producer.replica.digest == _reference(tmp_path, [_grads(1), _grads(2), _grads(3, salt=1), _grads(4)])


def test_publish_stored_but_unacknowledged_is_adopted_from_the_log_with_its_error_feedback(tmp_path):
    """The log has v3 though the trainer saw an error: the next step resyncs to v3 (and its residual), then v4."""
    url, log, producer = _at_v2(tmp_path)
    log.stored_then_down = True
    with pytest.raises(LogError, match="ack lost"):
        _step(producer, _grads(3))
    assert producer.version == 2 and producer.in_doubt is not None
    log.down = False
    assert _step(producer, _grads(4)) == 4  # resynced to the log's v3 first, never published a second v3
    assert _site_digest(url, "r", tmp_path, 4) == producer.replica.digest
    # Equal to a run that never failed: v3's spar residual was adopted, not lost (spar is lossy).
    assert producer.replica.digest == _reference(tmp_path, [_grads(1), _grads(2), _grads(3), _grads(4)])


def test_failed_publish_that_the_log_does_not_hold_changes_nothing(tmp_path):
    url = f"file://{tmp_path}/log"
    log = FlakyLog(open_log(url))
    producer = HiLoProducer.open(small_model(), producer_config(run="r", log=url, publish_deadline_s=1),
                                 log_backend=log)
    publish_random(producer, 2)
    digest, residual = producer.replica.digest, [e.clone() for e in producer.builder.encoder.residual]
    log.append = lambda topic, records, partition=0: (_ for _ in ()).throw(LogError("simulated: broker refused"))
    with pytest.raises(LogError, match="broker refused"):
        publish_random(producer, 1, seed=9)
    assert (producer.version, producer.replica.digest, producer.in_doubt) == (2, digest, None)
    assert all(torch.equal(a, b) for a, b in zip(residual, producer.builder.encoder.residual))
    del log.append
    publish_random(producer, 2, seed=10)
    assert _site_digest(url, "r", tmp_path, 4) == producer.replica.digest


def test_propose_mutates_nothing(tmp_path):
    producer = HiLoProducer.open(small_model(),
                                 producer_config(run="r", log=f"file://{tmp_path}/log", codec="powersgd"))
    publish_random(producer, 1)
    b = producer.builder
    before = (b.replica.digest, [e.clone() for e in b.encoder.residual], [q.clone() for q in b.encoder.q],
              b.encoder.cursor)
    proposal = b.propose([torch.randn(p.shape) for p in producer.params], {"lr": 1e-3})
    assert proposal.version == 2 and proposal.message.digest != before[0]
    assert b.replica.digest == before[0] and b.replica.version == 1
    assert all(torch.equal(x, y) for x, y in zip(before[1], b.encoder.residual))
    assert all(torch.equal(x, y) for x, y in zip(before[2], b.encoder.q)) and b.encoder.cursor == before[3]
    b.commit(proposal)
    assert b.replica.digest == proposal.message.digest and b.encoder.residual is proposal.encoding.state["residual"]


@pytest.mark.parametrize("field,value,match", [
    ("run", "a/b", "ProducerConfig.run"), ("codec", "gzip", "ProducerConfig.codec"),
    ("optimizer", "adam", "ProducerConfig.optimizer"), ("checkpoint_every", 0, "ProducerConfig.checkpoint_every"),
    ("chunk_bytes", 100, "ProducerConfig.chunk_bytes"),
    ("hparams", {"lr": -1.0}, r"hparams\['lr'\] = -1.0 is outside"),
])
def test_config_errors_name_the_field(field, value, match):
    with pytest.raises(HiloError, match=match):
        ProducerConfig(**{"run": "r", field: value})


def test_a_budget_with_no_room_for_payload_is_refused(tmp_path):
    from hilo.replica.codecs import Budget
    with pytest.raises(HiloError, match=r"ProducerConfig.budget: 524 bytes per message for this 32768-byte adapter "
                                        r"leave -502 bytes"):
        HiLoProducer.open(small_model(), ProducerConfig(run="r", log=f"file://{tmp_path}/log", budget=Budget(0.016)))


def _run(tmp_path, name, plan, codec, state=True):
    """Publish versions per `plan` (a list of step counts; a trainer restart between entries); returns the digest."""
    cfg = producer_config(run=name, log=f"file://{tmp_path}/{name}", codec=codec, checkpoint_every=100,
                          state_dir=str(tmp_path / f"{name}-trainer") if state else None)
    for steps in plan:
        producer = HiLoProducer.open(small_model(), cfg)
        for _ in range(steps):
            _step(producer, _grads(producer.version + 1))
        producer.close()
    return producer.replica.digest


@pytest.mark.parametrize("codec", ["spar", "powersgd"])
def test_a_restarted_trainer_continues_the_same_trajectory_from_its_snapshot(tmp_path, codec):
    """The error-feedback residual (and PowerSGD's Q) live in the trainer's snapshot: a restart changes nothing."""
    uninterrupted = _run(tmp_path, "a", [6], codec)
    assert _run(tmp_path, "b", [3, 3], codec) == uninterrupted
    assert _run(tmp_path, "c", [3, 3], codec, state=False) != uninterrupted  # without it the trajectory differs


@pytest.mark.parametrize("old", [1, 2])
@pytest.mark.parametrize("state", [True, False], ids=["snapshot", "checkpoint"])
def test_a_run_started_with_an_older_digest_version_is_continued_by_this_build(tmp_path, monkeypatch, state, old):
    """A run whose manifest says an older digest version (1: no digest_version field, started before version 2; or 2)
    keeps its digests: this build's trainer, whose model gives the newest version to new runs, resumes it (from its
    snapshot or the log), publishes under the run's manifest, and a site that follows the whole log reaches the
    trainer's digest."""
    url = f"file://{tmp_path}/log"
    cfg = producer_config(run="old", log=url, checkpoint_every=100, state_dir=str(tmp_path / "t") if state else None)
    manifest = lora_weights(small_model())[0]
    with monkeypatch.context() as older_build:  # the trainer of an older build: its manifests had that digest_version
        older_build.setattr(trainer_open, "lora_weights", lambda model, adapter: (
            dataclasses.replace(lora_weights(model, adapter)[0], digest_version=old), lora_weights(model, adapter)[1]))
        first = HiLoProducer.open(small_model(), cfg)
    assert first.replica.manifest.digest_version == old
    for v in (1, 2):
        _step(first, _grads(v))
    first.close()
    second = HiLoProducer.open(small_model(), cfg)  # its own manifest says the newest version
    assert second.version == 2 and second.replica.manifest.digest_version == old
    for v in (3, 4):
        _step(second, _grads(v))
    second.close()
    assert _site_digest(url, "old", tmp_path, 4) == second.replica.digest
    new = ReplicaState(manifest, *[getattr(second.replica.state, f)
                                   for f in ("optimizer", "version", "params", "slots", "scalars")])
    assert new.digest() != second.replica.digest  # the run's definition, not this build's new-run one


FENCED = {"file": r"run {run}: this trainer \(token 1\) was fenced by a newer trainer \(pid \d+ on .*, token 2\) that "
                  r"took over at v3; it publishes nothing more",
          "kafka": r"run {run}: this trainer \(writer since v0\) was fenced: a newer producer of transactional id "
                   r"hilo.{run} \(another trainer of this run\) took over; it publishes nothing more"}


def test_a_second_trainer_fences_the_first(log_url, tmp_path):
    """The zombie: trainer A paused, B started on the same run, A resumes. A is refused in one line, publishes
    nothing more; sites never stop and end at B's digest. (The file log: a fencing token; Kafka: B's
    transactional producer bumps the epoch of transactional id hilo.RUN.)"""
    from hilo.schemas.errors import FencedError
    run = new_run("fence")
    a = HiLoProducer.open(small_model(), producer_config(run=run, log=log_url))
    publish_random(a, 3)
    b = HiLoProducer.open(small_model(), producer_config(run=run, log=log_url))  # takes over at v3
    publish_random(b, 2, seed=1)
    for _ in range(2):  # refused, and stays refused
        with pytest.raises(FencedError, match=FENCED[log_url.split(":")[0]].format(run=run)):
            publish_random(a, 1, seed=2)
    assert a.version == 3 and _site_digest(log_url, run, tmp_path, 5) == b.replica.digest
    # Read after the site got v5 (so every commit marker is written): B's five versions, nothing from A.
    records = with_log(log_url, lambda log: log.read(f"{run}.updates", 0, timeout_s=5.0))
    assert [r.parsed.version for r in records] == [1, 2, 3, 4, 5]
    a.close()
    b.close()


@pytest.mark.parametrize("other", ["model", "optimizer"])
def test_a_trainer_that_would_be_refused_fences_nobody(log_url, tmp_path, other):
    """A second trainer started by mistake for a running run, with another model or optimizer: refused in one line,
    and the running trainer goes on publishing. (It used to take the run's transactional id first, fencing the
    running trainer, and only then be refused: the run was left with no trainer.)"""
    from hilo.schemas.errors import HiloError
    run = new_run("refused")
    a = HiLoProducer.open(small_model(), producer_config(run=run, log=log_url))
    publish_random(a, 2)
    model, kw = (small_model(hidden=32), {}) if other == "model" else (small_model(), {"optimizer": "sgd"})
    with pytest.raises(HiloError, match=f"run {run}") as refused:
        HiLoProducer.open(model, producer_config(run=run, log=log_url, **kw))
    assert "\n" not in str(refused.value)
    publish_random(a, 2, seed=1)  # not fenced
    assert a.version == 4 and not a.fenced and _site_digest(log_url, run, tmp_path, 4) == a.replica.digest
    a.close()


def test_a_step_waits_out_an_outage_shorter_than_its_deadline(tmp_path):
    """The log goes away mid-step and comes back before publish_deadline_s: the step returns the next version, the
    outage is said once and counted, and the run has no gap. (A step used to give up after six tries, about a minute
    on Kafka, ending the trainer on a broker restart.)"""
    import threading
    from tests.helpers import wait_until
    url = f"file://{tmp_path}/log"
    log = FlakyLog(open_log(url))
    producer = HiLoProducer.open(small_model(), producer_config(run="r", log=url, publish_deadline_s=120),
                                 log_backend=log)
    _step(producer, _grads(1))
    log.down = True

    def back_when_noticed():  # the log returns once the trainer has said it is gone
        wait_until(lambda: producer.outage.down, 60, "the trainer notices the outage")
        log.down = False
    t = threading.Thread(target=back_when_noticed)
    t.start()
    assert _step(producer, _grads(2)) == 2
    t.join()
    reg = producer.metrics.registry
    assert not producer.outage.down and reg.get_sample_value("hilo_trainer_log_outages_total", {"run": "r"}) == 1
    assert reg.get_sample_value("hilo_trainer_log_unavailable", {"run": "r"}) == 0
    assert _site_digest(url, "r", tmp_path, 2) == producer.replica.digest


def test_past_its_deadline_a_step_says_so_in_one_line_and_changes_nothing(tmp_path):
    url, log, producer = _at_v2(tmp_path)  # publish_deadline_s = 1
    log.down = True
    with pytest.raises(LogError, match=r"run r: v3 was not published within publish_deadline_s = 1s .*the trainer "
                                       r"stays at v2") as e:
        _step(producer, _grads(3))
    assert "\n" not in str(e.value) and producer.version == 2
