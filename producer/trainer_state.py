"""The trainer's own snapshot beyond the replica: the encoder's error feedback (and PowerSGD's warm start) and
the sync mode's state (delta mode's master). Never published; kept beside the replica in the state dir."""
import io
import logging

import torch

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
        logger.warning("run %s: resuming at v%d without the trainer state of that version (%s); error feedback restarts "
                       "from zero%s", run, replica.version,
                       f"the snapshot has no {', '.join(lacking)}" if lacking else f"the snapshot is of v{snapshot_version}",
                       sync.lost_on_restart)
        return False
    where = f"{store.dir}/snapshot"
    objs = {n: torch.load(io.BytesIO(d), weights_only=True) for n, d in data.items()}
    encoder.load_state_dict(objs.pop("encoder.pt"), f"{where}/encoder.pt")
    sync.load_state_files(objs, where)
    logger.info("run %s: trainer state (%s) restored from the snapshot (v%d)", run, ", ".join(names), replica.version)
    return True
