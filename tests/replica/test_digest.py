"""State digest versions (replica/digest.py): versions 1 and 2 still give the digests logs written before them
promise; version 3's pieces are the standard XXH3-64, whether the fused kernel hashed them or xxhash did; the bits do
not depend on how many threads hashed; a manifest says its version, and one this build does not know is refused by
name."""
import dataclasses
import json
import subprocess
import sys

import msgpack
import numpy as np
import pytest
import torch
import xxhash

from hilo.replica.state import ReplicaState
from hilo.replica.synthetic import initial_params, qwen3_manifest
from hilo.schemas.errors import UnsupportedVersion
from hilo.schemas.records import DIGEST_VERSION, BlockSpec, Manifest

# Computed by the version-1 code before version 2 existed (the commit before replica/digest.py): a known answer.
V1_MANIFEST_ID = "c1ab84e65afbebe24f8043b9a3cb4838"
V1_DIGEST = "91ab9cfc8c08d9992ad8e4e8283c75ea"
# Computed by the version-2 code before version 3 existed (357e3bb), for the same state under a version-2 manifest.
V2_MANIFEST_ID = "2bd79d95d013d9aaaaeaf28194aaa103"
V2_DIGEST = "7e14a5d8040c356742e6c145a96412e3"


def _state(manifest: Manifest) -> ReplicaState:
    g = torch.Generator().manual_seed(11)
    slots = {"exp_avg": [torch.randn(b.shape, generator=g) for b in manifest.blocks],
             "exp_avg_sq": [torch.rand(b.shape, generator=g) for b in manifest.blocks]}
    return ReplicaState(manifest, "adamw", 5, initial_params(manifest, seed=7), slots,
                        {"beta1_pow": 0.9 ** 5, "beta2_pow": 0.999 ** 5})


def _v1_manifest() -> Manifest:
    return dataclasses.replace(qwen3_manifest("tiny", rank=4), digest_version=1)


def _odd_manifest() -> Manifest:
    """Pieces of every kind: short (<= 240 bytes), just long (244), several per tensor with a short last one, and
    pieces that start mid-word (odd column count, so the kernel copies them aligned first)."""
    shapes = {"short": (5, 5), "edge": (61, 1), "tail": (16385, 1), "mid": (2000, 17), "wide": (3, 40_000)}
    return Manifest("odd-pieces", 4, 8.0, ("x",),
                    tuple(BlockSpec(f"odd.{k}", "A", v) for k, v in sorted(shapes.items())))


def test_version_1_gives_the_digest_it_always_gave():
    m = _v1_manifest()
    assert "digest_version" not in m.to_dict()  # a version-1 manifest is written byte for byte as before
    assert m.manifest_id.hex() == V1_MANIFEST_ID
    assert _state(m).digest().hex() == V1_DIGEST


def test_version_2_gives_the_digest_it_gave():
    m = dataclasses.replace(qwen3_manifest("tiny", rank=4), digest_version=2)
    assert m.manifest_id.hex() == V2_MANIFEST_ID
    assert _state(m).digest().hex() == V2_DIGEST


def test_new_manifests_use_version_3_and_it_names_itself():
    m = qwen3_manifest("tiny", rank=4)
    assert m.digest_version == DIGEST_VERSION == 3
    back = Manifest.from_dict(msgpack.unpackb(msgpack.packb(m.to_dict())), "x")
    assert back == m and back.manifest_id == m.manifest_id
    assert Manifest.from_dict(_v1_manifest().to_dict(), "old").digest_version == 1  # no field: version 1
    digests = {_state(m).digest(), _state(_v1_manifest()).digest(),
               _state(dataclasses.replace(m, digest_version=2)).digest()}
    assert len(digests) == 3  # three definitions (and three manifest ids)


def test_a_digest_version_this_build_does_not_know_is_refused_by_name():
    d = qwen3_manifest("tiny", rank=4).to_dict() | {"digest_version": DIGEST_VERSION + 1}
    with pytest.raises(UnsupportedVersion,
                       match=f"run x manifest: state digest version {DIGEST_VERSION + 1}; this build knows 1 to 3"):
        Manifest.from_dict(d, "run x")


@pytest.mark.parametrize("manifest", [qwen3_manifest("tiny", rank=4), _odd_manifest()], ids=["tiny", "odd"])
def test_every_tensor_and_every_piece_changes_the_version_3_digest(manifest):
    s = _state(manifest)
    seen, changes = {s.digest()}, 0
    for t in [s.params[0], s.params[-1], s.slots["exp_avg"][3], s.slots["exp_avg_sq"][-1]]:
        for at in {0, t.shape[0] // 2, t.shape[0] - 1}:  # the first, a middle and the last piece
            t[at, -1] += 1.0
            seen.add(s.digest())
            changes += 1
    assert len(seen) == 1 + changes  # every change gave a digest not seen before


def test_the_kernels_piece_hash_is_xxh3_64_at_every_length_and_alignment():
    """kernels/xxh3.py against the xxhash library, on lengths around each of XXH3's boundaries (a stripe, a block)."""
    from hilo.replica.kernels.xxh3 import piece_hash
    words = np.random.default_rng(3).integers(0, 2 ** 32, 20_000, dtype=np.uint64).astype(np.uint32)
    base = words.ctypes.data
    for start in (0, 1):  # 8-byte aligned, and mid-word
        for n in (61, 62, 63, 64, 65, 255, 256, 257, 271, 272, 273, 512, 4096, 16383, 16384, 16385):
            assert piece_hash(base + 4 * start,
                              n) == xxhash.xxh3_64_intdigest(words[start:start + n].tobytes()), (start, n)


def test_a_state_the_kernel_wrote_has_the_digest_xxhash_gives_it():
    """The fused kernel's piece hashes, which the first digest() takes, against the same state hashed from memory."""
    from hilo.producer.update_builder import UpdateBuilder
    from hilo.replica.codecs import make_encoder
    from hilo.replica.codecs.base import Budget
    from hilo.replica.synthetic import GradientStream
    from tests.conftest import genesis
    m = _odd_manifest()
    trainer = genesis(m, "adamw")
    msg = UpdateBuilder(trainer, make_encoder("spar4", m, Budget(0.25))).step(GradientStream(m, seed=2).next(),
                                                                              {"lr": 1e-3})
    site = genesis(m, "adamw")
    site.apply_mode = "kernel-only"
    for tamper in (False, True):
        state = site.compute(msg, "v1")
        assert state.known is not None and len(state.known) == 3 * len(m.blocks)
        if tamper:  # the known hashes are what the first digest reads: one changed, the digest changes
            long = next(k for k in state.known if len(k) > 1)
            long[0] ^= np.uint64(1)
        first = state.digest()
        assert state.known is None  # taken once
        assert (first == state.digest() == msg.digest) is not tamper  # the second digest read the memory


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
def test_the_digest_is_the_same_on_one_thread_or_many_in_separate_processes(cpus):
    """Hashed in the caller (no pool) vs a pool of every core (taskset to one core or not): one digest."""
    here = _state(qwen3_manifest("tiny", rank=4)).digest().hex()
    got = []
    for threshold in (1 << 62, 0):  # never parallel, always parallel
        cmd = [sys.executable, "-c", _CHILD, str(threshold)]
        if cpus is not None:
            cmd = ["taskset", "-c", ",".join(map(str, cpus))] + cmd
        got.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
    assert got == [here, here]
