"""schemas/SPEC.md against the code, where that can be checked mechanically: every header the writers emit is in its
header table, on the records the table says; its constants (framing, the embedded log's record header, the bounds)
are the code's; `manifest_id`'s bytes, the state digest's stream and `hilo-sum` are what its text spells out."""
import pathlib
import re
import struct

import msgpack
import pytest
import torch
import xxhash

from hilo.log import checkpoints_topic, filelog, open_log, updates_topic
from hilo.log.tail import records
from hilo.producer.producer import HiLoProducer
from hilo.replica.codecs import update_size_bound
from hilo.replica.digest import state_digest
from hilo.schemas import framing
from hilo.schemas import headers as H
from hilo.schemas.chunks import split
from hilo.schemas.records import BlockSpec, Manifest, checkpoint_size_bound
from hilo.schemas.signing import generate
from tests.conftest import producer_config, publish_random, small_model

SPEC = (pathlib.Path(H.__file__).parent / "SPEC.md").read_text()


def header_table() -> dict:
    """{header name: (the records it is on, its value)} from SPEC's "Log records" table."""
    rows = re.findall(r"^\| `(hilo-[a-z-]+)` \| ([^|]+) \| (.+) \|$", SPEC, re.M)
    return {name: (on.strip(), value) for name, on, value in rows}


def test_the_header_table_names_every_header_constant_and_nothing_else():
    constants = {v for k, v in vars(H).items() if k.isupper() and isinstance(v, str) and v.startswith("hilo-")}
    assert constants == set(H.ALL)
    assert set(header_table()) == set(H.ALL)


def test_the_kind_header_lists_every_kind_the_framing_knows():
    values = header_table()[H.KIND][1]
    assert set(re.findall(r"`([a-z]+)`", values)) == set(framing.KIND_NAMES.values())


@pytest.fixture(scope="module")
def emitted(tmp_path_factory) -> list:
    """(topic, kind, header names) of every record a signed delta-mode run with a key rotation writes."""
    tmp = tmp_path_factory.mktemp("spec")
    url, run = f"file://{tmp}/log", "spec"
    old, new = (generate(tmp / n) for n in ("old", "new"))
    producer = HiLoProducer.open(small_model(),
                                 producer_config(run=run, log=url, mode="delta", codec="spar4", optimizer="muon",
                                                                hparams={"lr": 0.02}, signing_key=str(old[0]),
                                                 checkpoint_every=2))
    try:
        publish_random(producer, 2, scale=0.05)
        producer.rotate_key(str(new[0]))
        publish_random(producer, 2, seed=1, scale=0.05)
    finally:
        producer.close()
    log = open_log(url)
    try:
        return [(t, r.headers.get(H.KIND), set(r.headers)) for t in (updates_topic(run), checkpoints_topic(run))
                for r in records(log, t)]
    finally:
        log.close()


def test_every_header_a_writer_emits_is_in_the_table_on_the_records_it_says(emitted):
    table = header_table()
    kinds = {kind for _, kind, _ in emitted}
    assert kinds == {"update", "checkpoint", "key"}
    seen = set()
    for topic, kind, names in emitted:
        for name in names:
            assert name in table, f"{topic}: header {name} is not in SPEC.md's header table"
            on = table[name][0]
            assert on == "every record" or f"{kind}s" in on, (f"{topic}: {name} on a {kind} record; SPEC says it is on "
                                                              f"{on}")
        seen |= names
    assert {H.LAG, H.GENESIS, H.UPDATES_OFFSET, H.DIGEST, H.LOG_BYTES} <= seen  # the run wrote what the table describes


def test_the_framing_and_the_embedded_logs_record_header_are_specs():
    assert f"| 0 | 4 | magic | `{framing.MAGIC.decode()}` ({' '.join(f'0x{b:02X}' for b in framing.MAGIC)}) |" in SPEC
    assert f"| {framing.HEADER_BYTES} | .. | body |" in SPEC and f"| end-{framing.TRAILER_BYTES} | 8 + 64 |" in SPEC
    assert f"schema version | u16, `{framing.SCHEMA_VERSION}` |" in SPEC
    magic = filelog._MAGIC
    assert filelog._HEAD.format == "<4sII" and filelog._HEAD.size == 12
    assert f"| 0 | 4 | magic | `{magic.decode()}` ({' '.join(f'0x{b:02X}' for b in magic)}) |" in SPEC
    assert "| 4 | 4 | length | u32" in SPEC and "| 8 | 4 | crc | u32" in SPEC and "| 12 | length | body |" in SPEC


def _manifest(blocks: int, rank: int, name: str, digest_version: int = 3) -> Manifest:
    mods = sorted(f"{name}.{i:03d}" for i in range(blocks))
    return Manifest("base/" + name, rank, 16.0, tuple(sorted({m.rsplit(".", 1)[0] for m in mods})),
                    tuple(BlockSpec(m, k, (rank, 70000) if k == "A" else (300, rank)) for m in mods for k in "AB"),
                    digest_version)


def _str(s: str) -> bytes:
    b = s.encode()
    n = len(b)
    return (bytes([0xA0 | n]) if n <= 31 else b"\xd9" + struct.pack(">B", n) if n < 256
            else b"\xda" + struct.pack(">H", n)) + b


def _int(i: int) -> bytes:
    return (bytes([i]) if i < 128 else b"\xcc" + struct.pack(">B", i) if i < 256 else b"\xcd" + struct.pack(">H", i)
            if i < 65536 else b"\xce" + struct.pack(">I", i) if i < 1 << 32 else b"\xcf" + struct.pack(">Q", i))


def _array(items: list) -> bytes:
    n = len(items)
    return (bytes([0x90 | n]) if n <= 15 else b"\xdc" + struct.pack(">H", n) if n < 65536
            else b"\xdd" + struct.pack(">I", n)) \
        + b"".join(items)


def spec_manifest_bytes(m: Manifest) -> bytes:
    """The manifest's bytes as SPEC.md ("Manifest") spells them out, without a msgpack library."""
    pairs = [("base_model", _str(m.base_model)), ("rank", _int(m.rank)),
             ("alpha", b"\xcb" + struct.pack(">d", m.alpha)),
             ("target_modules", _array([_str(t) for t in m.target_modules])),
             ("blocks",
              _array([bytes([0x84]) + _str("module") + _str(b.module) + _str("kind") + _str(b.kind) + _str("shape")
                                + _array([_int(x) for x in b.shape]) + _str("dtype") + _str("float32")
                      for b in m.blocks]))]
    if m.digest_version != 1:
        pairs.append(("digest_version", _int(m.digest_version)))
    return bytes([0x80 | len(pairs)]) + b"".join(_str(k) + v for k, v in pairs)


@pytest.mark.parametrize("m",
                         [_manifest(1, 8, "m", 1), _manifest(9, 200, "model.layers.with.a.long.name.past.31.bytes"),
                               _manifest(2, 70000, "x" * 300)], ids=["small-v1", "array16-u8", "str16-u32"])
def test_manifest_id_is_xxh3_128_of_the_bytes_spec_spells_out(m):
    raw = spec_manifest_bytes(m)
    assert raw == msgpack.packb(m.to_dict(), use_bin_type=True)
    assert m.manifest_id == xxhash.xxh3_128_digest(raw) == xxhash.xxh3_128(raw).intdigest().to_bytes(16, "big")


def test_the_state_digest_stream_and_its_float64_scalars_are_little_endian():
    m = _manifest(1, 2, "d", digest_version=1)
    params = [torch.arange(b.numel, dtype=torch.float32).reshape(b.shape) / 7 for b in m.blocks]
    slots, scalars = {"exp_avg": [p * 3 for p in params]}, {"t": 5.0, "beta1_pow": 0.9 ** 5}
    stream = struct.pack("<Q",
                         9) + m.manifest_id + b"adamw" + b"".join(p.numpy().astype("<f4").tobytes() for p in params)
    stream += b"exp_avg" + b"".join(p.numpy().astype("<f4").tobytes() for p in slots["exp_avg"])
    stream += b"beta1_pow" + struct.pack("<d", scalars["beta1_pow"]) + b"t" + struct.pack("<d", 5.0)
    assert state_digest(m, "adamw", 9, params, slots, scalars) == xxhash.xxh3_128_digest(stream)


def test_hilo_sum_is_seed_0_xxh3_64_as_16_hex_digits_most_significant_first():
    data = b"\x01" * 1000
    (_, _, h), = split(data, "r", "update", 1)
    assert h[H.SUM] == f"{xxhash.xxh3_64(data, seed=0).intdigest():016x}" == xxhash.xxh3_64(data).digest().hex()


@pytest.mark.parametrize("m", [_manifest(3, 8, "b"), _manifest(2, 300, "c")])
def test_the_size_bounds_are_the_formulas_spec_states(m):
    shapes = [b.shape for b in m.blocks]
    dense = sum(4 * a * b for a, b in shapes)
    topk = sum(6 * a * b + 32 for a, b in shapes)
    lowrank = sum(min(a, b) * (2 * (a + b) + 4) + 32 for a, b in shapes)
    u = max(dense, topk, lowrank) + 65536
    assert update_size_bound(m) == u
    assert framing.frame_bound(u) == 16 + u + u // 256 + 65536 + 72
    assert checkpoint_size_bound(m) == 4 * m.numel * 9 + len(spec_manifest_bytes(m)) + 65536
    assert "16 + U + floor(U / 256) + 65,536 + 72" in SPEC and "4·(sum m·n)·9 + len(manifest bytes) + 65,536" in SPEC
