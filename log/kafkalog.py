"""Apache Kafka backend (`kafka://HOST:PORT[,HOST:PORT]`) with kafka-python.

Producer: idempotent, acks=all, no client compression (messages are zstd already), one in-flight request
so chunks of one message land in order. Readers use manual assignment of partition 0 (no group
membership); a site's position is committed as its consumer group's offset through the admin API, so
`kafka-consumer-groups --describe` and `hilo lag` both see it.
"""
import time

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from kafka.errors import KafkaError, TopicAlreadyExistsError
from kafka.structs import OffsetAndMetadata

from hilo.schemas.chunks import DEFAULT_CHUNK_BYTES, Record
from hilo.schemas.errors import LogError

from .base import Log, check_run, checkpoints_topic, updates_topic

RETRIABLE_TRIES = 20
RECORD_OVERHEAD = 64 << 10  # headers + batch framing on top of a chunk's value, bytes
DELIVERY_TIMEOUT_MS = 120_000  # how long a publish may retry (a leader election takes ~10-30 s), then a clear error


def _retry(what, fn, *args, **kwargs):
    """Call fn, retrying Kafka's retriable errors (e.g. the group coordinator still starting) with backoff."""
    for attempt in range(RETRIABLE_TRIES):
        try:
            return fn(*args, **kwargs)
        except KafkaError as e:
            if not getattr(e, "retriable", False) or attempt == RETRIABLE_TRIES - 1:
                raise LogError(f"{what}: {type(e).__name__}: {e}") from None
            time.sleep(min(2.0, 0.05 * 2 ** attempt))  # backoff against a broker that is still electing
    raise AssertionError("unreachable")


class KafkaLog(Log):
    """Single-partition topics on a Kafka cluster.

    chunk_bytes: largest record value this client writes; sizes the producer's max_request_size, the topics'
        max.message.bytes and the readers' fetch sizes, and is checked against the cluster. Default: 900 KiB
    request_timeout_ms: per request. Default: 30000
    connect_timeout_ms: how long the first connection may take before the log is reported unreachable. Default: 10000
    """

    def __init__(self, bootstrap: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES, request_timeout_ms: int = 30_000,
                 connect_timeout_ms: int = 10_000):
        self.bootstrap = bootstrap
        self.url = f"kafka://{bootstrap}"
        self.chunk_bytes = chunk_bytes
        self.record_bytes = chunk_bytes + RECORD_OVERHEAD  # one record as the broker counts it
        self.timeout_ms = request_timeout_ms
        self.connect_timeout_ms = connect_timeout_ms
        self._unreachable = None  # the LogError of a failed first connection: reported again at once, not after another wait
        self._admin = self._producer = self._consumer = None
        self._positions = {}  # topic -> next offset the consumer will return

    @property
    def admin(self):
        """Lazily connected admin client."""
        if self._unreachable is not None:
            raise self._unreachable
        if self._admin is None:
            try:
                self._admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=self.timeout_ms,
                                               bootstrap_timeout_ms=self.connect_timeout_ms, client_id="hilo-admin")
            except KafkaError as e:
                self._unreachable = LogError(f"{self.url}: cannot connect within {self.connect_timeout_ms / 1000:.0f}s ({type(e).__name__}); "
                                             f"is the broker running and reachable? (ops/kafka/start.sh starts a local one)")
                raise self._unreachable from None
        return self._admin

    # -- topics -------------------------------------------------------------------------------
    def create_topics(self, run, retention_ms=-1):
        """Create RUN.updates / RUN.checkpoints with one partition and delete retention; validate existing ones."""
        check_run(run)
        created = []
        brokers = _retry("describe cluster", self.admin.describe_cluster)["brokers"]
        replication = min(3, len(brokers))
        self._check_broker_limits(brokers)
        for t in (updates_topic(run), checkpoints_topic(run)):
            spec = {t: {"num_partitions": 1, "replication_factor": replication,
                        "configs": {"cleanup.policy": "delete", "retention.ms": str(retention_ms),
                                    "min.insync.replicas": str(max(1, replication - 1)),
                                    "max.message.bytes": str(max(1 << 20, self.record_bytes))}}}
            try:
                self.admin.create_topics(spec, timeout_ms=self.timeout_ms, wait_for_metadata=True)
                created.append(t)
            except TopicAlreadyExistsError:
                pass
            except KafkaError as e:
                raise LogError(f"{self.url}: creating topic {t!r} failed: {type(e).__name__}: {e}") from None
            self._await_topic(t)
            self.check_topic(t)
        return created

    def _await_topic(self, topic, timeout_s: float = 30.0):
        """Wait until the brokers we ask know a topic just created: on a fresh multi-node cluster the metadata of a
        new topic reaches the brokers one by one, and a describe answered by a late one says "does not exist"."""
        deadline, seen = time.monotonic() + timeout_s, 0
        while seen < 3:  # three answers in a row (the admin client spreads requests over the brokers)
            desc = _retry(f"describe topic {topic}", self.admin.describe_topics, [topic])[0]
            seen = seen + 1 if desc["error_code"] == 0 else 0
            if seen < 3:
                if time.monotonic() >= deadline:
                    raise LogError(f"{self.url}: topic {topic!r} was created but the cluster does not show it after {timeout_s:.0f}s")
                time.sleep(0.1)  # polling the cluster's metadata propagation; nothing of ours to synchronise with

    def _check_broker_limits(self, brokers):
        """Refuse a chunk size the brokers cannot take in one request (socket.request.max.bytes)."""
        res = _retry("describe broker configs", self.admin.describe_configs,
                     [ConfigResource(ConfigResourceType.BROKER, str(b["broker_id"])) for b in brokers], config_filter="all")
        for broker, cfg in res.get("broker", {}).items():
            cap = int(cfg["socket.request.max.bytes"]["value"])
            if self.record_bytes > cap:
                raise LogError(f"{self.url}: chunk_bytes {self.chunk_bytes} needs records of {self.record_bytes} bytes, but broker {broker} "
                               f"takes requests of at most {cap} bytes (socket.request.max.bytes; message.max.bytes is "
                               f"{cfg['message.max.bytes']['value']}); lower chunk_bytes")

    def check_topic(self, topic):
        """Exactly one partition, cleanup.policy=delete and room for this client's records, or LogError saying what is wrong."""
        desc = _retry(f"describe topic {topic}", self.admin.describe_topics, [topic])[0]
        if desc["error_code"] == 3:
            raise LogError(f"{self.url}: topic {topic!r} does not exist (run `hilo topics create --log {self.url} --run ...`)")
        if desc["error_code"]:
            raise LogError(f"{self.url}: describing topic {topic!r} failed with error code {desc['error_code']}")
        if len(desc["partitions"]) != 1:
            raise LogError(f"{self.url}: topic {topic!r} has {len(desc['partitions'])} partitions; hilo-sync needs exactly 1 "
                           f"(Kafka orders records only within a partition)")
        cfg = _retry(f"describe configs of {topic}", self.admin.describe_configs,
                     [ConfigResource(ConfigResourceType.TOPIC, topic, None)], config_filter="all")["topic"][topic]
        policy = cfg["cleanup.policy"]["value"]
        if "compact" in policy:
            raise LogError(f"{self.url}: topic {topic!r} has cleanup.policy={policy}; compaction would delete versions, use delete")
        room = int(cfg["max.message.bytes"]["value"])
        if room < self.record_bytes:
            raise LogError(f"{self.url}: topic {topic!r} takes records of at most {room} bytes (max.message.bytes), chunk_bytes "
                           f"{self.chunk_bytes} needs {self.record_bytes}; lower chunk_bytes or raise the topic's max.message.bytes")

    # -- records ------------------------------------------------------------------------------
    @property
    def producer(self):
        """Lazily created idempotent producer."""
        if self._producer is None:
            self._producer = KafkaProducer(
                bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True, linger_ms=0,
                max_in_flight_requests_per_connection=1, max_request_size=self.record_bytes,
                request_timeout_ms=self.timeout_ms, delivery_timeout_ms=DELIVERY_TIMEOUT_MS, client_id="hilo-producer")
        return self._producer

    def append(self, topic, records):
        """Send in order and wait for every ack (acks=all)."""
        try:
            futures = [self.producer.send(topic, value=v, key=k, partition=0, headers=[(hk, hv.encode()) for hk, hv in h.items()])
                       for k, v, h in records]
            self.producer.flush()
            # The producer retries through a leader election up to its delivery timeout; wait for that, not less.
            return [f.get(timeout=DELIVERY_TIMEOUT_MS / 1000 + 5).offset for f in futures]
        except KafkaError as e:
            raise LogError(f"{self.url}: publishing to {topic!r} failed: {type(e).__name__}: {e}") from None

    @property
    def consumer(self):
        """Lazily created reader with no group (positions are explicit)."""
        if self._consumer is None:
            self._consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                max_partition_fetch_bytes=max(4 << 20, 2 * self.record_bytes), fetch_max_bytes=max(64 << 20, 2 * self.record_bytes),
                request_timeout_ms=self.timeout_ms + 5000, client_id="hilo-reader")
        return self._consumer

    def read(self, topic, offset, timeout_s=1.0, max_bytes=16 << 20):
        """Records from `offset` on, from one poll."""
        tp = TopicPartition(topic, 0)
        c = self.consumer
        if tp not in c.assignment():
            c.assign(list(c.assignment()) + [tp])
            self._positions.pop(topic, None)
        if self._positions.get(topic) != offset:
            c.seek(tp, offset)
            self._positions[topic] = offset
        polled = c.poll(timeout_ms=int(timeout_s * 1000), max_records=500)
        out = [Record(r.offset, r.key, r.value, {k: v.decode() for k, v in (r.headers or [])})
               for r in polled.get(tp, []) if r.offset >= offset]
        for other, recs in polled.items():
            if other != tp and recs:  # another assigned topic was fetched too: make it re-seek next time
                self._positions.pop(other.topic, None)
        if out:
            self._positions[topic] = out[-1].offset + 1
        return out

    def begin_offset(self, topic):
        """Oldest retained offset."""
        tp = TopicPartition(topic, 0)
        return _retry(f"beginning offset of {topic}", self.consumer.beginning_offsets, [tp])[tp]

    def end_offset(self, topic):
        """Log end offset."""
        tp = TopicPartition(topic, 0)
        return _retry(f"end offset of {topic}", self.consumer.end_offsets, [tp])[tp]

    def retention(self, topic):
        """The topic's retention.ms and retention.bytes as the broker reports them."""
        cfg = _retry(f"describe configs of {topic}", self.admin.describe_configs,
                     [ConfigResource(ConfigResourceType.TOPIC, topic, None)], config_filter="all")["topic"][topic]
        return {k: cfg[k]["value"] for k in ("retention.ms", "retention.bytes")}

    def become_writer(self, run, version):
        """No fencing on Kafka yet (it comes with transactional producers): None."""
        return None

    def trim(self, topic, before):
        """DeleteRecords up to `before`: the log start moves exactly there, whatever the segment layout."""
        tp = TopicPartition(topic, 0)
        _retry(f"trimming {topic} before offset {before}", self.admin.delete_records, {tp: before})
        return True

    # -- groups -------------------------------------------------------------------------------
    def commit(self, group, topic, offset, metadata):
        """Commit a group offset through the admin API (the group has no live members)."""
        def attempt():
            res = self.admin.alter_group_offsets(group, {TopicPartition(topic, 0): OffsetAndMetadata(offset, metadata, -1)})
            err = next(iter(res.values()))
            if getattr(err, "errno", 0):
                raise err()  # reported per partition, not raised: raise it so _retry retries a coordinator still loading
        _retry(f"{self.url}: committing group {group!r} at {topic}@{offset}", attempt)

    def committed(self, group, topic):
        """(offset, metadata) or None."""
        res = _retry(f"fetch offsets of {group}", self.admin.list_group_offsets, {group: None})
        om = res.get(group, {}).get(TopicPartition(topic, 0))
        return None if om is None or om.offset < 0 else (om.offset, om.metadata)

    def runs(self):
        """Topics named RUN.updates on the cluster."""
        topics = _retry("list topics", self.admin.list_topics)
        return sorted(t[: -len(".updates")] for t in topics if t.endswith(".updates"))

    def groups(self, prefix):
        """Consumer groups whose id starts with `prefix`."""
        return sorted(g["group_id"] for g in _retry("list groups", self.admin.list_groups) if g["group_id"].startswith(prefix))

    def close(self):
        """Close clients."""
        for c in (self._producer, self._consumer, self._admin):
            if c is not None:
                c.close()
        self._admin = self._producer = self._consumer = None
