"""`hilo bench scrape`: what an operator's scraper sees while a site applies: /metrics latency and lag consistency.

    hilo bench scrape [--shape qwen3-0.6b] [--versions 60] [--every-ms 50] [--json]

A trainer replica appends `versions` spar4 AdamW versions at a real adapter's shape (ops/bench/replay.publish) after
a genesis checkpoint, to an embedded log. A real site (consumer/site.py, snapshots every 10 versions as by default)
then catches up with its metrics endpoint up, while this process scrapes /metrics every `every_ms` over HTTP and parses
each answer with prometheus_client's parser. Reported: scrapes, p50 / p99 / max latency (target: p99 < 100 ms), and
how many scrapes had lag_versions != head_version - applied_version (must be 0). The snapshot in the apply loop is
part of what is measured (the keep-pace issue moves it off that loop).
"""
import pathlib
import tempfile
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from hilo.log import checkpoints_topic, open_log, threads
from hilo.ops.bench.replay import CHUNK_BYTES, publish
from hilo.ops.bench.report import results_dir, save
from hilo.replica.synthetic import initial_params, qwen3_manifest
from hilo.ops.metrics_server import MetricsConfig, MetricsServer
from hilo.replica.replica import PolicyReplica
from hilo.schemas import headers as H
from hilo.schemas.chunks import split

TARGET_P99_MS = 100.0
RUN = "scrape"


def _genesis(log, shape: str) -> None:
    """The checkpoint a site bootstraps from: the same genesis `publish` starts its trainer replica at."""
    replica = PolicyReplica.genesis(RUN, qwen3_manifest(shape), initial_params(qwen3_manifest(shape)), "adamw")
    ckpt = replica.checkpoint()
    log.append(checkpoints_topic(RUN), split(ckpt.to_bytes(), RUN, "checkpoint", 0, CHUNK_BYTES,
                                                H.checkpoint_headers(ckpt.digest, 0, 0, ckpt.genesis)))


def _sample(families) -> dict:
    return {s.name: s.value for f in families for s in f.samples if s.name.startswith("hilo_site_")}


def run_bench(shape: str, versions: int, every_ms: float, work: pathlib.Path) -> dict:
    """Publish, then scrape a catching-up site; the result row."""
    from hilo.consumer.config import SiteConfig
    from hilo.consumer.site import Site
    log = open_log(f"file://{work}/log")
    log.create_topics(RUN)
    _genesis(log, shape)
    digest = publish(log, RUN, shape, "adamw", versions)[0]
    site = Site.open(SiteConfig(log=f"file://{work}/log", run=RUN, site="s", state_dir=str(work / "s"),
                                export_adapters=False, until_version=versions, wait_checkpoint_s=10))
    server = MetricsServer(MetricsConfig(0, "127.0.0.1"), site.metrics.registry)
    latencies, inconsistent, t0 = [], 0, time.perf_counter()
    follower = threads.start(site.run, "bench-site", False)
    try:
        while follower.is_alive():
            a = time.perf_counter()
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=30) as r:
                m = _sample(text_string_to_metric_families(r.read().decode()))
            latencies.append(time.perf_counter() - a)
            if m["hilo_site_lag_versions"] != m["hilo_site_head_version"] - m["hilo_site_applied_version"]:
                inconsistent += 1
            # the scrape interval (a rate, not a wait on anything)
            time.sleep(max(0.0, every_ms / 1000 - (time.perf_counter() - a)))
    finally:
        follower.join()
        server.close()
    catch_up_s = time.perf_counter() - t0
    ms = sorted(x * 1000 for x in latencies)
    return {"shape": shape, "versions": versions, "every_ms": every_ms, "catch_up_s": round(catch_up_s, 2),
            "scrapes": len(ms), "p50_ms": round(ms[len(ms) // 2], 2),
            "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
            "max_ms": round(ms[-1], 2), "inconsistent": inconsistent, "target_p99_ms": TARGET_P99_MS,
            "met": ms[min(len(ms) - 1, int(len(ms) * 0.99))] < TARGET_P99_MS and inconsistent == 0,
            "digest_ok": site.follower.replica.digest == digest}


def main(as_json: bool, shape: str, versions: int, every_ms: float, out: str | None) -> int:
    """Run it; print a line or the JSON."""
    out_dir = results_dir("scrape", out)
    with tempfile.TemporaryDirectory(prefix="hilo-scrape-") as work:
        res = run_bench(shape, versions, every_ms, pathlib.Path(work))
    if not save(res, out_dir, "scrape", as_json):
        print(f"{res['shape']}: {res['scrapes']} scrapes while catching up {res['versions']} versions in "
              f"{res['catch_up_s']} s: p50 {res['p50_ms']} ms, p99 {res['p99_ms']} ms (target < {TARGET_P99_MS:g}), "
              f"max {res['max_ms']} ms; {res['inconsistent']} inconsistent; digest "
              f"{'ok' if res['digest_ok'] else 'WRONG'}")
    return 0 if res["digest_ok"] else 1
