"""Helpers the tests share: waiting on another thread or process, starting `hilo` processes, opening a site."""
import collections
import contextlib
import os
import pathlib
import re
import selectors
import subprocess
import sys
import time


def wait_until(cond, timeout_s: float, what: str, every_s: float = 0.05, max_every_s: float = 0.5):
    """Poll `cond` (another thread's or process's progress) until it is true; AssertionError naming `what` after
    `timeout_s`. Waiting on the condition itself, never a fixed sleep; `timeout_s` comes from the configured
    timeouts of what is awaited, so a slow machine only waits longer. The interval grows from `every_s` to
    `max_every_s`: a short wait ends at once, and a long one does not spend the CPU its processes need on polls
    (a scrape of a site's /metrics, a fresh Kafka client) every 50 ms."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"not reached within {timeout_s:.0f}s: {what}"
        time.sleep(every_s)
        every_s = min(max_every_s, every_s * 1.5)


PIPED = {"stderr": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}


def hilo(*args, **kw) -> subprocess.Popen:
    """`hilo ARGS` as a separate process, stdout and stderr piped as text (unless `kw` says otherwise)."""
    return subprocess.Popen([sys.executable, "-m", "hilo.ops.cli", *args], **(PIPED | kw))


def lying_site(lie: str, *args, **kw) -> subprocess.Popen:
    """`hilo consume ARGS` telling the lie `lie` (ops/faults/lies.py) as a separate process, piped as `hilo`'s."""
    return subprocess.Popen([sys.executable, "-m", "hilo.ops.faults.lying_site", lie, *args], **(PIPED | kw))


def held(proc) -> bool:
    """Whether `proc` is stopped (SIGSTOP: it reached its HILO_PAUSE_AT point, schemas/crash_points.py)."""
    stat = pathlib.Path(f"/proc/{proc.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def wait_for_line(proc, pattern, timeout_s=120):
    """Read the process's stderr until a line matches (the process is then known to be past that point).

    Waits on the pipe with a deadline (a process that goes silent fails the test after `timeout_s`, it does not
    hang it); lines read past the match are kept on `proc` for the next call."""
    deadline = time.monotonic() + timeout_s
    seen = collections.deque(maxlen=20)  # the last lines read, so a failure shows where the process was
    fd = proc.stderr.fileno()
    buf = getattr(proc, "_unread_stderr", b"")
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            *lines, buf = buf.split(b"\n")
            for i, raw in enumerate(lines):
                line = raw.decode(errors="replace")
                if re.search(pattern, line):
                    proc._unread_stderr = b"\n".join(lines[i + 1:] + [buf])
                    return line + "\n"
                seen.append(line)
            left = deadline - time.monotonic()
            chunk = os.read(fd, 1 << 16) if left > 0 and sel.select(left) else None
            if not chunk:  # deadline passed (None) or end of stream (b"")
                break
            buf += chunk
    proc._unread_stderr = buf
    why = "the process closed stderr" if chunk == b"" else f"not within {timeout_s:.0f}s"
    last = "\n  ".join(seen) or "(nothing)"
    raise AssertionError(f"process never printed {pattern!r} ({why}; exit {proc.poll()}); its last lines:\n  {last}")


def open_site(url, run, tmp_path, name="s", **kw):
    """A Site of `run` with its state under tmp_path/NAME; waits at most 5 s for the first checkpoint by default."""
    from hilo.consumer.config import SiteConfig
    kw.setdefault("wait_checkpoint_s", 5)
    return site_of(SiteConfig(log=url, run=run, site=name, state_dir=str(tmp_path / name), **kw))


def site_of(cfg, **kw):
    """Site.open(cfg, **kw): the site closes the log it opened with itself (site.close(), which run() ends with), and a
    refused open closes what it started."""
    from hilo.consumer.site import Site
    return Site.open(cfg, **kw)


@contextlib.contextmanager
def opened(url, **kw):
    """open_log(url, **kw) for the block, closed after it."""
    from hilo.log import open_log
    log = open_log(url, **kw)
    try:
        yield log
    finally:
        log.close()


def with_log(url, fn, **kw):
    """fn(log) on a log opened for the call and closed after it (a one-off read or append)."""
    with opened(url, **kw) as log:
        return fn(log)


@contextlib.contextmanager
def reaped(*groups):
    """Kill every process in `groups` (processes, or dicts of them, read when the block ends) still running then: a
    failed test leaves nothing running to slow the tests after it."""
    try:
        yield
    finally:
        for g in groups:
            for p in (g.values() if isinstance(g, dict) else [g]):
                if p.poll() is None:
                    p.kill()
                    p.wait()
