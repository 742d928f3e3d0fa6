"""A site's (or the trainer's) local saved state: the replica's tensors + log position, replaced atomically.

DIR/snapshot/{state.bin, state.msgpack, position.json, recent.msgpack}: state.bin is the replica's fp32 tensors as
they lie in memory, concatenated (params, then each optimizer slot, manifest order: the order the digest hashes),
state.msgpack a small header (format marker, run, version, digest, history, manifest, optimizer, slot names,
scalars; checksummed). Raw bytes, written at disk speed, uncompressed: at the 1.7B/AdamW shape 837 MB save in
0.6 s and load cold in 0.7 s where the msgpack + zstd checkpoint record took 3.8 s and 2.3 s to keep 9-21% fewer bytes,
and zstd over the raw bytes still cost 0.7-1.8 s more than it saved writing (docs/results/snapshot.json, written by
`python -m hilo.ops.bench.snapshot --out docs/results`): compressing pays only on a disk slower than ~40-220 MB/s.
`load` re-hashes the state and refuses one whose digest is not the saved one (torn, or altered); a snapshot from
before the format (DIR/snapshot/state.ckpt, a checkpoint record) still loads.

A new snapshot is written to DIR/snapshot.tmp-PID and fsynced; the old one is renamed to DIR/snapshot.old-PID and
the new one into place (POSIX cannot rename a directory over a non-empty one). A crash at any instant leaves a
whole snapshot: the current one, or, between the two renames, the old one, which `load` finds. Disk I/O lives
here, not in the state machine. One save at a time per state dir (the names above are per process). A save the disk
refuses (full, I/O error) removes its temp folder and raises StateNotWritten, one line; a temp folder a killed save
left is removed when the next process opens the state dir.
"""
import collections
import errno
import json
import os
import pathlib
import shutil

import msgpack
import torch
import xxhash

from hilo.replica.replica import PolicyReplica
from hilo.replica.state import ReplicaState
from hilo.schemas import fields as F
from hilo.schemas.errors import ConfigError, DivergenceError, MalformedMessage, StateNotWritten
from hilo.schemas.limits import DEFAULT_LIMITS
from hilo.schemas.position import Position
from hilo.schemas.records import DIGEST_BYTES, NONCE_BYTES, Checkpoint, Manifest, decode_record, history_id

from hilo.schemas import crash_points

# Named crash points of `save`, in order (tests stop a save at each one, as a crash there would).
CRASH_POINTS = ("written", "old-moved", "new-in-place")
RAW_FORMAT = 2  # state.msgpack's "format": raw tensors in state.bin. 1 was state.ckpt, a checkpoint record (read still)
FORMATS = ("raw", "ckpt")  # what `save` writes: raw (the default), or the checkpoint record of format 1 (benchmarks)
HEADER_MAX = 16 << 20      # bytes of state.msgpack read at most (a manifest of the largest adapter is well under 1 MB)


def fsync_dir(path) -> None:
    """Make a new file or a rename in the folder `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_writable_dir(path: pathlib.Path, what: str) -> None:
    """Create `path` if needed and prove it takes a file; ConfigError in one line otherwise (a file in the way, no
    permission)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        where = f" ({e.filename})" if e.filename and str(e.filename) != str(path) else ""
        raise ConfigError(f"{what} {path}: cannot be used: {e.strerror or type(e).__name__}{where}") from None


def remove_stale_temps(state_dir: pathlib.Path) -> None:
    """Remove DIR/snapshot.tmp-PID left by a save that failed or was killed, unless process PID is alive (saving
    now)."""
    for tmp in state_dir.glob("snapshot.tmp-*"):
        pid = tmp.name.rpartition("-")[2]
        if not (pid.isdigit() and _alive(int(pid))):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def not_written(store, error: OSError, replica: PolicyReplica, extra: dict) -> str:
    """The one line of a snapshot the disk refused: the path, why, what it needed and had, and that nothing is lost."""
    why = (error.strerror or type(error).__name__).lower()
    if error.errno == errno.ENOSPC:
        need = sum(t.numel() * t.element_size() for t in _tensors(replica.state)) + sum(len(d) for d in extra.values())
        why += f" (the snapshot needs about {need / 1e6:.1f} MB; {shutil.disk_usage(store.dir).free / 1e6:.1f} MB free)"
    kept = f"{store.path} is still the last whole snapshot" if store.path.exists() else "there was no snapshot before"
    return (f"cannot write the snapshot of v{replica.version} to {error.filename or store.dir}: {why}; nothing "
            f"acknowledged was lost (it is on the log; {kept}): a restart resumes once the disk has room")


def _tensors(state: ReplicaState) -> list:
    """The state's tensors in state.bin's (and the digest's) order: params, then each slot's, manifest order."""
    return list(state.params) + [t for ts in state.slots.values() for t in ts]


def raw_header(replica: PolicyReplica) -> bytes:
    """state.msgpack: everything but the tensors' bytes; the manifest gives their shapes."""
    s = replica.state
    body = msgpack.packb({"run": replica.run, "version": s.version, "digest": replica.digest,
                          "genesis": replica.genesis,
                          "nonce": replica.nonce if s.version == 0 else b"", "manifest": s.manifest.to_dict(),
                          "optimizer": s.optimizer, "slots": list(s.slots), "scalars": dict(s.scalars),
                          "bytes": 4 * s.manifest.numel * (1 + len(s.slots))}, use_bin_type=True)
    # the state's digest covers the tensors, version, manifest and optimizer; "check" covers the rest (run, history)
    return msgpack.packb({"format": RAW_FORMAT, "body": body, "check": xxhash.xxh3_128_digest(body)}, use_bin_type=True)


def _write(path: pathlib.Path, parts) -> None:
    """Write `parts` (bytes-like, in order) to a new file and fsync it; an OSError names the file."""
    try:
        with open(path, "wb") as f:
            for data in parts:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        e.filename = e.filename or str(path)
        raise


class SnapshotStore:
    """save(replica, position) / load() -> (replica, position) for one state directory.

    failpoint: called with each name of CRASH_POINTS as `save` passes it (tests raise there, or hold the save).
    Default: the named crash points (schemas/crash_points.py). fmt: "raw" (default) or "ckpt" (format 1, for
    comparison).
    """

    def __init__(self, state_dir, failpoint=None, fmt: str = "raw"):
        if fmt not in FORMATS:
            raise ConfigError(f"SnapshotStore.fmt = {fmt!r}: expected one of {', '.join(FORMATS)}")
        self.dir = pathlib.Path(state_dir)
        self.path = self.dir / "snapshot"
        self.fmt = fmt
        self.failpoint = failpoint or (lambda point: crash_points.reach(f"snapshot.{point}"))
        ensure_writable_dir(self.dir, "state dir")
        remove_stale_temps(self.dir)

    def save(self, replica: PolicyReplica, position: Position, extra: dict | None = None, written=None) -> None:
        """Write state + position (with the replica's version and digest) and `extra` files ({name: bytes}) atomically,
        together. `written()` is called once the new snapshot is whole on disk, before it is put in place (what counts
        it does so before anyone can find it there). A write the disk refuses (no space, I/O error, permission) leaves
        the snapshot in place as it was, removes what it wrote, and raises StateNotWritten in one line (which path, why,
        what it needed)."""
        tmp = self.dir / f"snapshot.tmp-{os.getpid()}"
        try:
            self._save(tmp, replica, position, extra or {}, written)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise StateNotWritten(not_written(self, e, replica, extra or {})) from None

    def _save(self, tmp: pathlib.Path, replica: PolicyReplica, position: Position, extra: dict, written) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        if self.fmt == "raw":  # each tensor's bytes as they lie in memory: no copy, no compression (disk speed)
            _write(tmp / "state.bin",
                   (memoryview(t.detach().contiguous().numpy()).cast("B") for t in _tensors(replica.state)))
            state = {"state.msgpack": raw_header(replica)}
        else:
            state = {"state.ckpt": replica.checkpoint().to_bytes()}
        files = state | {
            # the digests of recent versions: a restarted replica still tells a replayed old version from a fork
            "recent.msgpack": msgpack.packb([[v, d] for v, d in replica.recent.items()]),
            "position.json": json.dumps(position.to_json() | {"version": replica.version,
                                                              "digest": replica.digest.hex()}).encode()}
        for name, data in (files | extra).items():
            _write(tmp / name, [data])
        fsync_dir(tmp)
        self.failpoint("written")
        if written is not None:
            written()
        old = self.dir / f"snapshot.old-{os.getpid()}"
        if self.path.exists():  # whole: it only ever appears by a rename of a complete directory
            shutil.rmtree(old, ignore_errors=True)  # a crashed save's leftover (PIDs repeat across container restarts)
            os.replace(self.path, old)
        self.failpoint("old-moved")
        os.replace(tmp, self.path)
        fsync_dir(self.dir)
        self.failpoint("new-in-place")
        for stale in self.dir.glob("snapshot.*-*"):  # this save's old copy, and leftovers of crashed saves
            shutil.rmtree(stale, ignore_errors=True)

    def size(self) -> int:
        """Bytes of the snapshot in place (every file of it)."""
        return sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file()) if self.path.exists() else 0

    def load_extra(self, name: str) -> bytes | None:
        """An `extra` file saved with the snapshot that `load` returned (None if that snapshot has none)."""
        f = getattr(self, "loaded_from", self.path) / name
        return f.read_bytes() if f.exists() else None

    def load(self):
        """(replica, position) from the newest whole snapshot, or None when there is none. The state is re-hashed:
        one that is not what its saved digest says (a torn or altered file) is refused, naming the file."""
        path = self.path
        if not (path / "position.json").exists():
            olds = sorted(self.dir.glob("snapshot.old-*"))  # crashed between the two renames
            if not olds:
                return None
            path = olds[-1]
        what = f"snapshot {path}"
        try:
            saved = json.loads((path / "position.json").read_text())
            position = Position.from_json(saved, "position")
        except (ValueError, UnicodeDecodeError, MalformedMessage) as e:
            raise MalformedMessage(
                f"{what}/position.json: corrupt ({e}); remove {path} to bootstrap from the log") from None
        if (path / "state.msgpack").exists():
            replica = _load_raw(path, what)
        elif (path / "state.ckpt").exists():  # format 1
            ckpt = decode_record((path / "state.ckpt").read_bytes(), f"{what}/state.ckpt")
            if not isinstance(ckpt, Checkpoint):
                raise MalformedMessage(f"{what}/state.ckpt: holds an update record, expected a checkpoint")
            replica = PolicyReplica.from_checkpoint(ckpt, f"{what}/state.ckpt")
        else:
            raise MalformedMessage(f"{what}: state.msgpack (and state.ckpt) missing; remove {path} to bootstrap from "
                                   f"the log")
        said = (saved.get("version", replica.version), saved.get("digest", replica.digest.hex()))
        if said != (replica.version, replica.digest.hex()):  # written apart: the position is not this state's
            raise MalformedMessage(f"{what}/position.json: is of v{said[0]} digest {str(said[1])[:12]}, the state of "
                                   f"v{replica.version} digest {replica.digest.hex()[:12]}; remove {path} to bootstrap "
                                   f"from the log")
        self.loaded_from = path
        if (path / "recent.msgpack").exists():  # snapshots from before it was kept have none: only the current digest
            replica.recent = _recent((path / "recent.msgpack").read_bytes(), replica, f"{what}/recent.msgpack")
        return replica, position


def _load_raw(path: pathlib.Path, what: str) -> PolicyReplica:
    """The replica of a raw snapshot: the header checked field by field, state.bin's size checked before anything is
    allocated, the bytes read into one buffer the tensors view, the state re-hashed against the saved digest."""
    hw, bw = f"{what}/state.msgpack", f"{what}/state.bin"
    gone = f"remove {path} to bootstrap from the log"
    try:
        with open(path / "state.msgpack", "rb") as f:
            data = f.read(HEADER_MAX + 1)
        if len(data) > HEADER_MAX:
            raise MalformedMessage(f"over {HEADER_MAX} bytes")
        outer = msgpack.unpackb(data, raw=False, strict_map_key=True)
        if not isinstance(outer, dict):
            raise MalformedMessage(f"expected a map, got {type(outer).__name__}")
        if outer.get("format") != RAW_FORMAT:
            raise MalformedMessage(f"format {outer.get('format')!r}, this hilo reads {RAW_FORMAT} (and state.ckpt)")
        body = F.get_bytes(outer, "body", hw)
        if F.get_bytes(outer, "check", hw, 16) != xxhash.xxh3_128_digest(body):
            raise MalformedMessage("its check does not match its body")
        head = msgpack.unpackb(body, raw=False, strict_map_key=True)
        manifest = Manifest.from_dict(F.req(head, "manifest", hw), hw)
        slots = F.get_list(head, "slots", hw, 8)
        if not all(isinstance(s, str) and s for s in slots) or len(set(slots)) != len(slots):
            raise MalformedMessage(f"field 'slots' = {slots!r}, expected distinct names")
        scalars = F.get_scalar_map(head, "scalars", hw, DEFAULT_LIMITS.max_params)
        if not all(isinstance(v, (int, float)) for v in scalars.values()):
            raise MalformedMessage("field 'scalars' holds a non-number")
        version, digest = F.get_int(head, "version", hw), F.get_bytes(head, "digest", hw, DIGEST_BYTES)
        genesis, nonce = F.get_bytes(head, "genesis", hw, DIGEST_BYTES), F.get_bytes(head, "nonce", hw)
        if len(nonce) not in (0, NONCE_BYTES) or (version == 0 and genesis != history_id(digest, nonce)):
            raise MalformedMessage(f"v{version}: history {genesis.hex()} and nonce {nonce.hex() or '(none)'} disagree")
        run, optimizer = F.get_str(head, "run", hw), F.get_str(head, "optimizer", hw)
    except (ValueError, TypeError, msgpack.UnpackException, MalformedMessage) as e:  # MalformedMessage: schemas/fields'
        msg = str(e) if str(e).startswith(hw) else f"{hw}: corrupt ({e})"
        raise MalformedMessage(f"{msg}; {gone}") from None
    count = manifest.numel * (1 + len(slots))
    size = (path / "state.bin").stat().st_size if (path / "state.bin").exists() else None
    if size != 4 * count:
        have = "missing" if size is None else f"{size} bytes"
        raise MalformedMessage(f"{bw}: {have}, its header says {4 * count} (torn or altered); {gone}")
    flat = torch.empty(count, dtype=torch.float32)
    view, got = memoryview(flat.numpy()).cast("B"), 0
    with open(path / "state.bin", "rb", buffering=0) as f:
        while got < len(view):
            n = f.readinto(view[got:])
            if not n:
                raise MalformedMessage(f"{bw}: ended after {got} of {len(view)} bytes (truncated while read); {gone}")
            got += n
    tensors, at = [], 0
    for _ in range(1 + len(slots)):
        for b in manifest.blocks:
            tensors.append(flat[at:at + b.numel].view(b.shape))
            at += b.numel
    n = len(manifest.blocks)
    state = ReplicaState(manifest, optimizer, version, tensors[:n],
                         {s: tensors[n * (i + 1):n * (i + 2)] for i, s in enumerate(slots)},
                         {k: float(v) for k, v in scalars.items()})
    held = state.digest()
    if held != digest:
        raise DivergenceError(f"{bw}: v{version} content hashes to {held.hex()}, its header says {digest.hex()} (torn "
                              f"or altered); {gone}")
    return PolicyReplica(state, run, digest=digest, genesis=genesis, nonce=nonce if version == 0 else b"")


def _recent(data: bytes, replica: PolicyReplica, what: str) -> collections.OrderedDict:
    """The replica's recent {version: digest}, as saved; it must end at the replica's own version and digest."""
    try:
        pairs = msgpack.unpackb(data)
        recent = collections.OrderedDict((int(v), bytes(d)) for v, d in pairs)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise MalformedMessage(
            f"{what}: corrupt ({e}); remove it (forks of older versions then go unnoticed)") from None
    if recent.get(replica.version) != replica.digest:
        raise MalformedMessage(f"{what}: does not end at the snapshot's v{replica.version}; remove it")
    return recent
