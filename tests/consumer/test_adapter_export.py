"""Adapter export and pruning: the directory just written is never pruned, whatever a dead incarnation left."""
from hilo.consumer.adapter_export import discard_beyond, export_adapter, version_dirs
from tests.conftest import genesis


def test_the_exported_directory_survives_newer_ones_left_by_a_crash(manifest, tmp_path):
    for v in (3, 4, 5):  # a dead incarnation exported versions beyond the snapshot this one restarts from
        (tmp_path / f"v{v:08d}").mkdir()
    out = export_adapter(genesis(manifest), tmp_path, keep=1)
    assert out.name == "v00000000" and (out / "adapter_model.safetensors").is_file()
    assert sorted(version_dirs(tmp_path)) == [0, 5]  # the newest `keep` and the one just written


def test_discard_beyond_removes_only_newer_versions(tmp_path):
    for name in ("v00000002", "v00000007", "v00000009", ".tmp-v00000010-1", "notes"):
        (tmp_path / name).mkdir()
    assert discard_beyond(tmp_path, 7) == [9]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-v00000010-1", "notes", "v00000002", "v00000007"]
    assert discard_beyond(tmp_path / "missing", 0) == []
