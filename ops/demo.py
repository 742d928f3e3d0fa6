"""`hilo demo`: a trainer, three rollout sites, one of them killed and restarted, all ending bit-identical.

    hilo demo                       # embedded file log in a temp folder, no broker
    hilo demo --log kafka://127.0.0.1:9092 --json

The trainer (this process) trains the built-in tiny Qwen3+LoRA model with spar4 + adamw and publishes
every step. Three `hilo consume` processes follow the log; site-2 is SIGKILLed mid-run and restarted
from its state dir. Exit 0 only if every site's final digest equals the trainer's.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from hilo.ops.lag import format_rows, lag_rows
from hilo.log import open_log
from hilo.producer.config import ProducerConfig
from hilo.producer.producer import HiLoProducer
from hilo.ops.tiny_trainer import build_model, train
from hilo.replica.codecs import Budget

SITES = ("site-1", "site-2", "site-3")


def _consume(url, run, site, state_dir, until, log_file):
    cmd = [sys.executable, "-m", "hilo.ops.cli", "consume", "--log", url, "--run", run, "--site", site,
           "--state-dir", state_dir, "--until-version", str(until), "--snapshot-every", "5", "--no-progress"]
    return subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))


def _wait_applied(url, run, site, version, timeout_s=300):
    """Block until `site` has committed at least `version` (or the timeout); returns its applied version."""
    log, deadline, seen = open_log(url), time.monotonic() + timeout_s, -1
    while time.monotonic() < deadline:
        rows = [r for r in lag_rows(log, run) if r["site"] == site]
        seen = rows[0]["applied_version"] if rows else -1
        if seen >= version:
            break
        time.sleep(0.1)  # polling another process's progress
    log.close()
    return seen


def run_demo(log_url: str | None, steps: int, as_json: bool, out=sys.stdout) -> int:
    """Run the demo; returns the process exit code."""
    work = tempfile.mkdtemp(prefix="hilo-demo-")
    url = log_url or f"file://{work}/log"
    run = f"demo-{int(time.time())}-{os.getpid()}"
    say = (lambda *a: print(*a, file=sys.stderr)) if as_json else (lambda *a: print(*a, file=out, flush=True))
    say(f"hilo demo: run {run}, log {url}, work dir {work}")
    cfg = ProducerConfig(run=run, log=url, codec="spar4", budget=Budget(0.016), optimizer="adamw", checkpoint_every=10)
    producer = HiLoProducer.open(build_model(seed=0), cfg)
    adapter = producer.manifest.adapter_bytes()
    say(f"trainer: tiny Qwen3 + LoRA r={producer.manifest.rank}, {producer.manifest.numel:,} LoRA params "
        f"({adapter:,} B in bf16), codec spar4 at 1.6%, optimizer adamw, {steps} steps")
    logs = {s: open(f"{work}/{s}.log", "ab") for s in SITES}
    procs = {s: _consume(url, run, s, f"{work}/{s}", steps, logs[s]) for s in SITES}
    kill_at, restart_at = steps // 3, (2 * steps) // 3
    sizes, events = [], []

    def on_step(version, loss, compute_s, info):
        sizes.append(info["bytes"])
        if version % 10 == 0 or version == 1:
            say(f"  v{version:3d}  loss {loss:.3f}  message {info['bytes']:,} B ({100 * info['bytes'] / adapter:.2f}% "
                f"of adapter)")
        if version == kill_at:
            applied = _wait_applied(url, run, "site-2", 1)  # kill it while it follows, not while it imports torch
            procs["site-2"].send_signal(signal.SIGKILL)
            procs["site-2"].wait()
            events.append(f"v{version}: SIGKILLed site-2 (it had applied v{applied})")
            say(f"  -- SIGKILL site-2 at trainer v{version} (site-2 had applied v{applied})")
        if version == restart_at:
            procs["site-2"] = _consume(url, run, "site-2", f"{work}/site-2", steps, logs["site-2"])
            events.append(f"v{version}: restarted site-2 from its state dir")
            say(f"  -- restarted site-2 at trainer v{version}")

    loss = train(producer, steps, lr=3e-3, on_step=on_step)
    codes = {}
    for s, p in procs.items():
        try:
            codes[s] = p.wait(timeout=600)
        except subprocess.TimeoutExpired:
            p.kill()
            codes[s] = "timeout"
    log = open_log(url)
    rows = {r["site"]: r for r in lag_rows(log, run)}
    trainer_digest = producer.replica.digest.hex()
    sites = [{"site": s, "version": rows.get(s, {}).get("applied_version"), "digest": rows.get(s, {}).get("digest"),
              "exit_code": codes[s]} for s in SITES]
    ok = all(x["digest"] == trainer_digest and x["version"] == steps and x["exit_code"] == 0 for x in sites)
    summary = {"run": run, "log": url, "versions": producer.version, "final_loss": round(loss, 4),
               "trainer_digest": trainer_digest,
               "sites": sites, "bytes_per_step": round(sum(sizes) / len(sizes)), "adapter_bytes": adapter,
               "fraction_of_adapter": sum(sizes) / len(sizes) / adapter, "events": events, "ok": ok, "work_dir": work}
    if as_json:
        print(json.dumps(summary, indent=2), file=out)
    else:
        say(f"\nversions published: {producer.version}; bytes per step: {summary['bytes_per_step']:,} "
            f"vs adapter {adapter:,} ({100 * summary['fraction_of_adapter']:.2f}%)")
        say(f"trainer digest: {trainer_digest}")
        for x in sites:
            mark = "OK " if x["digest"] == trainer_digest else "MISMATCH"
            say(f"  {mark} {x['site']}: v{x['version']} {x['digest']} (exit {x['exit_code']})")
        say("\n" + format_rows(list(rows.values())))
        say("\nall sites match the trainer" if ok
            else "\nFAILED: a site does not match the trainer (see logs in the work dir)")
    producer.close()
    return 0 if ok else 1
