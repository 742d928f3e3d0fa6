"""tests/heavy.py: two heavy tests on two pytest-xdist workers never run at the same time; unmarked ones do."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Each test says it runs (a file of its own), then watches for the other's file for a while: seeing it means the two
# overlapped. Two workers and two tests: xdist hands one to each, so without the lock they run side by side.
INNER = '''
import os, pathlib, time
import pytest
SHARED = pathlib.Path(os.environ["HEAVY_PROBE_DIR"])

def _overlaps(me, other):
    (SHARED / me).touch()
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            if (SHARED / other).exists():
                return True
            time.sleep(0.05)
        return False
    finally:
        (SHARED / me).unlink()

@pytest.mark.{mark}
def test_a():
    assert not _overlaps("a", "b")

@pytest.mark.{mark}
def test_b():
    assert not _overlaps("b", "a")
'''


def _run(tmp_path, mark: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_inner.py").write_text(INNER.replace("{mark}", mark))
    probe = tmp_path / "probe"
    probe.mkdir()
    env = os.environ | {"PYTHONPATH": str(ROOT), "HEAVY_PROBE_DIR": str(probe)}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.heavy", "-p", "no:cacheprovider", "-q", "-n",
                           "2",
                           "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def test_two_heavy_tests_on_two_workers_run_one_after_the_other(tmp_path):
    out = _run(tmp_path, "heavy")
    assert out.returncode == 0, out.stdout[-2000:]
    assert "2 passed" in out.stdout


def test_the_probe_sees_two_unmarked_tests_overlap(tmp_path):
    # the check above could not fail if these two never overlapped anyway
    out = _run(tmp_path, "skipif(False, reason='unmarked')")
    assert out.returncode == 1 and " failed" in out.stdout, out.stdout[-2000:]  # one of them (or both) saw the other
