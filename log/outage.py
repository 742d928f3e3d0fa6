"""Waiting out a log that was reached before and does not answer now (a broker restart, a rolling upgrade, a partition).

    outage = Outage("site eu-1", metrics)
    try: work()
    except LogUnavailable as e: outage.wait(e, stopping=lambda: flag)   # says it once, then every minute; backs off
    else: outage.over()                                                  # says it is back, and after how long

A process that waits one out says so once when the log goes, again every REMIND_S while it stays gone, and once
when it is back with how long it was down; the metrics `log_unavailable`, `log_outages` and `log_outage_seconds`
of its role show the same.
"""
import logging
import time

from . import retry

logger = logging.getLogger(__name__)
REMIND_S = 60.0  # a long outage is said again this often


class Outage:
    """One process's view of its log's availability. `metrics`: a schemas.metrics.Metrics of any role (or None)."""

    def __init__(self, who: str, metrics=None, clock=time.monotonic, sleep=time.sleep, first_s: float = 0.5,
                 longest_s: float = 5.0):
        self.who, self.metrics, self.clock, self.sleep = who, metrics, clock, sleep
        self.backoff = retry.Backoff(first_s, longest_s)
        self.since = self.error = None
        self.reminded = 0.0

    @property
    def down(self) -> bool:
        """Whether the log is unreachable now (as last tried)."""
        return self.since is not None

    def seconds(self) -> float:
        """How long the current outage has lasted (0 when there is none)."""
        return 0.0 if self.since is None else self.clock() - self.since

    def reason(self) -> str:
        """One line for /readyz and errors."""
        return f"the log has been unreachable for {self.seconds():.0f}s ({self.error}); waiting for it"

    def failed(self, error: Exception) -> None:
        """One more failed try: the first one starts the outage (said once), a long one is said again."""
        now = self.clock()
        self.error = error
        if self.since is None:
            self.since = self.reminded = now
            logger.warning("%s: the log is unreachable (%s); waiting for it, nothing is lost meanwhile", self.who,
                           error)
            if self.metrics is not None:
                self.metrics.set("log_unavailable", 1)
                self.metrics.inc("log_outages")
        elif now - self.reminded >= REMIND_S:
            self.reminded = now
            logger.warning("%s: the log is still unreachable after %.0fs (%s); waiting", self.who, now - self.since,
                           error)

    def wait(self, error: Exception, stopping=lambda: False) -> None:
        """Record a failed try, then wait the next backoff (returning early once `stopping()`)."""
        self.failed(error)
        until = self.clock() + self.backoff.next()
        while not stopping() and self.clock() < until:
            self.sleep(min(0.1, max(0.0, until - self.clock())))

    def over(self) -> None:
        """A try succeeded: an outage in progress is over (said once, with its length)."""
        if self.since is None:
            return
        down = self.clock() - self.since
        logger.warning("%s: the log is back after %.1fs unreachable", self.who, down)
        if self.metrics is not None:
            self.metrics.set("log_unavailable", 0)
            self.metrics.observe("log_outage_seconds", down)
        self.since = self.error = None
        self.backoff.reset()
