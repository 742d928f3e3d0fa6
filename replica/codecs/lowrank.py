"""The low-rank payload format of powersgd and spar: k directions s_j * u_j v_j^T, decoded in a fixed order.

Block payload: {"i", "k", "u": fp16 (k, m), "v": fp16 (k, n), "s": fp32 (k,)}. Decode sums the rank-1
outer products j = 0..k-1 with elementwise fp32 ops (no matmul), so every IEEE-754 machine gets the same bits.
"""
import torch

from hilo.schemas import fields as F
from hilo.schemas.arrays import from_bytes, to_bytes

from .base import BLOCK_OVERHEAD, block_entries, block_what


def direction_bytes(shape) -> int:
    """Wire cost of one direction of an (m, n) block: fp16 u and v, fp32 s."""
    return 2 * (shape[0] + shape[1]) + 4


def factor_payload(i: int, g: torch.Tensor, U: torch.Tensor, V: torch.Tensor) -> dict:
    """Encode g ~ sum_j s_j u_j v_j^T from column factors U (m, k), V (n, k) of any scale.

    u and v are normalised then rounded to fp16; s_j is refit to the rounded vectors (least squares on
    each direction), so quantisation costs as little accuracy as it can.
    """
    u = torch.nn.functional.normalize(U.T, dim=1).to(torch.float16)   # (k, m)
    v = torch.nn.functional.normalize(V.T, dim=1).to(torch.float16)   # (k, n)
    uf, vf = u.float(), v.float()
    proj = torch.einsum("km,mn,kn->k", uf, g, vf)                       # u_j^T g v_j
    norms = uf.pow(2).sum(1) * vf.pow(2).sum(1)
    s = torch.where(norms > 0, proj / norms.clamp_min(1e-30), torch.zeros_like(proj))
    return {"i": i, "k": int(u.shape[0]), "u": to_bytes(u, "float16"), "v": to_bytes(v, "float16"), "s": to_bytes(s, "float32")}


def decode_block(entry: dict, shape, what: str, limits) -> torch.Tensor:
    """Rebuild one (m, n) block from its factors; lengths are checked before anything is allocated."""
    m, n = shape
    k = F.get_int(entry, "k", what, 0, min(m, n))
    u = from_bytes(F.req(entry, "u", what), "float16", (k, m), f"{what} field 'u'", limits)
    v = from_bytes(F.req(entry, "v", what), "float16", (k, n), f"{what} field 'v'", limits)
    s = from_bytes(F.req(entry, "s", what), "float32", (k,), f"{what} field 's'", limits)
    out = torch.zeros(m, n)
    for j in range(k):  # fixed order, individually rounded fp32 ops
        out.add_(torch.mul(torch.mul(u[j], s[j]).unsqueeze(1), v[j].unsqueeze(0)))
    return out


def max_block_bytes(shape) -> int:
    """Largest legitimate payload of one block (full rank)."""
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
