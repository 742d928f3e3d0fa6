"""AdamW (decoupled weight decay), torch.optim.AdamW semantics, bias corrections from running products."""
import math

import torch

from hilo.schemas.records import MATH_VERSION

from .base import INF, Buffers, Optimizer, f32


def sqrt(v: torch.Tensor, out: torch.Tensor, math_version: int) -> torch.Tensor:
    """sqrt(v) into `out` as arithmetic version `math_version` defines it. 2: correctly rounded on every CPU (in
    float64, then rounded once to fp32; a float32's root never lies close enough to a midpoint between floats for the
    second rounding to matter). 1: torch.sqrt (MKL's vector sqrt on CPU, off by 1-2 ulp for some inputs on its AVX-512
    and SSE4.2 paths)."""
    if math_version >= 2:
        return out.copy_(torch.sqrt(v.to(torch.float64)))
    return torch.sqrt(v, out=out)


class AdamW(Optimizer):
    """m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;  p = p*(1-lr*wd) - (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps)."""

    name = "adamw"
    slots = ("exp_avg", "exp_avg_sq")
    hparams = {"lr": (1e-3, 0.0, INF), "beta1": (0.9, 0.0, 1.0), "beta2": (0.999, 0.0, 1.0),
               "eps": (1e-8, 1e-30, INF), "weight_decay": (0.0, 0.0, INF)}
    open_hi = frozenset({"beta1", "beta2"})

    def init_scalars(self):
        """Step count and the running products beta1^t, beta2^t (float64, exact IEEE multiplies)."""
        return {"t": 0.0, "beta1_pow": 1.0, "beta2_pow": 1.0}

    def coefficients(self, scalars, h):
        """(the step's fp32 scalars, the next scalar state): shared with the fused kernel (replica/kernels/adamw.py)."""
        b1p = scalars["beta1_pow"] * h["beta1"]
        b2p = scalars["beta2_pow"] * h["beta2"]
        # sqrt: correctly rounded everywhere
        c = {"step_size": f32(h["lr"] / (1.0 - b1p)), "bc2_sqrt": f32(math.sqrt(1.0 - b2p)),
             "b1": f32(h["beta1"]), "c1": f32(1.0 - h["beta1"]), "b2": f32(h["beta2"]), "c2": f32(1.0 - h["beta2"]),
             "decay": f32(1.0 - h["lr"] * h["weight_decay"]), "eps": f32(h["eps"])}
        return c, {"t": scalars["t"] + 1.0, "beta1_pow": b1p, "beta2_pow": b2p}

    def step(self, params, grads, slots, scalars, h, out=None, math_version=MATH_VERSION):
        """One AdamW step; results written where `out` says."""
        out = out or Buffers()
        c, new_scalars = self.coefficients(scalars, h)
        step_size, bc2_sqrt, b1, c1, b2, c2, decay, eps = (c[k] for k in ("step_size", "bc2_sqrt", "b1", "c1", "b2",
                                                                          "c2", "decay", "eps"))
        new_p, new_m, new_v = [], [], []
        for i, (p, g, m, v) in enumerate(zip(params, grads, slots["exp_avg"], slots["exp_avg_sq"])):
            m = torch.mul(m, b1, out=out.slot("exp_avg", i, m)).add_(torch.mul(g, c1, out=out.scratch(g)))
            v = torch.mul(v, b2, out=out.slot("exp_avg_sq", i, v)).add_(torch.mul(g, g, out=out.scratch(g)).mul_(c2))
            denom = sqrt(v, out.scratch(v), math_version).div_(bc2_sqrt).add_(eps)
            upd = torch.div(m, denom, out=denom).mul_(step_size)
            new_p.append(torch.mul(p, decay, out=out.param(i, p)).sub_(upd))
            new_m.append(m)
            new_v.append(v)
        return new_p, {"exp_avg": new_m, "exp_avg_sq": new_v}, new_scalars
