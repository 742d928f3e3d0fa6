"""KafkaLog: the Log interface over a Kafka cluster, a facade over the parts of this package.

Security (TLS, SASL, ACLs) comes from a KafkaClientConfig (`--kafka-config FILE`); a refused connection or an
unauthorised request is one line that names the cause. A site's position is committed as its consumer group's
offset through the admin API, so `kafka-consumer-groups --describe` and `hilo lag` both see it.
"""
from kafka import KafkaConsumer

from hilo.log.base import Log
from hilo.log.kafka_config import KafkaClientConfig, client_config
from hilo.schemas.chunks import DEFAULT_CHUNK_BYTES

from .admin import Admin
from .connection import Connector
from .group_offsets import GroupOffsets
from .reader import ReaderSupervisor
from .writer import Writer

RECORD_OVERHEAD = 64 << 10  # headers + batch framing on top of a chunk's value, bytes


class KafkaLog(Log):
    """Single-partition topics on a Kafka cluster.

    chunk_bytes: largest record value this client writes; sizes the producer's max_request_size, the topics'
        max.message.bytes and the readers' fetch sizes, and is checked against the cluster. Default: 900 KiB
    request_timeout_ms: per request. Default: 30000
    connect_timeout_ms: how long the first connection may take before the log is reported unreachable. Default: 10000
    config: TLS/SASL settings, a KafkaClientConfig or the path of a client .properties file. Default: plaintext
    """

    marker_offsets = 1  # a committed transaction's marker follows its last record

    def __init__(self, bootstrap: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES, request_timeout_ms: int = 30_000,
                 connect_timeout_ms: int = 10_000, config: KafkaClientConfig | str | None = None):
        self.connector = Connector(bootstrap, client_config(config), connect_timeout_ms)
        self.url, self.chunk_bytes = self.connector.url, chunk_bytes
        record_bytes = chunk_bytes + RECORD_OVERHEAD  # one record as the broker counts it
        self.admin_side = Admin(self.connector, request_timeout_ms, chunk_bytes, record_bytes)
        self.group_offsets = GroupOffsets(self.admin_side)
        self.writer = Writer(self.connector, request_timeout_ms, record_bytes)
        self.reader = ReaderSupervisor(lambda: self.connector.connect(
            KafkaConsumer, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_partition_fetch_bytes=max(4 << 20, 2 * record_bytes), fetch_max_bytes=max(64 << 20, 2 * record_bytes),
            request_timeout_ms=request_timeout_ms + 5000, client_id="hilo-reader"), lambda: self.connector.reached,
                                       self.url)

    @property
    def admin(self):
        """The kafka-python admin client (for operator tools and tests that set a topic up by hand)."""
        return self.admin_side.client

    # -- topics and groups: the admin side and the group offsets ----------------------------------
    def create_topics(self, run, retention_ms=-1):
        """Create RUN.updates / RUN.checkpoints with one partition and delete retention; validate existing ones."""
        return self.admin_side.create_topics(run, retention_ms)

    def create_rollout_topics(self, run, prompt_partitions, retention_ms=-1):
        """Create RUN.prompts (P partitions) and RUN.rollouts (1) with delete retention; validate existing ones."""
        return self.admin_side.create_rollout_topics(run, prompt_partitions, retention_ms)

    def check_topic(self, topic, partitions=1):
        """Exactly `partitions` partitions, cleanup.policy=delete and room for this client's records, or LogError."""
        self.admin_side.check_topic(topic, partitions)

    def retention(self, topic):
        """The topic's retention.ms and retention.bytes as the broker reports them."""
        return self.admin_side.retention(topic)

    def trim(self, topic, before):
        """DeleteRecords up to `before`."""
        return self.admin_side.trim(topic, before)

    def commit(self, group, topic, offset, metadata):
        """Commit a group offset through the admin API (the group has no live members)."""
        self.group_offsets.commit(group, topic, offset, metadata)

    def committed(self, group, topic):
        """(offset, metadata) or None."""
        return self.group_offsets.committed(group, topic)

    def runs(self):
        """Topics named RUN.updates on the cluster."""
        return self.admin_side.runs()

    def groups(self, prefix):
        """Consumer groups whose id starts with `prefix`."""
        return self.group_offsets.groups(prefix)

    # -- records: the writer and the reader -------------------------------------------------------
    def append(self, topic, records, partition=0):
        """Send in order and wait for every ack (acks=all); a writer's records commit in one transaction."""
        with self.transaction() as tx:
            return tx.append(topic, records, partition)

    def partitions(self, topic):
        """The topic's partition count, from the cluster's metadata."""
        return self.admin_side.partitions(topic)

    def prompt_queue(self, run, site, lease_s):
        """The run's generating sites as one consumer group; a settle is one transaction (log/kafka/prompt_group.py).
        `lease_s` is the embedded log's: Kafka's group session decides when a silent site's prompts move."""
        from .prompt_group import KafkaPromptQueue
        return KafkaPromptQueue(self, run, site)

    def transaction(self):
        """Appends that commit together (a Kafka transaction once this client is a run's writer)."""
        return self.writer.transaction()

    def become_writer(self, run, version):
        """Take over the run's transactional id: every earlier producer of it is fenced. Returns None (the producer
        epoch is the broker's; kafka-python does not expose it)."""
        self.writer.become(run, version)

    def read(self, topic, offset, timeout_s=1.0, max_bytes=16 << 20, partition=0):
        """Records of `partition` from `offset` on, from one poll (a retriable failure reads as an empty batch)."""
        return self.reader.read(topic, offset, timeout_s, partition)

    def begin_offset(self, topic):
        """Oldest retained offset."""
        return self.reader.offset(topic, end=False)

    def end_offset(self, topic, partition=0):
        """Last stable offset: just past the last committed record (and its transaction's marker)."""
        return self.reader.offset(topic, end=True, partition=partition)

    def close(self):
        """Close clients."""
        self.writer.close()
        self.reader.close()
        self.group_offsets.close()
        self.admin_side.close()
