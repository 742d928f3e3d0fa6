"""Log backends behind one interface, chosen by URL: file://DIR (embedded) or kafka://HOST:PORT."""
from hilo.schemas.errors import ConfigError

from .base import Log, checkpoints_topic, site_group, updates_topic  # noqa: F401


def open_log(url: str) -> Log:
    """The backend for `url`; Kafka is imported only when asked for."""
    if url.startswith("file://"):
        from .filelog import FileLog
        return FileLog(url[len("file://"):])
    if url.startswith("kafka://"):
        from .kafkalog import KafkaLog
        return KafkaLog(url[len("kafka://"):])
    raise ConfigError(f"--log {url!r}: expected file://DIR or kafka://HOST:PORT")
