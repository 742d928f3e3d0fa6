"""powersgd (Vogels et al. 2019): one power iteration per block at a fixed rank, warm-started Q, error feedback.

P = orthonormalise(G Q);  Q = G^T P;  G ~ P Q^T. Payload: the low-rank format of lowrank.py. The rank is
the largest uniform rank whose payload fits the byte budget, unless given. When even rank 1 on every block
is over budget (a rank-64 Qwen3-1.7B adapter at 1.6%: rank 1 alone is 1.6%), each step sends rank 1 on the
next blocks round-robin that fit, and error feedback carries the rest.
"""
import torch

from .base import BLOCK_OVERHEAD, DEFAULT_BUDGET, Budget, Encoder
from .lowrank import decode, direction_bytes, factor_payload


class PowerSGDEncoder(Encoder):
    """Uniform communication rank across blocks; Q warm start kept here, never sent."""

    name = "powersgd"
    decoder = staticmethod(decode)
    state_names = ("residual", "q", "cursor")

    def __init__(self, manifest, budget: Budget = DEFAULT_BUDGET, rank: int | None = None, seed: int = 0):
        super().__init__(manifest, budget)
        # Configuration
        self.rank = rank if rank is not None else self.rank_for_budget()
        # State: warm-start Q per block, seeded so every trainer restart begins the same way
        gen = torch.Generator().manual_seed(seed)
        self.q = [torch.randn(b.shape[1], min(self.rank, *b.shape), generator=gen) for b in manifest.blocks]
        self.cursor = 0  # next block to send when only a subset fits

    def rank_for_budget(self) -> int:
        """Largest uniform rank whose payload fits the budget (at least 1)."""
        room = self.budget.payload_bytes(self.manifest)
        per_rank = sum(direction_bytes(b.shape) for b in self.manifest.blocks)
        fixed = BLOCK_OVERHEAD * len(self.manifest.blocks)
        return max(1, (room - fixed) // per_rank)

    def params(self):
        """The rank travels for inspection; decode reads k per block."""
        return {"rank": self.rank}

    def blocks_this_step(self) -> tuple:
        """(blocks to send, next cursor): all blocks if the rank fits, else the next round-robin run whose rank-1
        payload fits."""
        specs = self.manifest.blocks
        room = self.budget.payload_bytes(self.manifest)
        if sum(self.rank * direction_bytes(b.shape) + BLOCK_OVERHEAD for b in specs) <= room:
            return list(range(len(specs))), self.cursor
        chosen, spent = [], 0
        for j in range(len(specs)):
            i = (self.cursor + j) % len(specs)
            cost = direction_bytes(specs[i].shape) + BLOCK_OVERHEAD
            if spent + cost > room:
                break
            chosen.append(i)
            spent += cost
        cursor = (self.cursor + max(1, len(chosen))) % len(specs)
        return sorted(chosen) or [cursor], cursor

    def compress(self, grads):
        """One power iteration per block sent; the new warm starts are proposed, not stored."""
        blocks, q_next = [], list(self.q)
        chosen, cursor = self.blocks_this_step()
        for i in chosen:
            g = grads[i]
            p, _ = torch.linalg.qr(g @ self.q[i])   # (m, r) orthonormal
            q = g.T @ p                             # (n, r)
            q_next[i] = q
            blocks.append(factor_payload(i, g, p, q))
        return blocks, {"q": q_next, "cursor": cursor}
