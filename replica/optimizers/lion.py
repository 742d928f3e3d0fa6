"""Lion (Chen et al. 2023): sign of an interpolated momentum, decoupled weight decay."""
import torch

from .base import INF, Optimizer, f32


class Lion(Optimizer):
    """c = b1*m + (1-b1)*g;  p = p*(1-lr*wd) - lr*sign(c);  m = b2*m + (1-b2)*g."""

    name = "lion"
    slots = ("exp_avg",)
    hparams = {"lr": (1e-4, 0.0, INF), "beta1": (0.9, 0.0, 1.0), "beta2": (0.99, 0.0, 1.0), "weight_decay": (0.0, 0.0, INF)}
    open_hi = frozenset({"beta1", "beta2"})

    def step(self, params, grads, slots, scalars, h):
        """One Lion step, out of place."""
        lr, decay = f32(h["lr"]), f32(1.0 - h["lr"] * h["weight_decay"])
        b1, c1, b2, c2 = f32(h["beta1"]), f32(1.0 - h["beta1"]), f32(h["beta2"]), f32(1.0 - h["beta2"])
        new_p, new_m = [], []
        for p, g, m in zip(params, grads, slots["exp_avg"]):
            c = torch.mul(m, b1).add_(torch.mul(g, c1))
            new_p.append(torch.mul(p, decay).sub_(torch.sign(c).mul_(lr)))
            new_m.append(torch.mul(m, b2).add_(torch.mul(g, c2)))
        return new_p, {"exp_avg": new_m}, {"t": scalars["t"] + 1.0}
