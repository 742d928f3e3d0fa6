"""The log interface both backends implement: the embedded file log and Apache Kafka.

A topic here is always a single partition: offset order is the order of policy versions.
"""
import re
from abc import abstractmethod
from typing import Protocol

from hilo.schemas.chunks import Record  # noqa: F401  (part of the interface)
from hilo.schemas.errors import ConfigError

# A run id names topics (RUN.updates), consumer groups and file-log folders: the one rule for every backend.
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,200}$")


def check_run(run: str, what: str = "run") -> str:
    """`run` if it is a valid run id; else ConfigError naming `what` (letters, digits, '_', '-'; no '.', '/')."""
    if not isinstance(run, str) or not RUN_NAME.match(run):
        raise ConfigError(f"{what} = {run!r}: a run id is 1-201 letters, digits, '_' or '-', starting with a letter or "
                          f"digit (topics RUN.updates and RUN.checkpoints derive from it)")
    return run


def updates_topic(run: str) -> str:
    """Topic of update messages of `run`."""
    return f"{run}.updates"


def checkpoints_topic(run: str) -> str:
    """Topic of full checkpoints of `run`."""
    return f"{run}.checkpoints"


def prompts_topic(run: str) -> str:
    """Topic of the trainer's prompts of `run` (the return path's work queue; several partitions)."""
    return f"{run}.prompts"


def rollouts_topic(run: str) -> str:
    """Topic of the sites' rollouts of `run`."""
    return f"{run}.rollouts"


def site_group(run: str, site: str) -> str:
    """Consumer-group id under which a site commits its position (what `hilo lag` and kafka tools read)."""
    return f"hilo.{run}.{site}"


class Batch(list):
    """Records from one read, in order, and `next_offset`: where the next read continues. It can be past the last
    record: Kafka's transaction markers (and aborted records, under read_committed) take offsets no reader sees."""

    def __init__(self, records=(), next_offset: int = 0):
        super().__init__(records)
        self.next_offset = next_offset


class Transaction:
    """Appends that become visible together (Kafka transactions); on a backend without them, each append is
    durable as it returns and a reader skips a message left incomplete by a crash."""

    def __init__(self, log):
        self.log = log

    def append(self, topic: str, records: list, partition: int = 0) -> list:
        """Append in order within the transaction; returns the records' offsets."""
        return self.log.append(topic, records, partition)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Log(Protocol):
    """The log a run lives on: append / read / offsets / group positions over its topics. Two implementations:
    FileLog (filelog.py, the embedded log) and KafkaLog (kafka/backend.py). Each subclasses this Protocol explicitly,
    for the shared methods below; an abstract method it lacks is refused when it is constructed."""

    url = ""
    # Offsets a writer's commit can leave after its last record (Kafka: the transaction's marker). A position
    # that many below the log start lost nothing to retention; the digest chain checks that anyway.
    marker_offsets = 0

    def retained(self, topic: str, offset: int) -> bool:
        """Whether reading `topic` from `offset` misses no record to retention."""
        return offset >= self.begin_offset(topic) - self.marker_offsets

    @abstractmethod
    def create_topics(self, run: str, retention_ms: int = -1) -> list:
        """Create RUN.updates and RUN.checkpoints if missing; refuse existing misconfigured ones. Returns created
        names."""
        ...

    @abstractmethod
    def create_rollout_topics(self, run: str, prompt_partitions: int, retention_ms: int = -1) -> list:
        """Create RUN.prompts (`prompt_partitions` partitions: prompts spread over the sites of one consumer group) and
        RUN.rollouts (1 partition) if missing; refuse existing misconfigured ones. Returns created names."""
        ...

    @abstractmethod
    def check_topic(self, topic: str, partitions: int = 1) -> None:
        """Raise LogError unless `topic` exists with `partitions` partitions and cleanup.policy=delete."""
        ...

    @abstractmethod
    def append(self, topic: str, records: list, partition: int = 0) -> list:
        """Append (key, value, headers) records in order to `partition` (RUN.prompts has several; every other topic
        one); durable when this returns. Returns their offsets."""
        ...

    def partitions(self, topic: str) -> int:
        """How many partitions `topic` has (the embedded log: always 1)."""
        return 1

    @abstractmethod
    def prompt_queue(self, run: str, site: str, lease_s: float):
        """`site`'s view of the run's prompts: take them, settle them with their rollouts (log/prompt_queue.py)."""
        ...

    def transaction(self) -> Transaction:
        """A context whose appends commit together when it exits cleanly (and are discarded when it raises)."""
        return Transaction(self)

    @abstractmethod
    def read(self, topic: str, offset: int, timeout_s: float = 1.0, max_bytes: int = 16 << 20,
             partition: int = 0) -> Batch:
        """Records of `partition` at offsets >= `offset` (possibly none within `timeout_s`), in order, as a Batch."""
        ...

    @abstractmethod
    def begin_offset(self, topic: str) -> int:
        """Oldest offset still retained."""
        ...

    @abstractmethod
    def end_offset(self, topic: str, partition: int = 0) -> int:
        """Offset after the last committed record of `partition`: a reader that reaches it has seen everything
        (Kafka: the last stable offset)."""
        ...

    @abstractmethod
    def retention(self, topic: str) -> dict:
        """How the backend retains `topic`: {"retention.ms", "retention.bytes"} on Kafka; the file log keeps
        everything."""
        ...

    @abstractmethod
    def become_writer(self, run: str, version: int):
        """Make this client the run's only writer: an earlier writer's next append raises FencedError. Returns
        the fencing token (file log) or None (Kafka: the producer epoch is the broker's)."""
        ...

    @abstractmethod
    def trim(self, topic: str, before: int) -> bool:
        """Delete the records before offset `before` (as retention would); False where the backend keeps everything."""
        ...

    @abstractmethod
    def commit(self, group: str, topic: str, offset: int, metadata: str) -> None:
        """Store a group's next offset with a metadata string."""
        ...

    @abstractmethod
    def committed(self, group: str, topic: str):
        """(offset, metadata) last committed by `group`, or None."""
        ...

    @abstractmethod
    def runs(self) -> list:
        """Run ids with an updates topic on this log, sorted (nothing is created)."""
        ...

    @abstractmethod
    def groups(self, prefix: str) -> list:
        """Group ids starting with `prefix`."""
        ...

    def close(self) -> None:
        """Release connections and files."""
