"""40,000 mutated, truncated and random messages through decode + apply (and 60,000 checkpoints, snapshot files and
chunk headers in fresh processes): a project error or a correct result.

Every rejection must be a HiloError whose text names the record; the replica's digest must not move;
peak memory must stay bounded (forged sizes are refused before allocation).
"""
import random
import resource

import msgpack
import pytest
import zstandard

from hilo.producer.update_builder import UpdateBuilder
from hilo.replica.codecs import Budget, make_encoder
from hilo.replica.replica import PolicyReplica
from hilo.schemas.errors import HiloError, LimitExceeded, MalformedMessage
from hilo.schemas.framing import HEADER_BYTES, KIND_UPDATE, frame
from tests.conftest import CODECS, genesis

N = 40_000


def _valid_messages(manifest, grads):
    """One valid next-version message per codec, all from the same genesis."""
    out = {}
    for codec in CODECS:
        trainer = genesis(manifest, "adamw")
        out[codec] = UpdateBuilder(trainer, make_encoder(codec, manifest, Budget(0.3))).step(grads.next(), {"lr": 1e-3})
    return out


def _body(data):
    return msgpack.unpackb(zstandard.ZstdDecompressor().decompress(data[HEADER_BYTES:]), raw=False)


WEIRD = [None, True, -1, 0, 2**40, 2**64 - 1, 1e308, float("nan"), float("inf"), "", "x" * 600, b"", b"\0" * 7,
         [], {}, [1, 2], {"i": 0}, "dense", "muon", -2**63]


def _mutate_structure(rng, body):
    """Change one field somewhere in the body: a type, a value, a shape, a length."""
    body = msgpack.unpackb(msgpack.packb(body, use_bin_type=True), raw=False)  # deep copy
    choice = rng.random()
    if choice < 0.35 and body["blocks"]:
        entry = rng.choice(body["blocks"])
        key = rng.choice(sorted(entry))
        v = entry[key]
        if isinstance(v, bytes) and v and rng.random() < 0.6:
            cut = rng.randrange(len(v))
            entry[key] = rng.choice([v[:cut], v + v[:cut + 1], bytes([255]) * len(v),
                                     v[:cut] + b"\x7c\x00" + v[cut + 2:]])
        else:
            entry[key] = rng.choice(WEIRD)
    elif choice < 0.45:
        body["blocks"] = rng.choice([body["blocks"][::-1], body["blocks"] * 2, body["blocks"][1:], [], [{"i": 10**6}]])
    elif choice < 0.6:
        h = body["hparams"]
        h[rng.choice(sorted(h) + ["bogus"])] = rng.choice(WEIRD)
    elif choice < 0.7:
        body["codec_params"][rng.choice(["k", "rank", "budget"])] = rng.choice(WEIRD)
    else:
        body[rng.choice(sorted(body))] = rng.choice(WEIRD)
    return body


def _mutations(rng, messages):
    framed = {c: m.to_bytes() for c, m in messages.items()}
    for n in range(N):
        codec = rng.choice(sorted(framed))
        data = framed[codec]
        kind = n % 6
        if kind == 0:    # flip bytes anywhere
            b = bytearray(data)
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            yield bytes(b)
        elif kind == 1:  # truncate
            yield data[:rng.randrange(len(data))]
        elif kind == 2:  # random bytes, sometimes behind a valid header
            junk = rng.randbytes(rng.randrange(200))
            yield data[:HEADER_BYTES] + junk if rng.random() < 0.5 else junk
        elif kind == 3:  # forged declared size (zip bomb / huge allocation)
            b = bytearray(data)
            b[8:16] = rng.choice([2**62, 2**40, 2**33, len(data) * 1000]).to_bytes(8, "little")
            yield bytes(b)
        else:            # structural mutation, re-framed so it reaches the codec and the optimizer
            yield frame(KIND_UPDATE, _mutate_structure(rng, _body(data)))


@pytest.mark.slow
def test_fuzzed_messages_are_rejected_cleanly_and_never_mutate(manifest, grads):
    rng = random.Random(1234)
    messages = _valid_messages(manifest, grads)
    base = genesis(manifest, "adamw")
    checkpoint = base.checkpoint()
    replica = PolicyReplica.from_checkpoint(checkpoint)
    before = replica.digest
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rejected = applied = 0
    for n, data in enumerate(_mutations(rng, messages)):
        what = f"fuzz#{n}"
        try:
            replica.apply_bytes(data, what)
        except HiloError as e:
            assert what in str(e), f"error does not name the record: {e}"
            assert replica.digest == before and replica.state.digest() == before
            rejected += 1
        else:
            applied += 1  # the mutation kept the message valid (e.g. it hit `meta`): it applied correctly
            assert replica.version == 1 and replica.digest == next(m.digest for m in messages.values()
                                                                   if m.digest == replica.digest)
            replica = PolicyReplica.from_checkpoint(checkpoint)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    assert rejected + applied == N and rejected > 0.9 * N
    assert grown_mib < 256, f"peak RSS grew by {grown_mib:.0f} MiB while fuzzing"


def test_forged_sizes_are_refused_before_allocation(manifest, grads):
    replica = genesis(manifest)
    data = bytearray(next(iter(_valid_messages(manifest, grads).values())).to_bytes())
    data[8:16] = (2**40).to_bytes(8, "little")
    with pytest.raises(LimitExceeded, match="offset 7: declared decompressed size 1099511627776 > limit"):
        replica.apply_bytes(bytes(data), "offset 7")


def test_shape_mismatch_names_block_and_field(manifest, grads):
    replica = genesis(manifest)
    body = _body(_valid_messages(manifest, grads)["spar"].to_bytes())
    body["blocks"][0]["u"] = body["blocks"][0]["u"][:-2]
    with pytest.raises(MalformedMessage, match=r"offset 3, block \d+ '[^']+lora_[AB]' field 'u': \d+ bytes, expected"):
        replica.apply_bytes(frame(KIND_UPDATE, body), "offset 3")
    assert replica.version == 0


def test_nan_is_refused(manifest, grads):
    replica = genesis(manifest)
    body = _body(_valid_messages(manifest, grads)["dense"].to_bytes())
    g = bytearray(body["blocks"][2]["g"])
    g[0:4] = b"\x00\x00\xc0\x7f"  # fp32 NaN
    body["blocks"][2]["g"] = bytes(g)
    with pytest.raises(MalformedMessage, match="block 2 .* field 'g': contains NaN or Inf"):
        replica.apply_bytes(frame(KIND_UPDATE, body), "offset 5")


@pytest.mark.slow
@pytest.mark.parametrize("kind,n", [("checkpoint", 30_000), ("snapshot", 10_000), ("chunks", 20_000)])
def test_fuzzed_checkpoints_snapshots_and_chunk_headers(tmp_path, kind, n):
    """With the 40,000 updates above: 100,000 inputs. Each is accepted as exactly the original or refused by name,
    in a fresh process whose peak memory growth is its own."""
    import json
    import pathlib
    import subprocess
    import sys
    worker = pathlib.Path(__file__).with_name("_fuzz_worker.py")
    out = subprocess.run([sys.executable, str(worker), kind, str(n), "7", str(tmp_path)], capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout)
    # the rest: harmless mutations, accepted as exactly the original
    assert r["tried"] == n and r["rejected"] > 0.3 * n, r
    assert r["grew_mib"] < 64, f"peak RSS grew {r['grew_mib']:.0f} MiB"
