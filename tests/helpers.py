"""Helpers the tests share."""
import time


def wait_until(cond, timeout_s: float, what: str, every_s: float = 0.05):
    """Poll `cond` (another thread's or process's progress) until it is true; AssertionError naming `what` after
    `timeout_s`. Waiting on the condition itself, never a fixed sleep; `timeout_s` comes from the configured
    timeouts of what is awaited, so a slow machine only waits longer."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"not reached within {timeout_s:.0f}s: {what}"
        time.sleep(every_s)
