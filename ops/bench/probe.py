"""`hilo bench probe`: where a compressed method's optimizer steps part from the uncompressed shadow's.

    hilo bench probe --task rl --optimizers muon,adamw --sync spar4 --json

Per optimizer, runs of the quality benchmark (onpolicy.run, val split, the TUNE_SEEDS) with a probe on every
version and block: was the block in the message, the rank of its decoded gradient, the cosine between the
replica's step and the step the same optimizer takes from the same parameters on the uncompressed gradient,
their norm ratio, and the error-feedback residual relative to the gradient. The question it answers: does a
method lose because blocks go unsent, because each step points elsewhere, or because the residual grows?
"""
import json
import math
import pathlib
import statistics
import sys
from dataclasses import asdict, dataclass

import torch

from hilo.ops.bench.machine import measured_on
from hilo.ops.bench.onpolicy import SYNCS, RunConfig, run
from hilo.ops.pretrain import STUDENTS, pretrained, teacher_of
from hilo.replica.optimizers import OPTIMIZERS
from hilo.schemas.errors import ConfigError
from hilo.schemas.options import opt


@dataclass(frozen=True)
class ProbeConfig:
    """What `hilo bench probe` runs: the task, the optimizers and their rates, the compressed sync probed and its
    budget, the seeds and the steps per run; checked at construction. Each field's help is in its metadata
    (`hilo bench probe --help`, docs/cli.md)."""

    task: str = opt("rl", "distill or rl")
    optimizers: tuple = opt(("muon", "adamw"), "each is run at its rate in lrs")
    sync: str = opt("spar4", "a sync of the quality benchmark other than delta (spar4, topk, powersgd, post, ...)")
    budget: float = opt(0.016, "bytes per version as a fraction of the bf16 adapter")
    lrs: tuple = opt((1e-3, 1e-3), "one learning rate per optimizer")
    seeds: tuple = opt((1000, 1001, 1002), "val-split seeds (never a test seed)")
    steps: int = opt(60, "on-policy steps (versions) per run")
    eval_problems: int | None = opt(None, "val problems each run is scored on, a fixed seeded subset (none: all)")
    student: str = opt("h256-l4", f"the student's shape, a key of {list(STUDENTS)} (smoke: the tests' small pair)")

    def __post_init__(self):
        if self.task not in ("distill", "rl"):
            raise ConfigError(f"probe: task {self.task!r} must be distill or rl")
        bad = [o for o in self.optimizers if o not in OPTIMIZERS]
        if bad or not self.optimizers:
            raise ConfigError(f"probe: optimizers {list(self.optimizers)} must be a non-empty subset of "
                              f"{list(OPTIMIZERS)}")
        if self.sync not in SYNCS or SYNCS[self.sync].mode == "delta":
            raise ConfigError(f"probe: sync {self.sync!r} must be one whose trainer steps from the sites' params: "
                              f"{[k for k, v in SYNCS.items() if v.mode != 'delta']}")
        if len(self.lrs) != len(self.optimizers) or not all(lr > 0 for lr in self.lrs):
            raise ConfigError(f"probe: lrs {list(self.lrs)} must give one positive rate per optimizer "
                              f"{list(self.optimizers)}")
        if not 0 < self.budget <= 4:
            raise ConfigError(f"probe: budget {self.budget} must be a fraction of the adapter in (0, 4]")
        if self.steps < 1 or not self.seeds:
            raise ConfigError(f"probe: steps ({self.steps}) and seeds ({list(self.seeds)}) must be >= 1 and non-empty")
        if self.student not in STUDENTS:
            raise ConfigError(f"probe: student {self.student!r} must be one of {list(STUDENTS)}")
        if self.eval_problems is not None and self.eval_problems < 1:
            raise ConfigError(f"probe: eval_problems must be >= 1 or none, got {self.eval_problems}")


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.mean(xs) if xs else None


def summarise(probes: list) -> dict:
    """Means over every (seed, version, block) of the per-version probe dicts (onpolicy._probe)."""
    def pick(key, sent):
        return [v for p in probes for v, s in zip(p[key], p["sent"]) if s == sent]
    residual = [statistics.mean(p["residual_ratio"]) for p in probes]
    ranks = pick("rank", True)
    return {"sent_fraction": _mean([float(s) for p in probes for s in p["sent"]]),
            "step_cosine_sent": _mean(pick("cosine", True)), "step_cosine_unsent": _mean(pick("cosine", False)),
            "norm_ratio_sent": _mean(pick("norm_ratio", True)), "norm_ratio_unsent": _mean(pick("norm_ratio", False)),
            "decoded_rank_sent": _mean(ranks), "block_rank": _mean([r for p in probes for r in p["full_rank"]]),
            "residual_ratio_mean": _mean(residual)}


def probe(cfg: ProbeConfig, say=print) -> dict:
    """Run every (optimizer, seed) with the probe; per optimizer the summary and the per-run scores."""
    spec = STUDENTS[cfg.student]
    student, teacher = pretrained(spec, say), pretrained(teacher_of(spec), say)
    out = {"config": asdict(cfg), "optimizers": {}}
    for optimizer, lr in zip(cfg.optimizers, cfg.lrs):
        probes, runs = [], []
        for seed in cfg.seeds:
            got = []
            r = run(RunConfig(cfg.task, optimizer, cfg.sync, lr, seed=seed, steps=cfg.steps, eval_split="val",
                              budget=cfg.budget,
                                eval_problems=cfg.eval_problems),
                    student, teacher, got)
            probes += got
            runs.append({"seed": seed, "val_pass1": r["pass1"], "shadow_cosine": r["shadow_cosine"],
                         "residual_by_version": [round(statistics.mean(p["residual_ratio"]), 3) for p in got]})
            say(f"probe: {cfg.task}/{optimizer}/{cfg.sync} lr={lr:g} seed={seed}: val pass@1 {r['pass1']:.3f}, "
                f"shadow cosine {r['shadow_cosine']:.2f}")
        out["optimizers"][optimizer] = {"lr": lr, **summarise(probes), "runs": runs}
    return out


def table(res: dict) -> str:
    """One markdown row per optimizer."""
    rows = ["| optimizer | lr | blocks sent per version | decoded rank (of block rank) | step cosine to shadow (sent / "
            "unsent) | step norm ratio (sent / unsent) | residual / gradient | shadow cosine at the end | val pass@1 |",
            "|---|---:|---:|---|---|---|---:|---:|---:|"]
    f = lambda x, d=2: "n/a" if x is None else f"{x:.{d}f}"  # noqa: E731
    for optimizer, o in res["optimizers"].items():
        rows.append(f"| {optimizer} | {o['lr']:g} | {100 * o['sent_fraction']:.0f}% | "
                    f"{f(o['decoded_rank_sent'], 1)} of {o['block_rank']:.0f} | "
                    f"{f(o['step_cosine_sent'])} / {f(o['step_cosine_unsent'])} | "
                    f"{f(o['norm_ratio_sent'])} / {f(o['norm_ratio_unsent'])} | "
                    f"{f(o['residual_ratio_mean'])} | {statistics.mean(r['shadow_cosine'] for r in o['runs']):.2f} | "
                    f"{statistics.mean(r['val_pass1'] for r in o['runs']):.3f} |")
    return "\n".join(rows)


def main(cfg: ProbeConfig, as_json: bool, out: str | None) -> int:
    """Run, write probe.json to `out` (when given), print the table or the JSON."""
    torch.set_num_threads(1)
    res = probe(cfg, lambda *a: print(*a, file=sys.stderr, flush=True))
    if out:
        pathlib.Path(out).mkdir(parents=True, exist_ok=True)
        res["measured_on"] = measured_on()
        (pathlib.Path(out) / f"probe-{cfg.task}-{cfg.sync}.json").write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2) if as_json else table(res))
    return 0
