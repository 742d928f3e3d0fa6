"""The one retry policy of hilo-sync: exponential backoff with a cap (tenacity), for every loop that retries.

    call(fn, retriable=lambda e: ..., attempts=20)        # retry fn's failures that `retriable` accepts
    wait = Backoff(first_s=0.5, longest_s=30); wait.next() # the waits of a loop that cannot block in tenacity

Waits double from `first_s` up to `longest_s`. `sleep` is injected so that a caller can bound a wait by its own
deadline (a read never sleeps past its timeout).
"""
import time

import tenacity


def _waits(first_s: float, longest_s: float):
    return tenacity.wait_exponential(multiplier=first_s, min=first_s, max=longest_s)


def call(fn, *, retriable, attempts: int | None = 20, within_s: float | None = None, first_s: float = 0.05,
         longest_s: float = 2.0, on_retry=None, sleep=time.sleep):
    """fn(), retried while it raises an exception `retriable(e)` accepts: at most `attempts` times in all, and
    (when given) no retry starts after `within_s`. The last failure (or the first one not retriable) is raised as
    it was. `on_retry(e, attempt)` runs before each wait."""
    def before_sleep(state):
        if on_retry is not None:
            on_retry(state.outcome.exception(), state.attempt_number)
    stop = tenacity.stop_never if attempts is None else tenacity.stop_after_attempt(attempts)
    if within_s is not None:
        stop = stop | tenacity.stop_after_delay(within_s)
    return tenacity.Retrying(stop=stop, wait=_waits(first_s, longest_s),
                             retry=tenacity.retry_if_exception(retriable), reraise=True, sleep=sleep,
                             before_sleep=before_sleep)(fn)


class Backoff:
    """The same waits, one at a time, for a loop that waits on something else meanwhile (a condition variable)."""

    def __init__(self, first_s: float, longest_s: float):
        self.first_s, self.longest_s = first_s, longest_s
        self._strategy = _waits(first_s, longest_s)
        self.failures = 0

    def next(self) -> float:
        """The wait after one more failure."""
        self.failures += 1
        return float(self._strategy(_Attempt(self.failures)))

    def reset(self) -> None:
        """A success: the next failure waits `first_s` again."""
        self.failures = 0


class _Attempt:
    """What tenacity's wait strategies read of a retry state."""

    def __init__(self, n: int):
        self.attempt_number = n
