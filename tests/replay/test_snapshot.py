"""SnapshotStore: a save interrupted at each named crash point leaves a whole snapshot; corrupt files are named; the raw
format (state.bin + state.msgpack) loads back to the exact digest, refuses a torn or altered state in one line, and a
snapshot of the checkpoint format (state.ckpt) still loads."""
import json

import msgpack
import pytest
import torch
import xxhash

from hilo.producer.update_builder import UpdateBuilder
from hilo.replay.snapshot import CRASH_POINTS, RAW_FORMAT, SnapshotStore
from hilo.replica.codecs import Budget, make_encoder
from hilo.replica.synthetic import GradientStream
from hilo.schemas.errors import ConfigError, DivergenceError, MalformedMessage
from hilo.schemas.position import Position
from tests.conftest import genesis


class Crash(Exception):
    """Raised at a failpoint: the process would have died here."""


def _replicas(manifest, grads):
    """v1 and v2 of one run (two distinct snapshots)."""
    r = genesis(manifest)
    builder = UpdateBuilder(r, make_encoder("dense", manifest, Budget()))
    builder.step(grads.next(), {"lr": 1e-3})
    v1 = type(r).from_checkpoint(r.checkpoint())
    builder.step(grads.next(), {"lr": 1e-3})
    return v1, r


@pytest.mark.parametrize("fmt", ["raw", "ckpt"])
@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_crash_at_each_point_of_a_save_leaves_a_whole_snapshot(tmp_path, manifest, grads, point, fmt):
    v1, v2 = _replicas(manifest, grads)
    SnapshotStore(tmp_path, fmt=fmt).save(v1, Position(1))

    def failpoint(p):
        if p == point:
            raise Crash(p)
    with pytest.raises(Crash):
        SnapshotStore(tmp_path, failpoint, fmt=fmt).save(v2, Position(2))
    replica, pos = SnapshotStore(tmp_path).load()
    expected = v1 if point in ("written", "old-moved") else v2  # before the second rename the old one is current
    assert (replica.version, replica.digest, pos.next_offset) == (expected.version, expected.digest, expected.version)
    # The next save succeeds and leaves exactly one snapshot, no leftovers of the crashed one.
    SnapshotStore(tmp_path, fmt=fmt).save(v2, Position(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot"]
    assert SnapshotStore(tmp_path).load()[0].digest == v2.digest


def test_between_the_renames_only_the_old_copy_exists_and_is_found(tmp_path, manifest, grads):
    """The crash the two-rename scheme must survive: 'snapshot' is gone, 'snapshot.old-PID' holds the last one."""
    v1, v2 = _replicas(manifest, grads)
    SnapshotStore(tmp_path).save(v1, Position(1))
    with pytest.raises(Crash):
        SnapshotStore(tmp_path,
                      lambda p: (_ for _ in ()).throw(Crash()) if p == "old-moved" else None).save(v2, Position(2))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "snapshot" not in names and any(n.startswith("snapshot.old-") for n in names)
    assert SnapshotStore(tmp_path).load()[0].digest == v1.digest


def test_the_raw_format_is_the_state_as_it_lies_in_memory_and_loads_back_exactly(tmp_path, manifest, grads):
    v1, v2 = _replicas(manifest, grads)
    SnapshotStore(tmp_path).save(v2, Position(7, 123))
    snap = tmp_path / "snapshot"
    assert sorted(p.name for p in snap.iterdir()) == ["position.json", "recent.msgpack", "state.bin", "state.msgpack"]
    s = v2.state
    tensors = list(s.params) + [t for ts in s.slots.values() for t in ts]
    assert (snap / "state.bin").read_bytes() == b"".join(t.numpy().tobytes() for t in tensors)  # params, then each slot
    outer = msgpack.unpackb((snap / "state.msgpack").read_bytes())
    head = msgpack.unpackb(outer["body"])
    assert (outer["format"], head["version"], head["digest"], head["slots"]) == (RAW_FORMAT, 2, v2.digest,
                                                                                 list(s.slots))
    replica, pos = SnapshotStore(tmp_path).load()
    assert (replica.version, replica.digest, replica.genesis, replica.run) == (2, v2.digest, v2.genesis, v2.run)
    assert (pos.next_offset, pos.log_bytes) == (7, 123) and dict(replica.recent) == dict(v2.recent)
    assert replica.state.digest() == v2.digest and replica.state.scalars == s.scalars
    # It goes on applying from the loaded buffers, recycling them, to the same digests as the original.
    replica.recycle = True
    for r in (v2, replica):
        builder = UpdateBuilder(r, make_encoder("dense", manifest, Budget()))
        for g in (GradientStream(manifest, seed=5).next(), GradientStream(manifest, seed=6).next()):
            builder.step(g, {"lr": 1e-3})
    assert replica.digest == v2.digest and replica.version == 4


def test_a_v0_snapshot_keeps_its_history_nonce(tmp_path, manifest):
    from hilo.replica.replica import PolicyReplica
    from hilo.replica.synthetic import initial_params
    v0 = PolicyReplica.genesis("r", manifest, initial_params(manifest, seed=0), "adamw", nonce=b"\x05" * 16)
    SnapshotStore(tmp_path).save(v0, Position(0))
    got = SnapshotStore(tmp_path).load()[0]
    assert (got.nonce, got.genesis, got.digest) == (v0.nonce, v0.genesis, v0.digest)


def test_a_snapshot_of_the_checkpoint_format_still_loads(tmp_path, manifest, grads):
    v1, v2 = _replicas(manifest, grads)
    SnapshotStore(tmp_path, fmt="ckpt").save(v2, Position(2))
    assert sorted(p.name for p in (tmp_path / "snapshot").iterdir()) == ["position.json", "recent.msgpack",
                                                                         "state.ckpt"]
    replica, pos = SnapshotStore(tmp_path).load()
    assert (replica.version, replica.digest, pos.next_offset, dict(replica.recent)) == (2, v2.digest, 2,
                                                                                        dict(v2.recent))
    SnapshotStore(tmp_path).save(replica, pos)  # the next save writes the raw format over it
    assert (tmp_path / "snapshot" / "state.bin").exists() and SnapshotStore(tmp_path).load()[0].digest == v2.digest
    with pytest.raises(ConfigError, match=r"SnapshotStore.fmt = 'zip': expected one of raw, ckpt"):
        SnapshotStore(tmp_path, fmt="zip")


def _flip(path, at):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("fmt,damage,error,exc", [
    ("raw", "position", r"snapshot .*/snapshot/position.json: corrupt", MalformedMessage),
    ("raw", "position-type",
     r"snapshot .*/snapshot/position.json: corrupt \(position: expected a JSON object, got list\)",
     MalformedMessage),
    ("raw", "position-of-another-version",
     r"snapshot .*/snapshot/position.json: is of v1 digest [0-9a-f]{12}, the state of v2 "
     r"digest [0-9a-f]{12}; remove", MalformedMessage),
    ("raw", "bin-flipped",
     r"snapshot .*/snapshot/state.bin: v2 content hashes to [0-9a-f]{32}, its header says [0-9a-f]{32} "
     r"\(torn or altered\); remove .* to bootstrap from the log$", DivergenceError),
    ("raw", "bin-truncated", r"snapshot .*/snapshot/state.bin: \d+ bytes, its header says \d+ \(torn or altered\)",
     MalformedMessage),
    ("raw", "bin-missing", r"snapshot .*/snapshot/state.bin: missing, its header says \d+", MalformedMessage),
    ("raw", "header-truncated", r"snapshot .*/snapshot/state.msgpack: corrupt \(.*\); remove", MalformedMessage),
    ("raw", "header-other-format", r"snapshot .*/snapshot/state.msgpack: corrupt \(format 3, this hilo reads 2",
     MalformedMessage),
    ("raw", "header-other-run", r"snapshot .*/snapshot/state.msgpack: corrupt \(its check does not match its body\)",
     MalformedMessage),
    ("raw", "header-bad-digest", r"snapshot .*/snapshot/state.msgpack: field 'digest' is 3 bytes, expected 16; remove",
     MalformedMessage),
    ("raw", "state-missing", r"snapshot .*/snapshot: state.msgpack \(and state.ckpt\) missing", MalformedMessage),
    ("ckpt", "state-truncated", r"snapshot .*/snapshot/state.ckpt", MalformedMessage),
    ("ckpt", "state-other-content", r"snapshot .*/snapshot/state.ckpt: checkpoint v2 content hashes to",
     DivergenceError),
])
def test_corrupt_snapshot_files_get_named_errors(tmp_path, manifest, grads, fmt, damage, error, exc):
    v1, v2 = _replicas(manifest, grads)
    SnapshotStore(tmp_path, fmt=fmt).save(v2, Position(2))
    snap = tmp_path / "snapshot"
    if damage == "position":
        (snap / "position.json").write_text('{"next_offset": ')
    elif damage == "position-type":
        (snap / "position.json").write_text('["not", "a", "position"]')
    elif damage == "position-of-another-version":  # state and position written apart (by hand, or a bug)
        (snap / "position.json").write_text(json.dumps({"next_offset": 1, "version": 1, "digest": v1.digest.hex()}))
    elif damage == "bin-flipped":  # one bit of one optimizer moment: every size right, the content not what was saved
        _flip(snap / "state.bin", (snap / "state.bin").stat().st_size - 5)
    elif damage == "bin-truncated":
        data = (snap / "state.bin").read_bytes()
        (snap / "state.bin").write_bytes(data[: len(data) // 2])
    elif damage == "bin-missing":
        (snap / "state.bin").unlink()
    elif damage.startswith("header"):
        data = (snap / "state.msgpack").read_bytes()
        outer = msgpack.unpackb(data)
        body = msgpack.unpackb(outer["body"])
        if damage == "header-truncated":
            data = data[: len(data) // 2]
        elif damage == "header-other-format":
            data = msgpack.packb(outer | {"format": 3})
        elif damage == "header-other-run":  # a field the state's digest does not cover, changed: the check does
            data = msgpack.packb(outer | {"body": msgpack.packb(body | {"run": "other"})})
        else:
            bad = msgpack.packb(body | {"digest": b"abc"})
            data = msgpack.packb(outer | {"body": bad, "check": xxhash.xxh3_128_digest(bad)})
        (snap / "state.msgpack").write_bytes(data)
    elif damage == "state-missing":
        (snap / "state.msgpack").unlink()
    elif damage == "state-truncated":
        data = (snap / "state.ckpt").read_bytes()
        (snap / "state.ckpt").write_bytes(data[: len(data) // 2])
    else:  # a v1 body under v2's digest: every byte valid, the content is not what the digest promises
        ckpt = v1.checkpoint()
        ckpt.version, ckpt.digest = 2, v2.digest
        (snap / "state.ckpt").write_bytes(ckpt.to_bytes())
    with pytest.raises(exc, match=error) as e:
        SnapshotStore(tmp_path).load()
    assert "\n" not in str(e.value)


def test_a_raw_state_of_another_version_is_refused_by_its_digest(tmp_path, manifest, grads):
    """v1's tensors under v2's header: the right size, valid floats, and not the state the header's digest names."""
    v1, v2 = _replicas(manifest, grads)
    SnapshotStore(tmp_path / "a").save(v1, Position(1))
    SnapshotStore(tmp_path / "b").save(v2, Position(2))
    (tmp_path / "b" / "snapshot" / "state.bin").write_bytes((tmp_path / "a" / "snapshot" / "state.bin").read_bytes())
    with pytest.raises(DivergenceError, match=r"state.bin: v2 content hashes to .*torn or altered"):
        SnapshotStore(tmp_path / "b").load()
    assert torch.equal(SnapshotStore(tmp_path / "a").load()[0].state.params[0], v1.state.params[0])
