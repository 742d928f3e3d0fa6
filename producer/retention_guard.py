"""Keep a run joinable under retention: checkpoint before the updates after the newest checkpoint can expire.

A late site bootstraps from the newest checkpoint and replays the updates after it. Kafka keeps a record at least
retention.ms (it deletes a whole segment once its newest record is older) and the newest retention.bytes of the
partition. So once the first update after the newest checkpoint may expire, no site can join until the next
checkpoint. The trainer, the only writer, knows both limits and what it wrote: it publishes a checkpoint when
SHARE of either has passed since that first update. A restarted trainer does not know when the updates it found
were written, so its first version carries a checkpoint.
"""
import time
from dataclasses import dataclass

SHARE = 0.5  # of retention.ms / retention.bytes: leaves the other half for a checkpoint publish that fails and is retried


def _limit(text) -> int | None:
    """A retention setting as the log reports it; None for unlimited (-1) or unknown."""
    try:
        v = int(str(text).split()[0])
    except (ValueError, IndexError):
        return None
    return v if v > 0 else None


@dataclass
class RetentionGuard:
    """retention_ms / retention_bytes of the updates topic (None: unlimited); what was written since the newest checkpoint."""

    retention_ms: int | None
    retention_bytes: int | None
    first_update_at: float | None = None   # unix time of the first update after the newest checkpoint
    bytes_since: int = 0                   # update bytes written since the newest checkpoint
    restarted: bool = True                 # nothing known about the updates already on the log

    @classmethod
    def of(cls, log, topic: str) -> "RetentionGuard":
        """The guard for `topic`'s retention on `log` (the file log keeps everything: never due)."""
        r = log.retention(topic)
        return cls(_limit(r.get("retention.ms")), _limit(r.get("retention.bytes")))

    @property
    def limited(self) -> bool:
        """Whether anything can expire."""
        return self.retention_ms is not None or self.retention_bytes is not None

    def due(self, now: float | None = None) -> str | None:
        """Why the next version must carry a checkpoint, or None."""
        if not self.limited:
            return None
        if self.restarted:
            return "restarted: when the updates after the newest checkpoint were written is unknown"
        now = time.time() if now is None else now
        if self.retention_ms and self.first_update_at is not None and (now - self.first_update_at) * 1e3 >= SHARE * self.retention_ms:
            return f"the updates after it were first written {now - self.first_update_at:.0f}s ago (retention.ms {self.retention_ms})"
        if self.retention_bytes and self.bytes_since >= SHARE * self.retention_bytes:
            return f"{self.bytes_since} update bytes written since it (retention.bytes {self.retention_bytes})"
        return None

    def on_checkpoint(self) -> None:
        """A checkpoint of the newest version is on the log."""
        self.first_update_at, self.bytes_since, self.restarted = None, 0, False

    def on_update(self, nbytes: int, now: float | None = None) -> None:
        """An update without a checkpoint is on the log."""
        if self.first_update_at is None:
            self.first_update_at = time.time() if now is None else now
        self.bytes_since += nbytes
