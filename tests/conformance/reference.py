"""A second implementation of the wire format and the arithmetic, written from schemas/SPEC.md and schemas/ARITHMETIC.md
alone: numpy, msgpack, zstandard, xxhash, zlib, hashlib, cryptography (Ed25519) and kafka-python. It imports nothing
from the product (test_conformance.py runs it in a process where `hilo` cannot be imported).

    python tests/conformance/reference.py LOG RUN [TRUSTED_KEY_HEX]

reads LOG/RUN.updates/records and LOG/RUN.checkpoints/records (or, for LOG = kafka://HOST:PORT, the topics, with
kafka-python), replays the run from its genesis and prints JSON:
{"digests": {version: hex}, "checkpoints": {version: hex}, "skipped": [...], "exact": bool}."""
import hashlib
import json
import math
import pathlib
import struct
import sys
import zlib

import msgpack
import numpy as np
import xxhash
import zstandard
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

F32 = np.float32


# ---- the embedded log ------------------------------------------------------------------------------------------------
def file_records(path: pathlib.Path):
    """(offset, key, headers, value) of every complete record of a `records` file (SPEC, "The embedded log")."""
    data, pos, offset = path.read_bytes(), 0, 0
    while pos + 12 <= len(data):
        magic, length, crc = data[pos:pos + 4], *struct.unpack_from("<II", data, pos + 4)
        body = data[pos + 12:pos + 12 + length]
        if magic != b"HREC" or len(body) < length or zlib.crc32(body) != crc:
            return  # a torn tail ends the log
        key, headers, value = msgpack.unpackb(body, raw=False)
        yield offset, key, headers, value
        pos, offset = pos + 12 + length, offset + 1


def kafka_records(bootstrap: str, topic: str):
    """(offset, key, headers, value) of every committed record of partition 0 of `topic` (kafka-python,
    read_committed)."""
    from kafka import KafkaConsumer, TopicPartition
    tp = TopicPartition(topic, 0)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False)
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end, out = consumer.end_offsets([tp])[tp], []
        while consumer.position(tp) < end:  # the end is past the last commit marker: read_committed reaches it
            for r in consumer.poll(timeout_ms=1000).get(tp, []):
                out.append((r.offset, r.key, {k: v.decode() for k, v in r.headers}, r.value))
        return out
    finally:
        consumer.close()


def topic_records(source: str, topic: str):
    """The records of `topic` in a log: a `kafka://HOST:PORT` broker or an embedded log's folder."""
    if source.startswith("kafka://"):
        return kafka_records(source[len("kafka://"):], topic)
    return file_records(pathlib.Path(source) / topic / "records")


def messages(records, run: str):
    """(offset just past the message, headers of chunk 0, framed bytes) of every whole message of `run` (SPEC, "Log
    records")."""
    parts, want, first = None, None, None
    for offset, _, h, value in records:
        if h.get("hilo-run") != run or "hilo-chunk" not in h:
            continue
        i, n = (int(x) for x in h["hilo-chunk"].split("/"))
        if i == 0:
            parts, want, first = [value], (h["hilo-sum"], n), h
        elif parts is None or (h["hilo-sum"], n) != want or len(parts) != i:
            parts = None
            continue
        else:
            parts.append(value)
        if parts is not None and len(parts) == n:
            framed = b"".join(parts)
            assert len(framed) == int(first["hilo-size"]), f"offset {offset}: size"
            assert xxhash.xxh3_64_hexdigest(framed) == first["hilo-sum"], f"offset {offset}: hilo-sum"
            yield offset + 1, first, framed
            parts = None


# ---- framing and signatures ------------------------------------------------------------------------------------------
def key_id(raw_public: bytes) -> bytes:
    """The first 8 bytes of SHA-256 of the raw public key."""
    return hashlib.sha256(raw_public).digest()[:8]


def unframe(framed: bytes, trusted: list) -> tuple:
    """(kind, body, signing key id or None); with `trusted` raw keys, an unsigned or untrusted frame raises."""
    assert framed[:4] == b"HILO", "magic"
    version, kind, flags, size = struct.unpack_from("<HBBQ", framed, 4)
    assert version == 2 and flags in (0, 1), (version, flags)
    end, kid = len(framed), None
    if flags & 1:
        end, kid, sig = len(framed) - 72, framed[-72:-64], framed[-64:]
    if trusted:
        keys = {key_id(k): k for k in trusted}
        if kid not in keys:
            raise PermissionError("unsigned" if kid is None else "other-key")
        Ed25519PublicKey.from_public_bytes(keys[kid]).verify(sig, hashlib.sha256(framed[:end]).digest())
    body = zstandard.ZstdDecompressor().decompress(framed[16:end], max_output_size=size)
    assert len(body) == size
    return kind, msgpack.unpackb(body, raw=False), kid


# ---- manifest and state digest ---------------------------------------------------------------------------------------
def manifest_id(manifest: dict) -> bytes:
    """xxh3-128 of the manifest's msgpack bytes in the table's key order."""
    keys = ["base_model", "rank", "alpha", "target_modules", "blocks"]
    keys += ["digest_version"] if manifest.get("digest_version", 1) != 1 else []
    ordered = {k: manifest[k] for k in keys}
    ordered["alpha"] = float(ordered["alpha"])
    ordered["blocks"] = [{k: b[k] for k in ("module", "kind", "shape", "dtype")} for b in manifest["blocks"]]
    return xxhash.xxh3_128_digest(msgpack.packb(ordered, use_bin_type=True))


def tensor_part(t: np.ndarray, digest_version: int) -> bytes:
    """A tensor's bytes in the state digest (SPEC, "State digest")."""
    if digest_version == 1:
        return t.tobytes()
    if digest_version == 2:
        return xxhash.xxh3_128_digest(t.tobytes())
    rows = max(1, 16384 // t.shape[1])
    return b"".join(struct.pack("<Q", xxhash.xxh3_64_intdigest(t[r:r + rows].tobytes()))
                    for r in range(0, t.shape[0], rows))


def state_digest(manifest, mid, optimizer, version, params, slot_names, slots, scalars) -> bytes:
    """The 16-byte state digest."""
    dv = manifest.get("digest_version", 1)
    h = xxhash.xxh3_128()
    h.update(struct.pack("<Q", version) + mid + optimizer.encode())
    for p in params:
        h.update(tensor_part(p, dv))
    for name in slot_names:
        h.update(name.encode())
        for t in slots[name]:
            h.update(tensor_part(t, dv))
    for name in sorted(scalars):
        h.update(name.encode() + struct.pack("<d", scalars[name]))
    return h.digest()


# ---- codecs: the fp32 gradient of each block (ARITHMETIC.md, "Decode")
# -------------------------------------------------
def tensor(buf: bytes, dtype: str, shape) -> np.ndarray:
    """A bin as a little-endian array of `shape`; its length must be exact."""
    dt = np.dtype(dtype).newbyteorder("<")
    assert len(buf) == int(np.prod(shape)) * dt.itemsize, "tensor length"
    return np.frombuffer(buf, dt).reshape(shape).astype(dt.newbyteorder("="))


def decode_topk(e, shape) -> np.ndarray:
    """Scatter fp32(val) * fp32(scale) at the cumulative positions."""
    out = np.zeros(shape[0] * shape[1], F32)
    n = e["n"]
    pos = np.cumsum(tensor(e["idx"], "uint32", (n,)).astype(np.int64))
    out[pos] = tensor(e["val"], "float16", (n,)).astype(F32) * F32(e["scale"])
    return out.reshape(shape)


def widen4(buf: bytes, k: int, cols: int) -> np.ndarray:
    """4-bit factors: two nibbles per byte, low first, value + 8."""
    b = tensor(buf, "uint8", (k, (cols + 1) // 2))
    nib = np.stack([b & 15, b >> 4], 2).reshape(k, -1)[:, :cols]
    return nib.astype(F32) - F32(8)


def decode_lowrank(e, shape) -> np.ndarray:
    """out = 0; out = out + (u_j * s_j) outer v_j for j in order, every op an fp32 rounding."""
    m, n = shape
    k, bits = e["k"], e.get("bits", 16)
    if bits == 4:
        u, v = widen4(e["u"], k, m), widen4(e["v"], k, n)
    else:
        assert bits == 16, "bits"
        u, v = tensor(e["u"], "float16", (k, m)).astype(F32), tensor(e["v"], "float16", (k, n)).astype(F32)
    s = tensor(e["s"], "float32", (k,))
    out = np.zeros((m, n), F32)
    for j in range(k):
        out = out + np.outer(u[j] * s[j], v[j])  # outer of fp32 vectors: one fp32 multiply per element
    return out


def decode(codec: str, blocks: list, manifest) -> list:
    """The fp32 gradient per manifest block (absent blocks zero)."""
    shapes = [tuple(b["shape"]) for b in manifest["blocks"]]
    out = [np.zeros(s, F32) for s in shapes]
    for e in blocks:
        i = e["i"]
        if codec == "dense":
            out[i] = tensor(e["g"], "float32", shapes[i])
        elif codec == "topk":
            out[i] = decode_topk(e, shapes[i])
        else:
            out[i] = decode_lowrank(e, shapes[i])
    return out


# ---- optimizers (ARITHMETIC.md, "Optimizers") ------------------------------------------------------------------------
SLOTS = {"sgd": ("momentum",), "adamw": ("exp_avg", "exp_avg_sq"), "lion": ("exp_avg",), "muon": ("momentum",),
         "add": ()}


def f32(x: float) -> np.float32:
    """A scalar rounded to fp32 once (round to nearest even)."""
    return F32(x)


def sgd(p, g, s, sc, h, math_version):
    lr, mu, wd = f32(h["lr"]), f32(h["momentum"]), f32(h["weight_decay"])
    if h["weight_decay"] != 0:
        g = g + p * wd
    b = s["momentum"] * mu + g
    d = g + b * mu if h["nesterov"] != 0 else b
    return p - d * lr, {"momentum": b}


def adamw_coefficients(sc, h):
    b1p, b2p = sc["beta1_pow"] * h["beta1"], sc["beta2_pow"] * h["beta2"]
    c = {"step": f32(h["lr"] / (1.0 - b1p)), "bc2": f32(math.sqrt(1.0 - b2p)), "b1": f32(h["beta1"]),
         "c1": f32(1.0 - h["beta1"]),
         "b2": f32(h["beta2"]), "c2": f32(1.0 - h["beta2"]), "decay": f32(1.0 - h["lr"] * h["weight_decay"]),
         "eps": f32(h["eps"])}
    return c, {"beta1_pow": b1p, "beta2_pow": b2p}


def adamw(p, g, s, c, h, math_version):
    if math_version < 2:
        raise NotImplementedError("math 1: AdamW's sqrt is MKL's vector sqrt (ARITHMETIC.md), not reproducible here")
    m = s["exp_avg"] * c["b1"] + g * c["c1"]
    v = s["exp_avg_sq"] * c["b2"] + (g * g) * c["c2"]
    root = np.sqrt(v.astype(np.float64)).astype(F32)  # correctly rounded
    den = root / c["bc2"] + c["eps"]
    return p * c["decay"] - (m / den) * c["step"], {"exp_avg": m, "exp_avg_sq": v}


def lion(p, g, s, sc, h, math_version):
    lr, decay = f32(h["lr"]), f32(1.0 - h["lr"] * h["weight_decay"])
    mix = s["exp_avg"] * f32(h["beta1"]) + g * f32(1.0 - h["beta1"])
    sign = np.where(mix > 0, F32(1), np.where(mix < 0, F32(-1), F32(0)))  # +0 for either zero
    return p * decay - sign * lr, {"exp_avg": s["exp_avg"] * f32(h["beta2"]) + g * f32(1.0 - h["beta2"])}


NS = (3.4445, -4.7750, 2.0315)


def tree_sum(t: np.ndarray) -> np.ndarray:
    """Sum over the last axis: adjacent pairs added, an odd last element carried, until one is left."""
    while t.shape[-1] > 1:
        half = t.shape[-1] // 2
        pairs = t[..., 0:2 * half:2] + t[..., 1:2 * half:2]
        t = np.concatenate([pairs, t[..., 2 * half:]], -1) if t.shape[-1] % 2 else pairs
    return t[..., 0]


def matmul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """out[i, j] = tree_sum over k of fp32 products x[i, k] * y[k, j]."""
    return tree_sum(x[:, None, :] * y.T[None, :, :])


def newton_schulz(u: np.ndarray, math_version: int) -> np.ndarray:
    """The quintic iteration. math 3: products and norm in the specified order; before: numpy's BLAS, which is NOT the
    order the product used then (torch's), so the result is only close."""
    a, b, c = (f32(x) for x in NS)
    if math_version >= 3:
        mm, nrm = matmul, lambda x: F32(np.sqrt(np.float64(tree_sum((x * x).reshape(-1)))))
    else:
        mm, nrm = np.matmul, lambda x: F32(np.sqrt(np.sum(x * x, dtype=F32)))
    x = u.T if u.shape[0] > u.shape[1] else u
    x = x / (nrm(x) + f32(1e-7))
    for _ in range(5):
        A = mm(x, x.T)
        x = x * a + mm(A * b + mm(A, A) * c, x)
    return np.ascontiguousarray(x.T) if u.shape[0] > u.shape[1] else x


def muon(p, g, s, sc, h, math_version):
    mu, decay = f32(h["momentum"]), f32(1.0 - h["lr"] * h["weight_decay"])
    b = s["momentum"] * mu + g
    u = g + b * mu
    scale = f32(h["lr"] * math.sqrt(max(1.0, p.shape[0] / p.shape[1])))
    return p * decay - newton_schulz(u, math_version) * scale, {"momentum": b}


def add(p, g, s, sc, h, math_version):
    return p + g, {}


STEPS = {"sgd": sgd, "adamw": adamw, "lion": lion, "muon": muon, "add": add}


def exact(optimizer: str, math_version: int) -> bool:
    """Whether this replay must match the digests: muon's products were the BLAS's before math 3."""
    return optimizer != "muon" or math_version >= 3


class Replica:
    """A replica's state (params, slots, scalars) at one version, stepped by update bodies."""

    def __init__(self, ckpt: dict):
        self.manifest, self.mid = ckpt["manifest"], manifest_id(ckpt["manifest"])
        shapes = [tuple(b["shape"]) for b in self.manifest["blocks"]]
        self.optimizer, self.version = ckpt["optimizer"], ckpt["version"]
        self.params = [tensor(b, "float32", s) for b, s in zip(ckpt["params"], shapes)]
        self.slot_names = list(ckpt["slots"])
        self.slots = {n: [tensor(b, "float32", s) for b, s in zip(ts, shapes)]
                      for n, ts in zip(ckpt["slots"], ckpt["slot_tensors"])}
        self.scalars = dict(ckpt["scalars"])
        self.digest = self.compute_digest()
        assert self.digest == ckpt["digest"], f"checkpoint v{self.version}: its digest is not that of its contents"

    def compute_digest(self) -> bytes:
        return state_digest(self.manifest, self.mid, self.optimizer, self.version, self.params, self.slot_names,
                            self.slots, self.scalars)

    def apply(self, u: dict) -> bytes:
        """Step by update `u` (its parent must be this state); returns the digest the reference computes."""
        assert u["parent_digest"] == self.digest and u["version"] == self.version + 1, f"v{u['version']}: parent"
        assert u["manifest_id"] == self.mid
        grads = decode(u["codec"], u["blocks"], self.manifest)
        h, mv = {k: float(v) for k, v in u["hparams"].items()}, u.get("math", 1)
        sc = self.scalars
        if u["optimizer"] == "adamw":
            c, powers = adamw_coefficients(sc, h)
            sc = dict(sc) | powers
        step = STEPS[u["optimizer"]]
        params, slots = [], {n: [] for n in self.slot_names}
        for i, (p, g) in enumerate(zip(self.params, grads)):
            np_, ns = step(p, g, {n: self.slots[n][i] for n in self.slot_names}, c if u["optimizer"] == "adamw" else sc,
                           h, mv)
            params.append(np_.astype(F32))
            for n in self.slot_names:
                slots[n].append(ns[n].astype(F32))
        self.params, self.slots, self.version = params, slots, u["version"]
        self.scalars = dict(sc) | {"t": sc["t"] + 1.0}
        self.digest = self.compute_digest()
        return self.digest


def replay(log: str, run: str, trusted_hex: str | None = None) -> dict:
    """Every checkpoint's digest (checked against its contents) and every update's digest as replayed from genesis."""
    trusted = [bytes.fromhex(trusted_hex)] if trusted_hex else []
    ckpts, result = {}, {"digests": {}, "checkpoints": {}, "skipped": [], "exact": True}
    updates = list(messages(topic_records(log, f"{run}.updates"), run))
    known = list(trusted)
    for _, _, framed in updates:  # the keys a checkpoint may be signed by: the trusted one and those it rotated to
        kind, body, _ = unframe(framed, known)
        if kind == 3:
            known.append(body["public_key"])
    for _, _, framed in messages(topic_records(log, f"{run}.checkpoints"), run):
        kind, body, _ = unframe(framed, known)
        assert kind == 2
        ckpts[body["version"]] = body
        result["checkpoints"][str(body["version"])] = Replica(body).digest.hex()
    start = ckpts[min(ckpts)]  # the genesis, or the oldest a topic that deletes old checkpoints (Kafka) still holds
    if start["version"] == 0:
        assert start["genesis"] == (xxhash.xxh3_128_digest(start["digest"] + start["nonce"]) if "nonce" in start
                                    else start["digest"])
    replica, trusted_now = Replica(start), list(trusted)
    for offset, _, framed in updates:
        try:
            kind, body, _ = unframe(framed, trusted_now)
        except PermissionError as e:
            result["skipped"].append([offset, str(e)])
            continue
        if kind == 3:  # a rotation the trusted key signed: the new key signs from_version on
            trusted_now = [body["public_key"]] if trusted_now else []
            continue
        assert kind == 1 and body["run"] == run
        if body["version"] <= replica.version:
            continue
        mine = replica.apply(body)
        is_exact = exact(body["optimizer"], body.get("math", 1))
        result["exact"] &= is_exact
        result["digests"][str(body["version"])] = mine.hex()
        if is_exact:
            assert mine == body["digest"], (f"v{body['version']}: replayed digest {mine.hex()} != promised "
                                            f"{body['digest'].hex()}")
        elif mine != body["digest"]:  # muon: keep going from the promised state (close, not equal)
            replica.digest = body["digest"]
        if body["version"] in ckpts and is_exact:
            assert mine == ckpts[body["version"]]["digest"], f"v{body['version']}: replay differs from the checkpoint"
        elif body["version"] in ckpts:  # how far muon's replay is from the trainer's state, relative to the params
            theirs = Replica(ckpts[body["version"]]).params
            diff = max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) for a, b in zip(replica.params, theirs))
            result["max_rel_diff"] = max(result.get("max_rel_diff", 0.0), diff)
    return result


if __name__ == "__main__":
    print(json.dumps(replay(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)))
