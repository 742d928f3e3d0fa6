"""SnapshotStore: a save interrupted at each named crash point leaves a whole snapshot; corrupt files are named."""
import pytest

from hilo.producer.update_builder import UpdateBuilder
from hilo.replay.snapshot import CRASH_POINTS, SnapshotStore
from hilo.replica.codecs import Budget, make_encoder
from hilo.schemas.errors import DivergenceError, MalformedMessage
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


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_crash_at_each_point_of_a_save_leaves_a_whole_snapshot(tmp_path, manifest, grads, point):
    v1, v2 = _replicas(manifest, grads)
    SnapshotStore(tmp_path).save(v1, Position(1))

    def failpoint(p):
        if p == point:
            raise Crash(p)
    with pytest.raises(Crash):
        SnapshotStore(tmp_path, failpoint).save(v2, Position(2))
    replica, pos = SnapshotStore(tmp_path).load()
    expected = v1 if point in ("written", "old-moved") else v2  # before the second rename the old one is current
    assert (replica.version, replica.digest, pos.next_offset) == (expected.version, expected.digest, expected.version)
    # The next save succeeds and leaves exactly one snapshot, no leftovers of the crashed one.
    SnapshotStore(tmp_path).save(v2, Position(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot"]
    assert SnapshotStore(tmp_path).load()[0].digest == v2.digest


def test_between_the_renames_only_the_old_copy_exists_and_is_found(tmp_path, manifest, grads):
    """The crash the two-rename scheme must survive: 'snapshot' is gone, 'snapshot.old-PID' holds the last one."""
    v1, v2 = _replicas(manifest, grads)
    SnapshotStore(tmp_path).save(v1, Position(1))
    with pytest.raises(Crash):
        SnapshotStore(tmp_path, lambda p: (_ for _ in ()).throw(Crash()) if p == "old-moved" else None).save(v2, Position(2))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "snapshot" not in names and any(n.startswith("snapshot.old-") for n in names)
    assert SnapshotStore(tmp_path).load()[0].digest == v1.digest


@pytest.mark.parametrize("damage,error,exc", [
    ("position", r"snapshot .*/snapshot/position.json: corrupt", MalformedMessage),
    ("position-type", r"snapshot .*/snapshot/position.json: corrupt \(position: expected a JSON object, got list\)", MalformedMessage),
    ("state-truncated", r"snapshot .*/snapshot/state.ckpt", MalformedMessage),
    ("state-missing", r"snapshot .*/snapshot/state.ckpt: missing", MalformedMessage),
    ("state-other-content", r"snapshot .*/snapshot/state.ckpt: checkpoint v2 content hashes to", DivergenceError),
])
def test_corrupt_snapshot_files_get_named_errors(tmp_path, manifest, grads, damage, error, exc):
    v1, v2 = _replicas(manifest, grads)
    SnapshotStore(tmp_path).save(v2, Position(2))
    snap = tmp_path / "snapshot"
    if damage == "position":
        (snap / "position.json").write_text('{"next_offset": ')
    elif damage == "position-type":
        (snap / "position.json").write_text('["not", "a", "position"]')
    elif damage == "state-truncated":
        data = (snap / "state.ckpt").read_bytes()
        (snap / "state.ckpt").write_bytes(data[: len(data) // 2])
    elif damage == "state-missing":
        (snap / "state.ckpt").unlink()
    else:  # a v1 body under v2's digest: every byte valid, the content is not what the digest promises
        ckpt = v1.checkpoint()
        ckpt.version, ckpt.digest = 2, v2.digest
        (snap / "state.ckpt").write_bytes(ckpt.to_bytes())
    with pytest.raises(exc, match=error):
        SnapshotStore(tmp_path).load()
