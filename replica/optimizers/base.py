"""The optimizer interface and the arithmetic rules every implementation follows.

Rules (docs/design.md, "The replica contract"): out-of-place, elementwise, individually rounded fp32 ops only
(mul, add, sub, div, sqrt, sign). No torch.optim, no addcmul/lerp/alpha= (they may fuse), no foreach or
fused kernels. Scalars are rounded to fp32 once (`f32`) before they touch a tensor; powers like beta^t
come from running products kept in the state, never from pow/exp.
"""
import math

import torch

from hilo.schemas import fields as F
from hilo.schemas.errors import MalformedMessage


def f32(x: float) -> torch.Tensor:
    """A 0-dim fp32 tensor: the scalar operand of an fp32 op, rounded exactly once."""
    return torch.tensor(x, dtype=torch.float32)


class Optimizer:
    """One optimizer: its per-block slots, scalar state, hyperparameters and the step itself."""

    name: str = ""
    slots: tuple = ()                 # per-block state tensors, zero at genesis
    hparams: dict = {}                # name -> (default, lo, hi) ; hi exclusive when `open_hi`
    open_hi: frozenset = frozenset()  # hyperparameters whose upper bound is exclusive (betas < 1)
    applies_deltas: bool = False      # True for a delta-mode site's step: not an optimizer a trainer trains with

    def init_scalars(self) -> dict:
        """Scalar state at genesis."""
        return {"t": 0.0}

    def defaults(self) -> dict:
        """Default hyperparameters (the trainer overrides lr per step from its schedule)."""
        return {k: d for k, (d, lo, hi) in self.hparams.items()}

    def check_hparams(self, h: dict, what: str) -> dict:
        """Exactly the declared names, each finite and in range; raises naming the field."""
        unknown = sorted(set(h) - set(self.hparams))
        if unknown:
            raise MalformedMessage(f"{what}: unknown {self.name} hyperparameter(s) {unknown}; expected {sorted(self.hparams)}")
        out = {}
        for k, (_, lo, hi) in self.hparams.items():
            v = F.get_float(h, k, f"{what} hparams")
            if not (lo <= v <= hi) or (k in self.open_hi and v == hi):
                raise MalformedMessage(f"{what}: hparams['{k}'] = {v} is outside [{lo}, {hi}{')' if k in self.open_hi else ']'}")
            if not math.isfinite(float(f32(v))):  # the step uses the fp32 value: 1e39 is finite only in float64
                raise MalformedMessage(f"{what}: hparams['{k}'] = {v} is infinite as the fp32 value the step uses")
            out[k] = v
        return out

    def step(self, params: list, grads: list, slots: dict, scalars: dict, h: dict):
        """Return (new_params, new_slots, new_scalars); inputs are never modified."""
        raise NotImplementedError


INF = math.inf
