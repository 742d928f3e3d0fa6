"""Every background thread is started by hilo.log.threads (supervised), so that none dies while its process goes on.

No product module builds a threading.Thread (or Timer) itself: the check reads every module with ast. And the
mechanism does what it says, in a real process: an error escaping a thread stops the process with one line, exit 70.
"""
import ast
import pathlib
import subprocess
import sys

import pytest

from hilo.log import threads

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("schemas", "replica", "log", "replay", "producer", "consumer", "ops")
ALLOWED = ROOT / "log" / "threads.py"


def threads_built(source: str, name: str = "<m>") -> list:
    """Lines that call Thread(...) or Timer(...) (as threading.X or a name imported from threading)."""
    out = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Call):
            f = node.func
            called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if called in ("Thread", "Timer"):
                out.append(node.lineno)
    return out


def test_no_module_starts_a_thread_of_its_own():
    found = [f"{p.relative_to(ROOT)}:{line}" for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))
             if p != ALLOWED
             for line in threads_built(p.read_text(), str(p))]
    assert not found, f"threads built outside hilo.log.threads (use threads.start): {', '.join(found)}"


@pytest.mark.parametrize("source,expected", [
    ("import threading\nthreading.Thread(target=f).start()", [2]),
    ("from threading import Timer\nt = Timer(1, f)", [2]),
    ("from hilo.log import threads\nthreads.start(f, 'x')", []),
])
def test_the_check_sees_a_thread_built_either_way(source, expected):
    assert threads_built(source) == expected


def test_an_error_escaping_a_thread_stops_the_process_with_one_line():
    script = ("import threading\nfrom hilo.log import threads\n"
              "threads.start(lambda: open('/nonexistent/x'), 'hilo-example')\n"
              "threading.Event().wait(120)\n")  # the main thread would go on: the thread's error must end it
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == threads.EXIT_CODE
    assert p.stderr.strip().splitlines() == [
        "thread hilo-example stopped on FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent/x'; the "
        "process stops (exit 70): nothing it acknowledged is lost, and a restart resumes from its snapshot and the "
        "log"], p.stderr
