"""ProducerConfig.pipeline: step() returns once the version is applied and its publish is under way; the next
step() settles it (producer/inflight.py). Real file log; a FlakyLog wrapper makes the publish fail on cue."""
import pytest
import torch

from hilo.log import open_log, updates_topic
from hilo.producer.producer import HiLoProducer
from hilo.replay.history import check, log_versions, read_history
from hilo.schemas.errors import ConfigError, LogError, NotPublished
from tests.conftest import producer_config, small_model
from tests.producer.test_producer import FlakyLog, _grads, _reference, _site_digest, _step


def _open(url, tmp_path, log=None):
    """A pipelined trainer on `url` (publish_deadline_s = 1), recording its history, with its own snapshot."""
    cfg = producer_config(run="r", log=url, publish_deadline_s=1, pipeline=True,
                          history=str(tmp_path / "trainer.jsonl"), state_dir=str(tmp_path / "t"))
    return HiLoProducer.open(small_model(), cfg, log_backend=log)


def _model_holds_the_replica(producer) -> bool:
    return all(torch.equal(p.detach().float(), q) for p, q in zip(producer.params, producer.replica.state.params))


def _each_version_once(url, n: int) -> dict:
    """The log holds v1..vn, one single-record message each (nothing twice, nothing out of order): {version: digest}."""
    log = open_log(url)
    try:
        topic, versions = updates_topic("r"), log_versions(log, "r")
        assert sorted(versions) == list(range(1, n + 1))
        assert log.end_offset(topic) - log.begin_offset(topic) == n
        return versions
    finally:
        log.close()


def test_a_pipelined_run_is_the_in_line_run_and_a_site_reaches_its_digest(tmp_path):
    url = f"file://{tmp_path}/log"
    producer = _open(url, tmp_path)
    for v in (1, 2, 3, 4):
        assert _step(producer, _grads(v)) == v
        inflight = producer.commits.pipeline.inflight  # the version whose publish runs on its thread
        assert inflight is not None and inflight.proposal.version == v  # returned with v in flight
        assert producer.version == v and _model_holds_the_replica(producer)
    assert producer.last_step["version"] == 3 and producer.last_step["chunks"] == 1  # the last one settled
    assert producer.flush() == 0 and producer.commits.pipeline.inflight is None and producer.last_step["version"] == 4
    producer.close()
    assert producer.replica.digest == _reference(tmp_path, [_grads(v) for v in (1, 2, 3, 4)])
    assert _site_digest(url, "r", tmp_path, 4) == producer.replica.digest
    _each_version_once(url, 4)


def _at_v2(tmp_path) -> tuple:
    """(url, its FlakyLog, a pipelined producer on it that published v1 and v2, settled)."""
    url = f"file://{tmp_path}/log"
    log = FlakyLog(open_log(url))
    producer = _open(url, tmp_path, log)
    for v in (1, 2):
        _step(producer, _grads(v))
    producer.flush()
    return url, log, producer


def test_a_publish_that_fails_while_the_next_step_computes_is_raised_there_and_a_restart_has_every_version_once(
    tmp_path):
    url, log, producer = _at_v2(tmp_path)
    digest, residual = producer.replica.digest, [e.clone() for e in producer.builder.encoder.residual]
    log.append = lambda topic, records, partition=0: (_ for _ in ()).throw(LogError("simulated: broker refused"))
    assert _step(producer, _grads(3)) == 3  # applied locally; its publish fails on its thread
    assert producer.version == 3 and producer.replica.digest != digest
    with pytest.raises(NotPublished, match=r"run r: v3 was not published .*it is not on the log.*broker refused"):
        _step(producer, _grads(4))  # v4 was computed from v3; neither is published
    assert (producer.version, producer.replica.digest, producer.in_doubt) == (2, digest, None)
    assert all(torch.equal(a, b) for a, b in zip(residual, producer.builder.encoder.residual))
    assert _model_holds_the_replica(producer)  # the model is back at v2 too
    del log.append
    assert _step(producer, _grads(3, salt=1)) == 3 and _step(producer, _grads(4)) == 4
    producer.close()
    again = _open(url, tmp_path)  # a restart resumes at the head and goes on
    assert again.version == 4 and _step(again, _grads(5)) == 5
    again.close()
    want = [_grads(1), _grads(2), _grads(3, salt=1), _grads(4), _grads(5)]
    assert again.replica.digest == _reference(tmp_path, want) == _site_digest(url, "r", tmp_path, 5)
    report = check(read_history(str(tmp_path / "trainer.jsonl")), {}, _each_version_once(url, 5))
    assert report.anomalies == [] and report.trainer_versions == 6  # v0 (the start) to v5


def test_a_pipelined_publish_in_doubt_is_settled_from_the_log_by_the_step_after(tmp_path):
    """v3 is stored but its ack is lost and the log goes away: the next step raises in doubt, at v2; the one after
    resyncs, finds v3 on the log (with its error feedback) and publishes v4. Nothing is published twice."""
    url, log, producer = _at_v2(tmp_path)
    log.stored_then_down = True
    assert _step(producer, _grads(3)) == 3
    with pytest.raises(NotPublished, match="whether the log holds it is not known yet") as e:
        _step(producer, _grads(9))
    assert e.value.in_doubt and producer.version == 2 and producer.in_doubt.version == 3
    log.down = False
    assert _step(producer, _grads(4)) == 4
    producer.close()
    assert producer.replica.digest == _reference(tmp_path, [_grads(v) for v in (1, 2, 3, 4)])
    _each_version_once(url, 4)


def test_pipeline_is_refused_with_delta_mode():
    with pytest.raises(ConfigError, match="ProducerConfig.pipeline with mode = 'delta'"):
        producer_config(run="r", pipeline=True, mode="delta")
