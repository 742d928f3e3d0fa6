"""Where the log's head stands, as a site sees it: what its lag gauges and `/readyz` compare against.

A site that has read everything the log holds is at the head whatever the last record's headers claim. Otherwise the
head is the newest message it would accept (log/tail.newest): a record it would skip (junk, a replayed old version)
says nothing of the head. Only messages past the last head found are read again, at most once a second.
"""
import time
from dataclasses import dataclass

from hilo.log.tail import newest
from hilo.replay.checks import accepts

from .lag_view import LagView

EVERY_S = 1.0  # the head is read at most this often unless forced (an applied version, an outage)


@dataclass(frozen=True)
class HeadSeen:
    """The newest accepted message found: where the log ended then, where it starts, its version and log bytes."""

    end: int = -1
    first_offset: int | None = None
    version: int = -1
    log_bytes: int = 0


class HeadWatch:
    """Reads the head of one run's updates topic for a site (`newest` with what its follower would accept)."""

    def __init__(self, log, run: str):
        self.log, self.run = log, run
        self.seen = HeadSeen()
        self.checked = 0.0  # monotonic time of the newest read

    def reset(self) -> None:
        """Forget what was found (the follower was replaced: a rebootstrap)."""
        self.seen = HeadSeen()

    def refresh(self, follower, view: LagView, force: bool = False) -> LagView:
        """`view` with the head as it stands now (unchanged within EVERY_S of the last read, unless `force`)."""
        now = time.monotonic()
        if not force and now - self.checked < EVERY_S:
            return view
        self.checked = now
        f, seen = follower, self.seen
        version, log_bytes = f.replica.version, f.log_bytes
        end = self.log.end_offset(f.topic)
        if f.read_offset < end and end != seen.end:
            found = newest(self.log, f.topic, self.run, accepts(f.replica, f.topic), after=seen.first_offset)
            if found is not None and found.version > seen.version:
                seen = HeadSeen(end, found.first_offset, found.version, found.parsed.log_bytes or 0)
            else:
                seen = HeadSeen(end, seen.first_offset, seen.version, seen.log_bytes)
            self.seen = seen
        if f.read_offset < end:
            version, log_bytes = max(version, seen.version), max(log_bytes, seen.log_bytes)
        return view.with_head(version, log_bytes)
