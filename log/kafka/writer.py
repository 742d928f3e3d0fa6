"""The producer side of one KafkaLog: idle, then (once `become`) the run's transactional writer, then fenced.

Idempotent, acks=all, no client compression (messages are zstd already), one in-flight request so chunks of one
message land in order. As a run's writer the producer is transactional with transactional.id `hilo.RUN`: its
init fences every earlier producer of the run (a zombie trainer's next write fails, and its open transaction is
aborted), and a version's chunks (with its checkpoint's) commit in one transaction. Once fenced, every later
append raises the same FencedError.
"""
import enum
import time

from kafka import KafkaProducer
from kafka.errors import KafkaError

from hilo.log.base import Transaction
from hilo.schemas.errors import FencedError

from .deadline import call_within
from .errors import failure, is_fenced

DELIVERY_TIMEOUT_MS = 60_000  # how long a plain (non-transactional) append may retry through a leader election
# How long one step of a transactional publish (init, sends, commit) may wait on the cluster before this producer is
# dropped and the trainer tries a fresh one. Workaround: kafka-python keeps dialling a dead transaction coordinator
# ("Node coordinator-N not ready after 30000 ms", then it backs off and dials the same node) instead of looking the
# coordinator up again; a fresh producer's init finds the new one. Shown by
# tests/integration/test_cluster.py::test_the_updates_leader_sigkilled_mid_run_loses_nothing[txn-coordinator]
# (the trainer stalled 60 s, the old bound, before this one).
ATTEMPT_TIMEOUT_S = 10.0
ABORT_TIMEOUT_S = 10.0


class WriterState(enum.Enum):
    """Where the writer is."""

    IDLE = "idle"          # plain idempotent appends (tools, benchmarks)
    WRITER = "writer"      # the run's transactional writer
    FENCED = "fenced"      # a newer producer of the run took over: nothing more is written


DISCARD_JOIN_S = 2.0  # how long a dropped producer's I/O thread is given to fail what it holds and close its sockets


def discard(producer: KafkaProducer) -> None:
    """Close a producer whose unsent records are not wanted (the log decides what landed), without waiting on the
    cluster. `close(timeout=0)` alone flushes first, which raises while records are pending; the producer then stayed
    open and its `__del__` printed a traceback later. Failing the pending records first lets close finish."""
    sender = getattr(producer, "_sender", None)  # kafka-python's I/O thread: no public close-without-flush
    try:
        if sender is not None:
            sender.force_close()  # fails every pending batch, wakes the waiters, closes the network client
            sender.join(DISCARD_JOIN_S)
        producer.close(timeout=0)
    except Exception:  # noqa: BLE001  (closing a broken client; nothing to report)
        producer._closed = True  # what close() would have ended with: its __del__ must not try (and print) again


class Writer:
    """The producer of one KafkaLog (connection.Connector), sized for records of `record_bytes`."""

    def __init__(self, connector, timeout_ms: int, record_bytes: int):
        self.connector, self.timeout_ms, self.record_bytes = connector, timeout_ms, record_bytes
        self.url = connector.url
        self.state = WriterState.IDLE
        self.run = self.since_version = None   # the run and the version this client became its writer at
        self.fenced_error = None
        self._producer = None

    def become(self, run: str, version: int) -> None:
        """Take over the run's transactional id now: every earlier producer of it is fenced."""
        self.drop()
        self.state, self.run, self.since_version, self.fenced_error = WriterState.WRITER, run, version, None
        self.producer  # noqa: B018  (init_transactions is what fences the others)

    @property
    def producer(self) -> KafkaProducer:
        """The producer, created (and, as a writer, initialised for transactions) on first use."""
        if self.state is WriterState.FENCED:
            raise self.fenced_error
        if self._producer is None:
            # retry_backoff_ms: a transaction begun right after a commit is answered CONCURRENT_TRANSACTIONS until the
            # commit's markers are written; kafka-python's default 100 ms backoff made every version cost 108 ms
            # (2 ms without a transaction); 10 ms makes it ~15 ms.
            txn = ({"transactional_id": f"hilo.{self.run}", "retry_backoff_ms": 10,
                    "max_block_ms": int(ATTEMPT_TIMEOUT_S * 1000)}
                   if self.state is WriterState.WRITER else {})
            self._producer = self.connector.connect(
                KafkaProducer, acks="all", enable_idempotence=True, linger_ms=0,
                max_in_flight_requests_per_connection=1, max_request_size=self.record_bytes,
                request_timeout_ms=self.timeout_ms, delivery_timeout_ms=DELIVERY_TIMEOUT_MS, client_id="hilo-producer",
                **txn)
            if txn:
                try:  # fences every earlier producer of this transactional id and aborts its open transaction
                    self._producer.init_transactions()
                except KafkaError as e:
                    self.drop()
                    raise failure(f"{self.url}: becoming the writer of run {self.run}", e) from None
        return self._producer

    def drop(self) -> None:
        """Close the producer without waiting; the next use makes (and, if transactional, re-initialises) a new one.
        After an indefinite error (a timeout) a transactional producer's state cannot be trusted (Jepsen found
        anomalies there): a fresh one, plus the log head, decides what happened."""
        if self._producer is not None:
            discard(self._producer)
        self._producer = None

    def send(self, topic, records, partition=0) -> list:
        """Send in order to `partition` and wait for every ack (acks=all); the records' offsets."""
        p = self.producer
        futures = [p.send(topic, value=v, key=k, partition=partition,
                          headers=[(hk, hv.encode()) for hk, hv in h.items()])
                   for k, v, h in records]
        # A plain producer retries through a leader election up to its delivery timeout: wait for that, not less. A
        # writer waits one attempt and then tries a fresh producer (ATTEMPT_TIMEOUT_S).
        wait_s = ATTEMPT_TIMEOUT_S if self.state is WriterState.WRITER else DELIVERY_TIMEOUT_MS / 1000 + 5
        deadline = time.monotonic() + wait_s
        p.flush(timeout=wait_s)
        return [f.get(timeout=max(0.0, deadline - time.monotonic())).offset for f in futures]

    def fail(self, what, e):
        """The error to raise for a failed publish: FencedError (for good) once a newer writer took over."""
        if is_fenced(e) and self.state is WriterState.WRITER:
            self.state = WriterState.FENCED
            self.fenced_error = FencedError(
                f"{self.url}: run {self.run}: this trainer (writer since v{self.since_version}) was fenced: a newer "
                f"producer of transactional id hilo.{self.run} (another trainer of this run) took over; it publishes "
                f"nothing more")
            self.drop()
            return self.fenced_error
        if self.state is WriterState.WRITER:
            self.drop()
        return failure(what, e)

    def transaction(self) -> Transaction:
        """Appends that commit together (a Kafka transaction once this client is a run's writer)."""
        return KafkaTransaction(self) if self.state is not WriterState.IDLE else Plain(self)

    def close(self) -> None:
        """Close the producer, letting sent records finish."""
        if self._producer is not None:
            self._producer.close()
            self._producer = None


class Plain(Transaction):
    """Appends of a client that is not a run's writer: each one idempotent, durable when it returns."""

    def append(self, topic, records, partition=0):
        """Send and wait for the acks."""
        try:
            return self.log.send(topic, records, partition)
        except KafkaError as e:
            raise self.log.fail(f"{self.log.url}: publishing to {topic!r}", e) from None


class KafkaTransaction(Plain):
    """One Kafka transaction: begun on enter, committed on a clean exit, aborted when the block raises."""

    def __enter__(self):
        try:
            self.log.producer.begin_transaction()
        except KafkaError as e:
            raise self.log.fail(f"{self.log.url}: beginning a transaction", e) from None
        return self

    def __exit__(self, kind, error, tb):
        w = self.log
        if kind is None:
            try:
                call_within(w.producer.commit_transaction, ATTEMPT_TIMEOUT_S, on_abandon=w.drop)
            except KafkaError as e:
                raise w.fail(f"{w.url}: committing the transaction", e) from None
            return False
        if w._producer is not None:
            try:
                call_within(w._producer.abort_transaction, ABORT_TIMEOUT_S, on_abandon=w.drop)
            except KafkaError:  # the abort failed too: a fresh producer's init aborts the transaction instead
                w.drop()
        return False
