"""`hilo lag`: one row per site of a run (reads group positions and the log head only)."""
from . import COMMANDS
from .args import report


def register(sub):
    """The lag report."""
    from hilo.ops.lag import format_rows, lag_rows
    report(sub, "lag", COMMANDS["lag"][1], lag_rows, format_rows)
