"""The sweep's run store: one JSONL file, resumable after a kill mid-write, and the older one-file-per-run layout
read."""
import json

from hilo.ops.bench.runstore import RunStore


def test_runs_survive_reopening_and_a_torn_last_line(tmp_path):
    store = RunStore(tmp_path)
    store.put("a", {"pass4": 0.5})
    store.put("b", {"pass4": 0.25})
    with open(tmp_path / "runs.jsonl", "a") as f:
        f.write('{"id": "c", "resu')  # a kill mid-append
    again = RunStore(tmp_path)
    assert (again.get("a"), again.get("b"), again.get("c"), len(again)) == ({"pass4": 0.5}, {"pass4": 0.25}, None, 2)


def test_the_one_file_per_run_layout_is_still_read(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "distill-adamw-full-lr0.001-s0-abc.json").write_text(json.dumps({"pass4": 0.75}))
    assert RunStore(tmp_path).get("distill-adamw-full-lr0.001-s0-abc") == {"pass4": 0.75}
