"""LogTarget: where a run lives (log URL, run id, Kafka client settings), checked together, once.

Trainer and site configurations both name a log, a run and, for a secured cluster, a Kafka client file; they
build one LogTarget so the three are checked by one rule, and a bad value names the configuration's own field
(`what` is the prefix: "ProducerConfig" gives "ProducerConfig.run = ...").
"""
from dataclasses import dataclass, field

from hilo.schemas.errors import ConfigError

from .base import check_run
from .kafka_config import check_kafka_config

SCHEMES = ("file://", "kafka://")


@dataclass(frozen=True)
class LogTarget:
    """A log URL (file://DIR or kafka://HOST:PORT[,HOST:PORT]), a run id and an optional Kafka client .properties
    file."""

    log: str
    run: str
    kafka_config: str | None = None
    # Names the owner in errors only; two targets of the same log, run and client file are equal whoever built them.
    what: str = field(default="LogTarget", compare=False, repr=False, kw_only=True)

    def __post_init__(self):
        check_run(self.run, f"{self.what}.run")
        if not isinstance(self.log, str) or not self.log.startswith(SCHEMES):
            raise ConfigError(f"{self.what}.log = {self.log!r}: expected file://DIR or kafka://HOST:PORT")
        try:
            check_kafka_config(self.log, self.kafka_config)
        except ConfigError as e:  # its message names the option (--kafka-config); add the field it came from
            raise ConfigError(f"{self.what}.kafka_config: {e}") from None

