"""spar: per-block communication rank chosen by a global worth-per-byte greedy, with error feedback.

For each block G_b (one side <= the LoRA rank) take the thin SVD through the small Gram matrix. Direction
i of block b is worth sigma_{b,i}^2 (energy kept) and costs direction_bytes(shape_b, bits). Take directions
in order of worth per byte until the byte budget is spent; within a block worth is decreasing, so each block
gets a prefix: its communication rank k_b >= 0. The training LoRA rank never changes. Payload: lowrank.py.

Two variants behind one greedy: `spar` sends fp16 factors, `spar4` 4-bit factors (about 3.9x the directions
for the same bytes; the scale of each direction is refit into s). Both are charged on the compressed size
(base.fit_to_budget). Option `floor` (spar4's CLI default 0): that share of the budget first buys one
direction for each of the blocks sent least recently, so no block goes unsent for long under AdamW-like
optimizers, where a block that never gets a gradient never moves.
"""
import torch

from hilo.schemas.errors import ConfigError

from .base import BLOCK_OVERHEAD, DEFAULT_BUDGET, Budget, Encoder, fit_to_budget
from .lowrank import FactorPrefixes, decode, direction_bytes


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
    bits = 16

    def __init__(self, manifest, budget: Budget = DEFAULT_BUDGET, floor: float = 0.0):
        super().__init__(manifest, budget)
        if not 0.0 <= floor < 1.0:
            raise ConfigError(f"{self.name}: floor is a share of the budget in [0, 1), got {floor!r}")
        self.floor = floor
        if floor:  # steps since each block was last sent: the floor serves the oldest first
            self.state_names = ("residual", "age")
            self.age = torch.zeros(len(manifest.blocks), dtype=torch.int64)

    def params(self):
        """The payload byte budget the message was cut to."""
        return {"budget": self.budget.payload_bytes(self.manifest)}

    def compress(self, grads):
        """SVD every block, pick directions greedily against the compressed size, encode each block's prefix."""
        budget = self.budget.payload_bytes(self.manifest)
        svds = [thin_svd_small_side(g) for g in grads]
        cost = [direction_bytes(g.shape, self.bits) for g in grads]
        worth, owner = [], []
        for b, (sigma, _, _) in enumerate(svds):
            worth.append(sigma.double().pow(2) / cost[b])
            owner.append(torch.full((len(sigma),), b, device=sigma.device))
        flat = torch.cat(worth)
        order = torch.argsort(flat, descending=True, stable=True)
        owner = [b for b, w in zip(torch.cat(owner)[order].tolist(), flat[order].tolist()) if w > 0]
        prefixes = [FactorPrefixes(b, g, self._factors(g, svd), min(g.shape), self.bits)
                    for b, (g, svd) in enumerate(zip(grads, svds))]

        def build(nominal):
            ranks = self._ranks(owner, cost, nominal, [svd[0] for svd in svds])
            return [prefixes[b].payload(k) for b, k in enumerate(ranks) if k > 0]

        blocks = fit_to_budget(build, budget, budget)
        ranks = [0] * len(grads)
        for e in blocks:
            ranks[e["i"]] = e["k"]
        state = {"age": torch.where(torch.tensor(ranks) > 0, 0, self.age + 1)} if self.floor else {}
        return blocks, state

    def _ranks(self, owner, cost, nominal, sigmas):
        """Communication rank per block for `nominal` raw bytes: the floor's share first, then the greedy."""
        ranks, spent = [0] * len(cost), 0
        if self.floor:
            age = self.age.tolist()
            for b in sorted(range(len(cost)), key=lambda b: (-age[b], b)):
                c = cost[b] + BLOCK_OVERHEAD
                if spent + c > self.floor * nominal:
                    break
                if float(sigmas[b][0]) > 0:
                    ranks[b], spent = 1, spent + c
        seen = [0] * len(cost)
        for b in owner:
            seen[b] += 1
            if seen[b] <= ranks[b]:
                continue  # the floor already bought this direction
            c = cost[b] + (BLOCK_OVERHEAD if ranks[b] == 0 else 0)
            if spent + c > nominal:
                continue  # a cheaper direction of another block may still fit
            ranks[b] += 1
            spent += c
        return ranks

    @staticmethod
    def _factors(g, svd):
        """K -> (U (m, K), V (n, K)): the top K singular directions of g, the big side's columns scaled by sigma."""
        sigma, vecs, wide = svd
        x = g.T if wide else g

        def top(K):
            big = x @ vecs[:, :K]
            return (vecs[:, :K], big) if wide else (big, vecs[:, :K])
        return top


class Spar4Encoder(SparEncoder):
    """spar with 4-bit factors."""

    name = "spar4"
    bits = 4
