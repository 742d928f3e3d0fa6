"""The tests' own waiting helper: it must fail a test on its deadline, not hang it, and must not drop lines."""
import subprocess
import sys

import pytest

from tests.helpers import reaped, wait_for_line

# Two lines in one write, then silence: the child outlives any deadline below by far, so a helper that only checks
# its deadline when a line arrives returns at the child's exit, with the child gone.
CHILD = "import sys, time; sys.stderr.write('a 1\\na 2\\n'); sys.stderr.flush(); time.sleep(60)"


def test_wait_for_line_fails_on_its_deadline_while_the_process_is_silent():
    p = subprocess.Popen([sys.executable, "-c", CHILD], stderr=subprocess.PIPE, text=True)
    with reaped(p):
        with pytest.raises(AssertionError, match=r"never printed 'a 3' \(not within 1s; exit None\).*\n  a 1\n  a 2"):
            wait_for_line(p, "a 3", timeout_s=1)
        assert p.poll() is None, "the helper returned only when the silent process exited"


def test_wait_for_line_keeps_the_lines_read_past_a_match_for_the_next_call():
    p = subprocess.Popen([sys.executable, "-c", CHILD], stderr=subprocess.PIPE, text=True)
    with reaped(p):
        assert wait_for_line(p, r"^a 1$", timeout_s=30) == "a 1\n"
        assert wait_for_line(p, r"^a 2$", timeout_s=30) == "a 2\n"
