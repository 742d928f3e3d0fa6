"""Fuzzed inputs, a tenth of `hilo bench fuzz` (ops/bench/fuzz.py; its full size, 100,000 inputs, is in
docs/benchmarks.md): 4,000 mutated, truncated and random update messages through decode + apply, and 3,000
checkpoints, 1,000 snapshot folders and 2,000 chunk headers, each kind in a fresh process. Each input is refused
or accepted as a correct result.

Every rejection must be a HiloError whose text names the record; the replica's digest must not move;
peak memory must stay bounded (forged sizes are refused before allocation).
"""
import json

import pytest

from hilo.ops.bench.fuzz import FuzzConfig, decode_body, genesis, main, valid_messages
from hilo.schemas.errors import LimitExceeded, MalformedMessage
from hilo.schemas.framing import KIND_UPDATE, frame

SCALE = 0.1


@pytest.mark.slow
def test_fuzzed_inputs_are_refused_by_name_and_never_mutate(tmp_path):
    """The bench at a tenth of its size: every kind's counts and the same bounds the benchmark's `ok` asks."""
    rc = main(FuzzConfig(scale=SCALE), False, str(tmp_path))
    res = json.loads((tmp_path / "fuzz.json").read_text())
    kinds = res["kinds"]
    assert {k: r["tried"] for k, r in kinds.items()} == {"updates": 4_000, "checkpoints": 3_000, "snapshots": 1_000,
                                                         "chunk-headers": 2_000}, res
    for kind, r in kinds.items():
        assert r["rejected"] + r["accepted"] == r["tried"], (kind, r)
        assert r["unnamed"] == 0, f"{kind}: a refusal does not name the record: {r['examples']}"
        assert r["accepted_wrong"] == 0, f"{kind}: an accepted input is not the original: {r['examples']}"
        # the rest: harmless mutations (of `meta`, say), accepted as exactly the original
        assert r["rejected"] > (0.9 if kind == "updates" else 0.3) * r["tried"], (kind, r)
        assert r["rss_growth_mib"] < (256 if kind == "updates" else 64), f"{kind}: peak RSS grew {r['rss_growth_mib']}"
    assert kinds["updates"]["mutated"] == 0, f"a refused update changed the replica: {kinds['updates']['examples']}"
    assert rc == 0 and res["ok"] and res["problems"] == [], res["problems"]


def test_forged_sizes_are_refused_before_allocation(manifest, grads):
    replica = genesis(manifest)
    data = bytearray(next(iter(valid_messages(manifest, grads).values())).to_bytes())
    data[8:16] = (2**40).to_bytes(8, "little")
    with pytest.raises(LimitExceeded, match="offset 7: declared decompressed size 1099511627776 > limit"):
        replica.apply_bytes(bytes(data), "offset 7")


def test_shape_mismatch_names_block_and_field(manifest, grads):
    replica = genesis(manifest)
    body = decode_body(valid_messages(manifest, grads)["spar"].to_bytes())
    body["blocks"][0]["u"] = body["blocks"][0]["u"][:-2]
    with pytest.raises(MalformedMessage, match=r"offset 3, block \d+ '[^']+lora_[AB]' field 'u': \d+ bytes, expected"):
        replica.apply_bytes(frame(KIND_UPDATE, body), "offset 3")
    assert replica.version == 0


def test_nan_is_refused(manifest, grads):
    replica = genesis(manifest)
    body = decode_body(valid_messages(manifest, grads)["dense"].to_bytes())
    g = bytearray(body["blocks"][2]["g"])
    g[0:4] = b"\x00\x00\xc0\x7f"  # fp32 NaN
    body["blocks"][2]["g"] = bytes(g)
    with pytest.raises(MalformedMessage, match="block 2 .* field 'g': contains NaN or Inf"):
        replica.apply_bytes(frame(KIND_UPDATE, body), "offset 5")
