"""topk: the k largest-magnitude entries of the whole (error-corrected) gradient, with error feedback.

Block payload: {"i", "n", "idx": uint32 (n,) delta-coded positions in the flattened block (first absolute),
"val": fp16 (n,) values divided by "scale", "scale": fp32 max |value|}. k is the largest whose compressed payload
fits the byte budget (zstd shrinks the delta-coded indices).
"""
import torch

from hilo.schemas import fields as F
from hilo.schemas.arrays import from_bytes, to_bytes
from hilo.schemas.errors import MalformedMessage

from .base import BLOCK_OVERHEAD, Encoder, block_entries, block_what, fit_to_budget

ENTRY_BYTES = 6  # uint32 index delta + fp16 value


def decode(manifest, params, blocks, what, limits):
    """Scatter each block's values into zeros; positions must be strictly increasing and in range."""
    out = [torch.zeros(b.shape) for b in manifest.blocks]
    for i, entry in block_entries(manifest, blocks, what, require_all=False):
        bw, spec = block_what(what, manifest, i), manifest.blocks[i]
        n = F.get_int(entry, "n", bw, 1, spec.numel)
        deltas = from_bytes(F.req(entry, "idx", bw), "uint32", (n,), f"{bw} field 'idx'", limits)
        vals = from_bytes(F.req(entry, "val", bw), "float16", (n,), f"{bw} field 'val'", limits)
        scale = F.get_float(entry, "scale", bw)
        if n > 1 and int(deltas[1:].min()) < 1:
            raise MalformedMessage(f"{bw}: field 'idx' positions are not strictly increasing")
        idx = torch.cumsum(deltas, 0)
        if int(idx[-1]) >= spec.numel:
            raise MalformedMessage(f"{bw}: field 'idx' position {int(idx[-1])} >= block size {spec.numel}")
        out[i].view(-1)[idx] = torch.mul(vals, torch.tensor(scale, dtype=torch.float32))
    return out


def max_payload_bytes(manifest):
    """Every element sent."""
    return sum(ENTRY_BYTES * b.numel + BLOCK_OVERHEAD for b in manifest.blocks)


class TopKEncoder(Encoder):
    """Global top-k by magnitude across all blocks."""

    name = "topk"
    decoder = staticmethod(decode)

    def k(self, nominal: float | None = None) -> int:
        """Entries that fit `nominal` raw payload bytes (default: the budget) after per-block overhead."""
        nominal = self.budget.payload_bytes(self.manifest) if nominal is None else nominal
        room = int(nominal) - BLOCK_OVERHEAD * len(self.manifest.blocks)
        return max(1, min(self.manifest.numel, room // ENTRY_BYTES))

    def compress(self, grads):
        """Pick the global top-k, k as large as the compressed budget allows, then write each block's share."""
        flat = torch.cat([g.reshape(-1) for g in grads])
        budget = self.budget.payload_bytes(self.manifest)
        # zstd shrinks the indices by well under 3x: the 3k largest are all any fitting round can take
        order = torch.topk(flat.abs(), min(flat.numel(), 3 * self.k()), sorted=True).indices
        return fit_to_budget(lambda nominal: self._blocks(grads, order[:self.k(nominal)].sort().values), budget,
                             budget), {}

    @staticmethod
    def _blocks(grads, top):
        blocks, start = [], 0
        for i, g in enumerate(grads):
            end = start + g.numel()
            lo, hi = torch.searchsorted(top, torch.tensor([start, end]))
            idx = top[lo:hi] - start
            if len(idx):
                vals = g.reshape(-1)[idx]
                scale = float(vals.abs().max())
                if scale > 0:
                    deltas = torch.diff(idx, prepend=torch.zeros(1, dtype=idx.dtype))
                    blocks.append({"i": i, "n": len(idx), "idx": to_bytes(deltas, "uint32"),
                                   "val": to_bytes((vals / scale).to(torch.float16), "float16"), "scale": scale})
            start = end
        return blocks
