"""Delta mode end to end: the trainer's master runs the optimizer, sites only add; lag reported, flush, restart."""
import logging

import pytest
import torch

from hilo.consumer.config import SiteConfig
from hilo.log import updates_topic
from hilo.log.tail import last_message
from hilo.ops.lag import format_rows, lag_rows
from hilo.producer.delta import relative_lag
from hilo.producer.producer import HiLoProducer
from hilo.schemas import headers as H
from hilo.schemas.errors import ConfigError
from hilo.schemas.records import decode_record
from tests.conftest import new_run, producer_config, publish_random, small_model
from tests.helpers import site_of


def delta_producer(log_url, run, **kw):
    return HiLoProducer.open(small_model(),
                             producer_config(run=run, log=log_url, mode="delta", codec="spar4", optimizer="muon",
                                                       hparams={"lr": 0.02}, **kw))


def follow(log_url, run, tmp_path, version):
    s = site_of(SiteConfig(log=log_url, run=run, site="s1", state_dir=str(tmp_path / "s1"), until_version=version,
                        export_adapters=False, wait_checkpoint_s=5))
    assert s.run(progress=False) == version
    return s.follower.replica


def test_sites_hold_the_trainers_copy_and_every_message_reports_the_lag(log_url, tmp_path, logs):
    run = new_run()
    producer = delta_producer(log_url, run)
    publish_random(producer, 8, scale=0.05)
    lag = producer.last_step["lag"]
    assert 0 < lag < 1 and lag == producer.lag()  # the message reports exactly what the trainer then holds
    assert lag == relative_lag(producer.master.params, producer.replica.state.params)
    # the training model holds the master (ahead of the sites), not the sites' copy
    assert all(torch.equal(p.detach().float(), m) for p, m in zip(producer.params, producer.master.params))
    assert not all(torch.equal(m, s) for m, s in zip(producer.master.params, producer.replica.state.params))

    site = follow(log_url, run, tmp_path, 8)
    assert site.digest == producer.replica.digest
    assert site.state.optimizer == "add" and site.state.slots == {}  # a delta site holds params only

    log = logs(log_url)
    head = last_message(log, updates_topic(run), run)
    assert decode_record(head.data, "head").meta["lag"] == lag
    rows = lag_rows(log, run)
    assert [r["trainer_lag"] for r in rows] == [lag]  # the header's canonical form reads back exactly
    assert head.headers[H.LAG] == f"{lag:.16e}"
    assert "TRAINER-LAG" in format_rows(rows) and f"{lag:.2e}" in format_rows(rows)

    # flush: messages with no new step until the sites are within the tolerance of the master
    sent = producer.flush(lag=1e-3)
    assert sent >= 1 and producer.lag() <= 1e-3 < lag
    assert producer.version == 8 + sent
    site = follow(log_url, run, tmp_path, producer.version)
    assert site.digest == producer.replica.digest
    assert relative_lag(producer.master.params, site.state.params) <= 1e-3
    assert producer.flush(lag=1e-3) == 0  # nothing left to send
    producer.close()
    log.close()


def test_close_flushes_and_a_restart_resumes_the_master_from_the_snapshot(tmp_path):
    log_url, run = f"file://{tmp_path}/log", new_run()
    producer = delta_producer(log_url, run, state_dir=str(tmp_path / "trainer"), flush_lag=1e-4)
    publish_random(producer, 5, scale=0.05)
    before, lag = producer.version, producer.lag()
    producer.close()
    assert lag > 1e-4 and producer.version > before and producer.lag() <= 1e-4  # close() flushed
    master = [m.clone() for m in producer.master.params]
    slots = {k: [t.clone() for t in v] for k, v in producer.master.state.slots.items()}

    again = delta_producer(log_url, run, state_dir=str(tmp_path / "trainer"), flush_lag=1e-4)
    assert again.version == producer.version and again.replica.digest == producer.replica.digest
    assert all(torch.equal(a, b) for a, b in zip(again.master.params, master))
    assert all(torch.equal(a, b) for k in slots for a, b in zip(again.master.state.slots[k], slots[k]))  # momentum kept
    publish_random(again, 2, scale=0.05)
    again.close(flush=False)


def test_without_a_snapshot_the_master_restarts_from_the_sites_copy(tmp_path, caplog):
    log_url, run = f"file://{tmp_path}/log", new_run()
    producer = delta_producer(log_url, run)
    publish_random(producer, 4, scale=0.05)
    producer.close(flush=False)
    assert producer.lag() > 0
    again = delta_producer(log_url, run)  # resumes from the log's adapter-only checkpoint + updates
    assert again.replica.digest == producer.replica.digest and again.lag() == 0.0
    assert all(torch.equal(m, s) for m, s in zip(again.master.params, again.replica.state.params))
    publish_random(again, 2, scale=0.05)
    site = follow(log_url, run, tmp_path, again.version)
    assert site.digest == again.replica.digest
    again.close(flush=False)


def test_a_run_keeps_its_mode(tmp_path):
    log_url, run = f"file://{tmp_path}/log", new_run()
    delta_producer(log_url, run).close()
    with pytest.raises(ConfigError, match="mode delta .* this config says mode gradient"):
        HiLoProducer.open(small_model(), producer_config(run=run, log=log_url, optimizer="muon"))
    with pytest.raises(ConfigError, match="ProducerConfig.mode"):
        producer_config(run=run, mode="deltas")
    with pytest.raises(ConfigError, match="ProducerConfig.flush_lag"):
        producer_config(run=run, mode="delta", flush_lag=1.5)


def test_gradient_mode_has_nothing_to_flush(tmp_path, caplog):
    producer = HiLoProducer.open(small_model(), producer_config(run=new_run(), log=f"file://{tmp_path}/log"))
    publish_random(producer, 2)
    with caplog.at_level(logging.INFO):
        assert producer.flush() == 0 and producer.lag() == 0.0
    assert "lag" not in producer.last_step or producer.last_step["lag"] == 0.0
    producer.close()
