"""The low-rank payload format of powersgd, spar and spar4: k directions s_j * u_j v_j^T, decoded in a fixed order.

Block payload: {"i", "k", "u", "v", "s": fp32 (k,)} with the factors in one of two encodings, named by "bits":
- 16 (the field absent): "u" fp16 (k, m), "v" fp16 (k, n): unit vectors rounded to fp16;
- 4: "u" uint8 (k, ceil(m/2)), "v" uint8 (k, ceil(n/2)): signed integers -8..7 stored as two nibbles per byte
  (value + 8, low nibble first, a row of odd length padded). The scale of each direction lives in s_j alone.
Decode sums the rank-1 outer products j = 0..k-1 with elementwise fp32 ops (no matmul), so every IEEE-754
machine gets the same bits. The encoder refits s to the rounded vectors, so rounding costs as little as it can.
"""
import torch

from hilo.schemas import fields as F
from hilo.schemas.arrays import from_bytes, to_bytes
from hilo.schemas.errors import MalformedMessage

from .base import BLOCK_OVERHEAD, block_entries, block_what

BITS = (16, 4)   # the factor encodings, densest last
INT4_MAX = 7     # the encoder rounds to -7..7 (symmetric); decode accepts -8 too


def direction_bytes(shape, bits: int = 16) -> int:
    """Wire cost of one direction of an (m, n) block, before zstd: u and v at `bits`, fp32 s."""
    m, n = shape
    return (2 * (m + n) if bits == 16 else (m + 1) // 2 + (n + 1) // 2) + 4


def pack_int4(q: torch.Tensor) -> bytes:
    """(k, m) integers in -8..7 -> k rows of ceil(m/2) bytes, two nibbles each (value + 8, low first)."""
    k, m = q.shape
    nib = (q.to(torch.int64) + 8).to(torch.uint8)
    if m % 2:
        nib = torch.cat([nib, torch.full((k, 1), 8, dtype=torch.uint8)], 1)
    return to_bytes(nib[:, 0::2] | (nib[:, 1::2] << 4), "uint8")


def unpack_int4(buf, k: int, m: int, what: str, limits) -> torch.Tensor:
    """Inverse of pack_int4, as fp32 (k, m) (small integers: exact)."""
    b = from_bytes(buf, "uint8", (k, (m + 1) // 2), what, limits)
    nib = torch.stack([b % 16, b // 16], 2).reshape(k, -1)[:, :m]
    return (nib - 8).to(torch.float32)


def refit_scales(u: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """s minimising ||g - sum_j s_j u_j v_j^T|| for the rounded (k, m) u and (k, n) v, jointly (float64 least squares):
    rounded directions are no longer orthogonal, so fitting each on its own would double-count their overlap."""
    ud, vd, gd = u.double(), v.double(), g.double()
    gram = (ud @ ud.T) * (vd @ vd.T)                                   # <u_i v_i^T, u_j v_j^T>
    rhs = torch.einsum("km,mn,kn->k", ud, gd, vd)                      # <g, u_j v_j^T>
    if not len(rhs):
        return torch.zeros(0)
    s = torch.linalg.lstsq(gram, rhs.unsqueeze(1), driver="gelsd").solution.squeeze(1)
    return s.float()


def factor_payload(i: int, g: torch.Tensor, U: torch.Tensor, V: torch.Tensor, bits: int = 16) -> dict:
    """Encode g ~ sum_j s_j u_j v_j^T from column factors U (m, k), V (n, k) of any scale, at `bits`.

    16: u and v normalised then rounded to fp16, s_j refit to each rounded direction (least squares on it).
    4: each direction's u and v scaled so their largest entry is INT4_MAX, rounded to integers; s refit jointly.
    """
    u = torch.nn.functional.normalize(U.T, dim=1)   # (k, m)
    v = torch.nn.functional.normalize(V.T, dim=1)   # (k, n)
    if bits == 4:
        qu = torch.round(u * (INT4_MAX / u.abs().amax(1, keepdim=True).clamp_min(1e-30))).clamp(-INT4_MAX, INT4_MAX)
        qv = torch.round(v * (INT4_MAX / v.abs().amax(1, keepdim=True).clamp_min(1e-30))).clamp(-INT4_MAX, INT4_MAX)
        s = refit_scales(qu, qv, g)
        return {"i": i, "k": int(qu.shape[0]), "bits": 4, "u": pack_int4(qu), "v": pack_int4(qv), "s": to_bytes(s, "float32")}
    u, v = u.to(torch.float16), v.to(torch.float16)
    uf, vf = u.float(), v.float()
    proj = torch.einsum("km,mn,kn->k", uf, g, vf)                       # u_j^T g v_j
    norms = uf.pow(2).sum(1) * vf.pow(2).sum(1)
    s = torch.where(norms > 0, proj / norms.clamp_min(1e-30), torch.zeros_like(proj))
    return {"i": i, "k": int(u.shape[0]), "u": to_bytes(u, "float16"), "v": to_bytes(v, "float16"), "s": to_bytes(s, "float32")}


def decode_block(entry: dict, shape, what: str, limits) -> torch.Tensor:
    """Rebuild one (m, n) block from its factors; lengths are checked before anything is allocated."""
    m, n = shape
    k = F.get_int(entry, "k", what, 0, min(m, n))
    bits = F.get_int(entry, "bits", what, 0) if "bits" in entry else 16
    if bits not in BITS:
        raise MalformedMessage(f"{what}: field 'bits' is {bits}, expected one of {list(BITS)}")
    if bits == 4:
        u = unpack_int4(F.req(entry, "u", what), k, m, f"{what} field 'u'", limits)
        v = unpack_int4(F.req(entry, "v", what), k, n, f"{what} field 'v'", limits)
    else:
        u = from_bytes(F.req(entry, "u", what), "float16", (k, m), f"{what} field 'u'", limits)
        v = from_bytes(F.req(entry, "v", what), "float16", (k, n), f"{what} field 'v'", limits)
    s = from_bytes(F.req(entry, "s", what), "float32", (k,), f"{what} field 's'", limits)
    out = torch.zeros(m, n)
    for j in range(k):  # fixed order, individually rounded fp32 ops
        out.add_(torch.mul(torch.mul(u[j], s[j]).unsqueeze(1), v[j].unsqueeze(0)))
    return out


def max_block_bytes(shape) -> int:
    """Largest legitimate payload of one block (full rank, fp16)."""
    return min(shape) * direction_bytes(shape) + BLOCK_OVERHEAD


def decode(manifest, params, blocks, what, limits):
    """Rebuild every present block from its factors; absent blocks are zero."""
    out = [None] * len(manifest.blocks)
    for i, entry in block_entries(manifest, blocks, what, require_all=False):
        out[i] = decode_block(entry, manifest.blocks[i].shape, block_what(what, manifest, i), limits)
    return [o if o is not None else torch.zeros(b.shape) for o, b in zip(out, manifest.blocks)]


def max_payload_bytes(manifest):
    """Full rank everywhere."""
    return sum(max_block_bytes(b.shape) for b in manifest.blocks)
