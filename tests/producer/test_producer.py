"""HiLoProducer's own guarantees: a failed publish leaves no trace; config errors name the field."""
import pytest

from hilo.log import open_log
from hilo.producer.producer import HiLoProducer, ProducerConfig
from hilo.schemas.errors import HiloError, LogError
from tests.conftest import publish_random, small_model


class FailingAppends:
    """The real file log, except that appends to the updates topic fail while `fail` is set."""

    def __init__(self, log):
        self.log, self.fail = log, False

    def __getattr__(self, name):
        return getattr(self.log, name)

    def append(self, topic, records):
        if self.fail and topic.endswith(".updates"):
            raise LogError("simulated broker outage")
        return self.log.append(topic, records)


def test_failed_publish_rolls_back_and_the_next_step_continues_the_chain(tmp_path):
    from hilo.consumer.site import Site, SiteConfig
    url = f"file://{tmp_path}/log"
    log = FailingAppends(open_log(url))
    producer = HiLoProducer(small_model(), ProducerConfig(run="r", log=url), log_backend=log)
    publish_random(producer, 2)
    digest, version = producer.replica.digest, producer.version
    log.fail = True
    with pytest.raises(LogError, match="simulated broker outage"):
        publish_random(producer, 1, seed=9)
    assert (producer.version, producer.replica.digest) == (version, digest)
    log.fail = False
    publish_random(producer, 2, seed=10)
    site = Site(SiteConfig(log=url, run="r", site="s", state_dir=str(tmp_path / "s"), until_version=4, export_adapters=False))
    site.run(progress=False)
    assert site.follower.replica.digest == producer.replica.digest


@pytest.mark.parametrize("field,value,match", [
    ("run", "a/b", "ProducerConfig.run"), ("codec", "gzip", "ProducerConfig.codec"),
    ("optimizer", "adam", "ProducerConfig.optimizer"), ("checkpoint_every", 0, "ProducerConfig.checkpoint_every"),
    ("hparams", {"lr": -1.0}, r"hparams\['lr'\] = -1.0 is outside"),
])
def test_config_errors_name_the_field(field, value, match):
    with pytest.raises(HiloError, match=match):
        ProducerConfig(**{"run": "r", field: value})
