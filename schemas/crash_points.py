"""Named crash points for fault tests (as etcd's gofail): the process SIGKILLs itself at the Nth pass of a point.

    HILO_CRASH_AT=follower.applying:3 hilo consume ...   # dies the 3rd time a version is about to be applied
    HILO_PAUSE_AT=trainer.encoded:2 hilo produce ...     # stops (SIGSTOP) at its 2nd proposal until sent SIGCONT

Unset (the normal case) every `reach` is one dict lookup. The points are a table, so the fault tests and
`hilo bench faults` iterate the same names the code passes. It lives in schemas/, the lowest layer, so every layer
(the follower, the snapshot store, the log's prompt queues, the trainer, the site) may mark a point without an upward
import; it is no part of the wire format.
"""
import os
import signal

from hilo.schemas.errors import ConfigError

POINTS = {
    # sites (and a trainer catching up: the follower is shared)
    "follower.fetched": "a batch of records was read, none applied yet (mid-fetch)",
    "follower.applying": "a version decoded and verified, about to be applied (mid-apply)",
    "follower.applied": "a version applied in memory, before the snapshot and the group commit",
    "snapshot.written": "the new snapshot is written beside the old one",
    "snapshot.old-moved": "the old snapshot is moved aside, the new one not yet in place (between the renames)",
    "snapshot.new-in-place": "the new snapshot is in place, the old one not yet removed",
    "export.written": "an adapter directory is written, not yet renamed into place (mid-export)",
    "site.committing": "the site is about to commit its consumer-group offset (mid-commit)",
    # a generating site (the return path)
    "generate.taken": "a batch of prompts was taken, nothing generated yet (after fetch)",
    "generate.generating": "the first prompt of a batch is answered, the batch not settled (mid-generation)",
    "generate.in-transaction": "a batch's rollouts are sent, its prompts not yet settled (after produce, before "
                               "commit)",
    "generate.settled": "a batch is settled (rollouts and prompts committed together), the site not yet past it",
    # the trainer
    "trainer.encoded": "a version proposed (encoded, applied to a copy), nothing published (mid-encode)",
    "trainer.in-transaction": "a version's records sent, its transaction not committed (mid-transaction)",
    "trainer.committed": "a version's transaction committed, the trainer's state not yet advanced (before write-back)",
    # the trainer with ProducerConfig.pipeline (producer/inflight.py)
    "trainer.ahead": "a version applied locally and its publish started on its thread; step() about to return",
    "trainer.awaiting": "the next step (or flush, close) about to wait for the version in flight, the next one "
                        "proposed",
}
SITE_POINTS = tuple(p for p in POINTS if not p.startswith(("trainer.", "generate.")))
GENERATE_POINTS = tuple(p for p in POINTS if p.startswith("generate."))
TRAINER_POINTS = tuple(p for p in POINTS if p.startswith("trainer."))


def _armed(variable: str):
    """(point, pass count) from the environment variable `variable` (HILO_CRASH_AT, HILO_PAUSE_AT), or None."""
    spec = os.environ.get(variable)
    if not spec:
        return None
    point, _, count = spec.partition(":")
    if point not in POINTS or not count.isdigit() or int(count) < 1:
        raise ConfigError(f"{variable}={spec!r}: expected POINT:N with N >= 1 and POINT one of {', '.join(POINTS)}")
    return point, int(count)


# what each variable does at its point's Nth pass: die as a crash does, or stop until SIGCONT (a test acts on the
# world while the process is held exactly there, as gofail's "pause")
_ARMED = [(armed, sig) for armed, sig in ((_armed("HILO_CRASH_AT"), signal.SIGKILL),
                                          (_armed("HILO_PAUSE_AT"), signal.SIGSTOP)) if armed is not None]
_passes = {}


def reach(point: str) -> None:
    """Pass a named point; SIGKILL this process if HILO_CRASH_AT names it and this is the Nth pass (SIGSTOP it for
    HILO_PAUSE_AT: it goes on when continued)."""
    if not _ARMED or all(armed[0] != point for armed, _ in _ARMED):
        return
    _passes[point] = _passes.get(point, 0) + 1
    for (name, count), sig in _ARMED:
        if name == point and _passes[point] == count:
            os.kill(os.getpid(), sig)
