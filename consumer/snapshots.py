"""When a site saves its snapshot (state + position, replaced atomically): every K applied versions, and on exit.

A crash at any instant restarts from a whole snapshot and replays the rest; replay is deterministic, so it reaches
the same digests. The replica only ever holds a fully applied, digest-checked version: saving it is always safe.
"""
import time


class Snapshots:
    """The cadence of one site's snapshots into `store` (replay/snapshot.py), every `every` applied versions."""

    def __init__(self, store, every: int, metrics):
        self.store, self.every, self.metrics = store, every, metrics
        self.since = 0  # versions applied since the last snapshot

    def applied(self, follower, now: float) -> None:
        """One more version applied: save when `every` have been since the last snapshot."""
        self.since += 1
        if self.since >= self.every:
            self.save(follower, now)

    def save(self, follower, now: float) -> None:
        """Save `follower`'s replica and position now (wall time `now`), atomically."""
        t0 = time.perf_counter()
        self.store.save(follower.replica, follower.position(saved_at=now))
        self.metrics.observe("stage_seconds", time.perf_counter() - t0, stage="snapshot")
        self.since = 0
