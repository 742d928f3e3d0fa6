"""Where a process starts: the one decision the site and the trainer share.

The local snapshot if the log still holds what follows it; else the newest checkpoint on RUN.checkpoints.
Each caller adds its own refusals on top (a site never moves backwards or to another history; a trainer
never resumes past updates that expired), and the trainer adds genesis, which only it can publish.
"""
import enum
from dataclasses import dataclass

from hilo.log.base import updates_topic
from hilo.replica.replica import PolicyReplica
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


def choose_start(log, run: str, snapshot, verifier=None, max_version: int | None = None) -> Start:
    """Start from `snapshot` ((replica, Position) or None) if its next update is retained, else from the newest
    checkpoint (at most `max_version`, when there is no snapshot). LogError when no checkpoint is usable."""
    if snapshot is not None:
        replica, position = snapshot
        if log.retained(updates_topic(run), position.next_offset):
            return Start(replica, position, Source.SNAPSHOT)
        newer, newer_position = bootstrap_from_log(log, run, verifier=verifier)
        return Start(newer, newer_position, Source.CHECKPOINT_OVER_EXPIRED, set_aside=replica)
    replica, position = bootstrap_from_log(log, run, max_version, verifier)
    return Start(replica, position, Source.CHECKPOINT)
