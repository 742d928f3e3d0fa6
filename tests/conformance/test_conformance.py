"""A second implementation (tests/conformance/reference.py: written from schemas/SPEC.md and ARITHMETIC.md, numpy,
msgpack, zstandard, xxhash and cryptography only, run where `hilo` cannot be imported) reproduces every state digest of
the committed vectors and of runs the product writes now: when the text and the code disagree, this fails."""
import ast
import json
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import KAFKA_URL, new_run
from tests.conformance.runs import RUNS, produce

HERE = pathlib.Path(__file__).parent
VECTORS = HERE / "vectors"
ALLOWED = {"hashlib", "json", "math", "pathlib", "struct", "sys", "zlib", "msgpack", "numpy", "xxhash", "zstandard",
           "cryptography",
           "kafka"}


def replay(log, run: str, key: str | None) -> dict:
    """The reference's replay of one run, in a process where importing `hilo` fails."""
    code = ("import sys, json, pathlib; sys.modules['hilo'] = None; sys.path.insert(0, sys.argv[1]); import reference; "
            "assert not [m for m in sys.modules if m.startswith('hilo') and sys.modules[m] is not None]; "
            "print(json.dumps(reference.replay(sys.argv[2], sys.argv[3], sys.argv[4] or None)))")
    out = subprocess.run([sys.executable, "-c", code, str(HERE), str(log), run, key or ""], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, f"{run}: the reference failed:\n{out.stderr[-3000:]}"
    return json.loads(out.stdout)


def check(expected: dict, got: dict, since: int = 1) -> None:
    """Every promised digest from version `since` on reproduced, bit for bit."""
    run, replayed = expected["run"], set(got["digests"])
    assert {v for v in expected["digests"]
            if int(v) >= since} <= replayed <= set(expected["digests"]), f"{run}: versions replayed"
    expected = expected | {"digests": {v: d for v, d in expected["digests"].items() if v in replayed}}
    assert not got["skipped"], f"{run}: the reference skipped {got['skipped']}"
    assert got["exact"], f"{run}: written with an arithmetic version the text does not fix (muon before math 3)"
    assert got["digests"] == expected["digests"], f"{run}: the reference's digests differ from the product's"


def test_the_reference_imports_only_what_spec_allows():
    tree = ast.parse((HERE / "reference.py").read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert names <= ALLOWED, f"reference.py imports {sorted(names - ALLOWED)}"


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_committed_vectors_replay_to_every_digest(name):
    expected = json.loads((VECTORS / name / "expected.json").read_text())
    check(expected, replay(VECTORS / name, name, expected["trusted_key"]))


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_run_the_product_writes_now_replays_to_every_digest(name, tmp_path):
    expected = produce(name, tmp_path)
    check(expected, replay(tmp_path / "log", name, expected["trusted_key"]))


@pytest.mark.kafka
@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_run_the_product_writes_to_kafka_now_replays_to_every_digest(name, tmp_path):
    run = new_run("conform")
    expected = produce(name, tmp_path, log_url=KAFKA_URL, run=run)
    # the trainer deletes all but its newest 3 checkpoints (genesis included): the replay starts at v2's
    check(expected, replay(KAFKA_URL, run, expected["trusted_key"]), since=3)  # (or earlier, if not deleted yet)
