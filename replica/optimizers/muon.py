"""Muon (Jordan et al. 2024): Nesterov momentum orthogonalised by a quintic Newton-Schulz iteration per 2-D block.

Newton-Schulz needs matrix products. Arithmetic version 3 (schemas/ARITHMETIC.md, "muon") fixes their order: every
product and the norm are elementwise fp32 products summed by one fixed pairwise tree, so a Muon run is bit-identical on
every IEEE-754 machine and in any language. Versions 1 and 2 used torch.matmul and vector_norm, whose order is the
BLAS build's and thread count's: such a log replays exactly only where replicas run the same BLAS the same way.
"""
import math

import torch

from hilo.schemas.records import MATH_VERSION

from .base import INF, Buffers, Optimizer, f32

NS_COEFFS = (3.4445, -4.7750, 2.0315)  # quintic coefficients from the Muon reference implementation
NS_STEPS = 5


def tree_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over the first axis in a fixed order: adjacent pairs (0+1, 2+3, ...) added, an odd last one carried to the
    end unchanged, repeated until one is left; each add one rounded fp32 op (ARITHMETIC.md, "muon"). The summed axis is
    the first so that each add reads whole contiguous slices."""
    while t.shape[0] > 1:
        half = t.shape[0] // 2
        pairs = torch.add(t[0:2 * half:2], t[1:2 * half:2])
        t = torch.cat([pairs, t[2 * half:]]) if t.shape[0] % 2 else pairs
    return t[0]


def matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x @ y (fp32) in a fixed order: out[i, j] = tree_sum over k of the rounded products x[i, k] * y[k, j]."""
    return tree_sum(torch.mul(x.T.contiguous().unsqueeze(2), y.unsqueeze(1)))


def norm(x: torch.Tensor) -> torch.Tensor:
    """The Frobenius norm in a fixed order: the correctly rounded sqrt of tree_sum of x*x over x in row-major order."""
    return torch.sqrt(tree_sum(torch.mul(x, x).reshape(-1)).to(torch.float64)).to(torch.float32)


def newton_schulz(g: torch.Tensor, steps: int = NS_STEPS, eps: float = 1e-7,
                  math_version: int = MATH_VERSION) -> torch.Tensor:
    """Approximate U V^T of g = U S V^T: X <- aX + (b A + c A^2) X, A = X X^T, on the wide orientation. Products and
    norm in the fixed order from arithmetic version 3; torch's (the BLAS's) before."""
    mm, nrm = (matmul, norm) if math_version >= 3 else (torch.matmul, torch.linalg.vector_norm)
    a, b, c = (f32(x) for x in NS_COEFFS)
    x = g.T if g.shape[0] > g.shape[1] else g
    x = torch.div(x, torch.add(nrm(x), f32(eps)))
    for _ in range(steps):
        A = mm(x, x.T)
        B = torch.add(torch.mul(A, b), torch.mul(mm(A, A), c))
        x = torch.add(torch.mul(x, a), mm(B, x))
    return x.T.contiguous() if g.shape[0] > g.shape[1] else x


class Muon(Optimizer):
    """buf = mu*buf + g;  u = g + mu*buf (Nesterov);  p = p*(1-lr*wd) - lr*sqrt(max(1, rows/cols))*NS(u)."""

    name = "muon"
    slots = ("momentum",)
    hparams = {"lr": (0.02, 0.0, INF), "momentum": (0.95, 0.0, 1.0), "weight_decay": (0.0, 0.0, INF)}
    open_hi = frozenset({"momentum"})

    def step(self, params, grads, slots, scalars, h, out=None, math_version=MATH_VERSION):
        """One Muon step; parameters and momentum written where `out` says (Newton-Schulz allocates its products)."""
        out = out or Buffers()
        mu, decay = f32(h["momentum"]), f32(1.0 - h["lr"] * h["weight_decay"])
        new_p, new_b = [], []
        for i, (p, g, b) in enumerate(zip(params, grads, slots["momentum"])):
            b = torch.mul(b, mu, out=out.slot("momentum", i, b)).add_(g)
            u = torch.add(g, torch.mul(b, mu, out=out.scratch(b)), out=out.scratch(b))
            scale = f32(h["lr"] * math.sqrt(max(1.0, p.shape[0] / p.shape[1])))
            new_p.append(torch.mul(p, decay,
                                   out=out.param(i, p)).sub_(newton_schulz(u, math_version=math_version).mul_(scale)))
            new_b.append(b)
        return new_p, {"momentum": new_b}, {"t": scalars["t"] + 1.0}
