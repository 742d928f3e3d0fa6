"""Lion (Chen et al. 2023): sign of an interpolated momentum, decoupled weight decay."""
import torch

from hilo.schemas.records import MATH_VERSION

from .base import INF, Buffers, Optimizer, f32


class Lion(Optimizer):
    """c = b1*m + (1-b1)*g;  p = p*(1-lr*wd) - lr*sign(c);  m = b2*m + (1-b2)*g."""

    name = "lion"
    slots = ("exp_avg",)
    hparams = {"lr": (1e-4, 0.0, INF), "beta1": (0.9, 0.0, 1.0), "beta2": (0.99, 0.0, 1.0),
               "weight_decay": (0.0, 0.0, INF)}
    open_hi = frozenset({"beta1", "beta2"})

    def coefficients(self, scalars, h):
        """(the step's fp32 scalars, the next scalar state): shared with replica/kernels/lion.py."""
        c = {"lr": f32(h["lr"]), "decay": f32(1.0 - h["lr"] * h["weight_decay"]), "b1": f32(h["beta1"]),
             "c1": f32(1.0 - h["beta1"]),
             "b2": f32(h["beta2"]), "c2": f32(1.0 - h["beta2"])}
        return c, {"t": scalars["t"] + 1.0}

    def step(self, params, grads, slots, scalars, h, out=None, math_version=MATH_VERSION):
        """One Lion step; results written where `out` says."""
        out = out or Buffers()
        c, new_scalars = self.coefficients(scalars, h)
        lr, decay, b1, c1, b2, c2 = (c[k] for k in ("lr", "decay", "b1", "c1", "b2", "c2"))
        new_p, new_m = [], []
        for i, (p, g, m) in enumerate(zip(params, grads, slots["exp_avg"])):
            c = torch.mul(m, b1, out=out.scratch(m)).add_(torch.mul(g, c1, out=out.scratch(g, 1)))
            new_p.append(torch.mul(p, decay, out=out.param(i, p)).sub_(torch.sign(c, out=c).mul_(lr)))
            new_m.append(torch.mul(m, b2, out=out.slot("exp_avg", i, m)).add_(torch.mul(g, c2, out=out.scratch(g, 1))))
        return new_p, {"exp_avg": new_m}, new_scalars
