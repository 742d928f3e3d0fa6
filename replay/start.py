"""Where a process starts: the one decision the site and the trainer share.

The local snapshot if the log still holds what follows it; else the newest checkpoint on RUN.checkpoints.
Each caller adds its own refusals on top (a site never moves backwards or to another history; a trainer
never resumes past updates that expired), and the trainer adds genesis, which only it can publish.
"""
import enum
from dataclasses import dataclass

from hilo.log.base import checkpoints_topic, updates_topic
from hilo.log.tail import records
from hilo.replica.replica import PolicyReplica
from hilo.schemas.errors import Expired, LogError
from hilo.schemas.position import Position

from .follower import bootstrap_from_log


class Source(enum.Enum):
    """What a start used."""

    SNAPSHOT = "local snapshot"
    CHECKPOINT = "checkpoint"
    CHECKPOINT_OVER_EXPIRED = "checkpoint (snapshot fell out of retention)"


@dataclass(frozen=True)
class Start:
    """replica + position to follow from, where they came from, and the snapshot set aside (if it expired)."""

    replica: PolicyReplica
    position: Position
    source: Source
    set_aside: PolicyReplica | None = None


def choose_start(log, run: str, snapshot, verifier=None, max_version: int | None = None,
                 until: int | None = None) -> Start:
    """Start from `snapshot` ((replica, Position) or None) if its next update is retained, else from the newest
    checkpoint (at most `max_version`, when there is no snapshot). LogError when no checkpoint is usable. `until`: the
    reader ends at exactly this version, so no checkpoint past it is used, and one whose replay to it expired is refused
    (Expired, in one line naming the oldest version the log can still give)."""
    if snapshot is not None:
        replica, position = snapshot
        if log.retained(updates_topic(run), position.next_offset):
            return Start(replica, position, Source.SNAPSHOT)
        newer, newer_position = _bootstrap(log, run, until, verifier, until)
        return Start(newer, newer_position, Source.CHECKPOINT_OVER_EXPIRED, set_aside=replica)
    cap = until if max_version is None else max_version if until is None else min(max_version, until)
    replica, position = _bootstrap(log, run, cap, verifier, until)
    return Start(replica, position, Source.CHECKPOINT)


def _bootstrap(log, run: str, cap: int | None, verifier, until: int | None) -> tuple:
    """`bootstrap_from_log` at most `cap`; with `until`, only from a checkpoint that can be replayed to it."""
    if until is None:
        return bootstrap_from_log(log, run, cap, verifier)
    try:
        replica, position = bootstrap_from_log(log, run, cap, verifier)
    except LogError as e:
        raise Expired(_unreachable(log, run, until, str(e))) from None
    topic = updates_topic(run)
    if replica.version < until and not log.retained(topic, position.next_offset):
        raise Expired(_unreachable(log, run, until, f"the updates after checkpoint v{replica.version} (from offset "
                                   f"{position.next_offset}) have expired: {topic} begins at offset "
                                   f"{log.begin_offset(topic)}"))
    return replica, position


def _unreachable(log, run: str, version: int, why: str) -> str:
    """One line: `version` cannot be rebuilt from this log, why, and the oldest version it can still give."""
    oldest = oldest_replayable(log, run)
    can = "no version (no checkpoint whose updates are retained)" if oldest is None else f"v{oldest}"
    return (f"v{version} of run {run} cannot be rebuilt from {log.url} ({why}); the oldest version this log can still "
            f"give is {can}")


def oldest_replayable(log, run: str) -> int | None:
    """The version of the oldest whole checkpoint whose updates are retained: every version from it to the head can be
    rebuilt from this log (None: none can). Reads RUN.checkpoints from its start, up to that checkpoint."""
    topic, begin = checkpoints_topic(run), log.begin_offset(checkpoints_topic(run))
    for rec in records(log, topic):
        h = rec.parsed
        if not (h.of_run(run) and h.last_chunk
                and h.kind == "checkpoint") or h.updates_offset is None or h.version is None:
            continue
        if rec.offset - h.chunk[0] >= begin and log.retained(updates_topic(run), h.updates_offset):
            return h.version
    return None
