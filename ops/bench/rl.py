"""`hilo bench rl`: what asynchrony costs in reward and buys in wall time, on real RL runs across sites.

    ops/rl.sh bench                     # starts a vLLM server on the student base, runs this, stops the server
    hilo bench rl --vllm URL --json     # with a server already serving the student
                                          (python -m hilo.ops.rl_bases student)

For each paired seed and each staleness bound S (0 = synchronous: every sample comes from the newest policy and the
trainer waits for it), one `hilo rl` run (ops/rl.py): this process trains, 2 `hilo consume --generate` sites apply
every version, serve it through vLLM and answer prompts. Runs of one seed draw the same prompts and sampling seeds
from the same start, so S is the only difference and the differences are paired.

Per run: reward per step, wall time, the trainer's idle fraction, rollouts per second, the staleness histogram,
publish-to-serving latency per version and site (the site's "now serves vN" log line minus the trainer's commit), the
sampler/trainer mismatch (KL of vLLM's behaviour log-probabilities against the trainer's recomputed ones), bytes per
version against shipping the bf16 adapter, and how busy the machine's CPUs were. Per S: the reward of the last third
of the steps and of all steps, paired against S = 0 with a 95% t interval, and the wall-time ratio to S = 0.
Resumable: each finished run is appended to OUT/runs.jsonl; a rerun with the same --out computes only what is missing.
"""
import dataclasses
import datetime
import io
import json
import pathlib
import re
import shutil
import statistics
import sys
import time

from hilo.ops.bench.report import mean_ci, results_dir, save, save_figure
from hilo.ops.bench.runstore import RunStore
from hilo.ops.rl import RLConfig, run_rl
from hilo.producer.rollout_audit import AuditConfig
from hilo.schemas.errors import ConfigError
from hilo.schemas.options import opt

RUN_VERSION = 1  # bump when a run's result would change for the same settings (invalidates saved runs)
SERVES = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) .* now serves v(\d+) as ")  # consumer/vllm_serving.py


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """The grid of `hilo bench rl`: the vLLM servers and base, the staleness bounds compared, the paired seeds, and
    each run's steps, sites, GRPO batch and learning rate; checked at construction. Each field's help is in its
    metadata (`hilo bench rl --help`, docs/cli.md)."""

    vllm: str | None = opt(help="the vLLM server(s) the sites use (a comma list: site i uses the i-th), serving `base`")
    base: str = opt("student",
                    "the model, tiny or student (ops/rl_bases.py; python -m hilo.ops.rl_bases NAME writes its "
                    "directory)")
    staleness: tuple = opt((0, 1, 2, 4), "the bounds S compared; the first is the reference")
    seeds: int = opt(5, "paired seeds")
    steps: int = opt(40, "optimizer steps per run")
    sites: int = opt(2, "generating sites")
    batch_prompts: int = opt(8, "complete groups per step (B)")
    samples: int = opt(8, "samples per prompt (n, the GRPO group)")
    lr: float = opt(1e-3, "the trainer's AdamW learning rate")
    audit_share: float = opt(0.1, "share of rollouts the trainer audits (producer/rollout_audit.py)")

    def __post_init__(self):
        if self.vllm is None:
            raise ConfigError("BenchConfig.vllm = None: expected the URL of a vLLM server serving the base (--vllm "
                              "URL; ops/rl.sh bench starts one)")
        if not self.staleness or self.seeds < 1:
            raise ConfigError(f"BenchConfig: staleness {self.staleness} and seeds {self.seeds}: need at least one of "
                              f"each")
        for s in self.staleness:
            self.rl(s, 0)  # every run's config is valid before the first one starts

    def rl(self, staleness: int, seed: int) -> RLConfig:
        """The `hilo rl` config of one run."""
        return RLConfig(vllm=self.vllm, base=self.base, sites=self.sites, staleness=staleness, steps=self.steps,
                        batch_prompts=self.batch_prompts, samples=self.samples, lr=self.lr, seed=seed,
                        audit=AuditConfig(share=self.audit_share))


QUICK = dict(staleness=(0, 2), seeds=1, steps=3, batch_prompts=2, samples=2)  # CI's smoke run


def _cpu_times() -> tuple:
    """(busy, total) jiffies of all CPUs since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4], sum(v)  # idle and iowait are not busy


def serve_latencies(work: pathlib.Path, published: dict) -> dict:
    """{site: [seconds from the trainer's commit of v to the site's vLLM serving v, per version]} from the sites'
    logs."""
    out = {}
    for log in sorted(work.glob("site-*.log")):
        lat = []
        for line in log.read_text().splitlines():
            m = SERVES.match(line)
            if m and int(m.group(3)) in published:
                t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1000
                lat.append(round(t - published[int(m.group(3))], 3))
        out[log.stem] = lat
    return out


def one_run(cfg: RLConfig) -> dict:
    """Run `hilo rl` in this process; its figures (raises if a site ends at another digest)."""
    buf, (busy0, total0) = io.StringIO(), _cpu_times()
    code = run_rl(cfg, as_json=True, out=buf)
    busy1, total1 = _cpu_times()
    res = json.loads(buf.getvalue())
    work = pathlib.Path(res["work_dir"])
    if code != 0:
        raise RuntimeError(f"hilo rl {cfg}: sites ended at other digests than the trainer's ({res['site_digests']}); "
                           f"logs in {work}")
    steps = res["steps"]
    hist = {}
    for r in steps:
        for k, n in r["staleness_counts"].items():
            hist[k] = hist.get(k, 0) + n
    latency = serve_latencies(work, {r["step"]: r["published_at"] for r in steps})
    shutil.rmtree(work, ignore_errors=True)  # 10-20 MB of exported adapters per run
    lat = [x for v in latency.values() for x in v]
    rollouts = sum(r["rollouts"] for r in steps)
    verdicts = (res["audit"] or {}).get("sites", {})
    return {"reward": [r["reward"] for r in steps], "wall_s": res["wall_s"], "t": [r["t"] for r in steps],
            "trainer_idle_fraction": res["trainer_idle_fraction"], "rollouts_per_s": round(rollouts / res["wall_s"], 2),
            "staleness_hist": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))), "dropped": res["dropped"],
            "serve_latency_s": {"median": statistics.median(lat) if lat else None,
                                "p90": sorted(lat)[int(0.9 * (len(lat) - 1))] if lat else None, "per_site": latency},
            "mismatch_kl": statistics.mean(r["mismatch_kl"] for r in steps),
            "bytes_per_version": statistics.mean(r["bytes"] for r in steps), "adapter_bytes": res["adapter_bytes"],
            "cpu_busy_fraction": round((busy1 - busy0) / max(1, total1 - total0), 3), "ok": res["ok"],
            "audit_share": cfg.audit.share, "audited": sum(v["audited"] for v in verdicts.values()),
            "audit_failed": sum(v["failed"] for v in verdicts.values()),
            "audit_s_per_step": statistics.mean(r["audit_s"] for r in steps),
            "train_s_per_step": statistics.mean(r["train_s"] for r in steps)}


def summarize(cfg: BenchConfig, runs: dict) -> list:
    """One row per S: means over seeds, and paired differences against the first S."""
    ref_s, rows = cfg.staleness[0], []
    tail = max(1, cfg.steps // 3)

    def final(r):
        return statistics.mean(r["reward"][-tail:])

    def overall(r):
        return statistics.mean(r["reward"])

    for s in cfg.staleness:
        rs = {seed: runs[(s, seed)] for seed in range(cfg.seeds) if (s, seed) in runs}
        ref = {seed: runs[(ref_s, seed)] for seed in rs if (ref_s, seed) in runs}
        if not rs:
            continue
        hist = {}
        for r in rs.values():
            for k, n in r["staleness_hist"].items():
                hist[k] = hist.get(k, 0) + n
        lat = [r["serve_latency_s"]["median"] for r in rs.values() if r["serve_latency_s"]["median"] is not None]
        rows.append({
            "staleness": s, "seeds": len(rs),
            "reward_final": statistics.mean(map(final, rs.values())),
            "reward_all": statistics.mean(map(overall, rs.values())),
            "reward_final_vs_ref": mean_ci([final(rs[k]) - final(ref[k]) for k in ref]) if s != ref_s else None,
            "reward_all_vs_ref": mean_ci([overall(rs[k]) - overall(ref[k]) for k in ref]) if s != ref_s else None,
            "wall_s": statistics.mean(r["wall_s"] for r in rs.values()),
            "wall_ratio_vs_ref": [round(rs[k]["wall_s"] / ref[k]["wall_s"], 3) for k in ref],
            "trainer_idle_fraction": statistics.mean(r["trainer_idle_fraction"] for r in rs.values()),
            "rollouts_per_s": statistics.mean(r["rollouts_per_s"] for r in rs.values()),
            "staleness_hist": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
            "serve_latency_median_s": statistics.median(lat) if lat else None,
            "mismatch_kl": statistics.mean(r["mismatch_kl"] for r in rs.values()),
            "bytes_per_version": statistics.mean(r["bytes_per_version"] for r in rs.values()),
            "adapter_bytes": next(iter(rs.values()))["adapter_bytes"],
            "cpu_busy_fraction": statistics.mean(r["cpu_busy_fraction"] for r in rs.values()),
            **_audit_columns(rs.values()),
        })
    return rows


def _audit_columns(runs) -> dict:
    """The audit's columns over runs of one S: the share audited, failed audits, the trainer's audit seconds per step
    against its training seconds per step (absent from runs saved before the audit existed)."""
    runs = [r for r in runs if "audited" in r]
    if not runs:
        return {}
    audit_s, train_s = (statistics.mean(r["audit_s_per_step"] for r in runs),
                        statistics.mean(r["train_s_per_step"] for r in runs))
    return {"audit_share": runs[0]["audit_share"], "audited": sum(r["audited"] for r in runs),
            "audit_failed": sum(r["audit_failed"] for r in runs), "audit_s_per_step": audit_s,
            "audit_overhead": audit_s / train_s if train_s else None}


def plot(cfg: BenchConfig, runs: dict, out_dir: pathlib.Path) -> str:
    """Reward (mean over seeds, smoothed over 5 steps) against optimizer step and against wall time, per S."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for s in cfg.staleness:
        rs = [runs[(s, k)] for k in range(cfg.seeds) if (s, k) in runs]
        if not rs:
            continue
        reward = [statistics.mean(x) for x in zip(*(r["reward"] for r in rs))]
        t = [statistics.mean(x) for x in zip(*(r["t"] for r in rs))]
        smooth = [statistics.mean(reward[max(0, i - 4):i + 1]) for i in range(len(reward))]
        label = f"S = {s}" + (" (synchronous)" if s == 0 else "")
        axes[0].plot(range(1, len(smooth) + 1), smooth, label=label)
        axes[1].plot(t, smooth, label=label)
    axes[0].set(xlabel="optimizer step", ylabel="reward (mean of seeds, 5-step average)")
    axes[1].set(xlabel="wall time (s)", ylabel="reward")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend()
    axes[0].set_title(f"GRPO on the digit task, {cfg.sites} sites, {cfg.seeds} paired seeds")
    return save_figure(fig, out_dir, "rl")


def run_bench(cfg: BenchConfig, out_dir: pathlib.Path) -> dict:
    """Every (S, seed) run not already saved under out_dir, then the summary."""
    store = RunStore(out_dir)
    # a run is keyed by what changes its result: not the server's URL, nor the grid (more seeds or S values reuse it)
    key = {k: v for k, v in dataclasses.asdict(cfg).items()
           if k not in ("vllm", "staleness", "seeds")} | {"v": RUN_VERSION}
    # seed-major: pairs finish together
    runs, todo = {}, [(s, seed) for seed in range(cfg.seeds) for s in cfg.staleness]
    for i, (s, seed) in enumerate(todo):
        rid = f"S{s}-seed{seed}-" + json.dumps(key, sort_keys=True)
        saved = store.get(rid)
        if saved is None:
            print(f"bench rl [{i + 1}/{len(todo)}] S = {s}, seed {seed} ...", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            saved = one_run(cfg.rl(s, seed))
            store.put(rid, saved)
            print(f"bench rl [{i + 1}/{len(todo)}] S = {s}, seed {seed}: wall {saved['wall_s']:.1f} s, reward "
                  f"{statistics.mean(saved['reward']):.3f} ({time.monotonic() - t0:.0f} s)", file=sys.stderr,
                  flush=True)
        runs[(s, seed)] = saved
    rows = summarize(cfg, runs)
    return {"config": dataclasses.asdict(cfg), "rows": rows, "plot": plot(cfg, runs, out_dir),
            "runs": [{"staleness": s, "seed": k, **r} for (s, k), r in sorted(runs.items())]}


def table(res: dict) -> str:
    """The table of docs/benchmarks.md."""
    out = ["| S | seeds | reward, last third | vs S = 0 (95% CI) | reward, all steps | vs S = 0 (95% CI) | wall s | "
           "wall / S = 0 | trainer idle | rollouts/s | staleness histogram | publish -> served s (median) | mismatch "
           "KL | bytes/version (adapter) | CPU busy | audited (share) | audit failures | audit s/step (overhead) |",
           "|---:|---:|---:|---|---:|---|---:|---|---:|---:|---|---:|---:|---|---:|---:|---:|---:|"]

    def audit(r):
        if "audited" not in r:
            return "- | - | -"
        overhead = "" if r["audit_overhead"] is None else f" ({100 * r['audit_overhead']:.0f}%)"
        return (f"{r['audited']} ({100 * r['audit_share']:.0f}%) | {r['audit_failed']} | "
                f"{r['audit_s_per_step']:.3f}{overhead}")

    def ci(p):
        return "" if p is None else f"{p['diff']:+.3f} [{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}]"

    for r in res["rows"]:
        lat = r["serve_latency_median_s"]
        out.append(f"| {r['staleness']} | {r['seeds']} | {r['reward_final']:.3f} | {ci(r['reward_final_vs_ref'])} | "
                   f"{r['reward_all']:.3f} | {ci(r['reward_all_vs_ref'])} | {r['wall_s']:.1f} | "
                   f"{', '.join(f'{x:.2f}' for x in r['wall_ratio_vs_ref'])} | {100 * r['trainer_idle_fraction']:.0f}% "
                   f"| {r['rollouts_per_s']:.1f} | {' '.join(f'{k}:{n}' for k, n in r['staleness_hist'].items())} | "
                   f"{'-' if lat is None else f'{lat:.2f}'} | {r['mismatch_kl']:.1e} | "
                   f"{r['bytes_per_version']:,.0f} ({r['adapter_bytes']:,}) | {100 * r['cpu_busy_fraction']:.0f}% | "
                   f"{audit(r)} |")
    return "\n".join(out)


def main(cfg: BenchConfig, as_json: bool, out: str | None) -> int:
    """Run the benchmark; print the table or JSON."""
    out_dir = results_dir("rl", out)
    res = run_bench(cfg, out_dir)
    if not save(res, out_dir, "rl", as_json):
        print(table(res))
    return 0
