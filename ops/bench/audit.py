"""`hilo bench audit`: the audit's calibration and its cost, on real `hilo rl` runs with honest sites.

    hilo bench audit --vllm http://127.0.0.1:8011 --json     # a server serving the tiny base (ops/vllm/start.sh)
    hilo bench audit --served http://127.0.0.1:8011=float32,http://127.0.0.1:8012=bfloat16 --shares '' --json

With --served (ops/bench/audit_noise.py): per served dtype, the honest per-token differences, detection of each liar
by the per-token rule and by the statistical verdict, rollouts to detection, false quarantines over N honest rollouts.

One `hilo rl` run (ops/rl.py: this process trains, 2 `hilo consume --generate` sites serve every version through
vLLM with fp32 adapters) per audited share, same seed: 0 (the reference), 0.1 and 1. Per run: rollouts audited,
passed and failed, the worst per-token |log-probability difference| between vLLM's behaviour log-probabilities and
the trainer's recomputation, every audited token's difference by power of ten, the trainer's seconds spent auditing
per step against its seconds per training step (loss, backward, publish), and the run's wall time. The tolerance
(AuditConfig.tolerance, SiteConfig.self_check_tolerance) is set from the worst honest difference with a margin.
"""
import dataclasses
import io
import json
import shutil
import statistics
import sys

from hilo.ops.bench.audit_noise import LIARS, NoiseRun, measure
from hilo.ops.bench.report import results_dir, save
from hilo.ops.rl import RLConfig, run_rl
from hilo.producer.audit_noise import honest_noise
from hilo.producer.rollout_audit import AuditConfig, decade_order
from hilo.schemas.errors import ConfigError
from hilo.schemas.options import opt

PARTIAL = "hilo.ops.digit_task:partial_reward"  # partial credit: the tiny policy moves every step (0/1: it stays put)


@dataclasses.dataclass(frozen=True)
class AuditBenchConfig:
    """The runs of `hilo bench audit`: the vLLM server(s) and base, the shares audited, and each run's size; checked at
    construction. Each field's help is in its metadata (`hilo bench audit --help`, docs/cli.md)."""

    vllm: str | None = opt(None,
                           "the vLLM server(s) the sites use, serving `base` (a comma list: site i uses the i-th)")
    served: tuple = opt((),
                        "vLLM servers of the tiny base as URL=DTYPE (the dtype it serves and its sites export adapters "
                        "in): each measured as ops/bench/audit_noise.py says")
    honest: int = opt(1000, "with --served: honest rollouts per served dtype (N)")
    liar: int = opt(200, "with --served: rollouts of each liar per served dtype")
    base: str = opt("tiny", "the model, tiny or student (ops/rl_bases.py)")
    shares: tuple = opt((0.0, 0.1, 1.0), "the audited shares compared; 0 is the reference (no audit)")
    steps: int = opt(8, "optimizer steps per run")
    batch_prompts: int = opt(4, "complete groups per step (B)")
    samples: int = opt(4, "samples per prompt (n)")
    seed: int = opt(0, "the runs' seed (the same for every share)")

    def __post_init__(self):
        if self.vllm is None and (self.shares or not self.served):
            raise ConfigError("AuditBenchConfig.vllm = None: expected the URL of a vLLM server serving the base "
                              "(--vllm URL), or only --served (with --shares '')")
        for u in self.served:
            if "=" not in u or u.rpartition("=")[2] not in ("float32", "bfloat16", "float16"):
                raise ConfigError(f"AuditBenchConfig.served: {u!r}: expected URL=DTYPE, DTYPE float32, bfloat16 or "
                                  f"float16")
        for s in self.shares:
            self.rl(s)

    def rl(self, share: float) -> RLConfig:
        """The `hilo rl` config of one run."""
        return RLConfig(vllm=self.vllm, base=self.base, sites=2, staleness=1, steps=self.steps,
                        batch_prompts=self.batch_prompts,
                        samples=self.samples, seed=self.seed, audit=AuditConfig(share=share), reward=PARTIAL)


def one_run(cfg: RLConfig) -> dict:
    """Run `hilo rl` in this process; the audit's figures (raises if a site ends at another digest)."""
    buf = io.StringIO()
    code = run_rl(cfg, as_json=True, out=buf)
    res = json.loads(buf.getvalue())
    shutil.rmtree(res["work_dir"], ignore_errors=True)
    if code != 0:
        raise RuntimeError(f"hilo rl: sites ended at other digests than the trainer's ({res['site_digests']})")
    steps, audit = res["steps"], res["audit"]
    sites = audit["sites"] if audit else {}
    row = {"share": cfg.audit.share, "steps": len(steps), "rollouts": sum(r["rollouts"] for r in steps),
           "audited": sum(v["audited"] for v in sites.values()), "passed": sum(v["passed"] for v in sites.values()),
           "failed": sum(v["failed"] for v in sites.values()),
           "worst": max((v["worst"] for v in sites.values()), default=None),
           "sampling_z": {s: round(v["z"], 2) for s, v in sites.items()},
           "token_differences": audit["token_differences"] if audit else {},
           "audit_s_per_step": statistics.mean(r["audit_s"] for r in steps),
           "train_s_per_step": statistics.mean(r["train_s"] for r in steps),
           "kept_bytes": audit["kept_bytes"] if audit else 0, "wall_s": res["wall_s"],
           "trainer_idle_fraction": res["trainer_idle_fraction"], "dropped": res["dropped"]}
    row["overhead"] = round(row["audit_s_per_step"] / row["train_s_per_step"], 4) if row["train_s_per_step"] else None
    return row


def run(cfg: AuditBenchConfig) -> dict:
    """Every share's run, then the calibration: the worst honest difference over all runs and the margin to the
    tolerance."""
    rows = []
    for i, share in enumerate(cfg.shares):
        print(f"bench audit [{i + 1}/{len(cfg.shares)}] share {share:g} ...", file=sys.stderr, flush=True)
        rows.append(one_run(cfg.rl(share)))
    worst = max((r["worst"] for r in rows if r["worst"] is not None), default=None)
    tol = honest_noise("vllm", "float32").tolerance
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    served = [measure(NoiseRun(u.rpartition("=")[0], u.rpartition("=")[2], cfg.honest, cfg.liar, seed=cfg.seed), say)
              for u in cfg.served]
    return {"config": dataclasses.asdict(cfg), "rows": rows, "honest_worst": worst, "tolerance": tol,
            "margin": round(tol / worst, 1) if worst else None, "served": served}


def table(res: dict) -> str:
    """The table of docs/benchmarks.md."""
    out = ["| share audited | rollouts | audited | failed | worst per-token difference | audit s / step | train s / "
           "step | overhead | params kept | wall s |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        worst = "-" if r["worst"] is None else f"{r['worst']:.2e}"
        overhead = "-" if r["overhead"] is None else f"{100 * r['overhead']:.0f}%"
        out.append(f"| {100 * r['share']:.0f}% | {r['rollouts']} | {r['audited']} | {r['failed']} | {worst} | "
                   f"{r['audit_s_per_step']:.3f} | {r['train_s_per_step']:.3f} | "
                   f"{overhead} | {r['kept_bytes']:,} B | {r['wall_s']:.1f} |")
    decades = {}
    for r in res["rows"]:
        for k, n in r["token_differences"].items():
            decades[k] = decades.get(k, 0) + n
    if decades:
        out += ["", "Honest per-token |log-probability difference| (vLLM CPU, fp32 adapters), every audited token: "
                + ", ".join(f"{k}: {decades[k]}" for k in sorted(decades, key=decade_order))
                + f". Worst {res['honest_worst']:.2e}; this run's tolerance, {res['tolerance']:g}, is "
                  f"{res['margin']:g}x it."]
    parts = (["\n".join(out)] if res["rows"] else []) + ([served_table(res["served"])] if res.get("served") else [])
    return "\n\n".join(parts)


def main(cfg: AuditBenchConfig, as_json: bool, out: str | None) -> int:
    """Run the benchmark; print the table or JSON."""
    out_dir = results_dir("audit", out)
    res = run(cfg)
    if not save(res, out_dir, "audit", as_json):
        print(table(res))
    return 0


def served_markdown(res: dict) -> str:
    """The table of docs/benchmarks.md, "The audit where sites serve" (docs/results/audit-served.json)."""
    return served_table(res["served"])


def served_table(rows: list) -> str:
    """The table of the audit where sites serve: per dtype and rule, false quarantines and rollouts to each liar's."""
    out = ["| served | honest per-token abs(difference): mean / p99 / worst | rule | honest rollouts quarantined (N) | "
           + " | ".join(f"{lie}: rollouts to quarantine" for lie in LIARS) + " |",
           "|---|---|---|---:|" + "---:|" * len(LIARS)]
    for r in rows:
        d = r["differences"]
        for rule in r["honest"]:
            h = r["honest"][rule]
            caught = [r["liars"][rule][lie]["first_quarantine"] for lie in LIARS]
            out.append(f"| {r['engine']} CPU, {r['dtype']} | {d['abs_mean']:.2e} / {d['abs_p99']:.2e} / "
                       f"{d['worst']:.2e} | {rule} | {h['quarantines']} ({r['honest_rollouts']}) | "
                       + " | ".join("not caught" if c is None else str(c) for c in caught) + " |")
    return "\n".join(out)
