"""The suite cleans up after itself: a test that leaves a thread, a child process or an open Kafka client behind
fails (an error at its teardown) naming each one and where it was started.

Why: kafka-python runs an I/O thread per client; a CI run where tests never closed theirs held 99 idle I/O threads
and took 5,389 s instead of ~2,300 (context switches 25-54k/s on 2 cores).

What is compared, per test, is the state after the fixtures of wider scope were set up (a module's shared broker
and its clients are not the test's) with the state once the test's own fixtures are torn down:
- threads (threading.enumerate()): a new one still alive is given until the deadline to finish (a bounded join,
  for threads that are already stopping: a closed client's I/O thread, a site's committer);
- child processes (psutil, or /proc without it): a new one still running after the deadline (zombies are dead);
- kafka-python clients (KafkaProducer, KafkaConsumer, KafkaAdminClient, tracked by weak reference from their
  __init__): one not closed.
Each module is checked the same way once its module-scoped fixtures are torn down (a fixture that starts something
must stop it). What a failing test leaves is stopped by the check (processes killed, clients closed), so the
tests after it run on a quiet machine; a test that failed on its own is not reported again for its leftovers.
HILO_LEAK_GRACE_S: the deadline, seconds (default 10).
HILO_LEAK_CHECK: "strict" (the default) fails the test; "report" prints one warning per test naming each leftover
instead, and stops them all the same, so no run pays for them.
"""
import dataclasses
import functools
import os
import pathlib
import re
import sys
import threading
import time
import traceback
import weakref

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
GRACE_S = float(os.environ.get("HILO_LEAK_GRACE_S", "10"))
STRICT = os.environ.get("HILO_LEAK_CHECK", "strict") == "strict"
# Threads a library starts once per process and keeps for good, not a test's to stop: tqdm's monitor.
PROCESS_WIDE = re.compile(r"^(tqdm_monitor)$")  # tqdm._monitor.TMonitor names its thread so
# Processes the same way: multiprocessing's resource tracker (and forkserver), started by the first spawn-context pool
# of the process and kept until it exits.
PROCESS_WIDE_CMD = re.compile(r"from multiprocessing\.(resource_tracker|forkserver) import main")

_clients = weakref.WeakSet()  # every kafka-python client made in this process (closed ones included)


def _origin(skip: int = 2) -> str:
    """Where the caller's caller was called from: the innermost frames in this repository (tests and hilo)."""
    frames = traceback.extract_stack(sys._getframe(skip))
    here = [f for f in frames if f.filename.startswith(str(ROOT)) and f.filename != __file__]
    picked = (here or frames)[-3:]
    tests = [f for f in here if f.filename.startswith(str(ROOT / "tests")) and f not in picked]
    picked = tests[-1:] + picked  # and the test line that led there
    return " <- ".join(
        f"{pathlib.Path(f.filename).relative_to(ROOT) if f.filename.startswith(str(ROOT)) else f.filename}:"
        f"{f.lineno} ({f.name})" for f in reversed(picked))


def _install() -> None:
    """Record where each thread is started and where each Kafka client is made (once per process)."""
    if getattr(threading.Thread.start, "_hilo_tracked", False):
        return
    start = threading.Thread.start

    @functools.wraps(start)
    def tracked_start(self, *a, **kw):
        self._hilo_origin = _origin()
        return start(self, *a, **kw)
    tracked_start._hilo_tracked = True
    threading.Thread.start = tracked_start
    try:
        from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    except ImportError:
        return
    for cls in (KafkaProducer, KafkaConsumer, KafkaAdminClient):
        init = cls.__init__

        def tracked_init(self, *a, _init=init, **kw):
            _init(self, *a, **kw)
            self._hilo_origin = _origin()
            _clients.add(self)
        functools.update_wrapper(tracked_init, init)
        cls.__init__ = tracked_init


def _open_clients() -> list:
    return [c for c in list(_clients) if not getattr(c, "_closed", True)]


def _children() -> dict:
    """{pid: process} of this process's running descendants."""
    try:
        import psutil
    except ImportError:
        return _proc_children()
    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out[p.pid] = p
        except psutil.NoSuchProcess:
            pass
    return out


def _proc_children() -> dict:
    """{pid: None} of running descendants, from /proc (without psutil)."""
    parents = {}
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] != "Z":
                parents[int(d.name)] = int(fields[1])
    mine, frontier = {}, {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier and pid not in mine}
        mine.update(dict.fromkeys(frontier))
    return mine


def _cmdline(pid) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _describe_process(pid) -> str:
    return f"process {pid}: {_cmdline(pid)[:300]}"


def _alive(pid) -> bool:
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:][0] != "Z"


@dataclasses.dataclass
class State:
    """What ran and what was open at one moment."""

    threads: set
    clients: weakref.WeakSet
    processes: set

    @classmethod
    def now(cls):
        return cls(set(threading.enumerate()), weakref.WeakSet(_open_clients()), set(_children()))


def leftovers(before: State, grace_s: float = GRACE_S) -> list:
    """What was started since `before` and is still there once `grace_s` has passed (threads joined, processes
    awaited until then): one line each, naming it and where it was started. Stops what it reports."""
    deadline = time.monotonic() + grace_s
    threads = [t for t in threading.enumerate() if t not in before.threads and not PROCESS_WIDE.match(t.name)]
    for t in threads:
        if t is not threading.current_thread():
            t.join(max(0.0, deadline - time.monotonic()))
    clients = [c for c in _open_clients() if c not in before.clients]
    processes = [pid for pid in _children() if pid not in before.processes
                 and not PROCESS_WIDE_CMD.search(_cmdline(pid))]
    while processes and time.monotonic() < deadline:
        processes = [pid for pid in processes if _alive(pid)]
        if processes:
            time.sleep(0.05)  # polling other processes' exit, up to the deadline
    lines = []
    made_by_clients = {getattr(c, "_hilo_origin", None) for c in clients}
    for t in threads:
        # a leaked client's I/O thread: said once
        if t.is_alive() and getattr(t, "_hilo_origin", "?") not in made_by_clients:
            lines.append(f"thread {t.name!r} (daemon={t.daemon}) started at {getattr(t, '_hilo_origin', '?')}")
    for c in clients:
        lines.append(f"{type(c).__name__} client_id={c.config.get('client_id')!r} (not closed) made at "
                     f"{getattr(c, '_hilo_origin', '?')}")
    for pid in processes:
        if _alive(pid):
            lines.append(f"{_describe_process(pid)}")
    _stop(clients, [pid for pid in processes if _alive(pid)])
    return lines


def _stop(clients, pids) -> None:
    """Stop what a test left (so the tests after it do not pay for it): kill processes, close clients (bounded)."""
    import signal
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 5  # dead once a zombie: its Popen (or its parent) reaps it and keeps its status
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the killed processes' exit
    for c in clients:
        def close(c=c):
            try:
                c.close(timeout=0) if type(c).__name__ == "KafkaProducer" else c.close()
            except Exception:  # noqa: BLE001  (closing a leaked client, best effort)
                pass
        t = threading.Thread(target=close, daemon=True, name="leakcheck-close")
        t.start()
        t.join(5)


def _report(what: str, lines: list) -> None:
    if lines:
        said = (f"{what} left {len(lines)} thing(s) behind (close clients, join threads, reap processes: "
                f"see tests/leakcheck.py):\n  " + "\n  ".join(lines))
        if STRICT:
            pytest.fail(said, pytrace=False)
        import warnings
        warnings.warn(said, ResourceWarning, stacklevel=2)


_test_logs = []  # logs that test code opened itself with open_log (not the product's own): closed for it at teardown


def _track_test_logs() -> None:
    """A log a test opens for its own reads and appends (`open_log(url).read(...)`) is closed for it when the test
    ends, before the check; what the product opens (a Site's, a trainer's, a read-ahead's) is not, so the check
    still catches a product that forgets its clients. Works because test modules import `open_log` after this runs."""
    import hilo.log
    if getattr(hilo.log.open_log, "_hilo_tracked", False):
        return
    original = hilo.log.open_log

    @functools.wraps(original)
    def open_log(*a, **kw):
        log = original(*a, **kw)
        if sys._getframe(1).f_code.co_filename.startswith(str(ROOT / "tests")):
            _test_logs.append(log)
        return log
    open_log._hilo_tracked = True
    hilo.log.open_log = open_log


def _close_test_logs(since: int) -> None:
    """Close the logs test code opened after `since` (index into _test_logs); closing one twice is harmless."""
    while len(_test_logs) > since:
        log = _test_logs.pop()
        try:
            log.close()
        except Exception:  # noqa: BLE001  (a log the test broke on purpose, or closed already)
            pass


_install()
_track_test_logs()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item._hilo_call_failed = rep.failed


@pytest.fixture(scope="module", autouse=True)
def _module_cleans_up(request):
    """A module's fixtures (a shared broker, its clients) stop what they started when the module is done."""
    before, opened = State.now(), len(_test_logs)
    yield
    _close_test_logs(opened)
    _report(f"module {request.module.__name__} (its module-scoped fixtures)", leftovers(before))


@pytest.fixture(autouse=True)
def _test_cleans_up(request):
    """A test (and its function-scoped fixtures) stop what they started."""
    before, opened = State.now(), len(_test_logs)
    yield
    _close_test_logs(opened)
    lines = leftovers(before)
    if not getattr(request.node, "_hilo_call_failed", False):
        _report(request.node.nodeid, lines)
