"""A site's (or the trainer's) local saved state: checkpoint bytes + log position, replaced atomically.

DIR/snapshot/{state.ckpt, position.json, recent.msgpack}. A new snapshot is written to DIR/snapshot.tmp-PID and fsynced;
the old one is renamed to DIR/snapshot.old-PID and the new one into place (POSIX cannot rename a
directory over a non-empty one). A crash at any instant leaves a whole snapshot: the current one, or,
between the two renames, the old one, which `load` finds. Disk I/O lives here, not in the state machine.
"""
import collections
import json
import os
import pathlib
import shutil

import msgpack

from hilo.replica.replica import PolicyReplica
from hilo.schemas.errors import ConfigError, MalformedMessage
from hilo.schemas.position import Position
from hilo.schemas.records import Checkpoint, decode_record

from hilo.log import crashpoints

# Named crash points of `save`, in order (tests stop a save at each one, as a crash there would).
CRASH_POINTS = ("written", "old-moved", "new-in-place")


def _fsync_dir(path: pathlib.Path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_writable_dir(path: pathlib.Path, what: str) -> None:
    """Create `path` if needed and prove it takes a file; ConfigError in one line otherwise (a file in the way, no permission)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        where = f" ({e.filename})" if e.filename and str(e.filename) != str(path) else ""
        raise ConfigError(f"{what} {path}: cannot be used: {e.strerror or type(e).__name__}{where}") from None


class SnapshotStore:
    """save(replica, position) / load() -> (replica, position) for one state directory.

    failpoint: called with each name of CRASH_POINTS as `save` passes it (tests raise there). Default: none.
    """

    def __init__(self, state_dir, failpoint=None):
        self.dir = pathlib.Path(state_dir)
        self.path = self.dir / "snapshot"
        self.failpoint = failpoint or (lambda point: crashpoints.reach(f"snapshot.{point}"))
        ensure_writable_dir(self.dir, "state dir")

    def save(self, replica: PolicyReplica, position: Position, extra: dict | None = None) -> None:
        """Write state + position (with the replica's version and digest) and `extra` files ({name: bytes}) atomically, together."""
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f"snapshot.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        files = {"state.ckpt": replica.checkpoint().to_bytes(),
                 # the digests of recent versions: a restarted replica still tells a replayed old version from a fork
                 "recent.msgpack": msgpack.packb([[v, d] for v, d in replica.recent.items()]),
                 "position.json": json.dumps(position.to_json() | {"version": replica.version, "digest": replica.digest.hex()}).encode()}
        for name, data in (files | (extra or {})).items():
            with open(tmp / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        _fsync_dir(tmp)
        self.failpoint("written")
        old = self.dir / f"snapshot.old-{os.getpid()}"
        if self.path.exists():  # whole: it only ever appears by a rename of a complete directory
            shutil.rmtree(old, ignore_errors=True)  # a crashed save's leftover (PIDs repeat across container restarts)
            os.replace(self.path, old)
        self.failpoint("old-moved")
        os.replace(tmp, self.path)
        _fsync_dir(self.dir)
        self.failpoint("new-in-place")
        for stale in self.dir.glob("snapshot.*-*"):  # this save's old copy, and leftovers of crashed saves
            shutil.rmtree(stale, ignore_errors=True)

    def load_extra(self, name: str) -> bytes | None:
        """An `extra` file saved with the snapshot that `load` returned (None if that snapshot has none)."""
        f = getattr(self, "loaded_from", self.path) / name
        return f.read_bytes() if f.exists() else None

    def load(self):
        """(replica, position) from the newest whole snapshot, or None when there is none."""
        path = self.path
        if not (path / "position.json").exists():
            olds = sorted(self.dir.glob("snapshot.old-*"))  # crashed between the two renames
            if not olds:
                return None
            path = olds[-1]
        what = f"snapshot {path}"
        try:
            position = Position.from_json(json.loads((path / "position.json").read_text()), "position")
        except (ValueError, UnicodeDecodeError, MalformedMessage) as e:
            raise MalformedMessage(f"{what}/position.json: corrupt ({e}); remove {path} to bootstrap from the log") from None
        if not (path / "state.ckpt").exists():
            raise MalformedMessage(f"{what}/state.ckpt: missing; remove {path} to bootstrap from the log")
        ckpt = decode_record((path / "state.ckpt").read_bytes(), f"{what}/state.ckpt")
        self.loaded_from = path
        if not isinstance(ckpt, Checkpoint):
            raise MalformedMessage(f"{what}/state.ckpt: holds an update record, expected a checkpoint")
        replica = PolicyReplica.from_checkpoint(ckpt, f"{what}/state.ckpt")
        if (path / "recent.msgpack").exists():  # snapshots from before it was kept have none: only the current digest
            replica.recent = _recent((path / "recent.msgpack").read_bytes(), replica, f"{what}/recent.msgpack")
        return replica, position


def _recent(data: bytes, replica: PolicyReplica, what: str) -> collections.OrderedDict:
    """The replica's recent {version: digest}, as saved; it must end at the replica's own version and digest."""
    try:
        pairs = msgpack.unpackb(data)
        recent = collections.OrderedDict((int(v), bytes(d)) for v, d in pairs)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise MalformedMessage(f"{what}: corrupt ({e}); remove it (forks of older versions then go unnoticed)") from None
    if recent.get(replica.version) != replica.digest:
        raise MalformedMessage(f"{what}: does not end at the snapshot's v{replica.version}; remove it")
    return recent
