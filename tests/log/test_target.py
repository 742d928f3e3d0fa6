"""LogTarget: log URL, run id and Kafka client file checked together, once; trainer and site configs share it and a
bad value names the configuration's own field."""
import dataclasses

import pytest

from hilo.log.target import LogTarget
from hilo.schemas.errors import ConfigError


@pytest.fixture
def properties(tmp_path):
    """A valid client .properties file."""
    p = tmp_path / "client.properties"
    p.write_text("security.protocol=SSL\n")
    return str(p)


def test_a_good_target_is_frozen_and_equal_whoever_built_it(properties):
    t = LogTarget("kafka://127.0.0.1:9092", "r1", properties)
    assert t == LogTarget("kafka://127.0.0.1:9092", "r1", properties, what="SiteConfig")
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.run = "r2"


@pytest.mark.parametrize("field,kw", [
    ("run", {"run": "a/b"}),
    ("log", {"log": "kafak://127.0.0.1:9092"}),
    ("kafka_config", {"kafka_config": "PROPS"}),  # a client file for the embedded log
    ("kafka_config", {"log": "kafka://127.0.0.1:9092", "kafka_config": "/no/such.properties"}),
])
def test_a_bad_field_is_named(properties, field, kw):
    kw = {"log": "file:///tmp/log", "run": "r"} | {k: properties if v == "PROPS" else v for k, v in kw.items()}
    with pytest.raises(ConfigError, match=rf"^LogTarget\.{field}\b"):
        LogTarget(**kw)
    with pytest.raises(ConfigError, match=rf"^Owner\.{field}\b"):
        LogTarget(**kw, what="Owner")


def test_producer_config_names_its_own_field(properties):
    from hilo.producer.config import ProducerConfig
    cfg = ProducerConfig(run="r", log="kafka://127.0.0.1:9092", kafka_config=properties)
    assert cfg.target == LogTarget("kafka://127.0.0.1:9092", "r", properties)  # checked once, kept
    with pytest.raises(ConfigError, match=r"^ProducerConfig\.kafka_config: --kafka-config .*applies to kafka:// logs"):
        ProducerConfig(run="r", log="file:///tmp/log", kafka_config=properties)
    with pytest.raises(ConfigError, match=r"^ProducerConfig\.run = 'a\.b'"):
        ProducerConfig(run="a.b")


def test_site_config_names_its_own_field(properties):
    from hilo.consumer.config import SiteConfig
    kw = {"log": "file:///tmp/log", "run": "r", "site": "s", "state_dir": "/tmp/s"}
    assert SiteConfig(**kw).target == LogTarget("file:///tmp/log", "r")
    with pytest.raises(ConfigError, match=r"^SiteConfig\.kafka_config: --kafka-config .*applies to kafka:// logs"):
        SiteConfig(**kw, kafka_config=properties)
    with pytest.raises(ConfigError, match=r"^SiteConfig\.log = 'kafka:/x'"):
        SiteConfig(**kw | {"log": "kafka:/x"})
    # replace() builds a new config, checked again
    with pytest.raises(ConfigError, match=r"^SiteConfig\.run = "):
        dataclasses.replace(SiteConfig(**kw), run="")
