"""Scenarios more than one test module runs: whole multi-process stories, each asserting what must hold."""
import re
import signal
import time

from hilo.replay.history import check, log_versions, read_history
from tests.conftest import new_run
from tests.helpers import hilo, open_site, wait_for_line, with_log


def zombie(url, tmp_path):
    """Trainer A SIGSTOPped mid-run, trainer B started on the same run, then A SIGCONTed: A is fenced (its
    next write fails, it exits with one line), publishes nothing more; the live site never stops and every
    site ends at B's digest. (Before transactional publishing, A republished and every site stopped on a fork.)"""
    run, hist = new_run("zombie"), tmp_path / "history"
    common = ["--log", url, "--run", run, "--codec", "dense", "--checkpoint-every", "4"]
    a = hilo("produce", *common, "--steps", "500", "--history", str(hist / "trainer-a.jsonl"))
    live = hilo("consume", "--log", url, "--run", run, "--site", "live", "--state-dir", str(tmp_path / "live"),
                 "--no-progress", "--no-export", "--history", str(hist / "live.jsonl"))
    for line in a.stdout:
        if line.startswith("v6 "):
            break
    a.send_signal(signal.SIGSTOP)
    b = hilo("produce", *common, "--steps", "6", "--history", str(hist / "trainer-b.jsonl"))
    out, err = b.communicate(timeout=600)
    assert b.returncode == 0, err[-3000:]
    done = re.search(r"done: v(\d+) digest ([0-9a-f]{32})", out)
    final, digest = int(done.group(1)), done.group(2)
    t0 = time.monotonic()
    a.send_signal(signal.SIGCONT)
    _, a_err = a.communicate(timeout=300)
    fenced_after = time.monotonic() - t0
    errors = [line for line in a_err.splitlines() if "error:" in line]
    assert a.returncode == 1 and len(errors) == 1 and "was fenced" in errors[0] and "Traceback" not in a_err, a_err[
        -3000:]
    assert max(with_log(url, lambda log: log_versions(log, run))) == final  # A added nothing
    wait_for_line(live, rf"site live: v{final} ")
    assert live.poll() is None  # never stopped
    live.send_signal(signal.SIGTERM)
    live_out, _ = live.communicate(timeout=120)
    assert live.returncode == 0 and f"live: v{final} digest {digest}" in live_out
    late = open_site(url, run, tmp_path, "late", until_version=final, export_adapters=False,
                     history=str(hist / "late.jsonl"))
    late.run(progress=False)
    assert late.follower.replica.digest.hex() == digest
    check_histories(url, run, hist, ["trainer-a", "trainer-b"], ["live", "late"])
    print(f"zombie fenced {fenced_after:.1f}s after SIGCONT: {errors[0]}")


def check_histories(url, run, folder, trainers, sites):
    """The history check of replay/history.py over the files a fault test's processes wrote; prints its report."""
    trainer = [e for t in trainers for e in read_history(str(folder / f"{t}.jsonl"))]
    report = check(trainer, {s: read_history(str(folder / f"{s}.jsonl")) for s in sites},
                   with_log(url, lambda log: log_versions(log, run)))
    print("\n" + report.summary())
    assert report.ok, report.summary()
    return report
