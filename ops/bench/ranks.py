"""A multi-rank trainer's step against a lone one's, at a real adapter's shape: what the broadcast and every rank's
apply cost.

    python -m hilo.ops.bench.ranks [--shape qwen3-1.7b] [--steps 5] [--codec spar4] [--out DIR] [--json]

Each configuration is a job of its own on an embedded file log in a temp dir: one process (no torch.distributed), then
two ranks under torchrun (gloo), each with one CPU thread (a rank's core; the machine's others stay for its peer).
Every rank holds a LoRA adapter of the shape's layout, named as PEFT names it (LoraShell: the trainer reads and
writes only these; the base model's forward and backward are not what is timed), and sets the same synthetic
gradients (replica/synthetic.py) before each step, as DDP's all-reduce leaves them. A barrier opens each step, where
DDP's all-reduce would make the ranks meet. Timed on rank 0 after one warm-up step: `period_s`, barrier to barrier
(the job's step: it waits for the slowest rank), and `step_s`, barrier to HiLoProducer.step returning; on the other
rank `apply_s`, its decode and apply of the broadcast message (RankProducer.follow_s). Medians; the overhead is the
2-rank period over the 1-rank one (whose period is its step), with each round's ratio: the rounds alternate the two
jobs, so a busier minute on a shared machine shows as rounds that disagree.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from hilo.ops.bench.report import results_dir, save
from hilo.replica.synthetic import QWEN3, GradientStream, initial_params, qwen3_manifest

ROOT = pathlib.Path(__file__).resolve().parents[2]


class LoraShell(torch.nn.Module):
    """A PEFT LoRA adapter's parameters alone, at `manifest`'s shapes and under PEFT's names, with its peft_config: what
    HiLoProducer reads (lora_params.lora_parameters) and writes back, without a base model."""

    def __init__(self, manifest):
        from peft import LoraConfig
        super().__init__()
        self.peft_config = {"default": LoraConfig(r=manifest.rank, lora_alpha=manifest.alpha,
                                                  target_modules=list(manifest.target_modules),
                                                  base_model_name_or_path=manifest.base_model)}
        for b, init in zip(manifest.blocks, initial_params(manifest), strict=True):
            parent = self
            for name in ["base_model", "model", *b.module.split("."), f"lora_{b.kind}", "default"]:
                if not hasattr(parent, name):
                    parent.add_module(name, torch.nn.Module())
                parent = getattr(parent, name)
            parent.weight = torch.nn.Parameter(init)


def rank_main(shape: str, codec: str, steps: int, log_dir: str, out: str) -> None:
    """One rank (or the lone process): `steps` + 1 steps; writes OUT/rank{R}.json with its timings."""
    import torch.distributed as dist

    from hilo.producer.config import ProducerConfig
    from hilo.producer.producer import HiLoProducer
    from hilo.replica.codecs import DEFAULT_BUDGET
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    manifest = qwen3_manifest(shape)
    model = LoraShell(manifest)
    stream = GradientStream(manifest, seed=0)
    config = ProducerConfig(run="ranks", log=f"file://{log_dir}", codec=codec, budget=DEFAULT_BUDGET,
                            checkpoint_every=1000)
    producer = HiLoProducer.open(model, config)
    grads = stream.next()  # one draw, set before every step: drawing 1.7B-shape gradients is not what is timed
    step_s, apply_s, opened = [], [], []
    for _ in range(steps + 2):
        for p, g in zip(producer.params, grads, strict=True):
            p.grad = g
        if world > 1:
            dist.barrier()
        opened.append(time.perf_counter())
        producer.step(lr=1e-4)
        step_s.append(time.perf_counter() - opened[-1])
        if rank != config.publish_rank:  # only another rank follows (the publishing rank's follow_s stays 0)
            apply_s.append(getattr(producer, "follow_s", None))
    period_s = [b - a for a, b in zip(opened[1:], opened[2:])]  # barrier to barrier: the job's step, the slowest rank's
    pathlib.Path(out, f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "world": world, "step_s": step_s[1:-1], "period_s": period_s,
        "apply_s": [x for x in apply_s[1:-1] if x is not None], "version": producer.version,
        "digest": producer.replica.digest.hex()}))
    producer.close()
    if world > 1:
        dist.barrier()  # tear down together (a rank that destroys while its peer has left can abort in C++)
        dist.destroy_process_group()


def _job(world: int, shape: str, codec: str, steps: int) -> list:
    """Run one configuration; every rank's report."""
    return launch("hilo.ops.bench.ranks", world, ["--shape", shape, "--codec", codec, "--steps", str(steps)])


def launch(module: str, world: int, args: list) -> list:
    """`python -m module --rank-job ARGS --log-dir TMP/log --out TMP` as one process or `world` torchrun ranks (one
    thread each); every rank's report (TMP/rank{R}.json)."""
    with tempfile.TemporaryDirectory(prefix="hilo-ranks-") as tmp:
        args = ["-m", module, "--rank-job", *args, "--log-dir", f"{tmp}/log", "--out", tmp]
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")} | {"OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, *args] if world == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                           "--nproc_per_node", str(world), *args]
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, timeout=3600)
        return [json.loads(pathlib.Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]


def table(res: dict) -> str:
    """One line per job kind (medians over its rounds): its step, the publishing rank's, the other rank's apply, the
    overhead."""
    out = [f"| {res['shape']} r64, {res['codec']}, 1 thread per rank | job's step s | publishing rank's step s | "
           f"other ranks' apply s | over 1 rank |", "|---|---:|---:|---:|---:|"]
    lone = res["rows"][0]["period_s"]
    for r in res["rows"]:
        apply = ", ".join(f"{x:.3f}" for x in r["apply_s_other_ranks"]) or "-"
        out.append(f"| {r['ranks']} rank{'s' if r['ranks'] > 1 else ''} | {r['period_s']:.3f} | {r['step_s']:.3f} | "
                   f"{apply} | {r['period_s'] / lone:.2f}x |")
    return "\n".join(out)


def _ranks(text: str) -> tuple:
    """--ranks: "1,2,4" -> (1, 2, 4); 1 first (the others are measured against it)."""
    try:
        worlds = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ranks {text!r}: rank counts separated by commas (1,2,4)") from None
    if not worlds or worlds[0] != 1 or any(w < 1 for w in worlds) or len(set(worlds)) != len(worlds):
        raise argparse.ArgumentTypeError(f"--ranks {text!r}: distinct counts >= 1, the first 1 (the lone rank the "
                                         f"others are measured against)")
    return worlds


def main(argv=None) -> int:
    """`hilo bench ranks`: the 1-rank job and the multi-rank ones (2 by default), and each one's overhead."""
    ap = argparse.ArgumentParser(prog="hilo bench ranks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(QWEN3), default="qwen3-1.7b", help="adapter shape (default: %(default)s)")
    ap.add_argument("--codec", default="spar4", help="the run's codec (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=5,
                    help="timed steps per job, after one warm-up (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=2, help="every job, alternating, this many times each "
                    "(default: %(default)s)")
    ap.add_argument("--ranks", type=_ranks, default=(1, 2), metavar="N,N",
                    help="the jobs' rank counts, 1 first (default: 1,2; ranks beyond the machine's cores share them: "
                         "the JSON says how many there were)")
    ap.add_argument("--out", metavar="DIR", help="results folder (default: ~/.cache/hilo-sync/bench/ranks-TIME)")
    ap.add_argument("--json", action="store_true", help="print the JSON")
    # one rank of a job (this module, relaunched)
    ap.add_argument("--rank-job", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--log-dir", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.rank_job:
        rank_main(a.shape, a.codec, a.steps, a.log_dir, a.out)
        return 0
    reports = {world: [] for world in a.ranks}  # every round's reports; the rounds alternate (a busier minute hits all)
    for n in range(a.rounds):
        for world in a.ranks:
            print(f"bench ranks: round {n + 1}/{a.rounds}, {world} rank(s), {a.shape}, {a.codec}, {a.steps} steps",
                  file=sys.stderr, flush=True)
            reports[world].append(_job(world, a.shape, a.codec, a.steps))
    digests = {r["digest"] for jobs in reports.values() for job in jobs for r in job}
    rows = {}
    for world, jobs in reports.items():
        lead = [x for job in jobs for x in job[0]["period_s"]]
        rows[world] = {"ranks": world, "period_s": statistics.median(lead),
                       "step_s": statistics.median([x for job in jobs for x in job[0]["step_s"]]),
                       "apply_s_other_ranks": [statistics.median([x for job in jobs for x in job[r]["apply_s"]])
                                               for r in range(1, world)],
                       "period_s_per_round": [statistics.median(job[0]["period_s"]) for job in jobs]}
    over = {w: rows[w]["period_s"] / rows[1]["period_s"] for w in rows if w > 1}
    per_round = {w: [b / a for a, b in zip(rows[1]["period_s_per_round"], rows[w]["period_s_per_round"])]
                 for w in over}
    res = {"shape": a.shape, "codec": a.codec, "steps": a.steps, "rounds": a.rounds, "threads_per_rank": 1,
           "cores": os.cpu_count(), "rows": list(rows.values()), "overhead_x": over.get(2),
           "overhead_x_per_round": per_round.get(2), "overhead_x_by_ranks": {str(w): x for w, x in over.items()},
           "overhead_x_per_round_by_ranks": {str(w): x for w, x in per_round.items()},
           "same_digest": len(digests) == 1}
    out = results_dir("ranks", a.out)
    if not save(res, out, "ranks", a.json):
        print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
