"""State digest versions (replica/digest.py): version 1 still gives the digests logs written before version 2
promise; version 2's bits do not depend on how many threads hashed; a manifest says its version, and one this build
does not know is refused by name."""
import dataclasses
import json
import subprocess
import sys

import msgpack
import pytest
import torch

from hilo.replica.state import ReplicaState
from hilo.replica.synthetic import initial_params, qwen3_manifest
from hilo.schemas.errors import UnsupportedVersion
from hilo.schemas.records import DIGEST_VERSION, Manifest

# Computed by the version-1 code before version 2 existed (the commit before replica/digest.py): a known answer.
V1_MANIFEST_ID = "c1ab84e65afbebe24f8043b9a3cb4838"
V1_DIGEST = "91ab9cfc8c08d9992ad8e4e8283c75ea"


def _state(manifest: Manifest) -> ReplicaState:
    g = torch.Generator().manual_seed(11)
    slots = {"exp_avg": [torch.randn(b.shape, generator=g) for b in manifest.blocks],
             "exp_avg_sq": [torch.rand(b.shape, generator=g) for b in manifest.blocks]}
    return ReplicaState(manifest, "adamw", 5, initial_params(manifest, seed=7), slots,
                        {"beta1_pow": 0.9 ** 5, "beta2_pow": 0.999 ** 5})


def _v1_manifest() -> Manifest:
    return dataclasses.replace(qwen3_manifest("tiny", rank=4), digest_version=1)


def test_version_1_gives_the_digest_it_always_gave():
    m = _v1_manifest()
    assert "digest_version" not in m.to_dict()  # a version-1 manifest is written byte for byte as before
    assert m.manifest_id.hex() == V1_MANIFEST_ID
    assert _state(m).digest().hex() == V1_DIGEST


def test_new_manifests_use_version_2_and_it_names_itself():
    m = qwen3_manifest("tiny", rank=4)
    assert m.digest_version == DIGEST_VERSION == 2
    back = Manifest.from_dict(msgpack.unpackb(msgpack.packb(m.to_dict())), "x")
    assert back == m and back.manifest_id == m.manifest_id
    assert Manifest.from_dict(_v1_manifest().to_dict(), "old").digest_version == 1  # no field: version 1
    s2 = _state(m)
    assert s2.digest() != _state(_v1_manifest()).digest()  # another definition (and another manifest id)


def test_a_digest_version_this_build_does_not_know_is_refused_by_name():
    d = qwen3_manifest("tiny", rank=4).to_dict() | {"digest_version": DIGEST_VERSION + 1}
    with pytest.raises(UnsupportedVersion, match=f"run x manifest: state digest version {DIGEST_VERSION + 1}; this build knows 1 to 2"):
        Manifest.from_dict(d, "run x")


def test_every_tensor_changes_the_version_2_digest():
    s = _state(qwen3_manifest("tiny", rank=4))
    seen = {s.digest()}
    for t in [s.params[0], s.params[-1], s.slots["exp_avg"][3], s.slots["exp_avg_sq"][-1]]:
        t.view(-1)[-1] += 1.0
        seen.add(s.digest())
    assert len(seen) == 5


_CHILD = """
import json, sys, torch
from hilo.replica import digest
from tests.replica.test_digest import _state
from hilo.replica.synthetic import qwen3_manifest
digest.PARALLEL_FROM_BYTES = int(sys.argv[1])
torch.set_num_threads(1)
print(json.dumps(_state(qwen3_manifest("tiny", rank=4)).digest().hex()))
"""


@pytest.mark.parametrize("cpus", [[0], None])
def test_version_2_is_the_same_on_one_thread_or_many_in_separate_processes(cpus):
    """Hashed in the caller (no pool) vs a pool of every core (taskset to one core or not): one digest."""
    here = _state(qwen3_manifest("tiny", rank=4)).digest().hex()
    got = []
    for threshold in (1 << 62, 0):  # never parallel, always parallel
        cmd = [sys.executable, "-c", _CHILD, str(threshold)]
        if cpus is not None:
            cmd = ["taskset", "-c", ",".join(map(str, cpus))] + cmd
        got.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
    assert got == [here, here]
