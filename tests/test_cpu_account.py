"""tests/cpu_account.py: a test's `cpu_s` JUnit property counts the CPU of the processes it starts, not its wall
time."""
import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parents[1]
INNER = '''
import subprocess, sys, time

BURN = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 1: pass"

def test_burns_in_a_child():
    subprocess.run([sys.executable, "-c", BURN], check=True)

def test_waits():
    time.sleep(1)  # wall time without CPU: what the property must not count
'''


def test_cpu_s_counts_a_childs_cpu_and_not_a_wait(tmp_path):
    (tmp_path / "test_inner.py").write_text(INNER)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.cpu_account", "-p", "no:cacheprovider", "-q",
                           "--rootdir", str(tmp_path), f"--junitxml={tmp_path / 'junit.xml'}",
                           str(tmp_path / "test_inner.py")],
                          capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)}, cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    cpu = {case.get("name"): {p.get("name"): float(p.get("value")) for p in case.iter("property")}["cpu_s"]
           for case in ET.parse(tmp_path / "junit.xml").iter("testcase")}
    assert cpu["test_burns_in_a_child"] >= 1.0, cpu
    assert cpu["test_waits"] < 0.5, cpu
