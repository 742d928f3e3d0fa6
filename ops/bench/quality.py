"""`hilo bench quality`: does HiLo learn as well as full sync? The paper's comparison at CPU scale.

    hilo bench quality --quick              # smoke run (CI): 2 tasks x 4 optimizers x {full, spar}, 1 seed, 8 steps
    hilo bench quality --json --out DIR     # the full sweep: 2 tasks x 4 optimizers x 5 syncs x 3 seeds
    hilo bench quality --json --out DIR --budgets 1.6%,7.2%   # ... with every lossy sync at both budgets (README)

Learning rates are tuned per task and optimizer on full sync only (seed 0, val split; by pass@1, since pass@4
is nearer its ceiling), then kept for every sync method. Runs go to a pool of --workers processes (one torch
thread each); every finished run is saved under DIR/runs/, so rerunning with the same --out resumes an
interrupted sweep, and --saved-only reports the runs saved so far without computing any. Results:
DIR/quality.json, DIR/pass4_vs_bytes.png, DIR/curves.png; the table is printed.
"""
import hashlib
import json
import math
import multiprocessing as mp
import os
import pathlib
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace

import torch

from hilo.ops.bench.onpolicy import SYNCS, RunConfig, evaluate, run
from hilo.ops.bench.pretrain import STUDENT, TEACHER, greedy_accuracy, pretrained
from hilo.replica.optimizers import OPTIMIZERS as OPTIMIZER_REGISTRY
from hilo.schemas.errors import ConfigError

OPTIMIZERS = tuple(OPTIMIZER_REGISTRY)
TASKS = ("distill", "rl")
# Half-decade steps; each grid spans the best rate of both tasks with a worse one on either side
LR_GRID = {"adamw": (1e-4, 3e-4, 1e-3, 3e-3), "muon": (3e-4, 1e-3, 3e-3, 1e-2), "lion": (3e-5, 1e-4, 3e-4, 1e-3),
           "sgd": (3e-3, 0.01, 0.03, 0.1)}
DEFAULT_LR = {"adamw": 1e-3, "muon": 3e-3, "lion": 1e-4, "sgd": 0.03}
STEPS, QUICK_STEPS = 60, 8
QUICK_EVAL_SAMPLES = 4  # the smoke run's held-out samples per problem (the sweep uses RunConfig.eval_samples)
RUN_VERSION = 3  # bump when a run's result would change for the same RunConfig (invalidates saved runs)


@dataclass(frozen=True)
class SweepConfig:
    """What `hilo bench quality` runs. None means the default of the mode (quick or full)."""

    quick: bool = False          # smoke run: {full, spar}, DEFAULT_LR (no tuning), QUICK_STEPS, 1 seed
    steps: int | None = None     # training steps per run (default: QUICK_STEPS or STEPS)
    seeds: int | None = None     # seeds per cell (default: 1 quick, 3 full)
    workers: int = 2             # parallel runs, one torch thread each
    tasks: tuple = TASKS
    optimizers: tuple = OPTIMIZERS
    syncs: tuple | None = None   # default: ("full", "spar") quick, every SYNCS otherwise
    budgets: tuple = (RunConfig.budget,)  # fractions of the bf16 adapter; every lossy sync runs at each
    saved_only: bool = False     # compute nothing: report the runs saved so far

    def __post_init__(self):
        for name, allowed in (("tasks", TASKS), ("optimizers", OPTIMIZERS), ("syncs", SYNCS)):
            bad = [v for v in getattr(self, name) or () if v not in allowed]
            if bad or getattr(self, name) == ():
                raise ConfigError(f"quality: {name} {list(getattr(self, name))} must be a non-empty subset of {list(allowed)}")
        if self.workers < 1:
            raise ConfigError(f"quality: workers must be >= 1, got {self.workers}")
        for name in ("steps", "seeds"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"quality: {name} must be >= 1, got {getattr(self, name)}")
        if not self.budgets or not all(0 < b <= 4 for b in self.budgets):
            raise ConfigError(f"quality: budgets {list(self.budgets)} must be fractions of the adapter in (0, 4]")


def _say(*a):
    print(*a, file=sys.stderr, flush=True)


_MODELS = None  # (student, teacher) of this worker process


def _worker_init():
    """One torch thread per worker: tiny models scale better across processes than across threads."""
    global _MODELS
    torch.set_num_threads(1)
    _MODELS = pretrained(STUDENT, _say), pretrained(TEACHER, _say)


def _run_file(runs: pathlib.Path, cfg: RunConfig) -> pathlib.Path:
    key = hashlib.sha256(json.dumps(asdict(cfg) | {"v": RUN_VERSION}, sort_keys=True).encode()).hexdigest()[:10]
    return runs / f"{cfg.task}-{cfg.optimizer}-{cfg.sync}-lr{cfg.lr:g}-s{cfg.seed}-{key}.json"


def _run_to_file(cfg: RunConfig, path: str) -> dict:
    """Worker body: one run, written atomically so an interrupted sweep resumes without redoing it."""
    res = run(cfg, *_MODELS)
    tmp = f"{path}.tmp{os.getpid()}"
    pathlib.Path(tmp).write_text(json.dumps(res))
    os.replace(tmp, path)
    return res


def run_all(cfgs: list, runs: pathlib.Path, workers: int, label: str, compute: bool = True) -> list:
    """Results of `cfgs` in order: read from `runs/` where a finished run is saved, the rest computed in a pool
    (or None where compute is False)."""
    runs.mkdir(parents=True, exist_ok=True)
    paths = [_run_file(runs, c) for c in cfgs]
    results = {i: json.loads(p.read_text()) for i, p in enumerate(paths) if p.exists()}
    todo = [i for i in range(len(cfgs)) if i not in results]
    if results:
        _say(f"quality: {label}: {len(results)} of {len(cfgs)} runs already in {runs}")
    if not compute:
        return [results.get(i) for i in range(len(cfgs))]
    t0 = time.time()
    with ProcessPoolExecutor(min(workers, len(todo)) or 1, mp_context=mp.get_context("spawn"), initializer=_worker_init) as pool:
        futures = {pool.submit(_run_to_file, cfgs[i], str(paths[i])): i for i in todo}
        for n, fut in enumerate(as_completed(futures), 1):
            i = futures[fut]
            results[i] = fut.result()
            c, el = cfgs[i], time.time() - t0
            _say(f"  {label} [{n}/{len(todo)}] {c.task}/{c.optimizer}/{c.sync} lr={c.lr:g} seed={c.seed}: "
                 f"pass@4 {results[i]['pass4']:.3f} ({el / 60:.1f} min, ~{el / n * (len(todo) - n) / 60:.0f} min left)")
    return [results[i] for i in range(len(cfgs))]


def sweep(cfg: SweepConfig, out: pathlib.Path) -> dict:
    """Run the sweep (resuming from out/runs/); returns {"cells": [...], "lossless_delta_bytes_per_step": ..., ...}.

    With saved_only, a cell's `seeds` counts the runs it has so far.
    """
    t0 = time.time()
    quick, saved_only, workers, tasks, optimizers = cfg.quick, cfg.saved_only, cfg.workers, cfg.tasks, cfg.optimizers
    evals = QUICK_EVAL_SAMPLES if quick else RunConfig.eval_samples
    student, teacher = pretrained(STUDENT, _say), pretrained(TEACHER, _say)
    base = {"student_greedy_test_acc": greedy_accuracy(student), "teacher_greedy_test_acc": greedy_accuracy(teacher),
            # where every run starts: the student before any on-policy step, scored exactly like a run's end
            "untrained": evaluate(student, teacher, "test", RunConfig.group, evals, torch.Generator().manual_seed(99))}
    _say(f"quality: student greedy test accuracy {base['student_greedy_test_acc']:.3f}, teacher {base['teacher_greedy_test_acc']:.3f}")
    steps = cfg.steps or (QUICK_STEPS if quick else STEPS)
    seeds = cfg.seeds or (1 if quick else 3)
    syncs = cfg.syncs or (("full", "spar") if quick else SYNCS)
    runs = out / "runs"
    lrs = {(t, o): DEFAULT_LR[o] for t in tasks for o in optimizers}
    tuning = []  # full-sync val scores of every grid rate (empty for --quick, which uses DEFAULT_LR)
    if not quick:
        grid = [RunConfig(t, o, "full", lr, seed=0, steps=steps, eval_split="val", eval_samples=evals)
                for t in tasks for o in optimizers for lr in LR_GRID[o]]
        tuned = run_all(grid, runs, workers, "tune", compute=not saved_only)
        if None in tuned:
            raise ConfigError(f"quality: {out} holds {len(tuned) - tuned.count(None)} of {len(tuned)} tuning runs; "
                              "run without --saved-only to finish them")
        scores = {}
        for c, r in zip(grid, tuned):
            scores.setdefault((c.task, c.optimizer), {})[c.lr] = r["pass1"]
            tuning.append({"task": c.task, "optimizer": c.optimizer, "lr": c.lr, "val_pass1": r["pass1"], "val_pass4": r["pass4"]})
        lrs = {key: max(s, key=s.get) for key, s in scores.items()}
        _say("quality: tuned learning rates " + ", ".join(f"{t}/{o}={lr:g}" for (t, o), lr in lrs.items()))
    cellcfgs = [RunConfig(t, o, s, lrs[(t, o)], steps=steps, eval_samples=evals, budget=b)
                for t in tasks for o in optimizers for s in syncs for b in (cfg.budgets if s != "full" else (RunConfig.budget,))]
    # Seed-major order: a sweep stopped early has every cell at the same number of seeds (give or take one)
    flat = [replace(c, seed=i) for i in range(seeds) for c in cellcfgs]
    results = run_all(flat, runs, workers, "sweep", compute=not saved_only)
    cells = []
    for j, rc in enumerate(cellcfgs):
        rs = [r for r in results[j::len(cellcfgs)] if r is not None]
        if not rs:
            continue
        p1, p4 = [r["pass1"] for r in rs], [r["pass4"] for r in rs]
        cell = {
            "task": rc.task, "optimizer": rc.optimizer, "sync": rc.sync, "budget": None if rc.sync == "full" else rc.budget,
            "lr": rc.lr, "seeds": len(rs), "steps": steps,
            "pass1_mean": statistics.mean(p1), "pass1_std": statistics.pstdev(p1),
            "pass4_mean": statistics.mean(p4), "pass4_std": statistics.pstdev(p4), "pass4_seeds": p4,
            "kl_mean": statistics.mean(r["kl"] for r in rs), "kl_std": statistics.pstdev(r["kl"] for r in rs),
            "bytes_per_step": statistics.mean(r["bytes_per_step"] for r in rs),
            "adapter_bytes": rs[0]["adapter_bytes"],
            "lossless_delta_bytes_per_step": rs[0]["lossless_delta_bytes_per_step"] and
            statistics.mean(r["lossless_delta_bytes_per_step"] for r in rs),
            "rollout_digest_equal_versions": [r["rollout_digest_equal_versions"] for r in rs],
            "curve": [statistics.mean(c) for c in zip(*(r["curve"] for r in rs))],
        }
        cell["fraction_of_adapter"] = cell["bytes_per_step"] / cell["adapter_bytes"]
        cells.append(cell)
    lossless = [c["lossless_delta_bytes_per_step"] for c in cells if c["lossless_delta_bytes_per_step"]]
    return {"cells": cells, "lossless_delta_bytes_per_step": statistics.mean(lossless) if lossless else None,
            "tuning": tuning, "quick": quick, "seconds": round(time.time() - t0, 1), **base}


def diff_se(a: list, b: list) -> float:
    """Standard error of mean(a) - mean(b) for independent seeds (nan with fewer than 2 seeds on a side)."""
    if min(len(a), len(b)) < 2:
        return float("nan")
    return (statistics.variance(a) / len(a) + statistics.variance(b) / len(b)) ** 0.5


def label(cell: dict) -> str:
    """The sync method, with its budget when that is not the default: "spar", "spar @6.4%"."""
    b = cell.get("budget")
    return cell["sync"] if b is None or b == RunConfig.budget else f"{cell['sync']} @{100 * b:g}%"


def vs_full(cell: dict, full: dict | None) -> str:
    """pass@4 of `cell` minus full sync's, in points, +- the standard error of the difference over seeds."""
    if full is None:
        return "n/a"
    d = 100 * (cell["pass4_mean"] - full["pass4_mean"])
    se = diff_se(cell["pass4_seeds"], full["pass4_seeds"]) if cell is not full else float("nan")
    return f"{d:+.1f}" + ("" if math.isnan(se) else f" +- {100 * se:.1f}")


def table(res: dict) -> str:
    """Markdown table of the cells, with the distance to full sync: pass@4 in points (+- the standard error of the
    difference over seeds), and the held-out KL as the share of full sync's KL reduction (from the untrained
    student's) that the method achieved."""
    full = {(c["task"], c["optimizer"]): c for c in res["cells"] if c["sync"] == "full"}
    u = res["untrained"]
    out = [f"untrained student (every run's start): pass@1 {u['pass1']:.3f}, pass@4 {u['pass4']:.3f}, held-out KL {u['kl']:.3f}\n",
           "| task | optimizer | sync | lr | pass@1 | pass@4 | vs full (points +- SE) | held-out KL | KL gain vs full | bytes/step | % adapter |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in res["cells"]:
        f = full.get((c["task"], c["optimizer"]))
        kr = (u["kl"] - c["kl_mean"]) / (u["kl"] - f["kl_mean"]) if f and f["kl_mean"] != u["kl"] else float("nan")
        out.append(f"| {c['task']} | {c['optimizer']} | {label(c)} | {c['lr']:g} | {c['pass1_mean']:.3f} +- {c['pass1_std']:.3f} | "
                   f"{c['pass4_mean']:.3f} +- {c['pass4_std']:.3f} | {vs_full(c, f)} | {c['kl_mean']:.3f} +- {c['kl_std']:.3f} | "
                   f"{100 * kr:.0f}% | {c['bytes_per_step']:,.0f} | {100 * c['fraction_of_adapter']:.2f} |")
    if res["lossless_delta_bytes_per_step"]:
        spar = [c["bytes_per_step"] for c in res["cells"] if label(c) == "spar"]
        ratio = res["lossless_delta_bytes_per_step"] / statistics.mean(spar) if spar else float("nan")
        out.append(f"\nlossless adapter-delta codec on the full-sync runs: {res['lossless_delta_bytes_per_step']:,.0f} B/step "
                   f"({ratio:.1f}x Spar's bytes)")
    return "\n".join(out)


def summary(res: dict) -> str:
    """One row per (task, optimizer): full sync's pass@4, then every other method's distance to it (points +- SE)."""
    methods = list(dict.fromkeys(label(c) for c in res["cells"] if c["sync"] != "full"))
    rows = {}
    for c in res["cells"]:
        rows.setdefault((c["task"], c["optimizer"]), {})[label(c)] = c
    out = ["| task | optimizer | full pass@4 | " + " | ".join(methods) + " |", "|---|---|---:|" + "---:|" * len(methods)]
    for (task, opt), row in rows.items():
        f = row.get("full")
        cols = [f"{f['pass4_mean']:.3f}" if f else "n/a"] + [vs_full(row[m], f) if m in row else "" for m in methods]
        out.append(f"| {task} | {opt} | " + " | ".join(cols) + " |")
    return "\n".join(out)


def plots(res: dict, out: pathlib.Path) -> list:
    """pass@4 vs bytes per step, and learning curves; returns the PNG paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tasks = sorted({c["task"] for c in res["cells"]})
    opts = sorted({c["optimizer"] for c in res["cells"]})
    syncs = [s for s in SYNCS if any(c["sync"] == s for c in res["cells"])]
    colors = dict(zip(SYNCS, ("black", "tab:red", "tab:blue", "tab:green", "tab:purple")))
    markers = dict(zip(("adamw", "muon", "lion", "sgd"), "osD^"))
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.5), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for c in (c for c in res["cells"] if c["task"] == task):
            ax.errorbar(c["bytes_per_step"], c["pass4_mean"], yerr=c["pass4_std"], fmt=markers[c["optimizer"]],
                        color=colors[c["sync"]], capsize=3)
        for opt in opts:  # one line through each method's budgets (when the sweep ran several)
            for sync in syncs:
                pts = sorted((c["bytes_per_step"], c["pass4_mean"]) for c in res["cells"]
                             if (c["task"], c["optimizer"], c["sync"]) == (task, opt, sync))
                if len(pts) > 1:
                    ax.plot(*zip(*pts), color=colors[sync], lw=0.8, alpha=0.6)
        if res["lossless_delta_bytes_per_step"]:
            ax.axvline(res["lossless_delta_bytes_per_step"], color="gray", ls="--", lw=1)
        ax.set_xscale("log")
        ax.set(title=f"{task}: final pass@4 vs bytes/step", xlabel="bytes per step (log)", ylabel="held-out pass@4")
    handles = [plt.Line2D([], [], color=colors[s], marker="o", ls="", label=s) for s in syncs]
    handles += [plt.Line2D([], [], color="k", marker=markers[o], ls="", label=o) for o in opts]
    handles.append(plt.Line2D([], [], color="gray", ls="--", label="lossless delta"))
    axes[0][-1].legend(handles=handles, fontsize=8, loc="best")
    fig.tight_layout()
    p1 = out / "pass4_vs_bytes.png"
    fig.savefig(p1, dpi=110)
    fig, axes = plt.subplots(len(tasks), len(opts), figsize=(4 * len(opts), 3.2 * len(tasks)), squeeze=False)
    for i, task in enumerate(tasks):
        for j, opt in enumerate(opts):
            ax = axes[i][j]
            for c in (c for c in res["cells"] if c["task"] == task and c["optimizer"] == opt):
                dashed = label(c) != c["sync"]  # a non-default budget
                ax.plot(c["curve"], color=colors[c["sync"]], label=label(c), lw=1.2, ls="--" if dashed else "-")
            ax.set(title=f"{task} / {opt}", xlabel="step", ylabel="train sample accuracy")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    p2 = out / "curves.png"
    fig.savefig(p2, dpi=110)
    plt.close("all")
    return [str(p1), str(p2)]


def main(cfg: SweepConfig, as_json: bool, out_dir: str | None) -> int:
    """Run, write JSON + plots, print the table (or the JSON)."""
    out = pathlib.Path(out_dir or os.path.join(os.environ.get("HILO_CACHE", os.path.expanduser("~/.cache/hilo-sync")),
                                               "bench", f"quality-{'quick-' if cfg.quick else ''}{int(time.time())}"))
    out.mkdir(parents=True, exist_ok=True)
    res = sweep(cfg, out)
    res["plots"] = plots(res, out)
    (out / "quality.json").write_text(json.dumps(res, indent=2))
    _say(f"quality: results in {out}")
    print(json.dumps(res, indent=2) if as_json else table(res) + "\n\npass@4 vs full sync, points +- SE:\n\n" + summary(res))
    return 0
