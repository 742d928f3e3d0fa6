"""`hilo bench pace`: does a `hilo consume` process keep pace with a run that gains a version every second?

    hilo bench pace [--shape qwen3-1.7b] [--optimizer adamw] [--versions 300] [--interval 1.0] [--json]

1. Encode, beforehand: a trainer replica makes `versions` versions of spar4 at 1.6% from the synthetic gradients
   (replica/synthetic.py), so the publisher takes none of the site's CPU while it runs. Its encode seconds per
   version (the encoder alone, then with the trainer's own apply and digest) are reported on their own.
2. Follow: the run's v0 checkpoint goes on a fresh log (the embedded file log by default, or --log), one `hilo
   consume` process bootstraps from it (apply only, the default snapshot cadence, its history on), and once it
   follows, one version is appended every `interval` seconds, on schedule.
3. From the site's history and the append times: how many versions the site was behind at each append (the newest
   on the log, counted, minus what the site had applied by then); freshness, applied time minus append time, p50,
   p99 and max; and each snapshot: the seconds the apply loop stood still to copy the state (its stall), the seconds
   the background writer took and the bytes it wrote. The loop's longest wait is also reported: the most any
   version waited beyond its own apply, after it was on the log and the version before it was applied. The site
   must end at the trainer's digest.
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

from hilo.log import open_log, updates_topic
from hilo.ops.bench.codecs import DEFAULT_LR
from hilo.ops.bench.report import results_dir, save
from hilo.schemas.metrics import Metrics
from hilo.producer.checkpoints import Checkpoints
from hilo.producer.update_builder import UpdateBuilder
from hilo.replay.history import read_history
from hilo.replica.codecs import Budget, make_encoder
from hilo.replica.replica import PolicyReplica
from hilo.replica.synthetic import QWEN3, GradientStream, initial_params, qwen3_manifest
from hilo.schemas import headers as H
from hilo.schemas.chunks import split
from hilo.schemas.errors import ConfigError
from hilo.schemas.keyring import Keyring
from hilo.schemas.options import opt

CHUNK_BYTES = 900_000  # the producer's default record size
RUN = "pace"


@dataclasses.dataclass(frozen=True)
class PaceConfig:
    """The run `hilo bench pace` publishes and the site that follows it; checked at construction. Each field's help is
    in its metadata (`hilo bench pace --help`, docs/cli.md)."""

    shape: str = opt("qwen3-1.7b", "adapter shape, LoRA r64 on all seven projections")
    optimizer: str = opt("adamw", "the run's optimizer (add: a delta-mode site)")
    versions: int = opt(300, "versions published, one per interval (the first is a warm-up and not counted)")
    interval_s: float = opt(1.0, "seconds between versions")
    log: str | None = opt(None, "the log (default: an embedded file log in a temporary folder)")
    ready_s: float = opt(300.0, "how long the site may take to start and bootstrap")

    def __post_init__(self):
        if self.shape not in QWEN3:
            raise ConfigError(f"PaceConfig.shape = {self.shape!r}: expected one of {sorted(QWEN3)}")
        if self.optimizer not in DEFAULT_LR and self.optimizer != "add":
            raise ConfigError(f"PaceConfig.optimizer = {self.optimizer!r}: expected one of "
                              f"{sorted(DEFAULT_LR) + ['add']}")
        if self.versions < 2:
            raise ConfigError(f"PaceConfig.versions = {self.versions}: must be >= 2 (the first is a warm-up)")
        if not self.interval_s > 0:
            raise ConfigError(f"PaceConfig.interval_s = {self.interval_s}: must be > 0")


def _say(*a):
    print(*a, file=sys.stderr, flush=True)


def encode_run(cfg: PaceConfig) -> tuple:
    """(v0 replica, [(version, framed bytes, digest)], encoder seconds per version, encode + apply seconds per
    version)."""
    manifest = qwen3_manifest(cfg.shape)
    trainer = PolicyReplica.genesis(RUN, manifest, initial_params(manifest), cfg.optimizer)
    v0 = PolicyReplica.from_checkpoint(trainer.checkpoint(), "v0")
    builder = UpdateBuilder(trainer, make_encoder("spar4", manifest, Budget(0.016)))
    stream, hparams = GradientStream(manifest,
                                     seed=0), {"lr": DEFAULT_LR[cfg.optimizer]} if cfg.optimizer in DEFAULT_LR else {}
    messages, encode, whole = [], [], []
    for v in range(1, cfg.versions + 1):
        proposal = builder.propose(stream.next(), hparams)
        builder.commit(proposal)
        messages.append((v, proposal.message.to_bytes(), proposal.message.digest))
        encode.append(proposal.timing["encode"])
        whole.append(proposal.timing["encode"] + proposal.timing["apply"])
        if v % 25 == 0 or v == cfg.versions:
            _say(f"bench pace: encoded {v}/{cfg.versions} (encode median {statistics.median(encode):.3f} s)")
    return v0, messages, encode, whole


class _Site:
    """One `hilo consume` process following the run, writing its history; its files live under `work`."""

    def __init__(self, work: pathlib.Path, url: str, until: int):
        self.history_path, self.log_path = work / "site.jsonl", work / "site.log"
        cmd = [sys.executable, "-m", "hilo.ops.cli", "consume", "--log", url, "--run", RUN, "--site", "pace",
               "--state-dir", str(work / "site"), "--no-export", "--until-version", str(until), "--history",
               str(self.history_path), "--no-progress"]
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)

    def history(self) -> list:
        """The site's history entries so far."""
        return read_history(str(self.history_path)) if self.history_path.exists() else []

    def failed(self) -> str:
        """The exit status and the last lines the site logged."""
        tail = self.log_path.read_text(errors="replace").strip().splitlines()[-3:]
        return f"the site exited with {self.proc.returncode}: {' | '.join(tail)}"

    def wait(self, done, what: str, timeout_s: float) -> None:
        """Poll until done() holds; the site exiting first, or the timeout, raises."""
        deadline = time.monotonic() + timeout_s
        while not done():
            if self.proc.poll() is not None and not done():
                raise RuntimeError(self.failed())
            if time.monotonic() > deadline:
                raise RuntimeError(f"the site was not {what} after {timeout_s:.0f} s")
            time.sleep(0.2)  # polling another process's file

    def stop(self) -> None:
        """Kill it if it still runs."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _pct(xs: list, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def follow(cfg: PaceConfig, v0: PolicyReplica, messages: list, work: pathlib.Path) -> tuple:
    """Append the checkpoint, start the site, append one message per interval; (append times {version: t}, history)."""
    url = cfg.log or f"file://{work}/log"
    log = open_log(url)
    site = None
    try:
        log.create_topics(RUN)
        Checkpoints.open(log, RUN, 1 << 30, 1, CHUNK_BYTES, Keyring(), Metrics("trainer", run=RUN)).publish(v0, 0, 0)
        site = _Site(work, url, cfg.versions)
        site.wait(lambda: bool(site.history()), "following", cfg.ready_s)
        _say(f"bench pace: the site follows; appending {cfg.versions} versions, one per {cfg.interval_s} s")
        topic, log_bytes, appended, t_next = updates_topic(RUN), 0, {}, time.monotonic()
        for v, data, digest in messages:
            time.sleep(max(0.0, t_next - time.monotonic()))  # the cadence under test, not synchronisation
            t_next += cfg.interval_s
            log_bytes += len(data)
            log.append(topic, split(data, RUN, "update", v, CHUNK_BYTES, H.update_headers(digest, log_bytes)))
            appended[v] = time.time()
            if v % 50 == 0:
                _say(f"bench pace: appended v{v}")
        site.wait(lambda: site.proc.poll() == 0, "done", 120 + cfg.versions * 2)
        return appended, site.history()
    finally:
        if site:
            site.stop()
        log.close()


def summarize(cfg: PaceConfig, appended: dict, history: list, digest: bytes) -> dict:
    """The row: versions behind, freshness, the snapshots' stall, write time and size, from the append times and
    history."""
    applied = {e["v"]: e for e in history if "v" in e and not e.get("start")}
    if max(applied, default=0) != cfg.versions or applied[cfg.versions]["d"] != digest.hex():
        raise RuntimeError(f"the site ended at v{max(applied, default=0)}, not at the trainer's v{cfg.versions} digest "
                           f"{digest.hex()[:12]}")
    counted = range(2, cfg.versions + 1)  # v1 is the warm-up
    fresh = [applied[v]["t"] - appended[v] for v in counted]
    # behind at each append: the versions on the log (v counted) minus those the site had applied at that instant
    done = sorted((e["t"], v) for v, e in applied.items())
    behind, i, have = [], 0, 0
    for v in counted:
        while i < len(done) and done[i][0] <= appended[v]:
            have = max(have, done[i][1])
            i += 1
        behind.append(v - have)
    waits = [applied[v]["t"] - max(appended[v], applied[v - 1]["t"]) - applied[v]["a"] for v in counted]
    taken = [e for e in history if "snapshot" in e]
    written = [e for e in history if "snapshot_written" in e]
    applies = [applied[v]["a"] for v in counted]
    return {"versions": cfg.versions, "interval_s": cfg.interval_s,
            "message_record_bytes": round(statistics.mean(e["b"] for e in applied.values())),
            "behind_max": max(behind), "behind_median": statistics.median(behind),
            "freshness_p50_s": round(_pct(fresh, 0.5), 4), "freshness_p99_s": round(_pct(fresh, 0.99), 4),
            "freshness_max_s": round(max(fresh), 4), "apply_median_s": round(statistics.median(applies), 4),
            "apply_max_s": round(max(applies), 4), "loop_wait_max_s": round(max(waits), 4),
            "snapshots": len(taken), "snapshot_stall_max_s": round(max((e["copy_s"] for e in taken), default=0.0), 4),
            "snapshot_stall_median_s": round(statistics.median(e["copy_s"] for e in taken), 4) if taken else None,
            "snapshot_stall_s": [e["copy_s"] for e in taken],
            "snapshot_write_median_s": round(statistics.median(e["write_s"] for e in written), 3) if written else None,
            "snapshot_bytes": written[-1]["bytes"] if written else None}


def run_bench(cfg: PaceConfig) -> dict:
    """Encode, follow, summarise, in a temporary work dir."""
    v0, messages, encode, whole = encode_run(cfg)
    work = pathlib.Path(tempfile.mkdtemp(prefix="hilo-pace-"))
    try:
        appended, history = follow(cfg, v0, messages, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    row = summarize(cfg, appended, history, messages[-1][2])
    res = {"shape": cfg.shape, "optimizer": cfg.optimizer, "codec": "spar4", "budget": "1.6%", "cores": os.cpu_count(),
           "log": "file" if cfg.log is None else cfg.log.split("://")[0],
           "encode_median_s": round(statistics.median(encode), 3), "encode_p90_s": round(_pct(encode, 0.9), 3),
           "encode_apply_median_s": round(statistics.median(whole), 3)} | row
    _say(f"bench pace: behind at most {row['behind_max']}, freshness p50 {row['freshness_p50_s']:.3f} s p99 "
         f"{row['freshness_p99_s']:.3f} s; snapshot stall at most {row['snapshot_stall_max_s']:.3f} s")
    return res


def table(res: dict) -> str:
    """The table of docs/benchmarks.md."""
    return "\n".join([
        f"| shape | optimizer | versions (1 per {res['interval_s']:g} s) | behind at most | freshness p50 / p99 / max "
        f"s | "
        "apply median / max s | "
        "snapshot stall max s | loop's longest wait s | snapshot write s | snapshot MB | encode median / p90 s |",
        "|---|---|---:|---:|---|---|---:|---:|---:|---:|---|",
        f"| {res['shape']} | {res['optimizer']} | {res['versions']} | {res['behind_max']} | "
        f"{res['freshness_p50_s']:.3f} / {res['freshness_p99_s']:.3f} / {res['freshness_max_s']:.3f} | "
        f"{res['apply_median_s']:.3f} / {res['apply_max_s']:.3f} | {res['snapshot_stall_max_s']:.3f} | "
        f"{res['loop_wait_max_s']:.3f} | {res['snapshot_write_median_s'] or 0:.2f} | "
        f"{(res['snapshot_bytes'] or 0) / 1e6:,.0f} | {res['encode_median_s']:.3f} / {res['encode_p90_s']:.3f} |"])


def main(cfg: PaceConfig, as_json: bool, out: str | None) -> int:
    """Run it; print the table or JSON."""
    out_dir = results_dir("pace", out)
    res = run_bench(cfg)
    if not save(res, out_dir, "pace", as_json):
        print(table(res))
    return 0
