"""Which prompts each published version trained on: the trainer's ledger of the return path, for restarts.

    STATE_DIR/rollouts.jsonl:  {"v": 12, "trained": ["p-40", "p-41"], "retired": ["p-37"]}   one line per step

Propose, then commit: the line for version v is written and fsynced *before* v is published. After a crash the
trainer resumes at the version the log (or its snapshot) says it published; lines above that version were never
published and are ignored, and a later line for the same version replaces an earlier one. So a group is counted
as trained exactly when the version that trained on it is on the log: a restarted trainer neither trains on it
again nor loses a prompt that was in flight (the rest are rebuilt from RUN.prompts and RUN.rollouts).
"""
import json
import os

from hilo.schemas.errors import ConfigError


class RolloutLedger:
    """Append-only JSON lines at `path` (a torn last line, from a crash mid-write, is ignored)."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def record(self, version: int, trained, retired=()) -> None:
        """Before publishing `version`: the prompts its step trained on, and those dropped since the last step."""
        line = json.dumps({"v": int(version), "trained": sorted(trained), "retired": sorted(retired)}) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def settled(self, published: int) -> tuple:
        """(trained prompt ids, retired prompt ids) of every version up to `published`, the last line of each
        winning."""
        by_version = {}
        try:
            with open(self.path, encoding="utf-8") as f:
                lines = f.read().split("\n")
        except FileNotFoundError:
            return set(), set()
        for n, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                e = json.loads(line)
            except ValueError:
                if n == len(lines) - 1:  # torn by a crash mid-write: never fsynced, so never published either
                    continue
                raise ConfigError(
                    f"{self.path}: line {n + 1} is not JSON: the trainer's rollout ledger is damaged") from None
            by_version[e["v"]] = e
        trained, retired = set(), set()
        for v, e in by_version.items():
            if v <= published:
                trained.update(e["trained"])
                retired.update(e["retired"])
        return trained, retired
