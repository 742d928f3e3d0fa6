"""Tests that keep every core busy never run side by side, whatever the pytest-xdist workers happen to pair up.

A test marked `heavy` keeps both cores busy by itself (a quality sweep's pool of 2 processes, the demo's 4, the wheel
installed and its kernels compiled afresh). Two side by side on a 2-core machine, beside vLLM and Kafka, took the load
to 9-10 and one of them past 15 minutes; one at a time, each takes about what it takes alone.
- Heavy tests also name the xdist group "heavy": one worker runs them one after another, so no other worker waits.
- Whatever a heavy test's group, it holds a lock every worker of the run shares while it runs (setup, call, teardown):
  two heavy tests never overlap even where the groups would let them. A worker that waits for it waits idle (the wait
  is the test's setup time in `--durations`), which is why the group comes first: tried with the lock alone on RL runs,
  2-rank jobs and the sweeps, workers queued behind each other: 62% of the suite in 50 minutes (47 in all with the
  group).
Tests that use one core or less (an RL run waiting on vLLM, a 2-rank job of one thread each) are not heavy.
"""
import fcntl
import os
import pathlib
import shutil
import tempfile

import pytest

ENV = "HILO_HEAVY_LOCK"


def pytest_configure(config):
    """The controller (or a run without workers) makes the run's lock file; workers, started after this, inherit its
    path."""
    config.addinivalue_line("markers",
                            "heavy: keeps every core busy (tests/heavy.py): never runs beside another heavy test")
    if not hasattr(config, "workerinput"):
        folder = tempfile.mkdtemp(prefix="hilo-heavy-")
        config._hilo_heavy_dir = folder
        os.environ[ENV] = str(pathlib.Path(folder) / "heavy.lock")


def pytest_unconfigure(config):
    folder = getattr(config, "_hilo_heavy_dir", None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop(ENV, None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A heavy test's setup, call and teardown run under the run's lock."""
    if item.get_closest_marker("heavy") is None:
        yield
        return
    with open(os.environ[ENV], "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, even if the worker dies
        yield
