"""Subprocess side of test_memory_bounds: follow a file log; print the first refusal (a skip, or an error that stops
the follower) and the peak RSS growth.

    python _bound_worker.py LOG_DIR RUN    ->  {"error": "...", "grew_mib": N}
"""
import json
import resource
import sys

from hilo.log import open_log
from hilo.replay.bad_records import Skipped
from hilo.replay.follower import Follower, bootstrap_from_log
from hilo.schemas.errors import HiloError


def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


log = open_log(f"file://{sys.argv[1]}")
run = sys.argv[2]
replica, pos = bootstrap_from_log(log, run)
base = rss_mib()
error = None
try:
    for event in Follower(log, run, replica, pos).catch_up():
        if isinstance(event, Skipped) and error is None:
            error = event.detail
except HiloError as e:
    error = str(e)
print(json.dumps({"error": error, "grew_mib": rss_mib() - base}))
