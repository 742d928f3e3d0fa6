"""The trainer's own snapshot beyond the replica: the encoder's error feedback (and PowerSGD's warm start) and
the sync mode's state (delta mode's master). Never published; kept beside the replica in the state dir."""
import io
import logging

import torch

from hilo.schemas.position import Position

logger = logging.getLogger(__name__)


def save(store, replica, position, encoder, sync) -> None:
    """Replica, position, encoder state and the sync mode's state, replaced atomically together."""
    blobs = {}
    for name, obj in ({"encoder.pt": encoder.state_dict()} | sync.state_files()).items():
        buf = io.BytesIO()
        torch.save(obj, buf)
        blobs[name] = buf.getvalue()
    store.save(replica, position, blobs)


def restore(store, snapshot_version: int, replica, encoder, sync, run: str) -> bool:
    """Resume the encoder and the sync mode's state from the snapshot when the run has not moved past it; else say
    that error feedback restarts from zero (an adapter-only checkpoint is enough to go on). Returns whether it did."""
    names = ("encoder.pt", *sync.STATE_FILES)
    data = {n: store.load_extra(n) for n in names}
    lacking = [n for n, d in data.items() if d is None]
    if lacking or replica.version != snapshot_version:
        logger.warning("run %s: resuming at v%d without the trainer state of that version (%s); error feedback "
                       "restarts from zero%s", run, replica.version,
                       f"the snapshot has no {', '.join(lacking)}" if lacking
                       else f"the snapshot is of v{snapshot_version}", sync.lost_on_restart)
        return False
    where = f"{store.dir}/snapshot"
    # on the CPU whatever device saved it (a GPU trainer's residual): the encoder moves it to its gradients' device
    objs = {n: torch.load(io.BytesIO(d), weights_only=True, map_location="cpu") for n, d in data.items()}
    encoder.load_state_dict(objs.pop("encoder.pt"), f"{where}/encoder.pt")
    sync.load_state_files(objs, where)
    logger.info("run %s: trainer state (%s) restored from the snapshot (v%d)", run, ", ".join(names), replica.version)
    return True


class TrainerLedger:
    """Where the trainer's committed version ends on the log (its Position), and what it writes down about it on its
    own disk: the history file and the trainer snapshot. Advanced only after the log holds a version."""

    def __init__(self, position, history=None, store=None):
        self.position, self.history, self.store = position, history, store

    @property
    def next_offset(self) -> int:
        """The updates offset after the newest committed version."""
        return self.position.next_offset

    @property
    def log_bytes(self) -> int:
        """Update bytes through the newest committed version."""
        return self.position.log_bytes

    def started(self, replica) -> None:
        """The state a session starts from."""
        if self.history:
            self.history.record(replica.version, replica.digest, self.next_offset, start=True)

    def committed(self, replica, last_offset: int, nbytes: int) -> None:
        """`replica`'s version is on the log, its last record at `last_offset`, `nbytes` long."""
        self.position = Position(last_offset + 1, self.log_bytes + nbytes)
        if self.history:
            self.history.record(replica.version, replica.digest, last_offset)

    def caught_up(self, follower, replica, ours: bool) -> None:
        """A resync read the log to `follower`'s position; `ours`: the version it ends at is this trainer's proposal."""
        self.position = Position(follower.next_offset, follower.log_bytes)
        if ours and self.history:
            self.history.record(replica.version, replica.digest, self.next_offset - 1)

    def moved(self, next_offset: int) -> None:
        """Records that are not versions (a key rotation) were appended: the next version starts at `next_offset`."""
        self.position = Position(next_offset, self.log_bytes)

    def save(self, replica, encoder, sync) -> None:
        """The trainer snapshot (when it keeps one): replica, position and trainer-only state, atomically."""
        if self.store:
            save(self.store, replica, self.position, encoder, sync)

    def close(self) -> None:
        """Close the history file."""
        if self.history:
            self.history.close()
