"""How long `hilo --help` and `hilo lag --help` take, against building every command's parser (the layout before
the command table, which imported the benchmarks and torch to fill `choices`). One run, so the ratio holds on a
noisy machine.

    ~/.cache/hilo-sync/venv/bin/python -m hilo.ops.bench.startup > docs/results/startup.json
"""
import json
import resource
import subprocess
import sys
import time

CASES = {
    "every parser built (the old hilo --help)": "from hilo.ops.cli import parser; parser().format_help()",
    "hilo --help": "from hilo.ops.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass",
    "hilo lag --help": "from hilo.ops.cli import main\ntry:\n    main(['lag', '--help'])\nexcept SystemExit:\n    pass",
}


def measure(code: str, repeats: int = 3) -> dict:
    """Fastest wall and CPU seconds of a fresh interpreter running `code`."""
    walls, cpus = [], []
    for _ in range(repeats):
        r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        walls.append(time.perf_counter() - t0)
        cpus.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
    return {"wall_s": round(min(walls), 3), "cpu_s": round(min(cpus), 3)}


def main() -> int:
    """Print {"measured_on", "cases": {case: {wall_s, cpu_s, speedup}}} as JSON."""
    from hilo.ops.bench.machine import measured_on
    out = {name: measure(code) for name, code in CASES.items()}
    base = out[next(iter(CASES))]["wall_s"]
    for row in out.values():
        row["speedup"] = round(base / row["wall_s"], 1)
    print(json.dumps({"measured_on": measured_on(), "cases": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
