"""`hilo bench faults`: SIGKILL trainers and sites at every named crash point, then check every history.

    hilo bench faults [--kills 200] [--trainer-kills 20] [--log kafka://127.0.0.1:9092] [--json]

1. Trainer kills: `hilo produce --pipeline` processes on one run, each armed (HILO_CRASH_AT) to SIGKILL itself at
   a trainer point (mid-encode, mid-transaction on the publish thread, after the commit before write-back, a
   version applied ahead of its commit, the next step about to wait for it), cycling through them; the next one
   resumes from the log. The last one runs to its end.
2. Site kills: a trainer in this process publishes while one site process after another is started on
   the same state dir and killed: at a named site point (mid-fetch, mid-apply, between the snapshot's
   renames, mid-export, mid-commit, ...) reached a random 1-3 times, or (one kill in four) at a random
   instant. Each restart resumes from the site's snapshot.
3. A last site runs to the head; the history check (replay/history.py) compares every site and trainer
   session with the trainer's acknowledged versions and with the log read afresh.
Reports kills per point, anomalies (gaps, duplicates, forks, lost acknowledged versions) and the final
digests; exit 1 on any anomaly. Results: JSON in --out (default ~/.cache/hilo-sync/bench/faults-TIME).
"""
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid

import torch
from tqdm import tqdm

from hilo.consumer.config import SiteConfig
from hilo.consumer.site import Site
from hilo.log import open_log, threads
from hilo.schemas.crash_points import SITE_POINTS, TRAINER_POINTS
from hilo.ops.bench.report import results_dir, save
from hilo.ops.tiny_trainer import build_model
from hilo.producer.config import ProducerConfig
from hilo.producer.producer import HiLoProducer
from hilo.replay.history import check, log_versions, read_history
from hilo.replica.codecs import Budget


def _cli(args, env_extra=None, **kw):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.Popen([sys.executable, "-m", "hilo.ops.cli", "--log-level", "WARNING", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _trainer_kills(url, run, n, folder, rng, bar):
    """n trainer processes killed at trainer points, then one that finishes; per point counts."""
    common = ["produce", "--log", url, "--run", run, "--codec", "spar", "--budget", "25%", "--checkpoint-every", "5",
              # pipelined: its points are the in-line ones and more
              "--history", str(folder / "trainer.jsonl"), "--pipeline"]
    counts = {p: 0 for p in TRAINER_POINTS}
    for i in range(n):
        point = TRAINER_POINTS[i % len(TRAINER_POINTS)]
        p = _cli(common + ["--steps", "50"], {"HILO_CRASH_AT": f"{point}:{rng.randint(1, 4)}"})
        out, err = p.communicate(timeout=600)
        if p.returncode != -signal.SIGKILL:
            raise RuntimeError(f"trainer armed at {point} exited {p.returncode}, not killed: {err[-2000:]}")
        counts[point] += 1
        bar.update(1)
    p = _cli(common + ["--steps", "3"])
    out, err = p.communicate(timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"the trainer after {n} kills failed: {err[-2000:]}")
    return counts


def _site_kills(url, run, n, folder, rng, producer, bar):
    """n site processes killed (named points, and one in four at a random instant) while `producer` publishes."""
    stop, errors = threading.Event(), []

    def publish():
        gen = torch.Generator().manual_seed(7)
        while not stop.is_set():
            try:
                for p in producer.params:
                    p.grad = torch.randn(p.shape, generator=gen) * 0.01
                producer.step(lr=1e-3)
            except Exception as e:  # noqa: BLE001  (reported by the benchmark)
                errors.append(e)
                return
            # paces the trainer (~4 versions/s) so a site follows live, a batch a version; not synchronisation
            time.sleep(0.2)

    trainer = threads.start(publish, "bench-trainer")
    counts, state, launched, named, misses = {p: 0
                                              for p in SITE_POINTS} | {"random": 0}, str(folder / "victim"), 0, 0, 0
    common = ["consume", "--log", url, "--run", run, "--site", "victim", "--state-dir", state, "--snapshot-every", "2",
              "--keep-adapters", "2", "--no-progress", "--history", str(folder / "victim.jsonl")]
    try:
        while sum(counts.values()) < n:
            if errors:
                raise errors[0]
            launched += 1
            # Far enough ahead that a site, after catching up in one batch, follows live for a while (batch points
            # such as mid-fetch are then reached 1-3 times); a kill usually ends it much earlier.
            until = ["--until-version", str(producer.version + 60)]
            if launched % 4 == 0:
                p = _cli(common + until)
                time.sleep(rng.uniform(2.0, 6.0))  # a kill at a random instant (import, bootstrap, apply, ...)
                p.send_signal(signal.SIGKILL)
                p.communicate(timeout=120)
                counts["random"] += p.returncode == -signal.SIGKILL
            else:
                point = SITE_POINTS[named % len(SITE_POINTS)]  # each point in turn, tried until it is hit
                p = _cli(common + until, {"HILO_CRASH_AT": f"{point}:{rng.randint(1, 3)}"})
                _, err = p.communicate(timeout=600)
                if p.returncode == -signal.SIGKILL:
                    counts[point] += 1
                    named, misses = named + 1, 0
                elif p.returncode != 0:
                    raise RuntimeError(f"site armed at {point} failed with exit {p.returncode}: {err[-2000:]}")
                elif (misses := misses + 1) >= 5:
                    raise RuntimeError(f"site point {point} was not reached in 5 runs")
            bar.n = sum(counts.values())
            bar.refresh()
    finally:
        stop.set()
        trainer.join(timeout=120)
    return counts, launched


def main(as_json: bool, url: str, kills: int, trainer_kills: int, out: str | None, seed: int = 0) -> int:
    """Run the benchmark; exit 0 only with no anomaly."""
    folder, rng = results_dir("faults", out), random.Random(seed)
    run = f"faults-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    with tqdm(total=trainer_kills, desc="trainer kills", file=sys.stderr) as bar:
        trainer_counts = _trainer_kills(url, run, trainer_kills, folder, rng, bar)
    t_trainer = time.monotonic() - t0
    # No checkpoints while sites are killed: a restarted site replays from its snapshot (or the last trainer-phase
    # checkpoint) instead of jumping to a fresh checkpoint past its --until-version, so every site point is reached.
    cfg = ProducerConfig(run=run, log=url, codec="spar", budget=Budget(0.25), checkpoint_every=10 ** 6,
                         history=str(folder / "trainer.jsonl"))
    producer = HiLoProducer.open(build_model(seed=0), cfg)
    with tqdm(total=kills, desc="site kills", file=sys.stderr) as bar:
        site_counts, launched = _site_kills(url, run, kills, folder, rng, producer, bar)
    t_sites = time.monotonic() - t0 - t_trainer
    log = open_log(url)  # the last sites' (Site.open leaves a log it opens itself open) and the history check's
    try:
        def follow(name):
            site = Site.open(SiteConfig(log=url, run=run, site=name, state_dir=str(folder / name),
                                        until_version=producer.version,
                                        export_adapters=False, history=str(folder / f"{name}.jsonl")), log_backend=log)
            site.run(progress=False)
            return site
        final = follow("victim")
        late = follow("late")
        report = check(read_history(str(folder / "trainer.jsonl")),
                       {s: read_history(str(folder / f"{s}.jsonl")) for s in ("victim", "late")},
                       log_versions(log, run))
    finally:
        log.close()
    digests = {"trainer": producer.replica.digest.hex(), "victim": final.follower.replica.digest.hex(),
               "late": late.follower.replica.digest.hex()}
    divergent = sum(d != digests["trainer"] for d in digests.values())
    producer.close()
    res = {"run": run, "log": url, "versions": producer.version, "trainer_kills": trainer_counts,
           "site_kills": site_counts, "site_processes": launched, "anomalies": report.anomalies,
           "divergent_digests": divergent,
           "digests": digests, "sites": report.sites, "trainer_s": round(t_trainer, 1), "sites_s": round(t_sites, 1)}
    if not save(res, folder, "faults", as_json):
        print(f"{sum(trainer_counts.values())} trainer kills {trainer_counts}\n{sum(site_counts.values())} site kills "
              f"{site_counts}\n{report.summary()}\ndivergent digests: {divergent}")
    return 0 if report.ok and divergent == 0 else 1
