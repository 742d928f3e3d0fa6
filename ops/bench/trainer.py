"""`hilo bench trainer`: what a training step costs with hilo-sync against plain torch.optim.AdamW, in one table.

    hilo bench trainer [--shape qwen3-1.7b] [--steps 5] [--kafka kafka://127.0.0.1:9092] [--out DIR] [--json]

Each row is a job of its own (ops/bench/ranks.py's way: the shape's LoRA adapter under PEFT's names, the same
synthetic gradients set before every step, one CPU thread per rank, 2 ranks under torchrun with gloo and a barrier
where DDP's all-reduce would be): plain AdamW over the LoRA params; HiLoProducer (spar4 at the default budget, AdamW)
on an embedded file log and on Kafka over loopback, each in line and pipelined (ProducerConfig.pipeline, one rank).
Columns, medians on rank 0 after a warm-up step: encode and apply (the trainer's own, UpdateBuilder.propose's), the
rest of the step (the publish wait on the critical path: in line the transaction, pipelined the wait for the previous
version; with the write-back into the model), the step (barrier to barrier on 2 ranks: the slowest rank's), and its
ratio to plain AdamW's step on as many ranks. Kafka behind 50/150 ms of emulated round trip is not run: ops/wan/
shapes links into network namespaces with a broker inside them, which needs root (`sudo hilo bench wan`).
"""
import argparse
import json
import os
import pathlib
import statistics
import sys
import time
import uuid

import torch

from hilo.ops.bench.ranks import LoraShell, launch
from hilo.ops.bench.report import results_dir, save
from hilo.replica.synthetic import QWEN3, GradientStream, qwen3_manifest

JOBS = (("adamw", 1, False), ("file", 1, False), ("file", 1, True), ("kafka", 1, False), ("kafka", 1, True),
        ("adamw", 2, False), ("file", 2, False), ("kafka", 2, False))  # (log, ranks, pipelined)


def _stepper(model, log: str, pipeline: bool, log_dir: str, kafka: str, run: str):
    """(step(), timings() -> {encode_s, apply_s}, close()) for one job's kind of trainer."""
    if log == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        return opt.step, dict, lambda: None
    from hilo.producer.config import ProducerConfig
    from hilo.producer.producer import HiLoProducer
    from hilo.replica.codecs import DEFAULT_BUDGET
    url = f"file://{log_dir}" if log == "file" else kafka
    config = ProducerConfig(run=run, log=url, codec="spar4", budget=DEFAULT_BUDGET,
                            checkpoint_every=1000, pipeline=pipeline)
    producer = HiLoProducer.open(model, config)
    timings = lambda: {k: producer.last_step.get(k) for k in ("encode_s", "apply_s", "wait_s")}  # noqa: E731
    return lambda: producer.step(lr=1e-4), timings, producer.close


def rank_main(shape: str, log: str, pipeline: bool, steps: int, log_dir: str, kafka: str, run: str, out: str) -> None:
    """One rank (or the lone process) of one job: `steps` + 2 steps; writes OUT/rank{R}.json."""
    import torch.distributed as dist
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    manifest = qwen3_manifest(shape)
    model = LoraShell(manifest)
    grads = GradientStream(manifest, seed=0).next()
    step, timings, close = _stepper(model, log, pipeline, log_dir, kafka, run)
    params, opened, step_s, parts = list(model.parameters()), [], [], []
    for _ in range(steps + 2):
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        if world > 1:
            dist.barrier()
        opened.append(time.perf_counter())
        step()
        step_s.append(time.perf_counter() - opened[-1])
        parts.append(timings())
    close()
    period_s = [b - a for a, b in zip(opened[1:], opened[2:])]
    rank = dist.get_rank() if world > 1 else 0
    pathlib.Path(out, f"rank{rank}.json").write_text(json.dumps({"step_s": step_s[1:-1], "period_s": period_s,
                                                                 "parts": parts[1:-1]}))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def _median(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def row(log: str, world: int, pipeline: bool, report: dict) -> dict:
    """One table row from rank 0's report."""
    step = statistics.median(report["period_s"] if world > 1 else report["step_s"])
    enc, app = (_median([p.get(k) for p in report["parts"]]) for k in ("encode_s", "apply_s"))
    rest = None if enc is None else statistics.median([s - (p["encode_s"] or 0) - (p["apply_s"] or 0)
                                                        for s, p in zip(report["step_s"], report["parts"])])
    return {"trainer": "torch AdamW" if log == "adamw"
            else f"hilo, {'Kafka loopback' if log == 'kafka' else 'file log'}"
            + (", pipelined" if pipeline else ""), "ranks": world, "pipeline": pipeline, "encode_s": enc,
            "apply_s": app,
            "publish_wait_s": rest, "wait_s": _median([p.get("wait_s") for p in report["parts"]]), "step_s": step}


def table(res: dict) -> str:
    """The one table: a row per job, the ratio to plain AdamW on as many ranks."""
    out = [f"| {res['shape']} r64, spar4, 1 thread per rank | ranks | encode s | apply s | publish wait s | step s | "
           f"vs AdamW |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    plain = {r["ranks"]: r["step_s"] for r in res["rows"] if r["trainer"] == "torch AdamW"}
    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    for r in res["rows"]:
        out.append(f"| {r['trainer']} | {r['ranks']} | {f(r['encode_s'])} | {f(r['apply_s'])} | "
                   f"{f(r['publish_wait_s'])} | {r['step_s']:.3f} | {r['step_s'] / plain[r['ranks']]:.2f}x |")
    return "\n".join(out)


def main(argv=None) -> int:
    """`hilo bench trainer`: every job of JOBS, one after another; the table."""
    ap = argparse.ArgumentParser(prog="hilo bench trainer", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(QWEN3), default="qwen3-1.7b", help="adapter shape (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=5,
                    help="timed steps per job, after one warm-up (default: %(default)s)")
    ap.add_argument("--kafka", default=os.environ.get("HILO_KAFKA", "kafka://127.0.0.1:9092"),
                    help="the loopback broker (default: $HILO_KAFKA or %(default)s)")
    ap.add_argument("--out", metavar="DIR", help="results folder (default: ~/.cache/hilo-sync/bench/trainer-TIME)")
    ap.add_argument("--json", action="store_true", help="print the JSON")
    # one rank of a job (this module, relaunched)
    ap.add_argument("--rank-job", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--kind", help=argparse.SUPPRESS)
    ap.add_argument("--bench-run", help=argparse.SUPPRESS)  # the job's run, the same on every rank
    ap.add_argument("--pipeline", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--log-dir", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.rank_job:
        rank_main(a.shape, a.kind, a.pipeline, a.steps, a.log_dir, a.kafka, a.bench_run, a.out)
        return 0
    rows = []
    for log, world, pipeline in JOBS:
        print(f"bench trainer: {log}, {world} rank(s){', pipelined' if pipeline else ''}, {a.shape}, {a.steps} steps",
              file=sys.stderr, flush=True)
        args = ["--shape", a.shape, "--steps", str(a.steps), "--kind", log, "--kafka", a.kafka,
                "--bench-run", f"bench-trainer-{uuid.uuid4().hex[:8]}"] + (["--pipeline"] if pipeline else [])
        rows.append(row(log, world, pipeline, launch("hilo.ops.bench.trainer", world, args)[0]))
    res = {"shape": a.shape, "steps": a.steps, "threads_per_rank": 1, "cores": os.cpu_count(), "rows": rows,
           "not_run": "Kafka behind 50/150 ms emulated RTT: ops/wan/ needs root network namespaces (sudo hilo bench "
                      "wan)"}
    out = results_dir("trainer", a.out)
    if not save(res, out, "trainer", a.json):
        print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
