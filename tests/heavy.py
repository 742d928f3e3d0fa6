"""Tests that keep every core busy never run side by side, whatever the pytest-xdist workers happen to pair up.

A test marked `heavy` (its own process pool, an RL run, a quality sweep, a fan-out, a multi-process trainer or demo)
holds a lock that every worker of the run shares while it runs: at most one heavy test runs at a time, light tests run
beside it. Two side by side on a 2-core machine (each with a pool of 2, beside vLLM and Kafka) took the load to 9-10
and one of them past 15 minutes; one at a time, each takes about what it takes alone. The wait for the lock is part of
the test's setup time in `--durations`.
"""
import fcntl
import os
import pathlib
import shutil
import tempfile

import pytest

ENV = "HILO_HEAVY_LOCK"


def pytest_configure(config):
    """The controller (or a run without workers) makes the run's lock file; workers, started after this, inherit its path."""
    config.addinivalue_line("markers", "heavy: keeps every core busy (tests/heavy.py): never runs beside another heavy test")
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
