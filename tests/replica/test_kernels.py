"""The fused apply kernels (replica/kernels/) against the torch path, which is the specification: equal digests at every
version for every optimizer x codec, odd shapes, 1 and 2 threads, two processes; the same refusals; bad buffers
refused before anything is written."""
import json
import os
import pathlib
import re
import subprocess
import sys

import numba
import pytest
import torch

from hilo.producer.delta import ADD, MasterCopy
from hilo.producer.update_builder import UpdateBuilder
from hilo.replica import kernels
from hilo.replica.codecs import Budget, make_encoder
from hilo.replica.synthetic import GradientStream
from hilo.schemas.errors import ConfigError, NonFinite, UnfitState
from hilo.schemas.records import BlockSpec, Manifest
from tests.conftest import CODECS, LR, OPTIMIZERS, genesis

STEPS = 6
# every optimizer with a kernel, and delta mode's add
FUSED = tuple(o for o in OPTIMIZERS if o in kernels.STEPS) + (ADD,)


def odd_manifest() -> Manifest:
    """Blocks no real adapter has: a row, a column, primes, a square, one wider than an item (a digest piece); an odd
    column count over several items (items that start mid-word), a column whose last item is 4 bytes."""
    shapes = {"a": (7, 13), "b": (1, 29), "c": (13, 1), "d": (5, 5), "e": (3, 40_000), "f": (2000, 17), "g": (16385, 1)}
    blocks = tuple(BlockSpec(f"odd.{name}", "A", shape) for name, shape in sorted(shapes.items()))
    return Manifest("odd-shapes", 4, 8.0, ("x",), blocks)


def messages(manifest, codec: str, optimizer: str, steps: int = STEPS, seed: int = 1) -> tuple:
    """(genesis checkpoint bytes, [framed messages], [digest per version]) of a trainer on the reference path."""
    trainer = genesis(manifest, optimizer)
    trainer.apply_mode = "reference"
    ckpt = trainer.checkpoint().to_bytes()
    builder = UpdateBuilder(trainer, make_encoder(codec, manifest, Budget(0.25)))
    grads, out, digests = GradientStream(manifest, seed=seed), [], []
    master = MasterCopy(trainer.state.params, "adamw") if optimizer == ADD else None
    for _ in range(steps):
        if master is None:
            msg = builder.step(grads.next(), {"lr": LR[optimizer]})
        else:  # delta mode: the master's movement is the payload, sites add it
            state, movement = master.propose(grads.next(), {"lr": LR["adamw"]})
            master.commit(state)
            msg = builder.step(movement)
        out.append(msg.to_bytes())
        digests.append(trainer.digest)
    assert len(set(digests)) == steps, "the state did not change every version: the comparison would be vacuous"
    return ckpt, out, digests


def follow(manifest, optimizer: str, data: list, mode: str, recycle: bool = True) -> list:
    """Digests of a replica in `mode` applying `data` from genesis."""
    r = genesis(manifest, optimizer)
    r.apply_mode, r.recycle = mode, recycle
    out = []
    for i, d in enumerate(data):
        assert r.apply_bytes(d, f"v{i + 1}")
        out.append(r.digest)
    return out


@pytest.mark.parametrize("optimizer", FUSED)
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("shapes", ["tiny", "odd"])
def test_kernel_matches_reference_at_every_version(manifest, codec, optimizer, shapes):
    m = manifest if shapes == "tiny" else odd_manifest()
    _, data, expected = messages(m, codec, optimizer)
    assert follow(m, optimizer, data, "reference") == expected
    assert follow(m, optimizer, data, "kernel") == expected
    assert follow(m, optimizer, data, "kernel-only", recycle=False) == expected  # new buffers every version too


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_kernel_bits_do_not_depend_on_the_thread_count(manifest, optimizer):
    _, data, expected = messages(manifest, "spar4", optimizer)
    before = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            assert follow(manifest, optimizer, data, "kernel") == expected, f"{threads} thread(s)"
    finally:
        numba.set_num_threads(before)


def test_kernel_site_and_reference_site_in_two_processes(tmp_path, manifest):
    expected = {}
    for codec, opt in (("spar4", "adamw"), ("spar", "sgd"), ("dense", "lion"), ("topk", ADD), ("powersgd", "adamw")):
        d = tmp_path / f"{codec}-{opt}"
        d.mkdir()
        ckpt, data, digests = messages(manifest, codec, opt)
        (d / "genesis.ckpt").write_bytes(ckpt)
        for v, msg in enumerate(data, 1):
            (d / f"{v:06d}.msg").write_bytes(msg)
        expected[d.name] = [x.hex() for x in digests]
    worker = pathlib.Path(__file__).with_name("_apply_worker.py")
    # the kernel process on one numba thread, the reference on two torch threads
    runs = (("kernel", "1"), ("reference", "2"))
    procs = [subprocess.Popen([sys.executable, str(worker), str(tmp_path), mode], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, NUMBA_NUM_THREADS=threads, OMP_NUM_THREADS=threads))
             for mode, threads in runs]
    results = [json.loads(p.communicate(timeout=600)[0]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    for r in results:
        assert r == expected


def test_non_finite_is_refused_with_the_reference_words(manifest):
    _, data, _ = messages(manifest, "spar4", "sgd", steps=1)
    r = genesis(manifest, "sgd")
    msg = r.parse(data[0], "v1")
    msg.hparams = dict(msg.hparams, lr=3e38)  # finite in fp32; p - d*lr overflows
    said = []
    for mode in ("reference", "kernel"):
        r.apply_mode = mode
        with pytest.raises(NonFinite) as e:
            r.compute(msg, "v1")
        said.append(str(e.value))
    assert said[0] == said[1] and "params" in said[0]


@pytest.mark.parametrize("bad", ["float64", "non-contiguous", "shape"])
def test_a_state_the_kernel_cannot_take_is_refused_before_anything_is_written(manifest, bad):
    _, data, _ = messages(manifest, "spar4", "adamw", steps=3)
    r = genesis(manifest, "adamw")
    r.recycle = True
    for i, d in enumerate(data[:2]):  # two versions: the replaced state's buffers are the next step's (recycling)
        r.apply_bytes(d, f"v{i + 1}")
    spare = [t.clone() for t in r._spare.params] + [t.clone() for ts in r._spare.slots.values() for t in ts]
    held = r.state.digest()
    b = 3
    t = r.state.slots["exp_avg"][b]
    r.state.slots["exp_avg"][b] = {"float64": t.double(), "non-contiguous": t.T.contiguous().T,
                                   "shape": t.reshape(-1)}[bad]
    if bad == "non-contiguous":
        assert not r.state.slots["exp_avg"][b].is_contiguous() or t.shape[0] == 1
    with pytest.raises(UnfitState) as e:
        r.apply_bytes(data[2], "v3")
    text = str(e.value)
    assert "\n" not in text and manifest.blocks[b].key in text and "exp_avg" in text
    assert r.version == 2
    r.state.slots["exp_avg"][b] = t
    assert r.state.digest() == held
    assert all(torch.equal(x, y)
               for x, y in zip(spare, [t for t in r._spare.params] + [t for ts in r._spare.slots.values() for t in ts]))
    assert r.apply_bytes(data[2], "v3")  # the same replica, its buffer put right, goes on


def test_muon_stays_on_the_reference_path(manifest):
    _, data, expected = messages(manifest, "spar4", "muon", steps=2) if "muon" in OPTIMIZERS else (None, None, None)
    if data is None:
        pytest.skip("no muon in this build")
    assert kernels.unavailable("muon")
    assert follow(manifest, "muon", data, "kernel") == expected  # "kernel": the reference path where there is none
    with pytest.raises(ConfigError, match="kernel-only"):
        follow(manifest, "muon", data, "kernel-only")


def test_unknown_apply_mode_is_refused(manifest):
    with pytest.raises(ConfigError, match="apply"):
        genesis(manifest).apply_mode = "fast"


def test_the_kernel_has_no_fused_multiply_add(manifest):
    """fastmath off: LLVM keeps every multiply and add apart (an FMA rounds once where torch rounds twice). The kernel
    is compiled again without the disk cache (numba shows no assembly for cached code), used once, and read."""
    from hilo.replica.kernels import _jit, fused
    fresh = numba.njit(**(_jit.PARALLEL | {"cache": False}))(fused.run.py_func)
    _, data, expected = messages(manifest, "spar4", "adamw", steps=1)
    cached, fused.run = fused.run, fresh
    try:
        assert follow(manifest, "adamw", data, "kernel-only") == expected
    finally:
        fused.run = cached
    asm = "\n".join(fresh.inspect_asm().values())
    assert re.search(r"\bv?mul[ps]s\b", asm) and re.search(r"\bv?add[ps]s\b", asm), "the assembly was not read"
    assert not re.search(r"\bvfn?m(add|sub)\d*[ps]s\b", asm), "an FMA in the kernel"


def test_kernels_that_do_not_load_leave_the_reference_path_said_once(manifest, monkeypatch, caplog):
    _, data, expected = messages(manifest, "spar4", "sgd", steps=2)
    monkeypatch.setattr(kernels, "_modules", None)
    monkeypatch.setattr(kernels, "_error", "ImportError: No module named 'numba'")
    monkeypatch.setattr(kernels, "_said", set())
    assert "did not load" in kernels.unavailable("sgd")
    with caplog.at_level("WARNING", logger="hilo.replica.kernels"):
        assert follow(manifest, "sgd", data, "kernel") == expected  # the same bits, on the torch path
    assert [r.getMessage() for r in caplog.records].count(
        "apply: sgd runs on the reference path: the kernels did not load (ImportError: No module named 'numba')") == 1
    with pytest.raises(ConfigError, match="kernel-only"):
        follow(manifest, "sgd", data, "kernel-only")


@pytest.mark.parametrize("codec", [c for c in CODECS if c in kernels.DECODES and c != "dense"])
@pytest.mark.parametrize("shapes", ["tiny", "odd"])
def test_the_encoders_fused_self_check_gives_the_reference_bits(manifest, codec, shapes):
    """The encoder's decode + residual in one pass (kernels.encoder_check) against the reference decode and subtraction:
    the same decoded gradients, residuals and messages at every version; a trainer on either path publishes the same
    run (same message bytes, same digests)."""
    manifest = odd_manifest() if shapes == "odd" else manifest
    runs = {}
    for mode in ("kernel", "reference"):
        trainer = genesis(manifest, "adamw")
        trainer.apply_mode = mode
        builder, grads, seen = UpdateBuilder(trainer, make_encoder(codec, manifest,
                                                                   Budget(0.25))), GradientStream(manifest, seed=5), []
        for _ in range(STEPS):
            proposal = builder.propose(grads.next(), {"lr": LR["adamw"]})
            builder.commit(proposal)
            seen.append((proposal.message.to_bytes(), proposal.encoding.decoded, builder.encoder.residual,
                         trainer.digest))
        runs[mode] = seen
    assert kernels.encoder_check(codec) is not None
    for (m1, d1, r1, g1), (m2, d2, r2, g2) in zip(runs["kernel"], runs["reference"]):
        assert m1 == m2 and g1 == g2
        assert all(torch.equal(a, b) for a, b in zip(d1, d2)) and all(torch.equal(a, b) for a, b in zip(r1, r2))
    assert any(r.abs().sum() > 0 for r in runs["kernel"][-1][2])  # something was held back: the residual is compared
