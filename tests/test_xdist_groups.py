"""The xdist groups group (tests/xdist_groups.py): every test of one group runs on one worker."""
import collections
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from tests.xdist_groups import group_of

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("nodeid, group", [
    ("tests/integration/test_cluster.py::test_the_whole_cluster_restarted_mid_run_loses_nothing", "cluster"),
    ("tests/integration/test_secure.py::test_a_refused_client_gets_one_line_naming_the_cause[wrong CA-x]", "secure"),
    ("tests/integration/test_outage.py::test_hilo_rl_and_generating_sites_ride_through_a_broker_restart", "vllm"),
    ("tests/consumer/test_vllm.py::test_a_server_that_is_not_vllm_is_refused_at_start", "vllm"),
    ("tests/ops/test_audit.py::test_honest_sites_pass_every_audit_and_the_margin_is_reported", "vllm-b"),
    ("tests/integration/test_faults.py::test_every_named_crash_point_loses_nothing", None),
    ("tests/consumer/test_pipeline.py::test_large_messages_are_chunked_and_reassembled[kafka]", None),
])
def test_the_suites_groups_are_read_from_its_modules(nodeid, group):
    assert group_of(ROOT, nodeid) == group


def test_every_test_of_a_group_runs_on_one_worker(tmp_path):
    pytest.importorskip("xdist")
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.xdist_groups"]\n'
                                          'def pytest_configure(config):\n'
                                          '    config.addinivalue_line("markers", "vllm: the vLLM server")\n')
    body = textwrap.dedent("""
        import os, pathlib, time, pytest
        {marks}
        @pytest.mark.parametrize("i", range(4))
        def test_one(i):
            time.sleep(0.2)  # long enough for every worker to take work
            with open(pathlib.Path(__file__).parent / "ran", "a") as f:
                f.write(f"{{__name__}} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")
        @pytest.mark.vllm
        def test_two():
            with open(pathlib.Path(__file__).parent / "ran", "a") as f:
                f.write(f"{{__name__}}-vllm {{os.environ['PYTEST_XDIST_WORKER']}}\\n")
    """)
    (tmp_path / "test_a.py").write_text(body.format(marks='pytestmark = pytest.mark.xdist_group("ports")'))
    (tmp_path / "test_b.py").write_text(body.format(marks='pytestmark = pytest.mark.vllm'))
    (tmp_path / "test_c.py").write_text(body.format(marks=""))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "3", "--dist",
                        "loadgroup",
                        "-p", "no:randomly", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    workers = collections.defaultdict(set)
    for line in (tmp_path / "ran").read_text().splitlines():
        who, worker = line.split()
        workers[who].add(worker)
    # a module's group, its vLLM test too: one worker
    assert len(workers["test_a"] | workers["test_a-vllm"]) == 1
    # every other vLLM test: one worker
    assert len(workers["test_b"] | workers["test_b-vllm"] | workers["test_c-vllm"]) == 1


def test_a_group_the_source_does_not_show_fails_the_test(tmp_path):
    (tmp_path / "conftest.py").write_text('import pytest\npytest_plugins = ["tests.xdist_groups"]\n'
                                          'def pytest_collection_modifyitems(items):\n'
                                          '    for item in items:\n'
                                          '        item.add_marker(pytest.mark.xdist_group("hidden"))\n')
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path)], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and ("test_x.py::test_x: marked for xdist group 'hidden', its source says "
                                  "None") in p.stdout, p.stdout
