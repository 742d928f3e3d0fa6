"""Codec invariants: error feedback conserves the gradient, budgets hold, Spar beats uniform-rank PowerSGD."""
import pytest
import torch

from hilo.replica.synthetic import GradientStream, qwen3_manifest
from hilo.replica.codecs import AutoBudget, Budget, decode, make_encoder
from hilo.replica.codecs.budget import parse_budget
from hilo.replica.codecs.base import DEFAULT_LIMITS, compressed_size, fit_to_budget, payload_size
from hilo.replica.codecs.lowrank import INT4_MAX, FactorPrefixes, decode_block, pack_int4, unpack_int4
from hilo.schemas.errors import ConfigError, MalformedMessage
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
    err = max(float((s + e.double() - t).abs().max() / t.abs().max()) for t, s,
              e in zip(true_sum, sent_sum, enc.residual))
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
    manifest = type(manifest)(manifest.base_model, manifest.rank, manifest.alpha, manifest.target_modules,
                              manifest.blocks[:56])
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
        if codec == "powersgd":  # a uniform rank, rounded down to at least 1: charged on raw bytes, within 1%
            assert payload_size(blocks) <= budget.payload_bytes(manifest)
            assert len(msg.to_bytes()) <= budget.message_bytes(manifest) * 1.01
        else:  # charged on what zstd makes of the payload: the framed message stays within the budget
            assert compressed_size(blocks) <= budget.payload_bytes(manifest)
            assert len(msg.to_bytes()) <= budget.message_bytes(manifest)


def test_fit_to_budget_gives_up_on_a_budget_no_build_fits():
    """A budget below one compressed entry ends in an empty payload after a bounded number of builds."""
    calls = []

    def build(nominal):
        calls.append(nominal)
        if len(calls) > 1000:
            raise AssertionError("fit_to_budget keeps shrinking a build that can never fit")
        return [{"i": 0, "n": 1, "idx": bytes(range(256)), "val": b"\x01\x02"}]  # never below its own size

    assert fit_to_budget(build, 3, 3.0) == []
    assert len(calls) <= 6 + 40


@pytest.mark.parametrize("codec", ("topk", "spar", "spar4"))
def test_a_budget_too_small_for_one_entry_sends_nothing_and_keeps_it_all(manifest, grads, codec):
    """Budget(bytes) just over the header reserve: the payload is empty and the residual holds the gradient."""
    enc = make_encoder(codec, manifest, Budget(bytes=1030))
    g = grads.next()
    e = enc.encode(g)
    assert e.blocks == []
    enc.commit(e)
    assert all(torch.equal(r, gi) for r, gi in zip(enc.residual, g))


def _energy_kept(g, d):
    return 1 - sum(float((a - b).pow(2).sum()) for a, b in zip(g, d)) / sum(float(a.pow(2).sum()) for a in g)


def test_spar_keeps_more_energy_than_uniform_powersgd_at_same_bytes():
    """On blocks with unequal spectra, spending bytes where the energy is beats a uniform rank."""
    manifest = qwen3_manifest("qwen3-0.6b", rank=16)
    manifest = type(manifest)(manifest.base_model, manifest.rank, manifest.alpha, manifest.target_modules,
                              manifest.blocks[:56])
    g = GradientStream(manifest, seed=5).next()
    psgd = make_encoder("powersgd", manifest, Budget(0.02))
    e_p = psgd.encode(g)
    blocks_p, dec_p = e_p.blocks, e_p.decoded
    wire = compressed_size(blocks_p)  # the same bytes on the wire (spar charges its budget on zstd's output)
    spar = make_encoder("spar", manifest, Budget(bytes=int((wire + 1024) / 0.998) + 2))
    e_s = spar.encode(g)
    blocks_s, dec_s = e_s.blocks, e_s.decoded
    assert compressed_size(blocks_s) <= wire * 1.002
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


def _first_56_blocks():
    manifest = qwen3_manifest("qwen3-0.6b", rank=16)
    return type(manifest)(manifest.base_model, manifest.rank, manifest.alpha, manifest.target_modules,
                          manifest.blocks[:56])


@pytest.mark.parametrize("m", (1, 6, 7))
def test_int4_nibbles_round_trip(m):
    q = torch.randint(-8, 8, (3, m), generator=torch.Generator().manual_seed(m))
    data = pack_int4(q)
    assert len(data) == 3 * ((m + 1) // 2)
    assert torch.equal(unpack_int4(data, 3, m, "t", DEFAULT_LIMITS), q.float())


@pytest.mark.parametrize("bits", (16, 4))
def test_factor_prefixes_match_a_direct_fit_whatever_order_the_ranks_are_asked_in(bits):
    """Every prefix k sliced from the shared rounding equals a least-squares fit of its own (odd sizes, k
    asked out of order so the rounding is redone mid-way)."""
    m, n, r = 7, 33, 7
    gen = torch.Generator().manual_seed(bits)
    g = torch.randn(m, n, generator=gen)
    U, V = torch.randn(m, r, generator=gen), torch.randn(n, r, generator=gen)
    prefixes = FactorPrefixes(5, g, lambda K: (U[:, :K], V[:, :K]), r, bits)
    for k in (2, 1, 7, 3, 5):
        entry = prefixes.payload(k)
        assert entry["i"] == 5 and entry["k"] == k
        got = decode_block(entry, (m, n), "t", DEFAULT_LIMITS)
        u = torch.nn.functional.normalize(U[:, :k].T, dim=1)
        v = torch.nn.functional.normalize(V[:, :k].T, dim=1)
        if bits == 4:
            u = torch.round(u * INT4_MAX / u.abs().amax(1, keepdim=True))
            v = torch.round(v * INT4_MAX / v.abs().amax(1, keepdim=True))
        else:
            u, v = u.half().float(), v.half().float()
        design = torch.stack([torch.outer(a, b).flatten() for a, b in zip(u, v)], 1).double()   # (m n, k)
        if bits == 4:
            s = torch.linalg.lstsq(design, g.flatten().double().unsqueeze(1)).solution.squeeze(1)
        else:   # fp16 directions are fit one at a time
            s = (design * g.flatten().double().unsqueeze(1)).sum(0) / design.pow(2).sum(0)
        want = (design @ s).reshape(m, n).float()
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (k, float((got - want).abs().max()))


def test_spar4_spends_the_same_bytes_on_more_directions_and_compressed_budgets_are_spent():
    manifest = _first_56_blocks()
    budget = Budget(0.016)
    out = {}
    for codec in ("spar", "spar4", "topk"):
        e = make_encoder(codec, manifest, budget).encode(GradientStream(manifest, seed=3).next())
        out[codec] = e
        assert 0.9 * budget.payload_bytes(manifest) <= compressed_size(e.blocks) <= budget.payload_bytes(
            manifest), codec
    dirs = {c: sum(b["k"] for b in out[c].blocks) for c in ("spar", "spar4")}
    assert dirs["spar4"] >= 2.5 * dirs["spar"], dirs
    assert all(b["bits"] == 4 for b in out["spar4"].blocks) and all("bits" not in b for b in out["spar"].blocks)


def test_coverage_floor_reaches_every_block():
    """At a small budget plain spar4 leaves most blocks unsent for 20 steps; a 25% floor sends every one."""
    manifest = _first_56_blocks()
    never = {}
    for floor in (0.0, 0.25):
        stream, enc = GradientStream(manifest, seed=3), make_encoder("spar4", manifest, Budget(0.004), floor=floor)
        sent = set()
        for _ in range(20):
            e = enc.encode(stream.next())
            enc.commit(e)
            sent |= {b["i"] for b in e.blocks}
        never[floor] = len(manifest.blocks) - len(sent)
        if floor:  # the floor's cursor is encoder state: a restarted trainer resumes it
            again = make_encoder("spar4", manifest, Budget(0.004), floor=floor)
            again.load_state_dict(enc.state_dict())
            assert torch.equal(again.age, enc.age) and int(enc.age.max()) < 20
    assert never[0.0] > 20 and never[0.25] == 0, never


def test_malformed_bits_field_is_refused_by_block_and_field(manifest, grads):
    e = make_encoder("spar4", manifest, Budget(0.3)).encode(grads.next())
    bad = [dict(b) for b in e.blocks]
    bad[1]["bits"] = 5
    with pytest.raises(MalformedMessage,
                       match=rf"block {bad[1]['i']} '[^']+': field 'bits' is 5, expected one of \[16, 4\]"):
        decode("spar4", manifest, e.params, bad, "offset 9")
    short = [dict(b) for b in e.blocks]
    short[0]["u"] = short[0]["u"][:-1]
    with pytest.raises(MalformedMessage, match=r"field 'u': \d+ bytes, expected"):
        decode("spar4", manifest, e.params, short, "offset 9")


@pytest.mark.parametrize("text,expected", [
    ("1.6%", Budget(0.016)), ("0.016", Budget(0.016)), ("25%", Budget(0.25)), ("4", Budget(4.0)),
    ("2MB", Budget(None, 2_000_000)), ("2000000", Budget(None, 2_000_000)), ("500 kb", Budget(None, 500_000)),
    ("auto", AutoBudget()), ("AUTO:0.5", AutoBudget(share=0.5)),
])
def test_a_budget_parses_from_text_and_describes_itself_back(text, expected):
    """What `--budget` takes: parse -> describe -> parse is the same budget (Budget and AutoBudget alike)."""
    got = parse_budget(text)
    assert got == expected
    assert parse_budget(got.describe()) == got


@pytest.mark.parametrize("text,match", [
    ("lots", r"^--budget 'lots': expected a fraction \(0.016\), a percentage"),
    ("500%", r"^--budget '500%': Budget.fraction must be in \(0, 4\]"),
    ("1000", r"^--budget '1000': Budget.bytes must exceed the 1024-byte header reserve"),
    ("auto:2", r"^--budget 'auto:2': AutoBudget.share = 2.0"),
])
def test_a_bad_budget_text_says_what_was_expected(text, match):
    with pytest.raises(ConfigError, match=match):
        parse_budget(text, "--budget")

