"""dense: the fp32 gradient itself. Lossless, so the trajectory equals uncompressed training ("full sync")."""
import numpy as np
import torch

from hilo.schemas import fields as F
from hilo.schemas.arrays import to_bytes, view_bytes

from .base import Encoder, block_entries, block_what


def decode(manifest, params, blocks, what, limits):
    """One fp32 tensor per block, straight from the bytes."""
    return [torch.from_numpy(g.astype(np.float32)) for g in views(manifest, params, blocks, what, limits)]


def views(manifest, params, blocks, what, limits):
    """decode's checks, in its order, leaving each gradient in the message's bytes: one read-only fp32 numpy view per
    block (what the fused apply reads, replica/kernels/apply.py)."""
    out = [None] * len(manifest.blocks)
    for i, entry in block_entries(manifest, blocks, what, require_all=True):
        bw = block_what(what, manifest, i)
        out[i] = view_bytes(F.req(entry, "g", bw), "float32", manifest.blocks[i].shape, f"{bw} field 'g'", limits)
    return out


def max_payload_bytes(manifest):
    """Upper bound on the payload this codec can legitimately produce for `manifest`."""
    return 4 * manifest.numel


class DenseEncoder(Encoder):
    """Every block as raw fp32: {"i", "g": bin (m*n*4)}."""

    name = "dense"
    lossy = False
    decoder = staticmethod(decode)
    state_names = ()

    def compress(self, grads):
        """Send everything; no residual, no state."""
        return [{"i": i, "g": to_bytes(g, "float32")} for i, g in enumerate(grads)], {}
