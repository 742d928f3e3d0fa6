"""Putting one version on the log: one transaction, a failed try settled against the log, retries to a deadline.

A transport error does not say whether the broker kept the message, so a failed try asks the log: if it holds the
version (our digest), the publish happened; if it holds another message for that version, another trainer writes
the run (FencedError); if it holds neither, the message is tried again with a fresh producer, waiting 0.25 s,
0.5 s, ... 4 s between tries. While the log cannot be read at all, the outcome is unknown and the trainer waits, up
to the deadline (ProducerConfig.publish_deadline_s); on Kafka one try waits at most writer.ATTEMPT_TIMEOUT_S.
"""
import enum
import logging
import time
from dataclasses import dataclass

from hilo.log import retry
from hilo.log.tail import head
from hilo.schemas import crash_points
from hilo.schemas import headers as H
from hilo.schemas.chunks import split
from hilo.schemas.errors import FencedError, NotPublished

from .resume import catch_up

logger = logging.getLogger(__name__)


class Outcome(enum.Enum):
    """What a failed publish turned out to be, asked of the log afterwards."""

    COMMITTED = "committed"        # the log holds the message after all
    NOT_ON_LOG = "not on the log"  # safe to publish it again
    IN_DOUBT = "in doubt"          # the log could not be read: the next step resyncs before anything else


@dataclass(frozen=True)
class Published:
    """Where a version landed: its update records' offsets and, when it carried one, its checkpoint's; its size and
    how long signing and the transaction took."""

    offsets: list
    checkpoint_offsets: list | None
    nbytes: int = 0
    sign_s: float = 0.0
    transaction_s: float = 0.0


def update_headers(msg, log_bytes: int) -> dict:
    """The position headers of update `msg`, `log_bytes` through it: what readers of the tail need undecoded."""
    # `hilo lag` reads the lag from the head's headers
    return H.update_headers(msg.digest, log_bytes, msg.meta.get("lag"))


class _NotOnLog(Exception):
    """A publish failed and the log does not hold it (args[0]: the transport's error): safe to try again."""


class _Deadline(Exception):
    """A publish failed and the log could not be read before the deadline (args[0]: the transport's error)."""


class Publisher:
    """Publishes versions of one run to `log`, each in one transaction with its checkpoint when it carries one."""

    def __init__(self, log, run: str, updates: str, checkpoints: str, chunk_bytes: int, deadline_s: float, metrics,
                 outage):
        self.log, self.run, self.updates, self.checkpoints = log, run, updates, checkpoints
        self.chunk_bytes, self.deadline_s, self.metrics, self.outage = chunk_bytes, deadline_s, metrics, outage
        self.fenced = False  # another trainer took the run over: nothing more is published
        self.last_message = None  # the message of the last publish that returned (a multi-rank job's ranks apply it)

    def _fence(self, error: FencedError) -> FencedError:
        """Remember (and show) that another trainer writes the run; returns `error` to raise."""
        self.fenced = True
        self.metrics.set("fenced", 1)
        return error

    def publish(self, msg, signer, log_bytes: int, checkpoint=None, at_version: int = 0) -> Published:
        """Sign `msg` (with `signer`, or none) and append it, `log_bytes` before it, and, when `checkpoint(next update
        offset, log bytes)` is given, the checkpoint records it returns, as one transaction. NotPublished (in_doubt
        says whether the log may hold it) past the deadline; FencedError when another trainer wrote the version.
        `at_version`: the committed version (for the words)."""
        t_sign = time.perf_counter()
        data = msg.to_bytes(signer)
        t_tx = time.perf_counter()
        extra = update_headers(msg, log_bytes + len(data))
        checkpoint_records = None if checkpoint is None else (lambda offset: checkpoint(offset, log_bytes + len(data)))
        deadline = time.monotonic() + self.deadline_s

        def attempt():
            try:
                return self._append(msg, data, extra, checkpoint_records)
            except FencedError as e:
                self._fence(e)
                raise  # certain: nothing more will be written
            except Exception as e:  # noqa: BLE001  (whatever the transport raised, the broker may hold it: the log decides)
                outcome, offsets = self.settle(msg, e, deadline, at_version)
                if outcome is Outcome.COMMITTED:
                    return Published(offsets, None)
                if outcome is Outcome.IN_DOUBT:
                    raise _Deadline(e) from None
                raise _NotOnLog(e) from e

        def again(e, n):
            self.metrics.inc("publish_retries", cause=type(e.args[0]).__name__)
            self.outage.failed(e.args[0])  # said once, then every minute, while it lasts
            logger.debug("run %s: publishing v%d failed (%s) and the log does not hold it; try %d", self.run,
                         msg.version, e.args[0], n + 1)
        try:  # each try with a fresh producer (the writer drops a failed one)
            published = retry.call(attempt, retriable=lambda e: isinstance(e, _NotOnLog), attempts=None,
                                   within_s=self.deadline_s, first_s=0.25, longest_s=4.0, on_retry=again)
        except (_NotOnLog, _Deadline) as e:
            doubt = isinstance(e, _Deadline)
            where = "whether the log holds it is not known yet" if doubt else "it is not on the log"
            raise NotPublished(f"run {self.run}: v{msg.version} was not published within publish_deadline_s = "
                               f"{self.deadline_s:g}s ({where}; last error: {e.args[0]}); the trainer stays at "
                               f"v{at_version}: the next step (or a restart) resumes from the log",
                               in_doubt=doubt) from None
        self.outage.over()
        self.last_message = msg
        return Published(published.offsets, published.checkpoint_offsets, len(data), t_tx - t_sign,
                         time.perf_counter() - t_tx)

    def replay(self, replica, position, pending, on_bad_record, trust=None) -> tuple:
        """Settle an in-doubt publish of proposal `pending` by applying the log from `position` (the last committed) on
        `replica` (signed runs: what `trust`, the trainer's keyring, verifies): (the follower, whether the log holds
        `pending`). FencedError when the log moved by another message."""
        before = replica.version
        follower = catch_up(self.log, self.run, replica, position, on_bad_record, trust)
        ours = pending is not None and replica.version == pending.version and replica.digest == pending.message.digest
        if replica.version != before and not ours:  # the log moved, and not by this trainer's message
            raise self._fence(FencedError(f"run {self.run}: the log moved from v{before} to v{replica.version} (digest "
                              f"{replica.digest.hex()[:12]}) without this trainer's proposal: another trainer writes "
                              f"this run; this one publishes nothing more"))
        return follower, ours

    def _append(self, msg, data: bytes, extra: dict, checkpoint_records) -> Published:
        """One transaction: the version's chunks and, when due, its checkpoint become visible together, or not at
        all."""
        checkpoint_offsets = None
        with self.log.transaction() as tx:
            offsets = tx.append(self.updates, split(data, self.run, "update", msg.version, self.chunk_bytes, extra))
            if checkpoint_records is not None:
                checkpoint_offsets = tx.append(self.checkpoints, checkpoint_records(offsets[-1] + 1))
            crash_points.reach("trainer.in-transaction")
        crash_points.reach("trainer.committed")
        return Published(offsets, checkpoint_offsets)

    def settle(self, msg, error: Exception, deadline: float, at_version: int) -> tuple:
        """After a failed publish, ask the log what happened: (Outcome, offsets of `msg` when COMMITTED). A log that
        cannot be read is asked again until `deadline` (monotonic) and is IN_DOUBT after it. FencedError when the log
        holds another message for that version (another trainer writes the run)."""
        while True:
            try:
                h = head(self.log, self.updates, self.run) or H.RecordHeaders()
                landed = h.version == msg.version and h.digest == msg.digest.hex()
                end = self.log.end_offset(self.updates) if landed else None
                break
            except Exception as e:  # noqa: BLE001  (any failure here leaves the outcome unknown)
                if time.monotonic() >= deadline:
                    logger.warning("run %s: publishing v%d failed (%s) and the log head cannot be read (%s): staying "
                                   "at v%d, the next step resyncs from the log", self.run, msg.version, error, e,
                                   at_version)
                    return Outcome.IN_DOUBT, None
                self.outage.wait(e)
        if not landed and h.version is not None and h.version >= msg.version:  # someone else moved the run meanwhile
            raise self._fence(FencedError(f"run {self.run}: publishing v{msg.version} failed ({error}), and the log "
                                          f"holds another v{h.version} (digest {(h.digest or '?')[:12]}): another "
                                          f"trainer writes this run; this one publishes nothing more")) from None
        if not landed:
            return Outcome.NOT_ON_LOG, None
        logger.warning("run %s: publishing v%d reported %s, but the log holds it; continuing", self.run, msg.version,
                       error)
        return Outcome.COMMITTED, [end - 1]
