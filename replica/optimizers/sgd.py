"""SGD with momentum, torch.optim.SGD semantics (coupled weight decay, dampening 0, optional Nesterov)."""
import torch

from hilo.schemas.records import MATH_VERSION

from .base import INF, Buffers, Optimizer, f32


class SGD(Optimizer):
    """buf = mu*buf + g';  p = p - lr*(g' + mu*buf if nesterov else buf),  g' = g + wd*p."""

    name = "sgd"
    slots = ("momentum",)
    hparams = {"lr": (0.01, 0.0, INF), "momentum": (0.9, 0.0, 1.0), "weight_decay": (0.0, 0.0, INF),
               "nesterov": (0.0, 0.0, 1.0)}
    open_hi = frozenset({"momentum"})

    def coefficients(self, scalars, h):
        """(the step's fp32 scalars and switches, the next scalar state): shared with replica/kernels/sgd.py."""
        c = {"lr": f32(h["lr"]), "mu": f32(h["momentum"]), "wd": f32(h["weight_decay"]),
             "decay_on": bool(h["weight_decay"]),
             "nesterov": bool(h["nesterov"])}
        return c, {"t": scalars["t"] + 1.0}

    def step(self, params, grads, slots, scalars, h, out=None, math_version=MATH_VERSION):
        """One SGD-momentum step; results written where `out` says."""
        out = out or Buffers()
        c, new_scalars = self.coefficients(scalars, h)
        lr, mu, wd = c["lr"], c["mu"], c["wd"]
        new_p, new_b = [], []
        for i, (p, g, b) in enumerate(zip(params, grads, slots["momentum"])):
            if c["decay_on"]:
                g = torch.add(g, torch.mul(p, wd, out=out.scratch(p, 1)), out=out.scratch(p, 1))
            # zero-initialised buffer: step 1 gives b = g, like torch
            b = torch.mul(b, mu, out=out.slot("momentum", i, b)).add_(g)
            d = torch.add(g, torch.mul(b, mu, out=out.scratch(b)), out=out.scratch(b)) if c["nesterov"] else b
            new_p.append(torch.sub(p, torch.mul(d, lr, out=out.scratch(d, 2)), out=out.param(i, p)))
            new_b.append(b)
        return new_p, {"momentum": new_b}, new_scalars
