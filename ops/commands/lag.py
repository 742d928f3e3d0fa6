"""`hilo lag`: one row per site of a run (reads group positions and the log head only); --watch refreshes it."""
import json
import signal
import sys
import threading
import time

from . import COMMANDS
from .args import existing_run, open_from, report

CLEAR = "\x1b[H\x1b[J"  # cursor home, clear screen: the table is redrawn in place on a terminal


def seconds(text: str) -> float:
    """argparse type: a refresh interval > 0."""
    v = float(text)
    if not v > 0:
        raise ValueError(text)
    return v


def watch(a, rows_of, format_rows, out=sys.stdout):
    """Print the table every --watch seconds until Ctrl-C: redrawn in place on a terminal, appended (with a time line)
    otherwise; with --json one JSON object a line ({"time", "sites"})."""
    log = open_from(a)
    existing_run(log, a.run)
    tty = out.isatty()
    # Ctrl-C sets a flag the loop checks, instead of raising wherever the process happens to be: a KeyboardInterrupt
    # that lands in a finalizer or a callback is printed and swallowed, and the loop then ran on forever
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT,
                             lambda *_: stop.set()) if threading.current_thread() is threading.main_thread() else None
    try:
        while not stop.is_set():
            rows, now = rows_of(log, a.run), time.time()
            if a.json:
                out.write(json.dumps({"time": round(now, 3), "sites": rows}) + "\n")
            else:
                stamp = time.strftime("%H:%M:%S", time.localtime(now))
                out.write((CLEAR if tty else "") + f"{a.run} at {stamp} (every {a.watch:g}s, Ctrl-C to stop)\n"
                          + format_rows(rows) + "\n" + ("" if tty else "\n"))
            out.flush()
            stop.wait(a.watch)
    except KeyboardInterrupt:  # where no handler could be set (not the main thread)
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    return 0


def register(sub):
    """The lag report."""
    from hilo.ops.lag import format_rows, lag_rows
    p = report(sub, "lag", COMMANDS["lag"][1], lag_rows, format_rows)
    p.add_argument("--watch", type=seconds, nargs="?", const=2.0, metavar="SECONDS",
                   help="refresh every SECONDS (default 2) until Ctrl-C; with --json, one JSON object a line")
    p.add_argument("--mirror", action="append", default=[], metavar="URL",
                   help="a mirror of the run in another region (repeatable): shows each mirror's replication lag "
                        "(versions, and seconds since the first version it lacks was written) and the sites of every "
                        "cluster with their lag behind --log's head")
    once = p.get_default("fn")
    p.set_defaults(fn=lambda a: regions(a) if a.mirror else watch(a, lag_rows, format_rows) if a.watch else once(a))


def regions(a, out=sys.stdout) -> int:
    """`hilo lag --mirror URL ...`: the mirrors, then every cluster's sites against the source's head."""
    from hilo.log import open_log
    from hilo.ops.lag import format_regions, mirror_rows, region_site_rows
    source = open_from(a)
    existing_run(source, a.run)
    mirrors = {url: open_log(url, kafka_config=a.kafka_config) for url in a.mirror}
    m, sites = mirror_rows(source, mirrors, a.run), region_site_rows(source, mirrors, a.run)
    out.write((json.dumps({"mirrors": m, "sites": sites}, indent=2) if a.json else format_regions(m, sites)) + "\n")
    return 0
