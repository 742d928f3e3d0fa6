"""`hilo bench fanout`: what more sites cost a cluster, and what a regional mirror takes off the source.

    hilo bench fanout [--log kafka://127.0.0.1:9092] [--mirror kafka://127.0.0.1:19392] [--sites 1,4,16] [--json]

One fresh run per layout: N apply-only sites (`hilo consume --no-export`, one process each) on the source cluster,
for each N in --sites; with --mirror, the largest N again, split half on the source and half on the mirror, which
MirrorMaker 2 (ops/kafka/mirror.sh, started by this command for that run) fills from the source. This process
trains the tiny Qwen3 (ops/tiny_trainer.py) through HiLoProducer (spar4 at 1.6%, AdamW, Kafka transactions) and
publishes one version every --interval seconds once every site is following.

Per site and version: freshness, the site's applied time minus the version's log timestamp (Kafka's CreateTime of its
last record, set as the trainer sends it, just before the commit; a mirror keeps it; one machine, one clock; the
first version is a warm-up and not counted), from the history each site writes, and the part of it the
site spent verifying, decoding and applying (the rest is delivery: the broker's fetch path and waiting for a CPU). Per
cluster and version: egress, the bytes of update records (values and headers) its sites read, plus on the source the one
copy MirrorMaker reads (the message's record bytes; Kafka's protocol framing is not counted). Every site must end at
the trainer's digest. The figure of merit: the median freshness of the largest N over that of 1 site.
"""
import dataclasses
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from hilo.ops.bench.report import results_dir, save
from hilo.replay.history import read_history
from hilo.schemas.errors import ConfigError
from hilo.schemas.options import opt

MIRROR_SH = pathlib.Path(__file__).resolve().parents[1] / "kafka" / "mirror.sh"


@dataclasses.dataclass(frozen=True)
class FanoutConfig:
    """The layouts and the run of `hilo bench fanout`: the source cluster and an optional mirror, the site counts,
    and how many versions are published how often; checked at construction. Each field's help is in its metadata
    (`hilo bench fanout --help`, docs/cli.md)."""

    log: str = opt("kafka://127.0.0.1:9092", "the source cluster (the trainer's)")
    mirror: str | None = opt(None,
                             "a second cluster to split the largest site count over (MirrorMaker 2 fills it; none: "
                             "no split)")
    sites: tuple = opt((1, 4, 16), "site counts on the source alone")
    versions: int = opt(20, "versions published per layout (the first is a warm-up)")
    interval_s: float = opt(1.0, "seconds between versions (the sites are idle, waiting, when each arrives)")
    ready_s: float = opt(300.0, "how long sites may take to start and bootstrap")

    def __post_init__(self):
        for name in ("log", "mirror"):
            url = getattr(self, name)
            if url is not None and not url.startswith("kafka://"):
                raise ConfigError(f"FanoutConfig.{name} = {url!r}: expected a kafka:// URL (a mirror is a Kafka "
                                  f"cluster)")
        if not self.sites or any(not isinstance(n, int) or n < 1 for n in self.sites):
            raise ConfigError(f"FanoutConfig.sites = {self.sites!r}: expected site counts >= 1")
        if self.mirror is not None and max(self.sites) < 2:
            raise ConfigError(f"FanoutConfig.sites = {self.sites!r}: splitting over a mirror needs a count >= 2")
        if self.versions < 2:
            raise ConfigError(f"FanoutConfig.versions = {self.versions}: must be >= 2 (the first is a warm-up)")
        if self.interval_s <= 0:
            raise ConfigError(f"FanoutConfig.interval_s = {self.interval_s}: must be > 0")

    def layouts(self) -> list:
        """(sites on the source, sites on the mirror) per layout."""
        out = [(n, 0) for n in self.sites]
        if self.mirror:
            n = max(self.sites)
            out.append((n - n // 2, n // 2))
        return out


def _say(*a):
    print(*a, file=sys.stderr, flush=True)


def _mirror_sh(*args, env):
    """ops/kafka/mirror.sh ARGS; its failure names its log."""
    p = subprocess.run([str(MIRROR_SH), *args], env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"mirror.sh {args[0]} failed: {p.stderr.strip()[-600:]}")


class _Sites:
    """N `hilo consume` processes, each writing a history; their files live under `work`."""

    def __init__(self, work: pathlib.Path, run: str, placement: list, until: int):
        self.work, self.procs, self.names = work, {}, []
        for i, url in enumerate(placement):
            name = f"s{i:02d}"
            cmd = [sys.executable, "-m", "hilo.ops.cli", "consume", "--log", url, "--run", run, "--site", name,
                   "--state-dir", str(work / name), "--no-export", "--snapshot-every", "1000", "--until-version",
                   str(until), "--history", str(work / f"{name}.jsonl"), "--no-progress"]
            log = open(work / f"{name}.log", "ab")
            self.procs[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                                 env=dict(os.environ, OMP_NUM_THREADS="1")), url)
            self.names.append(name)

    def history(self, name: str) -> list:
        """The site's history entries so far."""
        path = self.work / f"{name}.jsonl"
        return read_history(str(path)) if path.exists() else []

    def _failed(self, name: str) -> str:
        tail = (self.work / f"{name}.log").read_text(errors="replace").strip().splitlines()[-3:]
        return f"site {name} exited with {self.procs[name][0].returncode}: {' | '.join(tail)}"

    def wait(self, done, what: str, timeout_s: float) -> None:
        """Poll until done(name) holds for every site; a site that exits first, or the timeout, raises."""
        deadline, left = time.monotonic() + timeout_s, list(self.names)
        while left:
            left = [n for n in left if not done(n)]
            for n in left:
                if self.procs[n][0].poll() is not None and not done(n):
                    raise RuntimeError(self._failed(n))
            if left and time.monotonic() > deadline:
                raise RuntimeError(f"{len(left)} site(s) not {what} after {timeout_s:.0f} s: {left[:4]}")
            if left:
                time.sleep(0.2)  # polling other processes' files

    def stop(self) -> None:
        """Kill what still runs."""
        for p, _ in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()


def _pct(xs: list, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def one_layout(cfg: FanoutConfig, on_source: int, on_mirror: int, work: pathlib.Path) -> dict:
    """Publish cfg.versions to a fresh run followed by on_source + on_mirror sites; the layout's row."""
    from hilo.ops.tiny_trainer import build_model, train
    from hilo.producer.config import ProducerConfig
    from hilo.producer.producer import HiLoProducer
    from hilo.replica.codecs import Budget

    run = f"fanout-{int(time.time())}-{on_source}-{on_mirror}"
    label = f"{on_source} on the source" + (f" + {on_mirror} on the mirror" if on_mirror else "")
    _say(f"bench fanout: {label}: run {run}")
    producer = HiLoProducer.open(build_model(seed=0), ProducerConfig(
        run=run, log=cfg.log, codec="spar4", budget=Budget(0.016), optimizer="adamw", checkpoint_every=10_000))
    env = dict(os.environ, HILO_MIRROR_DIR=str(work / "mirror"))
    sites = None
    try:
        if on_mirror:
            _mirror_sh("start", "--source", cfg.log.removeprefix("kafka://"), "--target",
                       cfg.mirror.removeprefix("kafka://"), "--run", run, env=env)
        placement = [cfg.log] * on_source + [cfg.mirror] * on_mirror
        sites = _Sites(work, run, placement, cfg.versions)
        sites.wait(lambda n: bool(sites.history(n)), "following", cfg.ready_s)
        _say(f"bench fanout: {label}: every site follows; publishing {cfg.versions} versions, one per "
             f"{cfg.interval_s} s")
        t_next = time.monotonic()
        for _ in range(cfg.versions):
            time.sleep(max(0.0, t_next - time.monotonic()))  # the cadence under test, not synchronisation
            t_next = time.monotonic() + cfg.interval_s
            train(producer, 1)
        sites.wait(lambda n: sites.procs[n][0].poll() == 0, "done", 120 + cfg.versions * 5)
        digest = producer.replica.digest.hex()
        fresh = {cfg.log: [], cfg.mirror: []}   # per cluster: (freshness, seconds to verify + decode + apply)
        egress = {cfg.log: 0, cfg.mirror: 0}
        message = []
        for name in sites.names:
            url = sites.procs[name][1]
            applied = [e for e in sites.history(name) if "v" in e and not e.get("start")]
            if not applied or applied[-1]["v"] != cfg.versions or applied[-1]["d"] != digest:
                raise RuntimeError(f"site {name} ended at {applied[-1]['v'] if applied else None}, not at the "
                                   f"trainer's v{cfg.versions} digest {digest[:12]}")
            for e in applied:
                if e["v"] >= 2:  # v1 is the warm-up
                    fresh[url].append((e["t"] - e["w"], e["a"]))
                    egress[url] += e["b"]
                    message.append(e["b"])
        per_version = cfg.versions - 1
        msg = statistics.mean(message)
        row = {"sites_source": on_source, "sites_mirror": on_mirror, "run": run, "versions": cfg.versions,
               "message_record_bytes": round(msg),
               "egress_source_per_version": round(egress[cfg.log] / per_version + (msg if on_mirror else 0)),
               "egress_mirror_per_version": round(egress[cfg.mirror] / per_version) if on_mirror else None,
               "apply_median_s": round(statistics.median(a for _, a in fresh[cfg.log] + fresh[cfg.mirror]), 4),
               "delivery_median_s": round(statistics.median(f - a for f, a in fresh[cfg.log] + fresh[cfg.mirror]), 4)}
        for key, pairs in (("", fresh[cfg.log] + fresh[cfg.mirror]), ("source_", fresh[cfg.log]),
                           ("mirror_", fresh[cfg.mirror])):
            xs = [f for f, _ in pairs]
            if xs and (key != "source_" or on_mirror):
                row[f"{key}freshness_median_s"] = round(statistics.median(xs), 4)
                row[f"{key}freshness_p90_s"] = round(_pct(xs, 0.9), 4)
                row[f"{key}freshness_max_s"] = round(max(xs), 4)
        _say(f"bench fanout: {label}: freshness median {row['freshness_median_s']:.3f} s, p90 "
             f"{row['freshness_p90_s']:.3f} s; source egress {row['egress_source_per_version']:,} B per version")
        return row
    finally:
        if sites:
            sites.stop()
        if on_mirror:
            _mirror_sh("stop", env=env)
        producer.close()


def run_bench(cfg: FanoutConfig) -> dict:
    """Every layout, in a temporary work dir each."""
    rows = []
    for on_source, on_mirror in cfg.layouts():
        work = pathlib.Path(tempfile.mkdtemp(prefix="hilo-fanout-"))
        try:
            rows.append(one_layout(cfg, on_source, on_mirror, work))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    single = [r for r in rows if r["sites_mirror"] == 0]
    one, most = min(single, key=lambda r: r["sites_source"]), max(single, key=lambda r: r["sites_source"])
    return {"log": cfg.log, "mirror": cfg.mirror, "versions": cfg.versions, "interval_s": cfg.interval_s,
            "codec": "spar4", "budget": "1.6%", "shape": "tiny (hidden 256, 4 layers, LoRA r16)",
            "cpus": os.cpu_count(),
            "rows": rows,
            "freshness_ratio_most_to_one": round(most["freshness_median_s"] / one["freshness_median_s"], 2),
            "ratio_sites": [most["sites_source"], one["sites_source"]]}


def table(res: dict) -> str:
    """The table of docs/benchmarks.md."""
    out = ["| sites (source + mirror) | freshness median s | p90 s | max s | apply (median) s | delivery (median) s | "
           "source egress per version | mirror egress per version |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        where = f"{r['sites_source']} + {r['sites_mirror']}" if r["sites_mirror"] else f"{r['sites_source']}"
        mirror = f"{r['egress_mirror_per_version']:,} B" if r["sites_mirror"] else ""
        out.append(f"| {where} | {r['freshness_median_s']:.3f} | {r['freshness_p90_s']:.3f} | "
                   f"{r['freshness_max_s']:.3f} | {r['apply_median_s']:.3f} | {r['delivery_median_s']:.3f} | "
                   f"{r['egress_source_per_version']:,} B | {mirror} |")
    return "\n".join(out)


def main(cfg: FanoutConfig, as_json: bool, out: str | None) -> int:
    """Run it; print the table or JSON."""
    out_dir = results_dir("fanout", out)
    res = run_bench(cfg)
    if not save(res, out_dir, "fanout", as_json):
        print(table(res))
        print(f"median freshness, {res['ratio_sites'][0]} sites / {res['ratio_sites'][1]}: "
              f"{res['freshness_ratio_most_to_one']}x")
    return 0
