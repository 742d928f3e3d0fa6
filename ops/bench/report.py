"""Where a benchmark's results go, how they are handed back (JSON file always, JSON or a table on stdout), and the
paired-difference interval the benchmarks that compare methods on shared seeds report."""
import json
import os
import pathlib
import statistics
import sys
import time

from hilo.ops.bench.machine import measured_on

# Student t quantiles t(0.975, df) for the 95% interval of a paired difference over few seeds
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def mean_ci(diffs: list) -> dict | None:
    """Mean, standard error and 95% t interval of per-seed paired differences; None below 2 of them."""
    if len(diffs) < 2:
        return None
    mean, se = statistics.mean(diffs), statistics.stdev(diffs) / len(diffs) ** 0.5
    half = T975.get(len(diffs) - 1, 1.96) * se
    return {"diff": mean, "se": se, "ci95": [mean - half, mean + half], "n": len(diffs)}


def results_dir(name: str, out: str | None) -> pathlib.Path:
    """`out`, or ~/.cache/hilo-sync/bench/NAME-TIME (HILO_CACHE moves it); created."""
    cache = os.environ.get("HILO_CACHE", os.path.expanduser("~/.cache/hilo-sync"))
    path = pathlib.Path(out or os.path.join(cache, "bench", f"{name}-{int(time.time())}"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def save(res: dict, out_dir: pathlib.Path, name: str, as_json: bool) -> bool:
    """Write OUT_DIR/NAME.json, say where, print the JSON when asked; True when the caller should print nothing more.
    `res` gains `measured_on` (ops/bench/machine.py: the commit and the machine) unless the benchmark set it."""
    if "measured_on" not in res:
        res["measured_on"] = measured_on()
    (out_dir / f"{name}.json").write_text(json.dumps(res, indent=2))
    print(f"bench {name}: results in {out_dir}", file=sys.stderr, flush=True)
    if as_json:
        print(json.dumps(res, indent=2))
    return as_json


def save_figure(fig, out_dir: pathlib.Path, name: str) -> str:
    """Write a matplotlib figure as OUT_DIR/NAME.png (laid out, 110 dpi), close it; returns the path."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    p = out_dir / f"{name}.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return str(p)
