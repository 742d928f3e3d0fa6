"""`hilo bench quality`: does HiLo learn as well as full sync? The paper's comparison at CPU scale.

    hilo bench quality --quick              # smoke run (CI): 2 tasks x 4 optimizers x QUICK_SYNCS at 1.6%, 1 seed,
                                              8 steps,
                                            # the smoke student and teacher, 128 held-out problems: the pipeline,
                                              not quality
    hilo bench quality --json --out DIR     # the full sweep: 2 tasks x 4 optimizers x PLAN (sync x budget) x 5 seeds

The protocol. Every (task, optimizer, sync, budget) cell gets its own learning rate, tuned on the val split
with the TUNE_SEEDS (never a test seed) by mean pass@1 (pass@4 is nearer its ceiling): full sync on a 4-rate
half-decade grid, every other cell on the 3 half-decade rates around full sync's choice. A rate is eligible
only when neither it nor the next larger half-decade rate collapses on any tuning seed (`choose_rate`; the
next rate is run when the grid stops short of it), so the choice is never the edge of a cliff. Then 5 test
seeds per cell on the test split. Runs of different methods with the same seed share the LoRA init, the prompt
stream and the evaluation sampling, so "vs full" is the paired difference, with its standard error and a
95% t interval over the seeds. Cells run one (sync, budget) stage at a time, budgets in PRIORITY order (1.6%
first). Runs go to a pool of --workers processes (one torch thread each); every finished run is appended to
DIR/runs.jsonl, so rerunning with the same --out resumes an interrupted sweep, and --saved-only reports the
runs saved so far without computing any.
Results: DIR/quality.json, DIR/pass4_vs_bytes.png, DIR/curves.png; the table is printed.
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

from hilo.ops.bench.machine import measured_on
from hilo.ops.bench.onpolicy import SYNCS, RunConfig, evaluate, run
from hilo.ops.pretrain import STUDENTS, greedy_accuracy, pretrained, teacher_of, weights_digest
from hilo.ops.bench.report import mean_ci
from hilo.ops.bench.runstore import RunStore
from hilo.replica.optimizers import OPTIMIZERS as OPTIMIZER_REGISTRY
from hilo.schemas.errors import ConfigError

OPTIMIZERS = tuple(OPTIMIZER_REGISTRY)
TASKS = ("distill", "rl")
# Full sync's grid: half-decade steps spanning the best rate of both tasks with a worse one on either side
LR_GRID = {"adamw": (1e-4, 3e-4, 1e-3, 3e-3), "muon": (3e-4, 1e-3, 3e-3, 1e-2), "lion": (3e-5, 1e-4, 3e-4, 1e-3),
           "sgd": (3e-3, 0.01, 0.03, 0.1)}
LADDER = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0)  # half-decade rates; lossy grids are 3 of them
DEFAULT_LR = {"adamw": 1e-3, "muon": 3e-3, "lion": 1e-4, "sgd": 0.03}
# Every sync method and the budgets (fractions of the bf16 adapter) it runs at; budgets run in PRIORITY order
# (PLAN's order within a budget is the order the sweep runs them: the questions first)
# (the cells that decide the comparison; spar, spar4-floor and 7.2% ran under the first, one-seed rule and
# still run with --syncs/--budgets)
PLAN = {"full": (None,), "spar4": (0.010, 0.016), "delta": (0.010, 0.016), "post": (0.016,), "topk": (0.016,),
        "powersgd": (0.016,)}
PRIORITY = (None, 0.016, 0.072, 0.010)  # the target budget first (a sweep cut short has it complete), then
# the larger one: whether more bytes close the gap is the next question a user asks
QUICK_SYNCS = ("full", "spar4", "delta")
STEPS, QUICK_STEPS = 60, 8
SEEDS = 5                   # test seeds 0..4 per cell
TUNE_SEEDS = (1000, 1001, 1002)  # the seeds of every tuning run: distinct from every test seed
COLLAPSE_MARGIN = 0.02  # a run collapsed if it ends this far below the untrained student's val pass@1 (~2 SE of one)
QUICK_EVAL_SAMPLES = 4  # the smoke run's held-out samples per problem (the sweep uses RunConfig.eval_samples)
QUICK_EVAL_PROBLEMS = 128  # the smoke run scores a fixed subset of each split: scoring all ~1,000 was 2/3 of a run
RUN_VERSION = 4  # bump when a run's result would change for the same RunConfig (invalidates saved runs)


@dataclass(frozen=True)
class SweepConfig:
    """What `hilo bench quality` runs. None means the default of the mode (quick or full)."""

    quick: bool = False          # smoke run: QUICK_SYNCS, DEFAULT_LR (no tuning), QUICK_STEPS, 1 seed
    steps: int | None = None     # training steps per run (default: QUICK_STEPS or STEPS)
    seeds: int | None = None     # test seeds per cell (default: 1 quick, SEEDS full)
    workers: int = 2             # parallel runs, one torch thread each
    tasks: tuple = TASKS
    optimizers: tuple = OPTIMIZERS
    syncs: tuple | None = None   # default: QUICK_SYNCS quick, every PLAN key otherwise
    budgets: tuple | None = None  # every lossy sync at each of these; default: each sync's budgets in PLAN
    saved_only: bool = False     # compute nothing: report the runs saved so far
    student: str | None = None   # a key of pretrain.STUDENTS (default: smoke quick, h256-l4 full)
    lrs_from: str | None = None  # a quality.json: every cell takes the rate tuned there (no tuning; another shape)
    eval_problems: int | None = None  # held-out problems scored per run (default: QUICK_EVAL_PROBLEMS quick, all full)

    def __post_init__(self):
        for name, allowed in (("tasks", TASKS), ("optimizers", OPTIMIZERS), ("syncs", tuple(SYNCS))):
            bad = [v for v in getattr(self, name) or () if v not in allowed]
            if bad or getattr(self, name) == ():
                raise ConfigError(f"quality: {name} {list(getattr(self, name))} must be a non-empty subset of "
                                  f"{list(allowed)}")
        if self.student is not None and self.student not in STUDENTS:
            raise ConfigError(f"quality: student {self.student!r} must be one of {list(STUDENTS)}")
        if self.lrs_from is not None and not os.path.isfile(self.lrs_from):
            raise ConfigError(f"quality: lrs_from {self.lrs_from!r} is not a file (a quality.json of an earlier sweep)")
        if self.workers < 1:
            raise ConfigError(f"quality: workers must be >= 1, got {self.workers}")
        for name in ("steps", "seeds", "eval_problems"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"quality: {name} must be >= 1, got {getattr(self, name)}")
        if self.budgets is not None and (not self.budgets or not all(0 < b <= 4 for b in self.budgets)):
            raise ConfigError(f"quality: budgets {list(self.budgets)} must be fractions of the adapter in (0, 4]")

    def shape(self) -> str:
        """The student's key in pretrain.STUDENTS."""
        return self.student or ("smoke" if self.quick else "h256-l4")

    def cells(self) -> list:
        """(sync, budget) pairs to run, in PRIORITY order of budget (full sync's budget is None)."""
        syncs = self.syncs or (QUICK_SYNCS if self.quick else tuple(PLAN))
        default = (RunConfig.budget,)
        pairs = [(s, None) if s == "full" else (s, b) for s in syncs
                 for b in ((None,) if s == "full" else self.budgets
                           or (default if self.quick else PLAN.get(s, default)))]
        rank, order = {b: i for i, b in enumerate(PRIORITY)}, {s: i for i, s in enumerate(PLAN)}
        return sorted(dict.fromkeys(pairs), key=lambda p: (rank.get(p[1], len(rank)), order.get(p[0], len(order))))


def lossy_grid(full_lr: float) -> tuple:
    """The 3 half-decade rates around full sync's tuned rate (a compressed method may want a lower or higher one)."""
    i = min(range(len(LADDER)), key=lambda j: abs(math.log(LADDER[j] / full_lr)))
    i = min(max(i, 1), len(LADDER) - 2)
    return LADDER[i - 1:i + 2]


def _say(*a):
    print(*a, file=sys.stderr, flush=True)


_MODELS = None  # (student, teacher) of this worker process


def _worker_init(student):
    """One torch thread per worker: tiny models scale better across processes than across threads."""
    global _MODELS
    torch.set_num_threads(1)
    _MODELS = pretrained(student, _say), pretrained(teacher_of(student), _say)


def _run_id(cfg: RunConfig, bases: dict, student=STUDENTS["h256-l4"]) -> str:
    # the pretrained models' weights are part of a run's identity: runs from another student are never mixed in
    # (`bases`: {"student": digest, "teacher": digest}; a spec alone trained to another model elsewhere)
    fields = {k: v for k, v in asdict(cfg).items() if not (k == "eval_problems" and v is None)}  # older runs' ids stand
    ident = fields | {"v": RUN_VERSION, "student": asdict(student), "teacher": asdict(teacher_of(student)),
                      "bases": bases}
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:10]
    return f"{cfg.task}-{cfg.optimizer}-{cfg.sync}-lr{cfg.lr:g}-s{cfg.seed}-{key}"


def _run_one(cfg: RunConfig) -> dict:
    """Worker body: one run."""
    return run(cfg, *_MODELS)


class Workers:
    """The sweep's pool of `n` spawned processes, started at its first run and kept for every stage and tuning round
    after: each worker imports torch and loads the student and teacher, CPU-seconds that a pool per stage paid
    again (the quick sweep's 3 stages of 2 runs each started 6 workers for 6 runs)."""

    def __init__(self, n: int, student):
        self.n, self.student, self._pool = n, student, None

    def pool(self) -> ProcessPoolExecutor:
        """The pool (started on first use; it spawns a worker per submitted run up to n)."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.n, mp_context=mp.get_context("spawn"), initializer=_worker_init,
                                             initargs=(self.student,))
        return self._pool

    def close(self) -> None:
        """Stop the workers (runs not started are cancelled)."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


def run_all(cfgs: list, runs: RunStore, workers: Workers, label: str, bases: dict, compute: bool = True) -> list:
    """Results of `cfgs` in order: read from `runs` where a finished run is saved, the rest computed in `workers`'
    pool and saved as each finishes (or None where compute is False)."""
    ids = [_run_id(c, bases, workers.student) for c in cfgs]
    results = {i: runs.get(r) for i, r in enumerate(ids) if runs.get(r) is not None}
    todo = [i for i in range(len(cfgs)) if i not in results]
    if results:
        _say(f"quality: {label}: {len(results)} of {len(cfgs)} runs already in {runs.path}")
    if not compute:
        return [results.get(i) for i in range(len(cfgs))]
    t0 = time.time()
    pool = workers.pool()
    futures = {pool.submit(_run_one, cfgs[i]): i for i in todo}
    for n, fut in enumerate(as_completed(futures), 1):
        i = futures[fut]
        results[i] = fut.result()
        runs.put(ids[i], results[i])
        c, el = cfgs[i], time.time() - t0
        _say(f"  {label} [{n}/{len(todo)}] {c.task}/{c.optimizer}/{c.sync} lr={c.lr:g} seed={c.seed}: "
             f"pass@4 {results[i]['pass4']:.3f} ({el / 60:.1f} min, ~{el / n * (len(todo) - n) / 60:.0f} min left)")
    return [results[i] for i in range(len(cfgs))]


def collapsed(score: float, floor: float) -> bool:
    """A tuning run collapsed: it ended more than COLLAPSE_MARGIN below `floor` (worse than it started) or at
    NaN/Inf."""
    return not (math.isfinite(score) and score >= floor - COLLAPSE_MARGIN)


def choose_rate(scores: dict, floor: float, grid_min: float) -> tuple:
    """(chosen rate, None) or (None, rate to run next) from {rate: [val pass@1 of each tuning seed]}.

    A run collapses when it ends more than COLLAPSE_MARGIN below `floor` (the untrained student's val pass@1: it
    ended worse than it started) or at a non-finite score. A rate is eligible when no seed collapses at it nor at
    the next larger LADDER rate; the best mean among eligible rates wins (the smaller on a tie). Where the winner's
    next rate has not been run, it is asked for first; where nothing is eligible, the rate below the smallest,
    down to two below `grid_min` (then the cell is reported as one no rate trains)."""
    def stable(lr):
        return not any(collapsed(x, floor) for x in scores[lr])

    def up(lr):
        i = LADDER.index(lr)
        return LADDER[i + 1] if i + 1 < len(LADDER) else None

    eligible = [lr for lr in scores if stable(lr) and (up(lr) is None or up(lr) not in scores or stable(up(lr)))]
    if eligible:
        best = max(eligible, key=lambda lr: (statistics.mean(scores[lr]), -lr))
        return (None, up(best)) if up(best) is not None and up(best) not in scores else (best, None)
    i = LADDER.index(min(scores))
    if i == 0 or i <= LADDER.index(grid_min) - 2:
        raise ConfigError(f"quality: every rate from {min(scores):g} up collapses (val pass@1 below the untrained "
                          f"student's {floor:.3f} - {COLLAPSE_MARGIN}) on some tuning seed")
    return None, LADDER[i - 1]


def _tune(cells: dict, runs, workers: Workers, compute, label_: str, floor: float, bases: dict) -> tuple:
    """({cell key: chosen rate}, tuning rows, [why each unfinished cell is]) for {cell key: (RunConfig of the cell,
    starting rates)}: every rate on every TUNE_SEED, then round by round the rates `choose_rate` asks for, each
    round's runs in one pool. Without `compute`, a cell missing a saved run is unfinished (left out)."""
    results = {key: {} for key in cells}   # key -> rate -> [run result per tuning seed]
    todo = {key: list(rates) for key, (_, rates) in cells.items()}
    best, unfinished = {}, {}
    while todo:
        flat = [(key, lr, replace(cells[key][0], lr=lr, seed=s)) for key, lrs in todo.items() for lr in lrs
                for s in TUNE_SEEDS]
        got = run_all([c for *_, c in flat], runs, workers, label_, bases, compute)
        for (key, lr, c), r in zip(flat, got):
            if r is None:
                unfinished.setdefault(key, f"quality: {runs.path} lacks the tuning run "
                                           f"{c.task}/{c.optimizer}/{c.sync}@{c.budget} lr={c.lr:g} seed={c.seed}; run "
                                           f"without --saved-only to finish it")
            else:
                results[key].setdefault(lr, []).append(r)
        todo = {}
        for key in cells:
            if key not in best and key not in unfinished:
                try:
                    chosen, nxt = choose_rate({lr: [r["pass1"] for r in rs] for lr, rs in results[key].items()}, floor,
                                              min(cells[key][1]))
                except ConfigError as e:  # no rate trains this cell: reported, the others go on
                    unfinished[key] = f"{'/'.join(map(str, key))}: {e}"
                    continue
                if chosen is None:
                    todo[key] = [nxt]
                else:
                    best[key] = chosen
    rows = []
    for key, (c, _) in cells.items():
        for lr, rs in sorted(results[key].items()) if key in best else ():
            p1 = [r["pass1"] for r in rs]
            rows.append({"task": c.task, "optimizer": c.optimizer, "sync": c.sync,
                         "budget": c.budget if c.sync != "full" else None,
                         "lr": lr, "val_pass1": statistics.mean(p1), "val_pass1_seeds": p1,
                         "val_pass4": statistics.mean(r["pass4"] for r in rs),
                         "stable": not any(collapsed(x, floor) for x in p1), "chosen": lr == best[key]})
    return best, rows, list(unfinished.values())


def _rate_from(path: str, task: str, optimizer: str, sync: str, budget) -> float:
    """The learning rate the sweep in `path` (its quality.json) chose for this cell; ConfigError naming it if none."""
    for c in json.loads(pathlib.Path(path).read_text())["cells"]:
        if (c["task"], c["optimizer"], c["sync"], c["budget"]) == (task, optimizer, sync,
                                                                   None if sync == "full" else budget):
            return c["lr"]
    raise ConfigError(f"quality: {path} has no cell {task}/{optimizer}/{sync}@{budget} to take a learning rate from")


def _sd(xs: list) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def _cell(rc: RunConfig, rs: list, seeds: list, steps: int) -> dict:
    """Aggregate one cell's runs (test seeds `seeds`)."""
    p1, p4 = [r["pass1"] for r in rs], [r["pass4"] for r in rs]
    sends = [r["sends_per_block"] for r in rs]
    cell = {
        "task": rc.task, "optimizer": rc.optimizer, "sync": rc.sync, "budget": None if rc.sync == "full" else rc.budget,
        "lr": rc.lr, "seeds": len(rs), "seed_ids": seeds, "steps": steps,
        "pass1_mean": statistics.mean(p1), "pass1_std": _sd(p1), "pass4_mean": statistics.mean(p4),
        "pass4_std": _sd(p4),
        "pass1_seeds": p1, "pass4_seeds": p4,
        "kl_mean": statistics.mean(r["kl"] for r in rs), "kl_std": _sd([r["kl"] for r in rs]),
        "bytes_per_step": statistics.mean(r["bytes_per_step"] for r in rs),
        "adapter_bytes": rs[0]["adapter_bytes"],
        "lossless_delta_bytes_per_step": rs[0]["lossless_delta_bytes_per_step"] and
        statistics.mean(r["lossless_delta_bytes_per_step"] for r in rs),
        "rollout_digest_equal_versions": [r["rollout_digest_equal_versions"] for r in rs],
        "shadow_cosine": statistics.mean(r["shadow_cosine"] for r in rs),
        "blocks": len(sends[0]),
        "blocks_never_sent": statistics.mean(sum(n == 0 for n in s) for s in sends),
        "blocks_sent_at_most_3": statistics.mean(sum(n <= 3 for n in s) for s in sends),
        "residual_ratio": statistics.mean(r["residual_ratio"] for r in rs),
        "lag_mean": statistics.mean(r["lag_mean"] for r in rs) if rs[0]["lag_mean"] is not None else None,
        "curve": [statistics.mean(c) for c in zip(*(r["curve"] for r in rs))],
    }
    cell["fraction_of_adapter"] = cell["bytes_per_step"] / cell["adapter_bytes"]
    return cell


def paired(cell: dict, full: dict, key: str = "pass4") -> dict | None:
    """mean, SE and 95% interval of (cell - full) over the seeds both have: the runs share every seed (LoRA init,
    prompt stream, evaluation sampling), so the per-seed differences are what varies. None below 2 shared seeds."""
    a, b = dict(zip(cell["seed_ids"], cell[f"{key}_seeds"])), dict(zip(full["seed_ids"], full[f"{key}_seeds"]))
    return mean_ci([a[s] - b[s] for s in a if s in b])


def sweep(cfg: SweepConfig, out: pathlib.Path) -> dict:
    """Run the sweep (resuming from out/runs.jsonl); returns {"cells": [...], "lossless_delta_bytes_per_step": ...,
    ...}.

    Per budget in PRIORITY order: tune every cell of that budget on val (TUNE_SEEDS, `choose_rate`; full sync on its
    LR_GRID, every other method on the 3 rates around full sync's choice), then run its test seeds (seed-major, so a
    sweep stopped early has every cell at the same number of seeds, give or take one). With saved_only, a cell's
    `seeds` counts the runs it has so far, and a cell whose tuning is unfinished is left out (named in `unfinished`).
    """
    workers = Workers(cfg.workers, STUDENTS[cfg.shape()])
    try:
        return _sweep(cfg, out, workers)
    finally:
        workers.close()


def _sweep(cfg: SweepConfig, out: pathlib.Path, workers: Workers) -> dict:
    """`sweep` with its pool."""
    t0 = time.time()
    quick, saved_only, tasks, optimizers = cfg.quick, cfg.saved_only, cfg.tasks, cfg.optimizers
    evals = QUICK_EVAL_SAMPLES if quick else RunConfig.eval_samples
    problems = cfg.eval_problems or (QUICK_EVAL_PROBLEMS if quick else None)
    shape = cfg.shape()
    spec = STUDENTS[shape]
    student, teacher = pretrained(spec, _say), pretrained(teacher_of(spec), _say)
    base = {"student": shape, "student_greedy_test_acc": greedy_accuracy(student),
            "teacher_greedy_test_acc": greedy_accuracy(teacher),
            # where every run starts: the student before any on-policy step, scored exactly like a run's end
            "untrained": evaluate(student, teacher, "test", RunConfig.group, evals, torch.Generator().manual_seed(99),
                                  problems),
            # the tuning rule's collapse line: a run that ends below where it started on val
            "untrained_val": evaluate(student, teacher, "val", RunConfig.group, evals,
                                      torch.Generator().manual_seed(99), problems)}
    bases = {"student": weights_digest(student), "teacher": weights_digest(teacher)}
    base["bases"] = bases
    _say(f"quality: student {bases['student'][:12]} greedy test accuracy {base['student_greedy_test_acc']:.3f}, "
         f"teacher {base['teacher_greedy_test_acc']:.3f}")
    steps = cfg.steps or (QUICK_STEPS if quick else STEPS)
    seeds = cfg.seeds or (1 if quick else SEEDS)
    runs = RunStore(out)
    plan = cfg.cells()
    if not quick and ("full", None) not in plan:
        plan = [("full", None)] + plan  # every other method's grid is centred on full sync's rate
    full_lr = {(t, o): DEFAULT_LR[o] for t in tasks for o in optimizers}
    tuning, cells, missing = [], [], []
    # one stage per (sync, budget), in plan order, so a sweep cut short has whole cells of the first ones
    for sync_, budget in plan:
        stage = [sync_]
        b = budget if budget is not None else RunConfig.budget
        try:
            if quick:
                lrs = {(t, o, sync): DEFAULT_LR[o] for t in tasks for o in optimizers for sync in stage}
            elif cfg.lrs_from:
                lrs = {(t, o, sync_): _rate_from(cfg.lrs_from, t, o, sync_, budget) for t in tasks for o in optimizers}
            else:
                grids = {(t, o, sync): (RunConfig(t, o, sync, DEFAULT_LR[o], steps=steps, eval_split="val",
                                                  eval_samples=evals, budget=b, eval_problems=problems),
                                        LR_GRID[o] if sync == "full" else lossy_grid(full_lr[(t, o)]))
                         for t in tasks for o in optimizers for sync in stage}
                lrs, rows, unfinished = _tune(grids, runs, workers, not saved_only, f"tune {sync_}@{budget}",
                                              base["untrained_val"]["pass1"], bases)
                tuning += rows
                missing += unfinished
                full_lr.update({(t, o): lr for (t, o, sync), lr in lrs.items() if sync == "full"})
        except ConfigError as e:
            if not saved_only:
                raise
            missing.append(str(e))
            continue
        _say(f"quality: budget {budget}: learning rates " + ", ".join(f"{t}/{o}/{s}={lr:g}" for (t, o, s),
                                                                      lr in lrs.items()))
        cellcfgs = [RunConfig(t, o, s, lrs[(t, o, s)], steps=steps, eval_samples=evals, budget=b,
                              eval_problems=problems)
                    for t in tasks for o in optimizers for s in stage if (t, o, s) in lrs]
        if not cellcfgs:
            continue
        flat = [replace(c, seed=i) for i in range(seeds) for c in cellcfgs]
        results = run_all(flat, runs, workers, f"test {sync_}@{budget}", bases, not saved_only)
        for j, rc in enumerate(cellcfgs):
            got = [(i, r) for i, r in enumerate(results[j::len(cellcfgs)]) if r is not None]
            if got:
                cells.append(_cell(rc, [r for _, r in got], [i for i, _ in got], steps))
    full = {(c["task"], c["optimizer"]): c for c in cells if c["sync"] == "full"}
    for c in cells:
        f = full.get((c["task"], c["optimizer"]))
        c["vs_full_pass4"] = paired(c, f) if f is not None and c is not f else None
        c["vs_full_pass1"] = paired(c, f, "pass1") if f is not None and c is not f else None
    lossless = [c["lossless_delta_bytes_per_step"] for c in cells if c["lossless_delta_bytes_per_step"]]
    return {"cells": cells, "lossless_delta_bytes_per_step": statistics.mean(lossless) if lossless else None,
            "tuning": tuning, "quick": quick, "unfinished": missing, "seconds": round(time.time() - t0, 1), **base}


def label(cell: dict) -> str:
    """The sync method with its budget: "full", "spar4 @1.6%"."""
    b = cell.get("budget")
    return cell["sync"] if b is None else f"{cell['sync']} @{100 * b:g}%"


def vs_full(cell: dict, key: str = "vs_full_pass4") -> str:
    """The paired difference to full sync in points with its 95% interval: "-1.2 [-2.0, -0.4]"."""
    p = cell.get(key)
    if p is None:
        return "n/a" if cell["sync"] != "full" else ""
    lo, hi = p["ci95"]
    return f"{100 * p['diff']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def table(res: dict) -> str:
    """Markdown table of every cell: scores, the paired distance to full sync, bytes, and the fidelity columns."""
    full = {(c["task"], c["optimizer"]): c for c in res["cells"] if c["sync"] == "full"}
    u = res["untrained"]
    out = [f"untrained student (every run's start): pass@1 {u['pass1']:.3f}, pass@4 {u['pass4']:.3f}, held-out KL "
           f"{u['kl']:.3f}\n",
           "| task | optimizer | sync | lr | seeds | pass@1 | pass@4 | pass@4 vs full (95% CI) | held-out KL | KL gain "
           "vs full | bytes/step | % adapter | shadow cos | blocks never sent | sent <= 3x | residual ratio | lag |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in res["cells"]:
        f = full.get((c["task"], c["optimizer"]))
        kr = (u["kl"] - c["kl_mean"]) / (u["kl"] - f["kl_mean"]) if f and f["kl_mean"] != u["kl"] else float("nan")
        lag = "" if c.get("lag_mean") is None else f"{c['lag_mean']:.3f}"
        out.append(f"| {c['task']} | {c['optimizer']} | {label(c)} | {c['lr']:g} | {c['seeds']} | "
                   f"{c['pass1_mean']:.3f} +- {c['pass1_std']:.3f} | "
                   f"{c['pass4_mean']:.3f} +- {c['pass4_std']:.3f} | {vs_full(c)} | {c['kl_mean']:.3f} +- "
                   f"{c['kl_std']:.3f} | {100 * kr:.0f}% | {c['bytes_per_step']:,.0f} | "
                   f"{100 * c['fraction_of_adapter']:.2f} | {c['shadow_cosine']:.2f} | {c['blocks_never_sent']:.1f} / "
                   f"{c['blocks']} | {c['blocks_sent_at_most_3']:.1f} | {c['residual_ratio']:.2f} | {lag} |")
    if res["lossless_delta_bytes_per_step"]:
        for name in ("spar", "spar4"):
            b = [c["bytes_per_step"] for c in res["cells"] if c["sync"] == name and c["budget"] == RunConfig.budget]
            if b:
                out.append(f"\nlossless adapter-delta codec on the full-sync runs: "
                           f"{res['lossless_delta_bytes_per_step']:,.0f} B/step = "
                           f"{res['lossless_delta_bytes_per_step'] / statistics.mean(b):.1f}x {name} @1.6%'s bytes")
    return "\n".join(out)


def summary(res: dict) -> str:
    """One row per (task, optimizer): full sync's pass@4, then every other method's paired distance to it."""
    methods = list(dict.fromkeys(label(c) for c in res["cells"] if c["sync"] != "full"))
    rows = {}
    for c in res["cells"]:
        rows.setdefault((c["task"], c["optimizer"]), {})[label(c)] = c
    out = ["| task | optimizer | full pass@4 | " + " | ".join(methods) + " |",
           "|---|---|---:|" + "---:|" * len(methods)]
    for (task, opt), row in rows.items():
        f = row.get("full")
        cols = [f"{f['pass4_mean']:.3f}" if f else "n/a"] + [vs_full(row[m]) if m in row else "" for m in methods]
        out.append(f"| {task} | {opt} | " + " | ".join(cols) + " |")
    return "\n".join(out)


def fidelity(res: dict) -> str:
    """One row per method and budget: bytes and the fidelity columns, each the mean over its (task, optimizer) pairs."""
    groups = {}
    for c in res["cells"]:
        if c["sync"] != "full":
            groups.setdefault(label(c), []).append(c)
    out = ["| method | pairs | bytes/step | shadow cosine | blocks never sent | sent <= 3x | residual ratio | site "
           "lag |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, cs in groups.items():
        mean = lambda k, cs=cs: statistics.mean(c[k] for c in cs)  # noqa: E731
        lag = "" if cs[0].get("lag_mean") is None else f"{mean('lag_mean'):.3f}"
        out.append(f"| {name} | {len(cs)} | {mean('bytes_per_step'):,.0f} | {mean('shadow_cosine'):.2f} | "
                   f"{mean('blocks_never_sent'):.1f} / {cs[0]['blocks']} | {mean('blocks_sent_at_most_3'):.1f} | "
                   f"{mean('residual_ratio'):.2f} | {lag} |")
    return "\n".join(out)


def plots(res: dict, out: pathlib.Path) -> list:
    """pass@4 vs bytes per step, and learning curves; returns the PNG paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tasks = sorted({c["task"] for c in res["cells"]})
    opts = sorted({c["optimizer"] for c in res["cells"]})
    syncs = [s for s in SYNCS if any(c["sync"] == s for c in res["cells"])]
    palette = ("black", "tab:red", "tab:orange", "tab:brown", "tab:blue", "tab:green", "tab:purple", "tab:olive",
               "tab:cyan",
               "tab:pink", "tab:gray")
    colors = {s: palette[i % len(palette)] for i, s in enumerate(SYNCS)}  # every sync method has a colour
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
                dashed = c["budget"] not in (None, RunConfig.budget)  # not the 1.6% budget
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
    saved = out / "runs.jsonl"
    # said before the base models are evaluated
    if cfg.saved_only and (not saved.exists() or saved.stat().st_size == 0):
        raise ConfigError(f"quality: no finished cell in {saved}: nothing is saved there (--saved-only computes "
                          f"nothing)")
    res = sweep(cfg, out)
    if not res["cells"]:  # only --saved-only gets here: nothing to plot or tabulate
        raise ConfigError(f"quality: no finished cell in {out / 'runs.jsonl'}"
                          + "".join(f"; {m}" for m in res["unfinished"]))
    res["plots"] = plots(res, out)
    # the process that ran the last cells and wrote this (a resumed sweep ran earlier ones)
    res["measured_on"] = measured_on()
    (out / "quality.json").write_text(json.dumps(res, indent=2))
    _say(f"quality: results in {out}")
    print(json.dumps(res, indent=2) if as_json
          else table(res) + "\n\npass@4 vs full sync, points, paired over seeds [95% CI]:\n\n" + summary(res)
          + "\n\nfidelity, mean over each method's pairs:\n\n" + fidelity(res))
    return 0
