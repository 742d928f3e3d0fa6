"""Every background thread hilo-sync starts is started here, so that none dies while its process goes on.

    threads.start(target, "hilo-commit-eu-1", arg)   # a daemon thread; an error escaping `target` stops the process

A thread's loop handles the errors it expects: as an outage, reported once per streak and retried with backoff
(consumer/group_commit.py), or handed to the thread that waits on it (log/prefetch.py, the snapshot writer, the
transaction deadline). Anything else escaping it is a fault the process cannot go on from: a thread that died alone
would leave its process running with a part missing (a commit that never lands again, a `hilo lag` that lies). So
the process says so in one line (which thread, what error) and exits with EXIT_CODE: what it acknowledged is on
its disk or on the log already, and a restart resumes from there. tests/test_threads.py checks that no other module
starts a thread of its own.
"""
import logging
import os
import sys
import threading

logger = logging.getLogger(__name__)
EXIT_CODE = 70  # EX_SOFTWARE: a supervisor restarts the process; the line before it says why


def start(target, name: str, *args) -> threading.Thread:
    """Start `target(*args)` on a daemon thread named `name`, supervised: an exception escaping it stops the process."""
    t = threading.Thread(target=_supervised, args=(target, name, args), name=name, daemon=True)
    t.start()
    return t


def _supervised(target, name: str, args: tuple) -> None:
    try:
        target(*args)
    except BaseException as e:  # noqa: BLE001  (every escape is fatal: that is the point)
        if sys.is_finalizing():  # the interpreter is tearing down under a daemon thread: nothing is left to stop
            return
        stop_process(name, e)


def stop_process(name: str, error: BaseException) -> None:
    """One line naming thread `name` and `error`, then exit EXIT_CODE at once (other threads cannot outlive it)."""
    logger.critical("thread %s stopped on %s: %s; the process stops (exit %d): nothing it acknowledged is lost, and a "
                    "restart resumes from its snapshot and the log", name, type(error).__name__, error, EXIT_CODE)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(EXIT_CODE)
