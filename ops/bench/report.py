"""Where a benchmark's results go, and how they are handed back (JSON file always, JSON or a table on stdout)."""
import json
import os
import pathlib
import sys
import time


def results_dir(name: str, out: str | None) -> pathlib.Path:
    """`out`, or ~/.cache/hilo-sync/bench/NAME-TIME (HILO_CACHE moves it); created."""
    cache = os.environ.get("HILO_CACHE", os.path.expanduser("~/.cache/hilo-sync"))
    path = pathlib.Path(out or os.path.join(cache, "bench", f"{name}-{int(time.time())}"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def save(res: dict, out_dir: pathlib.Path, name: str, as_json: bool) -> bool:
    """Write OUT_DIR/NAME.json, say where, print the JSON when asked; True when the caller should print nothing more."""
    (out_dir / f"{name}.json").write_text(json.dumps(res, indent=2))
    print(f"bench {name}: results in {out_dir}", file=sys.stderr, flush=True)
    if as_json:
        print(json.dumps(res, indent=2))
    return as_json
