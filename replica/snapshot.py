"""A site's (or the trainer's) local saved state: checkpoint bytes + log position, replaced atomically.

DIR/snapshot/{state.ckpt, position.json}. A new snapshot is written to DIR/snapshot.tmp-PID, fsynced, and
renamed over the old one, so a crash at any instant leaves either the old or the new snapshot, whole.
"""
import json
import os
import pathlib
import shutil

from hilo.schemas.errors import MalformedMessage
from hilo.schemas.records import Checkpoint, decode_record

from .replica import PolicyReplica


def _fsync_dir(path: pathlib.Path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SnapshotStore:
    """save(replica, position) / load() -> (replica, position) for one state directory."""

    def __init__(self, state_dir):
        self.dir = pathlib.Path(state_dir)
        self.path = self.dir / "snapshot"

    def save(self, replica: PolicyReplica, position: dict) -> None:
        """Write state + position (next offset, version, ...) atomically."""
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f"snapshot.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for name, data in (("state.ckpt", replica.checkpoint().to_bytes()),
                           ("position.json", json.dumps(position | {"version": replica.version, "digest": replica.digest.hex()}).encode())):
            with open(tmp / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        _fsync_dir(tmp)
        old = self.dir / f"snapshot.old-{os.getpid()}"
        if self.path.exists():
            os.replace(self.path, old)   # two renames: POSIX cannot rename a dir over a non-empty dir
        os.replace(tmp, self.path)
        _fsync_dir(self.dir)
        shutil.rmtree(old, ignore_errors=True)

    def load(self, limits=None):
        """(replica, position) from the newest whole snapshot, or None when there is none."""
        path = self.path
        if not (path / "position.json").exists():
            olds = sorted(self.dir.glob("snapshot.old-*"))  # crashed between the two renames
            if not olds:
                return None
            path = olds[-1]
        position = json.loads((path / "position.json").read_text())
        ckpt = decode_record((path / "state.ckpt").read_bytes(), f"snapshot {path}")
        if not isinstance(ckpt, Checkpoint):
            raise MalformedMessage(f"snapshot {path}/state.ckpt: holds an update record, expected a checkpoint")
        kwargs = {} if limits is None else {"limits": limits}
        return PolicyReplica.from_checkpoint(ckpt, f"snapshot {path}", **kwargs), position
