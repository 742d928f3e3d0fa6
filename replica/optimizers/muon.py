"""Muon (Jordan et al. 2024): Nesterov momentum orthogonalised by a quintic Newton-Schulz iteration per 2-D block.

Newton-Schulz needs matrix products, so Muon is bit-identical only where replicas run identical matmul
kernels (same library, same thread count); the digest chain is what detects a mismatch.
"""
import math

import torch

from hilo.schemas.records import MATH_VERSION

from .base import INF, Buffers, Optimizer, f32

NS_COEFFS = (3.4445, -4.7750, 2.0315)  # quintic coefficients from the Muon reference implementation
NS_STEPS = 5


def newton_schulz(g: torch.Tensor, steps: int = NS_STEPS, eps: float = 1e-7) -> torch.Tensor:
    """Approximate U V^T of g = U S V^T: X <- aX + (b A + c A^2) X, A = X X^T, on the wide orientation."""
    a, b, c = (f32(x) for x in NS_COEFFS)
    x = g.T if g.shape[0] > g.shape[1] else g
    x = torch.div(x, torch.add(torch.linalg.vector_norm(x), f32(eps)))
    for _ in range(steps):
        A = torch.matmul(x, x.T)
        B = torch.add(torch.mul(A, b), torch.mul(torch.matmul(A, A), c))
        x = torch.add(torch.mul(x, a), torch.matmul(B, x))
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
            new_p.append(torch.mul(p, decay, out=out.param(i, p)).sub_(newton_schulz(u).mul_(scale)))
            new_b.append(b)
        return new_p, {"momentum": new_b}, {"t": scalars["t"] + 1.0}
