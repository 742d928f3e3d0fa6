"""Arithmetic versions (schemas/records.py MATH_VERSION): from version 2 AdamW's sqrt is correctly rounded, so a site
computes the trainer's bits whichever code path MKL picks on its CPU; a version-1 message (every log written before
the field) reads and applies as it always did; a version this build does not know is refused by name."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

from hilo.producer.update_builder import UpdateBuilder
from hilo.replica.codecs import Budget, make_encoder
from hilo.replica.codecs import decode as decode_gradient
from hilo.replica.optimizers.adamw import AdamW, sqrt
from hilo.replica.synthetic import GradientStream
from hilo.schemas.errors import UnsupportedVersion
from hilo.schemas.limits import DEFAULT_LIMITS
from hilo.schemas.records import MATH_VERSION, UpdateMessage, decode_record
from tests.conftest import genesis

MKL_PATHS = ("SSE4_2", "AVX2", "AVX512")  # MKL_ENABLE_INSTRUCTIONS: its SSE4.2 and AVX-512 vector sqrt are not exact


def test_version_2_sqrt_is_correctly_rounded_for_every_kind_of_float():
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(0, 0x7F800000, (1 << 20,), generator=g, dtype=torch.int64).to(torch.int32)  # every finite >= 0
    v = torch.cat([bits.view(torch.float32), torch.tensor([0.0, 1e-45, 1.17549435e-38, 3.4028235e38, 1.0, 4.0])])
    got = sqrt(v, torch.empty_like(v), 2)
    assert torch.equal(got, torch.from_numpy(np.sqrt(v.numpy())))  # numpy's float32 sqrt is the hardware's: IEEE, exact


def _messages(manifest, steps=4):
    trainer = genesis(manifest, "adamw")
    trainer.apply_mode = "reference"
    ckpt = trainer.checkpoint().to_bytes()
    builder = UpdateBuilder(trainer, make_encoder("spar4", manifest, Budget(0.25)))
    grads, data, digests = GradientStream(manifest, seed=3), [], []
    for _ in range(steps):
        data.append(builder.step(grads.next(), {"lr": 1e-2}).to_bytes())
        digests.append(trainer.digest.hex())
    return ckpt, data, digests


def test_adamw_sites_on_every_mkl_code_path_reach_the_trainers_digests(tmp_path, manifest):
    """Three reference-path sites, separate processes, each made to use another MKL code path, follow one run of
    AdamW messages. Before version 2, the SSE4.2 and AVX-512 sites' torch.sqrt rounded some elements otherwise and
    their digests parted from an AVX2 trainer's at the first version."""
    ckpt, data, digests = _messages(manifest)
    d = tmp_path / "adamw"
    d.mkdir()
    (d / "genesis.ckpt").write_bytes(ckpt)
    for v, msg in enumerate(data, 1):
        (d / f"{v:06d}.msg").write_bytes(msg)
    worker = pathlib.Path(__file__).with_name("_apply_worker.py")
    procs = [subprocess.Popen([sys.executable, str(worker), str(tmp_path), "reference"], stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, MKL_ENABLE_INSTRUCTIONS=isa)) for isa in MKL_PATHS]
    results = [json.loads(p.communicate(timeout=600)[0]) for p in procs]
    assert [p.returncode for p in procs] == [0] * len(MKL_PATHS)
    for isa, r in zip(MKL_PATHS, results):
        assert r == {"adamw": digests}, f"MKL {isa}"


@pytest.mark.parametrize("mode", ["reference", "kernel"])
def test_each_message_is_stepped_with_its_own_arithmetic_version(manifest, mode):
    """A version-1 message (written before the field: the bytes carry none) steps with torch.sqrt, a version-2 one with
    the correctly rounded sqrt, on both apply paths: each is exactly the specification's step at its version."""
    _, data, _ = _messages(manifest, steps=1)
    new = decode_record(data[0], "v1")
    old = UpdateMessage(**{**new.__dict__, "math": 1})
    framed = old.to_bytes()
    assert new.math == MATH_VERSION >= 2 and b"math" not in framed and decode_record(framed, "old").math == 1
    s = genesis(manifest, "adamw").state
    grads = decode_gradient(new.codec, manifest, new.codec_params, new.blocks, "v1", DEFAULT_LIMITS)
    h = AdamW().check_hparams(new.hparams, "v1")
    for msg in (old, new):
        want = AdamW().step(s.params, grads, s.slots, s.scalars, h, math_version=msg.math)
        r = genesis(manifest, "adamw")
        r.apply_mode = mode
        got = r.compute(msg, "v1")
        assert all(torch.equal(a, b) for a, b in zip(got.params, want[0])), f"math {msg.math}"
        assert all(torch.equal(a, b) for a, b in zip(got.slots["exp_avg_sq"], want[1]["exp_avg_sq"]))


def test_an_arithmetic_version_this_build_does_not_know_is_refused_by_name(manifest):
    _, data, _ = _messages(manifest, steps=1)
    msg = decode_record(data[0], "v1")
    future = UpdateMessage(**{**msg.__dict__, "math": MATH_VERSION + 1}).to_bytes()
    with pytest.raises(UnsupportedVersion,
                       match=f"arithmetic version {MATH_VERSION + 1}; this build knows 1 to {MATH_VERSION}"):
        decode_record(future, "offset 9")
