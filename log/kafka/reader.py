"""The reader supervisor: one kafka-python consumer per KafkaLog, its positions, and when to replace it.

Readers use manual assignment of partition 0 (no group membership) and isolation_level=read_committed, so an
aborted or half-written message is never seen; transaction markers take offsets no reader gets (see Batch).

Replacement policy (each rule covers a kafka-python behaviour seen here, with the test that shows it):
- a read that fails with a retriable error is an empty batch; every second failure in a row replaces the client
  (after a broker restart the old client kept failing where a fresh one read at once:
  tests/integration/test_cluster.py::test_the_whole_cluster_restarted_mid_run_loses_nothing);
- reconnecting while every broker is down is a retriable empty read, not a verdict on the address
  (tests/log/test_log_contract.py::test_a_reader_replaced_while_every_broker_is_down_waits_instead_of_failing);
- after STALE_S of empty reads the end offset is checked: records the reader does not get mean a wedged client
  (kafka-python kept polling a SIGKILLed leader:
  tests/integration/test_cluster.py::test_the_updates_leader_sigkilled_mid_run_loses_nothing);
- an offsets request that times out twice in a row replaces the client (same restart test).
A failed read waits before returning, but never longer than the read's own timeout. Reads that have failed for
UNAVAILABLE_AFTER_S in a row raise LogUnavailable instead (so does an offsets request after OFFSETS_PATIENCE_S): the
caller is told of an outage it should wait out, and says so (log/outage.py), instead of seeing a quiet log.
"""
import logging
import time

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from hilo.log import retry
from hilo.log.base import Batch
from hilo.schemas.chunks import Record
from hilo.schemas.errors import LogError, LogUnavailable

from .errors import failure, is_retriable

logger = logging.getLogger(__name__)
STALE_S = 10.0  # empty reads this long make a reader check that it is not wedged
OFFSETS_TIMEOUT_MS = 10_000  # one ListOffsets attempt; retried (with a fresh consumer) after that
RETRIABLE_TRIES = 20
OFFSETS_PATIENCE_S = 25.0  # an election on a 3-node cluster answers within it (a fresh client included)
UNAVAILABLE_AFTER_S = 10.0  # reads failing this long in a row are an outage, said to the caller


class ReaderSupervisor:
    """Owns the consumer and the positions.

    make_consumer: () -> a connected KafkaConsumer (or LogError); injected, so a test can play a cluster that goes away.
    reached: () -> whether the cluster was ever reached (a failed reconnect is then retriable).
    clock, sleep: time.monotonic and time.sleep unless a test drives them.
    """

    def __init__(self, make_consumer, reached, url: str, clock=time.monotonic, sleep=time.sleep):
        self.make_consumer, self.reached, self.url = make_consumer, reached, url
        self.clock, self.sleep = clock, sleep
        self._consumer = None
        self.positions = {}     # TopicPartition -> next offset the consumer will return
        self.failures = retry.Backoff(0.05, 2.0)  # consecutive failed reads, and the wait after each
        self.idle_since = {}    # TopicPartition -> when reads of it started returning nothing
        self.replaced = 0       # clients replaced so far
        self.failing_since = None  # when the reads that are failing now began failing (None: the last one worked)

    @property
    def consumer(self) -> KafkaConsumer:
        """The current client, connected on first use."""
        if self._consumer is None:
            self._consumer = self.make_consumer()
        return self._consumer

    def replace(self) -> None:
        """Close the client; the next use connects a new one (and re-seeks: positions are forgotten)."""
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:  # noqa: BLE001  (closing a wedged client; nothing to report)
                pass
            self.replaced += 1
        self._consumer, self.positions = None, {}

    def read(self, topic, offset, timeout_s=1.0, partition=0) -> Batch:
        """Records of `partition` from `offset` on, from one poll. A retriable failure (a broker restarting) reads as
        an empty batch; anything else is a LogError."""
        tp = TopicPartition(topic, partition)
        t0 = self.clock()
        try:
            c = self.consumer
            if tp not in c.assignment():
                c.assign(list(c.assignment()) + [tp])
                self.positions.pop(tp, None)
            if self.positions.get(tp) != offset:
                c.seek(tp, offset)
                self.positions[tp] = offset
            polled = self._poll(c, tp, t0 + timeout_s)
            # The consumer's position is past transaction markers and aborted records too, not only past records.
            position = c.position(tp, timeout_ms=int(timeout_s * 1000)) or 0
        except (KafkaError, LogError) as e:  # LogError: connecting a new client failed
            if isinstance(e, LogError) and not self.reached():
                raise
            if isinstance(e, KafkaError) and not is_retriable(e):
                raise failure(f"{self.url}: reading {topic!r} at offset {offset}", e) from None
            self.positions.pop(tp, None)  # whatever the consumer fetched is dropped: the next read seeks again
            if self.failing_since is None:
                self.failing_since = t0
            elif self.clock() - self.failing_since >= UNAVAILABLE_AFTER_S:
                self.replace()
                raise LogUnavailable(f"{self.url}: reading {topic!r} has failed for "
                                     f"{self.clock() - self.failing_since:.0f}s ({type(e).__name__}: {e})") from None
            wait = self.failures.next()
            if self.failures.failures % 2 == 0:
                self.replace()
            self.sleep(max(0.0, min(wait, timeout_s - (self.clock() - t0))))  # backoff, within this read's timeout
            return Batch([], offset)
        self.failures.reset()
        self.failing_since = None
        if not polled.get(tp) and position <= offset and self._stale(tp, offset):
            return Batch([], offset)
        self.idle_since.pop(tp, None)
        out = Batch([Record(r.offset, r.key, r.value, {k: v.decode() for k, v in (r.headers or [])},
                            r.timestamp / 1000 if r.timestamp is not None and r.timestamp >= 0 else None)
                     for r in polled.get(tp, []) if r.offset >= offset], offset)
        out.next_offset = max(offset, out[-1].offset + 1 if out else offset, position)
        self.positions[tp] = out.next_offset
        return out

    def _poll(self, c, tp, deadline: float) -> dict:
        """Poll until `tp` gets records, a poll gets none, or `deadline`. Records the consumer fetched ahead for another
        partition come first (a burst of junk on RUN.updates: 500 a poll), and a read of `tp` that stopped at them came
        back empty as if `tp` held nothing; they are dropped, and that partition's next read seeks again."""
        while True:
            polled = c.poll(timeout_ms=max(0, int((deadline - self.clock()) * 1000)), max_records=500)
            for other, recs in polled.items():
                if other != tp and recs:
                    self.positions.pop(other, None)
            if polled.get(tp) or not polled or self.clock() >= deadline:
                return polled

    def _stale(self, tp, offset) -> bool:
        """After STALE_S of empty reads, ask for the end offset: records beyond `offset` that the reader does not
        get mean a wedged reader, which is then replaced."""
        since = self.idle_since.setdefault(tp, self.clock())
        if self.clock() - since < STALE_S:
            return False
        self.idle_since[tp] = self.clock()
        if self.offset(tp.topic, end=True, partition=tp.partition) > offset:
            logger.info("%s: reader of %s[%d] gets nothing although the log has records past offset %d; reconnecting",
                        self.url, tp.topic, tp.partition, offset)
            self.replace()
            return True
        return False

    def offset(self, topic, end: bool, partition: int = 0) -> int:
        """The partition's end (last stable) or beginning offset; a client that times out twice in a row is replaced."""
        tp = TopicPartition(topic, partition)

        def ask():
            c = self.consumer
            return (c.end_offsets if end else c.beginning_offsets)([tp], timeout_ms=OFFSETS_TIMEOUT_MS)[tp]

        def on_retry(e, attempt):
            if attempt % 2 == 0:
                self.replace()
        try:
            return retry.call(ask, retriable=is_retriable, attempts=RETRIABLE_TRIES, within_s=OFFSETS_PATIENCE_S,
                              on_retry=on_retry, sleep=self.sleep)
        except KafkaError as e:
            raise failure(f"{'end' if end else 'beginning'} offset of {topic}", e) from None

    def close(self) -> None:
        """Close the client."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
