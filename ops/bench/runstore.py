"""A sweep's finished runs as one append-only JSONL file: DIR/runs.jsonl, one {"id", "result"} object a line.

One file per sweep instead of one per run: the parent process appends each run as it finishes (flushed and
fsynced, so a killed sweep resumes without redoing it); a torn last line from a kill mid-write is ignored.
A folder of the older layout (DIR/runs/ID.json, one file per run) is still read.
"""
import json
import os
import pathlib


class RunStore:
    """{run id: result} saved under `folder`."""

    def __init__(self, folder: pathlib.Path):
        self.folder = pathlib.Path(folder)
        self.path = self.folder / "runs.jsonl"
        self.results = {}
        legacy = self.folder / "runs"
        if legacy.is_dir():
            for p in sorted(legacy.glob("*.json")):
                self.results[p.stem] = json.loads(p.read_text())
        if self.path.exists():
            with open(self.path, encoding="utf-8") as f:
                for line in f:
                    try:
                        row = json.loads(line)
                    except ValueError:
                        if line.endswith("\n"):
                            raise
                        break  # a torn last line: that run is computed again
                    self.results[row["id"]] = row["result"]

    def get(self, run_id: str):
        """The saved result of `run_id`, or None."""
        return self.results.get(run_id)

    def put(self, run_id: str, result: dict) -> None:
        """Append one finished run, durable when this returns."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"id": run_id, "result": result}, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.results[run_id] = result

    def __len__(self):
        return len(self.results)
