"""powersgd (Vogels et al. 2019): one power iteration per block at a fixed rank, warm-started Q, error feedback.

P = orthonormalise(G Q);  Q = G^T P;  G ~ P Q^T. Payload: the low-rank format of lowrank.py. The rank is
the largest uniform rank whose payload fits the byte budget, unless given.
"""
import torch

from .base import BLOCK_OVERHEAD, Budget, Encoder, block_entries, block_what
from .lowrank import decode_block, direction_bytes, factor_payload, max_block_bytes


class PowerSGDEncoder(Encoder):
    """Uniform communication rank across blocks; Q warm start kept here, never sent."""

    name = "powersgd"

    def __init__(self, manifest, budget: Budget = Budget(), rank: int | None = None, seed: int = 0):
        super().__init__(manifest, budget)
        # Configuration
        self.rank = rank if rank is not None else self.rank_for_budget()
        # State: warm-start Q per block, seeded so every trainer restart begins the same way
        gen = torch.Generator().manual_seed(seed)
        self.q = [torch.randn(b.shape[1], min(self.rank, *b.shape), generator=gen) for b in manifest.blocks]

    def rank_for_budget(self) -> int:
        """Largest uniform rank whose payload fits the budget (at least 1)."""
        room = self.budget.payload_bytes(self.manifest)
        per_rank = sum(direction_bytes(b.shape) for b in self.manifest.blocks)
        fixed = BLOCK_OVERHEAD * len(self.manifest.blocks)
        return max(1, (room - fixed) // per_rank)

    def params(self):
        """The rank travels for inspection; decode reads k per block."""
        return {"rank": self.rank}

    def compress(self, grads):
        """One power iteration per block."""
        blocks = []
        for i, (g, q) in enumerate(zip(grads, self.q)):
            p, _ = torch.linalg.qr(g @ q)        # (m, r) orthonormal
            q = g.T @ p                          # (n, r)
            self.q[i] = q
            blocks.append(factor_payload(i, g, p, q))
        return blocks


def decode(manifest, params, blocks, what, limits):
    """Rebuild every present block from its factors; absent blocks are zero."""
    out = [None] * len(manifest.blocks)
    for i, entry in block_entries(manifest, blocks, what, require_all=False):
        out[i] = decode_block(entry, manifest.blocks[i].shape, block_what(what, manifest, i), limits)
    return [o if o is not None else torch.zeros(b.shape) for o, b in zip(out, manifest.blocks)]


def max_payload_bytes(manifest):
    """Full rank everywhere."""
    return sum(max_block_bytes(b.shape) for b in manifest.blocks)
