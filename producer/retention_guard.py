"""Keep a run joinable under retention: checkpoint before the newest checkpoint, or the updates after it, can expire.

A late site bootstraps from the newest checkpoint and replays the updates after it. Kafka keeps a record at least
retention.ms (it deletes a whole segment once its newest record is older) and the newest retention.bytes of the
partition. So a new site can join only while both the newest checkpoint (RUN.checkpoints' limits) and the first
update after it (RUN.updates' limits) are retained. The trainer, the only writer, knows what it wrote and when: it
publishes a checkpoint once SHARE of a limit has passed since what that limit applies to. Operators change limits
while a run goes on (to reclaim disk), so the limits of both topics are read again every READ_SHARE of the shortest
retention.ms (at most every READ_EVERY_MAX_S), each change is logged, and the next version carries a checkpoint
where the new limit puts the run at risk. A restarted trainer does not know when the updates it found were written,
so its first version carries a checkpoint. A retention.bytes on RUN.checkpoints below one checkpoint keeps none
whole: said in one line (when the size is first known, and when that limit changes).
"""
import logging
import math
import time
from dataclasses import dataclass

from hilo.log import checkpoints_topic, updates_topic
from hilo.schemas.errors import LogError

logger = logging.getLogger(__name__)

SHARE = 0.5  # of a limit: leaves the other half for a checkpoint publish that fails and is retried
READ_SHARE = 0.1  # the limits are read again every tenth of the shortest retention.ms ...
# ... and at least every 10 s: a limit lowered from unlimited (a tenth of which is no bound) is seen that soon. A
# minute was too slow: lowered to 20 s, the newest checkpoint expired before the trainer read the change.
READ_EVERY_MAX_S = 10.0


def limit_of(text) -> int | None:
    """A retention setting as the log reports it; None for unlimited (-1) or unknown."""
    try:
        v = int(str(text).split()[0])
    except (ValueError, IndexError):
        return None
    return v if v > 0 else None


def _shown(v: int | None) -> str:
    return "unlimited" if v is None else str(v)


@dataclass(frozen=True)
class Limits:
    """retention.ms and retention.bytes of one topic (None: unlimited)."""

    ms: int | None = None
    bytes: int | None = None

    @classmethod
    def of(cls, log, topic: str) -> "Limits":
        """`topic`'s limits on `log` (the file log keeps everything: unlimited)."""
        r = log.retention(topic)
        return cls(limit_of(r.get("retention.ms")), limit_of(r.get("retention.bytes")))

    def changes(self, new: "Limits") -> list:
        """'retention.ms OLD -> NEW' per limit that differs in `new`."""
        return [f"{name} {_shown(a)} -> {_shown(b)}" for name, a, b in
                (("retention.ms", self.ms, new.ms), ("retention.bytes", self.bytes, new.bytes)) if a != b]


class RetentionGuard:
    """The limits of run `run`'s two topics on `log`, read again as they change, and what was written since the newest
    checkpoint: whether the next version must carry a checkpoint (`due`) and until when a new site can join."""

    def __init__(self, log, run: str):
        self.log, self.run = log, run
        self.updates, self.checkpoints = updates_topic(run), checkpoints_topic(run)
        # at start a failure is the log's error
        self.limits = {t: Limits.of(log, t) for t in (self.updates, self.checkpoints)}
        self.read_at = time.monotonic()
        self.checkpoint_at = None     # unix time the newest checkpoint was published (None: not by this process)
        self.checkpoint_bytes = None  # bytes of the newest checkpoint this process published
        self.first_update_at = None   # unix time of the first update after the newest checkpoint
        self.bytes_since = 0          # update bytes written since the newest checkpoint
        self.restarted = True         # nothing known about the updates already on the log
        self.said_unkeepable = None   # the RUN.checkpoints retention.bytes last said to keep no checkpoint

    @property
    def limited(self) -> bool:
        """Whether anything can expire."""
        return any(v is not None for lim in self.limits.values() for v in (lim.ms, lim.bytes))

    @property
    def interval_s(self) -> float:
        """Seconds between two reads of the limits."""
        ms = [lim.ms for lim in self.limits.values() if lim.ms is not None]
        return min([READ_EVERY_MAX_S] + [READ_SHARE * m / 1e3 for m in ms])

    def refresh(self) -> None:
        """Read the limits again once `interval_s` has passed; log each change. A failed read keeps the old ones."""
        if time.monotonic() - self.read_at < self.interval_s:
            return
        self.read_at = time.monotonic()
        try:
            new = {t: Limits.of(self.log, t) for t in self.limits}
        except LogError as e:  # the guard goes on with what it knew; the next read may succeed
            logger.warning("run %s: reading the topics' retention again failed (%s); keeping the limits read before",
                           self.run, e)
            return
        changes = [(topic, change) for topic, lim in new.items() for change in self.limits[topic].changes(lim)]
        self.limits = new
        for topic, change in changes:
            logger.warning("run %s: %s %s (the retention guard follows it; read again every %.1fs)", self.run, topic,
                           change, self.interval_s)
        self._say_unkeepable()

    def due(self, now: float | None = None) -> str | None:
        """Why the next version must carry a checkpoint, or None (the limits are read again first, when due)."""
        self.refresh()
        if not self.limited:
            return None
        if self.restarted:
            return "restarted: when the updates after the newest checkpoint were written is unknown"
        now = time.time() if now is None else now
        upd, ckpt = self.limits[self.updates], self.limits[self.checkpoints]
        if upd.ms and self.first_update_at is not None and (now - self.first_update_at) * 1e3 >= SHARE * upd.ms:
            return (f"the updates after it were first written {now - self.first_update_at:.0f}s ago ({self.updates} "
                    f"retention.ms {upd.ms})")
        if upd.bytes and self.bytes_since >= SHARE * upd.bytes:
            return f"{self.bytes_since} update bytes written since it ({self.updates} retention.bytes {upd.bytes})"
        if ckpt.ms and self.checkpoint_at is not None and (now - self.checkpoint_at) * 1e3 >= SHARE * ckpt.ms:
            return f"it was published {now - self.checkpoint_at:.0f}s ago ({self.checkpoints} retention.ms {ckpt.ms})"
        return None

    def joinable_until(self) -> float:
        """Unix time until which a new site can join from the newest checkpoint as things stand (inf: nothing can
        expire; nan: unknown, a restarted trainer before its first checkpoint). Past `now` where the bytes after it
        exceed a limit."""
        upd, ckpt = self.limits[self.updates], self.limits[self.checkpoints]
        if not self.limited:
            return math.inf
        if self.checkpoint_at is None:
            return math.nan
        until = [self.checkpoint_at + ckpt.ms / 1e3] if ckpt.ms else []
        if upd.ms and self.first_update_at is not None:
            until.append(self.first_update_at + upd.ms / 1e3)
        if (upd.bytes and self.bytes_since > upd.bytes) or self._unkeepable():
            until.append(0.0)
        return min(until, default=math.inf)

    def joinable(self, now: float | None = None) -> float:
        """1 when a new site can join now, 0 when it cannot, -1 when unknown (`joinable_until` is nan)."""
        until = self.joinable_until()
        return -1.0 if math.isnan(until) else float((time.time() if now is None else now) < until)

    def on_checkpoint(self, nbytes: int | None = None, now: float | None = None) -> None:
        """A checkpoint (of `nbytes`) of the newest version is on the log."""
        self.checkpoint_at = time.time() if now is None else now
        self.first_update_at, self.bytes_since, self.restarted = None, 0, False
        if nbytes is not None:
            self.checkpoint_bytes = nbytes
            self._say_unkeepable()

    def on_update(self, nbytes: int, now: float | None = None) -> None:
        """An update without a checkpoint is on the log."""
        if self.first_update_at is None:
            self.first_update_at = time.time() if now is None else now
        self.bytes_since += nbytes

    def _unkeepable(self) -> bool:
        """Whether RUN.checkpoints' retention.bytes is below one checkpoint (Kafka then keeps none whole)."""
        limit = self.limits[self.checkpoints].bytes
        return limit is not None and self.checkpoint_bytes is not None and limit < self.checkpoint_bytes

    def _say_unkeepable(self) -> None:
        """One line when the checkpoints topic cannot keep a checkpoint, once per limit."""
        limit = self.limits[self.checkpoints].bytes
        if self._unkeepable() and self.said_unkeepable != limit:
            logger.warning("run %s: %s retention.bytes %d is below one checkpoint (%d bytes): the topic cannot keep a "
                           "whole checkpoint, so no new site can join; raise it above %d or unset it", self.run,
                           self.checkpoints, limit, self.checkpoint_bytes, self.checkpoint_bytes)
            self.said_unkeepable = limit
