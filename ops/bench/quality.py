"""`hilo bench quality`: does HiLo learn as well as full sync? The paper's comparison at CPU scale.

    hilo bench quality --quick              # smoke run (CI): 2 tasks x 4 optimizers x {full, spar}, 1 seed, 8 steps
    hilo bench quality --json --out DIR     # the full sweep: 2 tasks x 4 optimizers x 5 syncs x 3 seeds

Learning rates are tuned per task and optimizer on full sync only (seed 0, val split), then kept for every
sync method. Results: DIR/quality.json, DIR/pass4_vs_bytes.png, DIR/curves.png; the table is printed.
"""
import json
import os
import pathlib
import statistics
import sys
import time
from dataclasses import replace

from hilo.ops.bench.onpolicy import SYNCS, RunConfig, run
from hilo.ops.bench.pretrain import STUDENT, TEACHER, greedy_accuracy, pretrained

OPTIMIZERS = ("adamw", "muon", "lion", "sgd")
TASKS = ("distill", "rl")
LR_GRID = {"adamw": (3e-4, 1e-3, 3e-3), "muon": (1e-3, 3e-3, 1e-2), "lion": (3e-5, 1e-4, 3e-4), "sgd": (0.01, 0.03, 0.1)}
DEFAULT_LR = {"adamw": 1e-3, "muon": 3e-3, "lion": 1e-4, "sgd": 0.03}


def _say(*a):
    print(*a, file=sys.stderr, flush=True)


def sweep(quick: bool, steps: int | None, seeds: int | None, tasks=TASKS, optimizers=OPTIMIZERS, syncs=SYNCS) -> dict:
    """Run the sweep; returns {"cells": [...], "lossless_delta_bytes_per_step": ..., ...}."""
    t0 = time.time()
    student, teacher = pretrained(STUDENT, _say), pretrained(TEACHER, _say)
    base = {"student_greedy_test_acc": greedy_accuracy(student), "teacher_greedy_test_acc": greedy_accuracy(teacher)}
    _say(f"quality: student greedy test accuracy {base['student_greedy_test_acc']:.3f}, teacher {base['teacher_greedy_test_acc']:.3f}")
    steps = steps or (8 if quick else 40)
    seeds = seeds or (1 if quick else 3)
    syncs = ("full", "spar") if quick else syncs
    lrs = {}
    for task in tasks:
        for opt in optimizers:
            if quick:
                lrs[(task, opt)] = DEFAULT_LR[opt]
                continue
            scores = {}
            for lr in LR_GRID[opt]:
                r = run(RunConfig(task, opt, "full", lr, seed=0, steps=steps, eval_split="val"), student, teacher)
                scores[lr] = r["pass4"]
                _say(f"  tune {task}/{opt} lr={lr:g}: val pass@4 {r['pass4']:.3f}")
            lrs[(task, opt)] = max(scores, key=scores.get)
    cells, total = [], len(tasks) * len(optimizers) * len(syncs)
    for task in tasks:
        for opt in optimizers:
            for sync in syncs:
                cfg = RunConfig(task, opt, sync, lrs[(task, opt)], steps=steps)
                runs = [run(replace(cfg, seed=s), student, teacher) for s in range(seeds)]
                p1, p4 = [r["pass1"] for r in runs], [r["pass4"] for r in runs]
                cell = {
                    "task": task, "optimizer": opt, "sync": sync, "lr": cfg.lr, "seeds": seeds, "steps": steps,
                    "pass1_mean": statistics.mean(p1), "pass1_std": statistics.pstdev(p1),
                    "pass4_mean": statistics.mean(p4), "pass4_std": statistics.pstdev(p4),
                    "bytes_per_step": statistics.mean(r["bytes_per_step"] for r in runs),
                    "adapter_bytes": runs[0]["adapter_bytes"],
                    "lossless_delta_bytes_per_step": runs[0]["lossless_delta_bytes_per_step"] and
                    statistics.mean(r["lossless_delta_bytes_per_step"] for r in runs),
                    "rollout_digest_equal_versions": [r["rollout_digest_equal_versions"] for r in runs],
                    "curve": [statistics.mean(c) for c in zip(*(r["curve"] for r in runs))],
                }
                cell["fraction_of_adapter"] = cell["bytes_per_step"] / cell["adapter_bytes"]
                cells.append(cell)
                _say(f"  [{len(cells)}/{total}] {task}/{opt}/{sync}: pass@4 {cell['pass4_mean']:.3f} +- {cell['pass4_std']:.3f}, "
                     f"{cell['bytes_per_step']:,.0f} B/step ({100 * cell['fraction_of_adapter']:.2f}%)")
    lossless = [c["lossless_delta_bytes_per_step"] for c in cells if c["lossless_delta_bytes_per_step"]]
    return {"cells": cells, "lossless_delta_bytes_per_step": statistics.mean(lossless) if lossless else None,
            "quick": quick, "seconds": round(time.time() - t0, 1), **base}


def table(res: dict) -> str:
    """Markdown table of the cells, with the distance to full sync."""
    full = {(c["task"], c["optimizer"]): c["pass4_mean"] for c in res["cells"] if c["sync"] == "full"}
    out = ["| task | optimizer | sync | lr | pass@1 | pass@4 | vs full | bytes/step | % adapter |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for c in res["cells"]:
        d = c["pass4_mean"] - full.get((c["task"], c["optimizer"]), float("nan"))
        out.append(f"| {c['task']} | {c['optimizer']} | {c['sync']} | {c['lr']:g} | {c['pass1_mean']:.3f} +- {c['pass1_std']:.3f} | "
                   f"{c['pass4_mean']:.3f} +- {c['pass4_std']:.3f} | {100 * d:+.1f} | {c['bytes_per_step']:,.0f} | "
                   f"{100 * c['fraction_of_adapter']:.2f} |")
    if res["lossless_delta_bytes_per_step"]:
        spar = [c["bytes_per_step"] for c in res["cells"] if c["sync"] == "spar"]
        ratio = res["lossless_delta_bytes_per_step"] / statistics.mean(spar) if spar else float("nan")
        out.append(f"\nlossless adapter-delta codec on the full-sync runs: {res['lossless_delta_bytes_per_step']:,.0f} B/step "
                   f"({ratio:.1f}x Spar's bytes)")
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
                ax.plot(c["curve"], color=colors[c["sync"]], label=c["sync"], lw=1.2)
            ax.set(title=f"{task} / {opt}", xlabel="step", ylabel="train sample accuracy")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    p2 = out / "curves.png"
    fig.savefig(p2, dpi=110)
    plt.close("all")
    return [str(p1), str(p2)]


def main(quick: bool, as_json: bool, out_dir: str | None, steps=None, seeds=None) -> int:
    """Run, write JSON + plots, print the table (or the JSON)."""
    out = pathlib.Path(out_dir or os.path.join(os.environ.get("HILO_CACHE", os.path.expanduser("~/.cache/hilo-sync")),
                                               "bench", f"quality-{'quick-' if quick else ''}{int(time.time())}"))
    out.mkdir(parents=True, exist_ok=True)
    res = sweep(quick, steps, seeds)
    res["plots"] = plots(res, out)
    (out / "quality.json").write_text(json.dumps(res, indent=2))
    _say(f"quality: results in {out}")
    print(json.dumps(res, indent=2) if as_json else table(res))
    return 0
