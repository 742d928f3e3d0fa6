"""spar: per-block communication rank chosen by a global worth-per-byte greedy, with error feedback.

For each block G_b (one side <= the LoRA rank) take the thin SVD through the small Gram matrix. Direction
i of block b is worth sigma_{b,i}^2 (energy kept) and costs direction_bytes(shape_b). Take directions in
order of worth per byte until the byte budget is spent; within a block worth is decreasing, so each block
gets a prefix: its communication rank k_b >= 0. The training LoRA rank never changes. Payload: lowrank.py.
"""
import torch

from .base import BLOCK_OVERHEAD, Encoder, payload_size
from .lowrank import decode, direction_bytes, factor_payload


def thin_svd_small_side(g: torch.Tensor):
    """(sigma desc, V (n, r)) of g (m, n) through the Gram matrix of its smaller side; U = g V / sigma."""
    wide = g.shape[0] < g.shape[1]
    x = g.T if wide else g                         # (big, small)
    gram = (x.T @ x).double()                      # (small, small)
    evals, evecs = torch.linalg.eigh(gram)         # ascending
    sigma = evals.clamp_min(0).sqrt().flip(0).float()
    vecs = evecs.flip(1).float()                   # (small, small), columns = right singular vectors of x
    return sigma, vecs, wide


class SparEncoder(Encoder):
    """Global byte budget split across blocks by worth per byte."""

    name = "spar"
    decoder = staticmethod(decode)

    def params(self):
        """The payload byte budget the message was cut to."""
        return {"budget": self.budget.payload_bytes(self.manifest)}

    def compress(self, grads):
        """SVD every block, pick directions greedily, encode each block's prefix."""
        budget = self.budget.payload_bytes(self.manifest)
        svds = [thin_svd_small_side(g) for g in grads]
        worth, owner = [], []
        for b, (sigma, _, _) in enumerate(svds):
            worth.append(sigma.double().pow(2) / direction_bytes(grads[b].shape))
            owner.append(torch.full((len(sigma),), b))
        order = torch.argsort(torch.cat(worth), descending=True, stable=True)
        owner = torch.cat(owner)[order].tolist()
        ranks, spent = [0] * len(grads), 0
        for b in owner:
            cost = direction_bytes(grads[b].shape) + (BLOCK_OVERHEAD if ranks[b] == 0 else 0)
            if spent + cost > budget:
                continue  # a cheaper direction of another block may still fit
            ranks[b] += 1
            spent += cost
        blocks = [self._block(b, grads[b], svds[b], k) for b, k in enumerate(ranks) if k > 0]
        while blocks and payload_size(blocks) > budget:  # overhead estimate was short: drop the last directions
            blocks.sort(key=lambda e: e["i"])
            worst = min(range(len(blocks)), key=lambda j: float(svds[blocks[j]["i"]][0][blocks[j]["k"] - 1]) ** 2 / direction_bytes(grads[blocks[j]["i"]].shape))
            b, k = blocks[worst]["i"], blocks[worst]["k"] - 1
            blocks[worst:worst + 1] = [self._block(b, grads[b], svds[b], k)] if k else []
        return blocks, {}

    @staticmethod
    def _block(b, g, svd, k):
        sigma, vecs, wide = svd
        v_small = vecs[:, :k]                              # (small, k)
        u_big = (g.T if wide else g) @ v_small             # (big, k), columns scaled by sigma
        U, V = (v_small, u_big) if wide else (u_big, v_small)
        return factor_payload(b, g, U, V)
