"""When a site saves its snapshot (state + position, replaced atomically): every K applied versions or every S
seconds, whichever bound is reached first, written by a background thread while the site goes on applying; and on
exit, synchronously, so a clean stop leaves one at the head.

A crash at any instant restarts from a whole snapshot and replays the rest; replay is deterministic, so it reaches
the same digests. The replica only ever holds a fully applied, digest-checked version: saving it is always safe.

In the background: between two versions (the only time the replica's buffers are still: a recycling replica writes
the next version into the ones it replaced, replica.recycle) the state is copied into a second set of buffers, kept
from one snapshot to the next, with its version, digest, history, recent digests and the follower's position of that
version; one thread writes the copy (replay/snapshot.py) while the loop applies the next versions. The loop stalls
for the copy, not the write: at 1.7B/AdamW 0.13-0.15 s against the 3.8 s (13.7 s in docs/results/replay.json) of a
synchronous msgpack + zstd save (docs/results/snapshot.json); the copy costs a third set of state buffers (837 MB
there).
"""
import collections
import logging
import time

import numpy as np
import torch

from hilo.log import threads
from hilo.replica.replica import PolicyReplica
from hilo.replica.state import ReplicaState
from hilo.schemas.errors import DivergenceError, HiloError, StateNotWritten

logger = logging.getLogger(__name__)


class SnapshotFailed(HiloError):
    """The background writer could not write a snapshot (the previous one is whole): the site stops on it."""


class StateCopy:
    """A second set of a replica's tensors that snapshots are copied into, reused from one snapshot to the next
    (a 1.7B/AdamW state is 837 MB: allocated once, not per snapshot)."""

    def __init__(self):
        self.key, self.params, self.slots = None, [], {}

    def reserve(self, state: ReplicaState) -> None:
        """Allocate the buffers for states shaped like `state` and touch every page, so the first copy in the apply loop
        pays no page faults (at 1.7B/AdamW they made it 0.36 s against 0.13-0.15). Reads `state`'s shapes only, so it
        runs on a thread of its own while the loop goes on (Snapshots.applied starts it at a site's first version)."""
        key = (state.manifest.manifest_id, state.optimizer, tuple(state.slots))
        if key != self.key:  # the first snapshot, or another adapter or optimizer
            new = lambda t: torch.from_numpy(np.zeros(tuple(t.shape), np.float32))  # noqa: E731  (np.zeros: one thread)
            self.params = [new(t) for t in state.params]
            self.slots = {k: [new(t) for t in ts] for k, ts in state.slots.items()}
            for t in self.params + [t for ts in self.slots.values() for t in ts]:
                t.numpy().fill(0.0)  # np.zeros maps untouched pages: touch them here, not in the loop's copy
            self.key = key

    def take(self, replica: PolicyReplica) -> PolicyReplica:
        """A replica holding a copy of `replica`'s state (in this set's buffers), digest, history and recent digests.
        Between versions only; the copy's buffers are overwritten by the next `take`."""
        s = replica.state
        self.reserve(s)
        # numpy's copy, one thread: torch's copy_ splits each block over its intra-op threads, which on a site's few
        # shared cores made the copy 4-6x slower (0.74 s against 0.13-0.2 s at 1.7B/AdamW on 2 busy cores)
        for dst, src in zip(self.params + [t for ts in self.slots.values() for t in ts],
                            list(s.params) + [t for ts in s.slots.values() for t in ts]):
            np.copyto(dst.numpy(), src.detach().numpy())
        copy = PolicyReplica(ReplicaState(s.manifest, s.optimizer, s.version, self.params, self.slots, dict(s.scalars)),
                             replica.run, replica.limits, replica.digest, replica.genesis, replica.nonce)
        copy.recent = collections.OrderedDict(replica.recent)
        return copy


class Snapshots:
    """The cadence of one site's snapshots into `store` (replay/snapshot.py): every `every` applied versions, or
    every `every_s` seconds (of `clock`) when set, whichever comes first; at most one being written at a time."""

    def __init__(self, store, every: int, metrics, every_s: float | None = None, clock=time.monotonic):
        self.store, self.every, self.every_s, self.metrics, self.clock = store, every, every_s, metrics, clock
        self.since = 0                # versions applied since the last snapshot was taken
        self.last_at = clock()        # when it was taken (or this site started)
        self.copy = StateCopy()
        self.writer = None            # the thread writing a copy, while one is (or until it is joined)
        self.failure = None           # (version, error) of a background write that failed, until it is raised
        self.saved = None             # (version, next offset) of the newest snapshot written
        self.touched = False          # a version was applied here (so a clean stop has something to leave)
        self.deferred = False         # a due snapshot is waiting for the writer
        self.skipped = 0              # due snapshots that waited for the writer
        self.failures = 0             # background writes that failed
        # what snapshots cost, for the site's history: drained by `drain` (list.append is atomic)
        self.notes = []
        # the thread allocating the copy's buffers at the first version (StateCopy.reserve)
        self.reserver = None
        self.refused = None           # the StateNotWritten the site stops on: no snapshot is tried after it

    def due(self) -> bool:
        """Either bound reached since the last snapshot was taken."""
        return self.since >= self.every or (self.every_s is not None and self.clock() - self.last_at >= self.every_s)

    @property
    def busy(self) -> bool:
        """A snapshot is being written."""
        return self.writer is not None and self.writer.is_alive()

    def applied(self, follower, now: float) -> None:
        """One more version applied (wall time `now`): raise a background write's failure (once); else start a
        snapshot when one is due and none is being written.

        A due snapshot while one is still being written is not taken now: it stays due, is counted (`skipped`),
        and is taken at the first version after the writer finishes. That is safe because a snapshot only bounds
        how much a site replays after a crash: any whole snapshot plus deterministic replay reaches the same digests,
        so a later one is as correct and the one in flight (or the old one, until it lands) covers the crash meanwhile.
        """
        self.check()
        self.touched = True
        self.since += 1
        if self.reserver is None:  # the first version: the copy's buffers, allocated and touched off the loop
            self.reserver = threads.start(self.copy.reserve, "snapshot-reserve", follower.replica.state)
        if not self.due():
            return
        if self.busy:
            if not self.deferred:
                self.deferred, self.skipped = True, self.skipped + 1
                self.metrics.inc("snapshots_deferred")
                logger.info("snapshot of v%d deferred: the previous one is still being written",
                            follower.replica.version)
            return
        self.reserver.join()  # long done by the first due snapshot, unless it is due at the first version
        t0 = time.perf_counter()
        copy, position = self.copy.take(follower.replica), follower.position(saved_at=now)  # between versions
        copy_s = time.perf_counter() - t0
        self.metrics.observe("stage_seconds", copy_s, stage="snapshot_copy")
        self.notes.append({"snapshot": copy.version, "copy_s": round(copy_s, 4)})
        self.since, self.last_at, self.deferred = 0, self.clock(), False
        self.writer = threads.start(self._write, f"snapshot-v{copy.version}", copy, position)

    def _write(self, copy: PolicyReplica, position) -> None:
        """The writer thread: check the copy is the version it says, write it; a failure is kept for `applied`."""
        t0 = time.perf_counter()
        try:
            held = copy.state.digest()
            if held != copy.digest:  # a copy taken while the state moved: never saved under this version
                raise DivergenceError(f"the copy of v{copy.version} hashes to {held.hex()}, not {copy.digest.hex()}")
            self.store.save(copy, position, written=self._counter(t0))
        except Exception as e:
            self.failure, self.failures = (copy.version, e), self.failures + 1
            self.metrics.inc("snapshot_failures")
            if not isinstance(e, StateNotWritten):  # that one is said by the site stopping on it (`check`), in one line
                logger.error("snapshot of v%d failed in the background: %s; the previous snapshot is whole",
                             copy.version,
                             f"{type(e).__name__}: {e}")
            return
        self.saved = (copy.version, position.next_offset)
        self.notes.append({"snapshot_written": copy.version, "write_s": round(time.perf_counter() - t0, 4),
                           "bytes": self.store.size()})

    def _counter(self, t0: float):
        """What `store.save` calls when a snapshot begun at `t0` is whole on disk: it is counted (stage "snapshot")
        before it is put in place, so a scrape that finds it in the state dir finds it counted (counted after the save
        returned, after the old one was removed, a scrape in between showed one snapshot fewer than the dir held)."""
        return lambda: self.metrics.observe("stage_seconds", time.perf_counter() - t0, stage="snapshot")

    def drain(self) -> list:
        """The notes since the last drain (taken: the loop's copy seconds; written: the writer's seconds and bytes)."""
        out, self.notes = self.notes, []
        return out

    def check(self) -> None:
        """Join a finished writer; raise its failure, once (the site checks between reads too, so an idle site stops as
        soon). The site stops on it (Site.run), as it did when the write was synchronous: a write that failed (disk
        full, permissions, I/O) will fail again, and a site going on would leave its snapshot ever further behind,
        unbounding the replay a crash costs, with nothing but a log line to say so (docs/operations.md: out of
        space)."""
        if self.writer is not None and not self.writer.is_alive():
            self.writer.join()
            self.writer = None
        if self.failure is not None:
            (version, error), self.failure = self.failure, None
            if isinstance(error, StateNotWritten):
                self.refused = error
                raise error
            raise SnapshotFailed(f"snapshot of v{version} to {self.store.path}: {type(error).__name__}: {error}; the "
                                 f"previous snapshot is whole (a restart replays from it)") from error

    def wait(self) -> None:
        """Until the snapshot being written (if any) is written or has failed."""
        if self.reserver is not None:
            self.reserver.join()
        if self.writer is not None:
            self.writer.join()
            self.writer = None

    def save(self, follower, now: float) -> None:
        """Save `follower`'s replica and position now (wall time `now`), atomically, after the write in flight. Its
        outcome supersedes a failed background write's: it raises itself if it fails. Nothing is tried once the disk
        refused a snapshot (the site is stopping on that)."""
        self.wait()
        self.failure = None
        if self.refused is not None:
            return
        try:
            self.store.save(follower.replica, follower.position(saved_at=now),
                            written=self._counter(time.perf_counter()))
        except StateNotWritten as e:
            self.refused = e
            raise
        self.saved = (follower.replica.version, follower.next_offset)
        self.since, self.last_at, self.deferred = 0, self.clock(), False

    def close(self, follower, now: float) -> None:
        """On exit: wait for the write in flight, then save synchronously unless the newest snapshot is already at the
        head (nothing was applied here, or `save` just ran). Idempotent."""
        self.wait()
        if follower is not None and self.touched and self.saved != (follower.replica.version, follower.next_offset):
            self.save(follower, now)
