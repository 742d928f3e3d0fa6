"""Where a benchmark ran: the commit of the code and the machine (cores, CPU model, memory bandwidth). Every results
file records it as `measured_on`, so a figure is never quoted without what it was measured on; a value nobody recorded
is "unknown", never a guess (files saved before this existed say which commit wrote them, from git log)."""
import datetime
import os
import pathlib
import platform
import subprocess
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the checkout the benchmark runs from
UNKNOWN = "unknown"
TRIAD_ELEMENTS = 50_000_000  # 600 MB over three arrays: far past any cache


def triad_gbps(runs: int = 5) -> float:
    """The machine's memory bandwidth as STREAM's triad measures it (a = b + s*c, 12 bytes per element), in GB/s."""
    import torch
    a, b, c = torch.empty(TRIAD_ELEMENTS), torch.ones(TRIAD_ELEMENTS), torch.full((TRIAD_ELEMENTS,), 2.0)
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        torch.add(b, c, alpha=3.0, out=a)
        best = min(best, time.perf_counter() - t0)
    return 12 * TRIAD_ELEMENTS / best / 1e9


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what the platform says, else unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or UNKNOWN


def cores() -> int:
    """The cores this process may run on (a container's share, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def commit() -> tuple:
    """(HEAD of the checkout, whether tracked files differ from it); unknown outside a git checkout."""
    head = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return (head.strip() if head else UNKNOWN), (bool(status.strip()) if status is not None else UNKNOWN)


def measured_on(triad: float | None = None) -> dict:
    """What a results file records about its run: commit (and whether the code differed from it), when, the cores, the
    CPU model and the triad bandwidth (`triad`: the one the benchmark measured; else measured now)."""
    head, dirty = commit()
    return {"commit": head, "dirty": dirty, "recorded": "at run",
            "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "cores": cores(), "cpu_model": cpu_model(),
            "triad_gbps": round(triad if triad is not None else triad_gbps(), 2)}
