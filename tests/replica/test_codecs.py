"""Codec invariants: error feedback conserves the gradient, budgets hold, Spar beats uniform-rank PowerSGD."""
import pytest
import torch

from hilo.ops.bench.synthetic import GradientStream, qwen3_manifest
from hilo.replica.codecs import Budget, decode, make_encoder
from hilo.replica.codecs.base import payload_size
from hilo.schemas.records import UpdateMessage
from tests.conftest import CODECS, LOSSY


@pytest.mark.parametrize("codec", LOSSY)
def test_error_feedback_conserves_the_gradient(manifest, grads, codec):
    """sum(decoded) + final residual == sum(true gradients), block by block."""
    enc = make_encoder(codec, manifest, Budget(0.3))
    true_sum = [torch.zeros(b.shape, dtype=torch.float64) for b in manifest.blocks]
    sent_sum = [torch.zeros(b.shape, dtype=torch.float64) for b in manifest.blocks]
    for _ in range(30):
        g = grads.next()
        encoding = enc.encode(g)
        enc.commit(encoding)
        decoded = encoding.decoded
        for t, s, gi, di in zip(true_sum, sent_sum, g, decoded):
            t += gi.double()
            s += di.double()
    err = max(float((s + e.double() - t).abs().max() / t.abs().max()) for t, s, e in zip(true_sum, sent_sum, enc.residual))
    lost = max(float(e.abs().max()) for e in enc.residual)
    assert lost > 0, "a lossy codec left no residual: the test would not exercise error feedback"
    assert err < 1e-5


@pytest.mark.parametrize("codec", CODECS)
def test_decoded_equals_what_replicas_decode(manifest, grads, codec):
    """The encoder's own view of the message is exactly what a replica decodes from the bytes."""
    enc = make_encoder(codec, manifest, Budget(0.3))
    e = enc.encode(grads.next())
    again = decode(codec, manifest, e.params, e.blocks, "test")
    assert all(torch.equal(a, b) for a, b in zip(e.decoded, again))


@pytest.mark.parametrize("fraction", (0.004, 0.016, 0.05))
@pytest.mark.parametrize("codec", LOSSY)
def test_message_fits_budget(codec, fraction):
    """The whole framed message, not just the payload, stays within the byte budget."""
    manifest = qwen3_manifest("qwen3-0.6b", rank=16)
    manifest = type(manifest)(manifest.base_model, manifest.rank, manifest.alpha, manifest.target_modules, manifest.blocks[:56])
    stream = GradientStream(manifest, seed=3)
    budget = Budget(fraction)
    enc = make_encoder(codec, manifest, budget)
    for v in range(3):
        e = enc.encode(stream.next())
        enc.commit(e)
        blocks, params = e.blocks, e.params
        msg = UpdateMessage("run-with-a-long-name", v + 1, b"x" * 16, b"y" * 16, manifest.manifest_id, codec, params,
                            "adamw", {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0},
                            blocks, {"loss": 1.2345, "trainer_time_s": 12.5})
        assert payload_size(blocks) <= budget.payload_bytes(manifest)
        if codec == "spar":  # topk/powersgd round k or rank down to at least 1; spar spends exactly its budget
            assert len(msg.to_bytes()) <= budget.message_bytes(manifest)
        assert len(msg.to_bytes()) <= budget.message_bytes(manifest) * 1.01


def _energy_kept(g, d):
    return 1 - sum(float((a - b).pow(2).sum()) for a, b in zip(g, d)) / sum(float(a.pow(2).sum()) for a in g)


def test_spar_keeps_more_energy_than_uniform_powersgd_at_same_bytes():
    """On blocks with unequal spectra, spending bytes where the energy is beats a uniform rank."""
    manifest = qwen3_manifest("qwen3-0.6b", rank=16)
    manifest = type(manifest)(manifest.base_model, manifest.rank, manifest.alpha, manifest.target_modules, manifest.blocks[:56])
    g = GradientStream(manifest, seed=5).next()
    psgd = make_encoder("powersgd", manifest, Budget(0.02))
    e_p = psgd.encode(g)
    blocks_p, dec_p = e_p.blocks, e_p.decoded
    spar = make_encoder("spar", manifest, Budget(bytes=payload_size(blocks_p) + 1024 + 8))  # same payload bytes
    e_s = spar.encode(g)
    blocks_s, dec_s = e_s.blocks, e_s.decoded
    assert payload_size(blocks_s) <= payload_size(blocks_p) * 1.002
    ks = [b["k"] for b in blocks_s]
    assert max(ks) > psgd.rank and len(ks) < len(manifest.blocks) or min(ks) < psgd.rank, "spar should be non-uniform"
    e_spar, e_psgd = _energy_kept(g, dec_s), _energy_kept(g, dec_p)
    assert e_spar > e_psgd + 0.05, (e_spar, e_psgd)


@pytest.mark.parametrize("codec", CODECS)
def test_encoder_state_round_trips(manifest, grads, codec):
    """A restarted trainer that loads the encoder state continues exactly as the one that saved it."""
    a = make_encoder(codec, manifest, Budget(0.1))
    for _ in range(3):
        a.commit(a.encode(grads.next()))
    b = make_encoder(codec, manifest, Budget(0.1))
    b.load_state_dict(a.state_dict())
    g = grads.next()
    ea, eb = a.encode(g), b.encode(g)
    assert all(torch.equal(x, y) for x, y in zip(ea.decoded, eb.decoded)) and ea.blocks == eb.blocks
    if codec in LOSSY:
        fresh = make_encoder(codec, manifest, Budget(0.1)).encode(g)
        assert not all(torch.equal(x, y) for x, y in zip(ea.decoded, fresh.decoded))  # the state mattered
