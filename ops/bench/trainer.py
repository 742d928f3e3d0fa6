"""`hilo bench trainer`: what a training step costs with hilo-sync against plain torch.optim.AdamW, in one table.

    hilo bench trainer [--shape qwen3-1.7b] [--steps 5] [--kafka kafka://127.0.0.1:9092] [--rtt-ms 50,150]
                       [--compute-s 0] [--rows adamw-1,kafka-1,wan] [--out DIR] [--json]

Each row is a job of its own (ops/bench/ranks.py's way: the shape's LoRA adapter under PEFT's names, the same synthetic
gradients set before every step, one CPU thread per rank, 2 ranks under torchrun with gloo and a barrier where DDP's
all-reduce would be): plain AdamW over the LoRA params; HiLoProducer (spar4 at the default budget, AdamW) on an embedded
file log and on Kafka over loopback, each in line and pipelined (ProducerConfig.pipeline), on 1 and 2 ranks; with
--rtt-ms, on Kafka behind each emulated round trip, in line and pipelined (one rank): a broker of its own whose clients
reach it through a latency proxy (ops/bench/delayed_broker.py, ops/wan/toxiproxy.sh; no root, no sch_netem), started and
stopped by the bench; the JSON records what a metadata request costs through the proxy and straight. --compute-s X
models the forward and backward a real step computes before its optimizer step: each rank sleeps X s before every
step(). The pipelined publish can hide the RTT only behind compute that exists: at the tiny shape a step is about 0.1 s,
less than a transaction over 150 ms RTT, so with no compute the next step waits for the previous commit. Columns,
medians on rank 0 after a warm-up step: encode and apply (the trainer's own, UpdateBuilder.propose's), the rest of the
step (the publish wait on the critical path: in line the transaction, pipelined the wait for the previous version; with
the write-back into the model), the step (the optimizer's step, compute excluded: barrier to barrier less X on 2 ranks,
the slowest rank's), and its ratio to plain AdamW's step on as many ranks. --rows runs only the jobs named (adamw-1,
file-1, file-1-pipelined, kafka-1, kafka-1-pipelined, adamw-2, file-2, file-2-pipelined, kafka-2, kafka-2-pipelined,
wan-1, wan-1-pipelined; a name also picks the jobs it begins: `kafka-1` is both 1-rank Kafka jobs, `wan` all WAN ones).
"""
import argparse
import json
import os
import pathlib
import statistics
import sys
import time
import uuid
from dataclasses import dataclass

import torch

from hilo.ops.bench.delayed_broker import DelayedBroker
from hilo.ops.bench.trainer_flags import add_arguments
from hilo.ops.bench.ranks import LoraShell, launch
from hilo.ops.bench.report import results_dir, save
from hilo.replica.synthetic import GradientStream, qwen3_manifest


@dataclass(frozen=True)
class Job:
    """One row's job: its log (adamw: none; wan: Kafka behind `rtt_ms` of emulated round trip), ranks, pipelined."""
    log: str
    ranks: int
    pipeline: bool = False
    rtt_ms: int = 0

    @property
    def name(self) -> str:
        """What --rows calls it: LOG-RANKS[-pipelined]."""
        return f"{self.log}-{self.ranks}" + ("-pipelined" if self.pipeline else "")

    @property
    def label(self) -> str:
        """The table's name for it."""
        if self.log == "adamw":
            return "torch AdamW"
        where = {"file": "file log", "kafka": "Kafka loopback"}.get(self.log, f"Kafka {self.rtt_ms} ms RTT")
        return f"hilo, {where}" + (", pipelined" if self.pipeline else "")


JOBS = (Job("adamw", 1), Job("file", 1), Job("file", 1, True), Job("kafka", 1), Job("kafka", 1, True),
        Job("adamw", 2), Job("file", 2), Job("file", 2, True), Job("kafka", 2), Job("kafka", 2, True))


def wan_jobs(rtts: list) -> list:
    """Kafka behind each round trip: 1 rank, in line and pipelined."""
    return [Job("wan", 1, pipeline, rtt) for rtt in rtts for pipeline in (False, True)]


def picked(job: Job, rows: list | None) -> bool:
    """Whether --rows names the job (or a name it begins with)."""
    return rows is None or any(job.name == r or job.name.startswith(r + "-") for r in rows)


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


def rank_main(shape: str, log: str, pipeline: bool, steps: int, log_dir: str, kafka: str, run: str, out: str,
              compute_s: float = 0.0) -> None:
    """One rank (or the lone process) of one job: `steps` + 2 steps, each after `compute_s` of modelled forward and
    backward; writes OUT/rank{R}.json."""
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
        if compute_s:
            time.sleep(compute_s)  # the step's forward and backward, which a pipelined publish can run behind
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        if world > 1:
            dist.barrier()
        opened.append(time.perf_counter())
        step()
        step_s.append(time.perf_counter() - opened[-1])
        parts.append(timings())
    close()
    if pipeline:  # a step's account comes with the next step (or close()), which settles it: pair each with its own
        parts = [dict(own, wait_s=p.get("wait_s")) for p, own in zip(parts, parts[1:] + [timings()])]
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


def row(job: Job, report: dict, compute_s: float = 0.0) -> dict:
    """One table row from rank 0's report (on 2 ranks the period less the modelled compute)."""
    step = (statistics.median(report["period_s"]) - compute_s if job.ranks > 1
            else statistics.median(report["step_s"]))
    enc, app = (_median([p.get(k) for p in report["parts"]]) for k in ("encode_s", "apply_s"))
    rest = None if enc is None else statistics.median([s - (p["encode_s"] or 0) - (p["apply_s"] or 0)
                                                        for s, p in zip(report["step_s"], report["parts"])])
    return {"trainer": job.label, "ranks": job.ranks, "pipeline": job.pipeline,
            "rtt_ms": job.rtt_ms if job.log == "wan" else None, "encode_s": enc, "apply_s": app,
            "publish_wait_s": rest, "wait_s": _median([p.get("wait_s") for p in report["parts"]]), "step_s": step}


def table(res: dict) -> str:
    """The one table: a row per job, the ratio to plain AdamW on as many ranks."""
    out = [f"| {res['shape']} r64, spar4, 1 thread per rank | ranks | encode s | apply s | publish wait s | step s | "
           f"vs AdamW |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    plain = {r["ranks"]: r["step_s"] for r in res["rows"] if r["trainer"] == "torch AdamW"}
    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    for r in res["rows"]:
        ratio = f"{r['step_s'] / plain[r['ranks']]:.2f}x" if r["ranks"] in plain else "-"
        out.append(f"| {r['trainer']} | {r['ranks']} | {f(r['encode_s'])} | {f(r['apply_s'])} | "
                   f"{f(r['publish_wait_s'])} | {r['step_s']:.3f} | {ratio} |")
    return "\n".join(out)


def _run_job(a, job: Job, kafka: str) -> dict:
    print(f"bench trainer: {job.label}, {job.ranks} rank(s), {a.shape}, {a.steps} steps", file=sys.stderr, flush=True)
    args = ["--shape", a.shape, "--steps", str(a.steps), "--kind", "kafka" if job.log == "wan" else job.log,
            "--kafka", kafka, "--compute-s", str(a.compute_s),
            "--bench-run", f"bench-trainer-{uuid.uuid4().hex[:8]}"] + (["--pipeline"] if job.pipeline else [])
    return row(job, launch("hilo.ops.bench.trainer", job.ranks, args)[0], a.compute_s)


def run_wan(a, jobs: list) -> tuple:
    """The WAN jobs on one delayed broker, the proxy's RTT set before each RTT's jobs: (rows, {rtt: what a
    metadata request costs through the proxy and straight})."""
    rows, measured = [], {}
    with DelayedBroker(jobs[0].rtt_ms, a.wan_port) as broker:
        for job in jobs:
            if str(job.rtt_ms) not in measured:
                broker.set_rtt(job.rtt_ms)
                measured[str(job.rtt_ms)] = {"metadata_request_s": broker.metadata_s(),
                                             "direct_metadata_request_s": broker.metadata_s(proxied=False)}
            rows.append(_run_job(a, job, broker.url))
    return rows, measured


def main(argv=None) -> int:
    """`hilo bench trainer`: every job of JOBS (those --rows names), then the WAN ones; the table."""
    ap = argparse.ArgumentParser(prog="hilo bench trainer", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    # one rank of a job (this module, relaunched)
    ap.add_argument("--rank-job", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--kind", help=argparse.SUPPRESS)
    ap.add_argument("--bench-run", help=argparse.SUPPRESS)  # the job's run, the same on every rank
    ap.add_argument("--pipeline", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--log-dir", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.rank_job:
        rank_main(a.shape, a.kind, a.pipeline, a.steps, a.log_dir, a.kafka, a.bench_run, a.out, a.compute_s)
        return 0
    jobs = [j for j in JOBS if picked(j, a.rows)]
    wan = [j for j in wan_jobs(a.rtt_ms) if picked(j, a.rows)]
    rows = [_run_job(a, job, a.kafka) for job in jobs]
    wan_rows, rtt = run_wan(a, wan) if wan else ([], {})
    not_run = [f"{j.label}, {j.ranks} rank(s)" for j in JOBS + tuple(wan_jobs(a.rtt_ms)) if not picked(j, a.rows)]
    if not a.rtt_ms:
        not_run.append("Kafka behind emulated RTT (--rtt-ms)")
    res = {"shape": a.shape, "steps": a.steps, "threads_per_rank": 1, "cores": os.cpu_count(),
           "compute_s": a.compute_s, "rows": rows + wan_rows, "rtt": rtt, "not_run": not_run}
    out = results_dir("trainer", a.out)
    if not save(res, out, "trainer", a.json):
        print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
