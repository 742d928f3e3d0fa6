"""The low-rank payload format of powersgd, spar and spar4: k directions s_j * u_j v_j^T, decoded in a fixed order.

Block payload: {"i", "k", "u", "v", "s": fp32 (k,)} with the factors in one of two encodings, named by "bits":
- 16 (the field absent): "u" fp16 (k, m), "v" fp16 (k, n): unit vectors rounded to fp16;
- 4: "u" uint8 (k, ceil(m/2)), "v" uint8 (k, ceil(n/2)): signed integers -8..7 stored as two nibbles per byte
  (value + 8, low nibble first, a row of odd length padded). The scale of each direction lives in s_j alone.
Decode sums the rank-1 outer products j = 0..k-1 with elementwise fp32 ops (no matmul), so every IEEE-754
machine gets the same bits. The encoder refits s to the rounded vectors, so rounding costs as little as it can.
"""
import numpy as np
import torch

from hilo.schemas import fields as F
from hilo.schemas.arrays import to_bytes, view_bytes
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


# byte -> (low nibble - 8, high nibble - 8) as fp32: one table lookup per byte instead of int64 arithmetic
NIBBLES = np.stack([np.arange(256) % 16, np.arange(256) // 16], 1).astype(np.float32) - 8


def unpack_int4(buf, k: int, m: int, what: str, limits) -> torch.Tensor:
    """Inverse of pack_int4, as fp32 (k, m) (small integers: exact)."""
    return widen(view_bytes(buf, "uint8", (k, (m + 1) // 2), what, limits), 4, m)


def refit_scales(gram: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """s minimising ||g - sum_j s_j u_j v_j^T|| given gram_ij = <u_i v_i^T, u_j v_j^T> and rhs_j = <g, u_j v_j^T>
    (float64 least squares): rounded directions are no longer orthogonal, so fitting each on its own would
    double-count their overlap."""
    if not len(rhs):
        return torch.zeros(0)
    # on the CPU whatever the encoder's device (k x k at most 64 x 64): CUDA's lstsq has only the full-rank driver
    return torch.linalg.lstsq(gram.cpu(), rhs.cpu().unsqueeze(1), driver="gelsd").solution.squeeze(1).float()


class FactorPrefixes:
    """Payloads of block i, g ~ the first k directions of factors(K) -> (U (m, K), V (n, K)), for any k.

    spar's budget fit tries several ranks per block. Each direction is rounded on its own, and the joint refit
    of s for a prefix needs only the leading k x k corner of one Gram matrix, so the directions are rounded
    and packed once for a prefix of K and every k <= K slices them (K doubles when a larger k is asked for).
    16 bits: u and v normalised then rounded to fp16, s_j fit to each rounded direction alone.
    4 bits: each direction's u and v scaled so their largest entry is INT4_MAX, rounded; s refit jointly.
    """

    def __init__(self, i: int, g: torch.Tensor, factors, rank: int, bits: int = 16):
        self.i, self.g, self.factors, self.rank, self.bits = i, g, factors, rank, bits
        self.K = 0
        self.made = {}  # k -> payload, from the current rounding (the budget fit asks for the same k again and again)

    def payload(self, k: int) -> dict:
        """The block's payload map with its first k directions."""
        if k > self.K or not self.K:
            self._round(min(self.rank, max(4, 2 * k)))
        if k not in self.made:
            rows = slice(0, k * self.row_u), slice(0, k * self.row_v)
            if self.bits == 4:
                s = refit_scales(self.gram[:k, :k], self.rhs[:k])
                self.made[k] = {"i": self.i, "k": k, "bits": 4, "u": self.u[rows[0]], "v": self.v[rows[1]],
                                "s": to_bytes(s, "float32")}
            else:
                self.made[k] = {"i": self.i, "k": k, "u": self.u[rows[0]], "v": self.v[rows[1]], "s": self.s[: 4 * k]}
        return self.made[k]

    def _round(self, K: int):
        U, V = self.factors(K)
        u = torch.nn.functional.normalize(U.T, dim=1)   # (K, m)
        v = torch.nn.functional.normalize(V.T, dim=1)   # (K, n)
        m, n = u.shape[1], v.shape[1]
        if self.bits == 4:
            qu = torch.round(u * (INT4_MAX / u.abs().amax(1, keepdim=True).clamp_min(1e-30))).clamp(-INT4_MAX, INT4_MAX)
            qv = torch.round(v * (INT4_MAX / v.abs().amax(1, keepdim=True).clamp_min(1e-30))).clamp(-INT4_MAX, INT4_MAX)
            # integers <= 7: each Gram factor is exact in fp32 (sums < 2^24 for m < 342k), their product is not
            self.gram = (qu @ qu.T).double() * (qv @ qv.T).double()
            self.rhs = ((qu @ self.g) * qv).sum(1, dtype=torch.float64)
            self.u, self.v, self.row_u, self.row_v = pack_int4(qu), pack_int4(qv), (m + 1) // 2, (n + 1) // 2
        else:
            u, v = u.to(torch.float16), v.to(torch.float16)
            uf, vf = u.float(), v.float()
            proj = ((uf @ self.g) * vf).sum(1)                               # u_j^T g v_j
            norms = uf.pow(2).sum(1) * vf.pow(2).sum(1)
            s = torch.where(norms > 0, proj / norms.clamp_min(1e-30), torch.zeros_like(proj))
            self.u, self.v, self.s = to_bytes(u, "float16"), to_bytes(v, "float16"), to_bytes(s, "float32")
            self.row_u, self.row_v = 2 * m, 2 * n
        self.K, self.made = K, {}


def factor_payload(i: int, g: torch.Tensor, U: torch.Tensor, V: torch.Tensor, bits: int = 16) -> dict:
    """Encode g ~ sum_j s_j u_j v_j^T from column factors U (m, k), V (n, k) of any scale, at `bits`."""
    k = U.shape[1]
    return FactorPrefixes(i, g, lambda K: (U[:, :K], V[:, :K]), k, bits).payload(k)


def block_payload(entry: dict, shape, what: str, limits) -> tuple:
    """(k, bits, u, v, s) of one block's payload, every field checked, left in the message's bytes: u (k, ceil(m/2)) and
    v uint8 for 4 bits, (k, m) and (k, n) fp16 for 16; s (k,) fp32. The fused apply (replica/kernels/apply.py) widens
    them itself."""
    m, n = shape
    k = F.get_int(entry, "k", what, 0, min(m, n))
    bits = F.get_int(entry, "bits", what, 0) if "bits" in entry else 16
    if bits not in BITS:
        raise MalformedMessage(f"{what}: field 'bits' is {bits}, expected one of {list(BITS)}")
    if bits == 4:
        u = view_bytes(F.req(entry, "u", what), "uint8", (k, (m + 1) // 2), f"{what} field 'u'", limits)
        v = view_bytes(F.req(entry, "v", what), "uint8", (k, (n + 1) // 2), f"{what} field 'v'", limits)
    else:
        u = view_bytes(F.req(entry, "u", what), "float16", (k, m), f"{what} field 'u'", limits)
        v = view_bytes(F.req(entry, "v", what), "float16", (k, n), f"{what} field 'v'", limits)
    s = view_bytes(F.req(entry, "s", what), "float32", (k,), f"{what} field 's'", limits)
    return k, bits, u, v, s


def widen(raw: np.ndarray, bits: int, cols: int) -> torch.Tensor:
    """A factor from block_payload as fp32 (rows, cols): 4-bit nibbles to -8..7, fp16 widened (both exact)."""
    if bits == 4:
        return torch.from_numpy(np.ascontiguousarray(NIBBLES[raw].reshape(raw.shape[0], 2 * raw.shape[1])[:, :cols]))
    return torch.from_numpy(raw.astype(np.float32))


def block_factors(entry: dict, shape, what: str, limits) -> tuple:
    """(k, bits, u (k, m), v (k, n), s (k,)) of one block's payload, every field checked, as fp32 tensors."""
    k, bits, u, v, s = block_payload(entry, shape, what, limits)
    return k, bits, widen(u, bits, shape[0]), widen(v, bits, shape[1]), torch.from_numpy(s.astype(np.float32))


def decode_block(entry: dict, shape, what: str, limits, scratch: list | None = None) -> torch.Tensor:
    """Rebuild one (m, n) block from its factors; lengths are checked before anything is allocated. `scratch`: a
    one-item list holding a flat buffer reused for each rank-1 term (grown as needed), instead of a new (m, n) each."""
    m, n = shape
    k, bits, u, v, s = block_factors(entry, shape, what, limits)
    out = torch.zeros(m, n)
    if k:
        scratch = scratch if scratch is not None else [torch.empty(0)]
        if scratch[0].numel() < m * n:
            scratch[0] = torch.empty(m * n)
        term = scratch[0][:m * n].view(m, n)
    for j in range(k):  # fixed order, individually rounded fp32 ops (a result written into `term` rounds the same)
        out.add_(torch.mul(torch.mul(u[j], s[j]).unsqueeze(1), v[j].unsqueeze(0), out=term))
    return out


def max_block_bytes(shape) -> int:
    """Largest legitimate payload of one block (full rank, fp16)."""
    return min(shape) * direction_bytes(shape) + BLOCK_OVERHEAD


def decode(manifest, params, blocks, what, limits):
    """Rebuild every present block from its factors; absent blocks are zero."""
    out, scratch = [None] * len(manifest.blocks), [torch.empty(0)]
    for i, entry in block_entries(manifest, blocks, what, require_all=False):
        out[i] = decode_block(entry, manifest.blocks[i].shape, block_what(what, manifest, i), limits, scratch)
    return [o if o is not None else torch.zeros(b.shape) for o, b in zip(out, manifest.blocks)]


def max_payload_bytes(manifest):
    """Full rank everywhere."""
    return sum(max_block_bytes(b.shape) for b in manifest.blocks)
