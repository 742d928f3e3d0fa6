"""Apache Kafka backend (`kafka://HOST:PORT[,HOST:PORT]`) with kafka-python.

Security (TLS, SASL, ACLs) comes from a KafkaClientConfig (kafka_config.py, `--kafka-config FILE`); a refused
connection or an unauthorised request is reported in one line that names the cause (kafka_causes.py).

Producer: idempotent, acks=all, no client compression (messages are zstd already), one in-flight request
so chunks of one message land in order. A trainer (`become_writer`) publishes with a transactional producer,
transactional.id `hilo.RUN`: its init fences every earlier producer of the run (a zombie trainer's next write
fails with ProducerFencedError, and its open transaction is aborted), and a version's chunks (with its
checkpoint's) commit in one transaction. Readers use isolation_level=read_committed, so an aborted or
half-written message is never seen; the markers transactions leave take offsets no reader gets (see Batch). Readers use manual assignment of partition 0 (no group
membership); a site's position is committed as its consumer group's offset through the admin API, so
`kafka-consumer-groups --describe` and `hilo lag` both see it.
"""
import logging
import re
import threading
import time

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from kafka.errors import KafkaError, KafkaTimeoutError, TopicAlreadyExistsError, TopicAuthorizationFailedError
from kafka.structs import OffsetAndMetadata

from hilo.schemas.chunks import DEFAULT_CHUNK_BYTES, Record
from hilo.schemas.errors import FencedError, LogError, NoSuchTopic

from . import kafka_causes
from .base import Batch, Log, Transaction, check_run, checkpoints_topic, updates_topic
from .kafka_config import KafkaClientConfig, client_config

logger = logging.getLogger(__name__)
RETRIABLE_TRIES = 20
RECORD_OVERHEAD = 64 << 10  # headers + batch framing on top of a chunk's value, bytes
STALE_S = 10.0  # empty reads this long make a reader check that it is not wedged
OFFSETS_TIMEOUT_MS = 10_000  # one ListOffsets attempt; retried (with a fresh consumer) after that
DELIVERY_TIMEOUT_MS = 60_000  # how long one publish may retry (a leader election takes ~10-30 s); the trainer then tries a fresh producer


_RESOURCES = {"Topic": "topic", "Cluster": "cluster", "Group": "consumer group", "TransactionalId": "transactional id"}


def _failure(what, e: KafkaError) -> LogError:
    """One line for a failed request; an ACL refusal says so without kafka-python's request dump."""
    name = type(e).__name__
    refused = re.search(r"(\w*)AuthorizationFailedError", f"{name} {e}")  # kafka-python wraps some in a plain KafkaError
    if refused:
        name, resource = refused.group(0), _RESOURCES.get(refused.group(1), refused.group(1).lower() or "resource")
        return LogError(f"{what}: the broker refused it: this principal is not authorised on the {resource} ({name}); "
                        f"an operator grants a run's ACLs with `hilo acls grant`")
    return LogError(f"{what}: {name}: {e}")


def _fenced(e: Exception) -> bool:
    """Whether a producer error says a newer producer of the same transactional id took over."""
    return any(n in f"{type(e).__name__} {e}" for n in ("ProducerFencedError", "InvalidProducerEpochError"))


def _within(fn, seconds: float):
    """fn(), or KafkaTimeoutError if it has not returned within `seconds`: kafka-python's commit_transaction and
    abort_transaction wait without a bound while the transaction coordinator is unreachable."""
    box = {}

    def call():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001  (handed to the caller's thread)
            box["error"] = e
    t = threading.Thread(target=call, daemon=True, name="hilo-txn")
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise KafkaTimeoutError(f"no answer from the transaction coordinator within {seconds:.0f}s")
    if "error" in box:
        raise box["error"]
    return box.get("result")


def _retry(what, fn, *args, **kwargs):
    """Call fn, retrying Kafka's retriable errors (e.g. the group coordinator still starting) with backoff."""
    for attempt in range(RETRIABLE_TRIES):
        try:
            return fn(*args, **kwargs)
        except KafkaError as e:
            if not getattr(e, "retriable", False) or attempt == RETRIABLE_TRIES - 1:
                raise _failure(what, e) from None
            time.sleep(min(2.0, 0.05 * 2 ** attempt))  # backoff against a broker that is still electing
    raise AssertionError("unreachable")


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
        self.bootstrap = bootstrap
        self.config = client_config(config)
        self._security = self.config.client_kwargs()
        self.url = f"kafka://{bootstrap}"
        self.chunk_bytes = chunk_bytes
        self.record_bytes = chunk_bytes + RECORD_OVERHEAD  # one record as the broker counts it
        self.timeout_ms = request_timeout_ms
        self.connect_timeout_ms = connect_timeout_ms
        self._unreachable = None  # the LogError of a failed first connection: reported again at once, not after another wait
        self._reached = False     # a client connected once: a later failed reconnect is a restarting cluster, not a bad address
        self._admin = self._producer = self._consumer = None
        self._positions = {}  # topic -> next offset the consumer will return
        self._read_failures = 0  # consecutive reads that failed (a reader failing twice is replaced)
        self._idle_since = {}    # topic -> when reads of it started returning nothing (see _stale)
        self._writer = None   # (run, version at takeover) once this client is the run's transactional writer
        self._fenced = None   # the FencedError once a newer writer took over: every later append raises it

    @property
    def admin(self):
        """Lazily connected admin client."""
        if self._unreachable is not None:
            raise self._unreachable
        if self._admin is None:
            self._admin = self._connect(KafkaAdminClient, request_timeout_ms=self.timeout_ms,
                                        bootstrap_timeout_ms=self.connect_timeout_ms, client_id="hilo-admin")
        return self._admin

    def _connect(self, client, **kwargs):
        """A connected kafka-python client, or LogError saying why it could not connect (refused credentials,
        an untrusted certificate, the wrong security.protocol, or no broker)."""
        with kafka_causes.watch() as lines:
            try:
                connected = client(bootstrap_servers=self.bootstrap, **self._security, **kwargs)
            except KafkaError as e:
                cause = kafka_causes.explain(lines, self.config)
                if cause is None:
                    cause = (f"cannot connect within {self.connect_timeout_ms / 1000:.0f}s ({type(e).__name__}); is the broker "
                             f"running and reachable? (ops/kafka/start.sh starts a local one)")
                failure = LogError(f"{self.url}: {cause}")
                if not self._reached:  # never reached: a wrong address or credentials, said at once from now on
                    self._unreachable = failure
                raise failure from None
        self._reached = True
        return connected

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
                raise _failure(f"{self.url}: creating topic {t!r}", e) from None
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
        for b in brokers:
            broker, cfg = b["broker_id"], self._configs(ConfigResourceType.BROKER, str(b["broker_id"]))
            cap = int(cfg["socket.request.max.bytes"]["value"])
            if self.record_bytes > cap:
                raise LogError(f"{self.url}: chunk_bytes {self.chunk_bytes} needs records of {self.record_bytes} bytes, but broker {broker} "
                               f"takes requests of at most {cap} bytes (socket.request.max.bytes; message.max.bytes is "
                               f"{cfg['message.max.bytes']['value']}); lower chunk_bytes")

    def _configs(self, kind, name) -> dict:
        """A broker's or topic's configs; kafka-python returns an empty set for a resource this principal may not
        describe, which is reported as what it is."""
        what = "broker" if kind == ConfigResourceType.BROKER else "topic"
        res = _retry(f"describe configs of {what} {name}", self.admin.describe_configs, [ConfigResource(kind, name)],
                     config_filter="all")
        cfg = res.get(what, {}).get(name)
        if not cfg:
            raise LogError(f"{self.url}: the cluster shows no configs of {what} {name!r}: this principal may not describe them "
                           f"(DESCRIBE_CONFIGS on the {'cluster' if what == 'broker' else 'topic'}; `hilo acls grant` gives "
                           f"the trainer and sites theirs)")
        return cfg

    def check_topic(self, topic):
        """Exactly one partition, cleanup.policy=delete and room for this client's records, or LogError saying what is wrong."""
        desc = _retry(f"describe topic {topic}", self.admin.describe_topics, [topic])[0]
        if desc["error_code"] == 29:
            raise _failure(f"{self.url}: describing topic {topic!r}", TopicAuthorizationFailedError())
        if desc["error_code"] == 3:
            raise NoSuchTopic(f"{self.url}: topic {topic!r} does not exist (run `hilo topics create --log {self.url} --run ...`)")
        if desc["error_code"]:
            raise LogError(f"{self.url}: describing topic {topic!r} failed with error code {desc['error_code']}")
        if len(desc["partitions"]) != 1:
            raise LogError(f"{self.url}: topic {topic!r} has {len(desc['partitions'])} partitions; hilo-sync needs exactly 1 "
                           f"(Kafka orders records only within a partition)")
        cfg = self._configs(ConfigResourceType.TOPIC, topic)
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
        """Lazily created idempotent producer; transactional (id hilo.RUN) once this client is a run's writer."""
        if self._fenced is not None:
            raise self._fenced
        if self._producer is None:
            # retry_backoff_ms: a transaction begun right after a commit is answered CONCURRENT_TRANSACTIONS until the
            # commit's markers are written; kafka-python's default 100 ms backoff made every version cost 108 ms
            # (2 ms without a transaction); 10 ms makes it ~15 ms.
            txn = {} if self._writer is None else {"transactional_id": f"hilo.{self._writer[0]}", "retry_backoff_ms": 10}
            self._producer = self._connect(
                KafkaProducer, acks="all", enable_idempotence=True, linger_ms=0,
                max_in_flight_requests_per_connection=1, max_request_size=self.record_bytes,
                request_timeout_ms=self.timeout_ms, delivery_timeout_ms=DELIVERY_TIMEOUT_MS, client_id="hilo-producer", **txn)
            if txn:
                try:  # fences every earlier producer of this transactional id and aborts its open transaction
                    self._producer.init_transactions()
                except KafkaError as e:
                    self._drop_producer()
                    raise _failure(f"{self.url}: becoming the writer of run {self._writer[0]}", e) from None
        return self._producer

    def _drop_producer(self):
        """Close the producer without waiting; the next use makes (and, if transactional, re-initialises) a new one.
        After an indefinite error (a timeout) a transactional producer's state cannot be trusted (Jepsen found
        anomalies there): a fresh one, plus the log head, decides what happened."""
        if self._producer is not None:
            try:
                self._producer.close(timeout=0)
            except Exception:  # noqa: BLE001  (closing a broken client; nothing to report)
                pass
        self._producer = None

    def _send(self, topic, records):
        """Send in order and wait for every ack (acks=all); the records' offsets."""
        futures = [self.producer.send(topic, value=v, key=k, partition=0, headers=[(hk, hv.encode()) for hk, hv in h.items()])
                   for k, v, h in records]
        self.producer.flush()
        # The producer retries through a leader election up to its delivery timeout; wait for that, not less.
        return [f.get(timeout=DELIVERY_TIMEOUT_MS / 1000 + 5).offset for f in futures]

    def _fail(self, what, e):
        """The error to raise for a failed publish: FencedError (for good) once a newer writer took over."""
        if _fenced(e) and self._writer is not None:
            run, version = self._writer
            self._fenced = FencedError(f"{self.url}: run {run}: this trainer (writer since v{version}) was fenced: a newer producer "
                                       f"of transactional id hilo.{run} (another trainer of this run) took over; it publishes "
                                       f"nothing more")
            self._drop_producer()
            return self._fenced
        if self._writer is not None:
            self._drop_producer()
        return _failure(what, e)

    def append(self, topic, records):
        """Send in order and wait for every ack (acks=all); a writer's records commit in one transaction."""
        with self.transaction() as tx:
            return tx.append(topic, records)

    def transaction(self):
        """Appends that commit together (a Kafka transaction once this client is a run's writer)."""
        return _KafkaTransaction(self) if self._writer is not None else _Plain(self)

    @property
    def consumer(self):
        """Lazily created reader with no group (positions are explicit)."""
        if self._consumer is None:
            self._consumer = self._connect(
                KafkaConsumer, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest", isolation_level="read_committed",
                max_partition_fetch_bytes=max(4 << 20, 2 * self.record_bytes), fetch_max_bytes=max(64 << 20, 2 * self.record_bytes),
                request_timeout_ms=self.timeout_ms + 5000, client_id="hilo-reader")
        return self._consumer

    def read(self, topic, offset, timeout_s=1.0, max_bytes=16 << 20):
        """Records from `offset` on, from one poll. A retriable failure (a broker restarting) reads as an empty
        batch, and a reader failing twice in a row is replaced; anything else is a LogError."""
        tp = TopicPartition(topic, 0)
        try:
            c = self.consumer
            if tp not in c.assignment():
                c.assign(list(c.assignment()) + [tp])
                self._positions.pop(topic, None)
            if self._positions.get(topic) != offset:
                c.seek(tp, offset)
                self._positions[topic] = offset
            polled = c.poll(timeout_ms=int(timeout_s * 1000), max_records=500)
            # The consumer's position is past transaction markers and aborted records too, not only past records.
            position = c.position(tp, timeout_ms=int(timeout_s * 1000)) or 0
        except (KafkaError, LogError) as e:  # LogError: replacing the reader failed to connect
            if isinstance(e, LogError) and not self._reached:
                raise
            if isinstance(e, KafkaError) and not getattr(e, "retriable", False):
                raise _failure(f"{self.url}: reading {topic!r} at offset {offset}", e) from None
            self._read_failures += 1
            self._positions.pop(topic, None)  # whatever the consumer fetched is dropped: the next read seeks again
            if self._read_failures % 2 == 0:
                self._drop_consumer()
            time.sleep(min(2.0, 0.05 * 2 ** self._read_failures))  # backoff against a broker that is restarting
            return Batch([], offset)
        self._read_failures = 0
        if not polled.get(tp) and position <= offset and self._stale(topic, offset):
            return Batch([], offset)
        self._idle_since.pop(topic, None)
        out = Batch([Record(r.offset, r.key, r.value, {k: v.decode() for k, v in (r.headers or [])})
                     for r in polled.get(tp, []) if r.offset >= offset], offset)
        for other, recs in polled.items():
            if other != tp and recs:  # another assigned topic was fetched too: make it re-seek next time
                self._positions.pop(other.topic, None)
        out.next_offset = max(offset, out[-1].offset + 1 if out else offset, position)
        self._positions[topic] = out.next_offset
        return out

    def _stale(self, topic, offset) -> bool:
        """After STALE_S of empty reads, ask for the end offset: records beyond `offset` that the reader does not
        get mean a wedged reader (seen after a partition leader was SIGKILLed: kafka-python kept polling the dead
        leader), which is then replaced."""
        since = self._idle_since.setdefault(topic, time.monotonic())
        if time.monotonic() - since < STALE_S:
            return False
        self._idle_since[topic] = time.monotonic()
        if self._offset(topic, end=True) > offset:
            logger.info("%s: reader of %s gets nothing although the log has records past offset %d; reconnecting",
                        self.url, topic, offset)
            self._drop_consumer()
            return True
        return False

    def _offset(self, topic, end: bool) -> int:
        """The partition's end (last stable) or beginning offset. A consumer that times out twice in a row is
        replaced: after a broker is SIGKILLed and restarted, kafka-python's consumer was seen to keep timing out
        for minutes while a fresh client answered at once."""
        tp = TopicPartition(topic, 0)
        fails = 0
        while True:
            try:
                c = self.consumer
                return (c.end_offsets if end else c.beginning_offsets)([tp], timeout_ms=OFFSETS_TIMEOUT_MS)[tp]
            except KafkaError as e:
                fails += 1
                if not getattr(e, "retriable", False) or fails == RETRIABLE_TRIES:
                    raise _failure(f"{'end' if end else 'beginning'} offset of {topic}", e) from None
                if fails % 2 == 0:
                    self._drop_consumer()
                time.sleep(min(2.0, 0.05 * 2 ** fails))  # backoff against a broker that is still electing

    def _drop_consumer(self):
        """Close the reader; the next use connects a new one (and re-seeks: positions are forgotten)."""
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:  # noqa: BLE001  (closing a wedged client; nothing to report)
                pass
        self._consumer, self._positions = None, {}

    def begin_offset(self, topic):
        """Oldest retained offset."""
        return self._offset(topic, end=False)

    def end_offset(self, topic):
        """Last stable offset: just past the last committed record (and its transaction's marker)."""
        return self._offset(topic, end=True)

    def retention(self, topic):
        """The topic's retention.ms and retention.bytes as the broker reports them."""
        cfg = self._configs(ConfigResourceType.TOPIC, topic)
        return {k: cfg[k]["value"] for k in ("retention.ms", "retention.bytes")}

    def become_writer(self, run, version):
        """Take over the run's transactional id: every earlier producer of it is fenced; returns the producer epoch."""
        self._drop_producer()
        self._writer, self._fenced = (run, version), None
        epoch = getattr(getattr(self.producer, "_transaction_manager", None), "producer_id_and_epoch", None)
        return getattr(epoch, "epoch", None)

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


class _Plain(Transaction):
    """Appends of a client that is not a run's writer: each one idempotent, durable when it returns."""

    def append(self, topic, records):
        """Send and wait for the acks."""
        try:
            return self.log._send(topic, records)
        except KafkaError as e:
            raise self.log._fail(f"{self.log.url}: publishing to {topic!r}", e) from None


class _KafkaTransaction(Transaction):
    """One Kafka transaction: begun on enter, committed on a clean exit, aborted when the block raises."""

    def __enter__(self):
        try:
            self.log.producer.begin_transaction()
        except KafkaError as e:
            raise self.log._fail(f"{self.log.url}: beginning a transaction", e) from None
        return self

    def append(self, topic, records):
        """Send within the transaction and wait for the acks (the records stay invisible until the commit)."""
        try:
            return self.log._send(topic, records)
        except KafkaError as e:
            raise self.log._fail(f"{self.log.url}: publishing to {topic!r}", e) from None

    def __exit__(self, kind, error, tb):
        log = self.log
        if kind is None:
            try:
                _within(log.producer.commit_transaction, DELIVERY_TIMEOUT_MS / 1000)
            except KafkaError as e:
                raise log._fail(f"{log.url}: committing the transaction", e) from None
            return False
        try:
            if log._producer is not None:
                _within(log._producer.abort_transaction, 10)
        except KafkaError:  # the abort failed too: a fresh producer's init aborts the transaction instead
            log._drop_producer()
        return False
