"""The log both ends speak: backends behind one interface, chosen by URL (file://DIR or kafka://HOST:PORT).

Also here: reading a topic's tail (tail.py). Replaying the log onto a replica is hilo.replay.
"""
from hilo.schemas.chunks import DEFAULT_CHUNK_BYTES
from hilo.schemas.errors import ConfigError

from .base import Log, checkpoints_topic, prompts_topic, rollouts_topic, site_group, updates_topic  # noqa: F401
from .kafka_config import check_kafka_config
from .target import LogTarget


def open_log(url, chunk_bytes: int = DEFAULT_CHUNK_BYTES, kafka_config=None, connect_timeout_ms: int = 10_000) -> Log:
    """The backend for `url`: a log URL, or a LogTarget whole (its log and kafka_config; a configuration's `target`).
    Kafka is imported only when asked for. `chunk_bytes`: largest record value written; `kafka_config`: a Kafka client
    .properties file (or KafkaClientConfig) with TLS/SASL settings; `connect_timeout_ms`: how long Kafka's first
    connection may take."""
    if isinstance(url, LogTarget):
        url, kafka_config = url.log, url.kafka_config
    if url.startswith("file://"):
        check_kafka_config(url, kafka_config)
        from .filelog import FileLog
        return FileLog(url[len("file://"):])
    if url.startswith("kafka://"):
        from .kafka.backend import KafkaLog
        return KafkaLog(url[len("kafka://"):], chunk_bytes=chunk_bytes, config=kafka_config,
                        connect_timeout_ms=connect_timeout_ms)
    raise ConfigError(f"--log {url!r}: expected file://DIR or kafka://HOST:PORT")
