"""The optimizer interface and the arithmetic rules every implementation follows.

Rules (docs/design.md, "The replica contract"): inputs are never modified; elementwise, individually rounded fp32
ops only (mul, add, sub, div, sqrt, sign). No torch.optim, no addcmul/lerp/alpha= (they may fuse), no foreach or
fused kernels. Scalars are rounded to fp32 once (`f32`) before they touch a tensor; powers like beta^t
come from running products kept in the state, never from pow/exp. Results go where `Buffers` says: writing an op's
result into a given tensor (`out=`) rounds exactly as a new one would, so recycling changes no bit.
"""
import math

import torch

from hilo.schemas import fields as F
from hilo.schemas.errors import MalformedMessage
from hilo.schemas.records import MATH_VERSION


def f32(x: float) -> torch.Tensor:
    """A 0-dim fp32 tensor: the scalar operand of an fp32 op, rounded exactly once."""
    return torch.tensor(x, dtype=torch.float32)


def _fits(t, like: torch.Tensor) -> bool:
    return t is not None and t.shape == like.shape and t.dtype == like.dtype and t.is_contiguous()


class Buffers:
    """Where a step writes: the tensors of a discarded state (recycled: no adapter-sized allocation per version), or
    new ones. `scratch` is a list of flat buffers, kept by the caller across steps, that hold a block's temporaries."""

    def __init__(self, params: list | None = None, slots: dict | None = None, scratch: list | None = None):
        self._params, self._slots = params, slots or {}
        self._scratch = scratch if scratch is not None else []

    def param(self, i: int, like: torch.Tensor) -> torch.Tensor:
        """Block i's new parameters go here."""
        t = self._params[i] if self._params else None
        return t if _fits(t, like) else torch.empty_like(like, memory_format=torch.contiguous_format)

    def slot(self, name: str, i: int, like: torch.Tensor) -> torch.Tensor:
        """Block i's new optimizer slot `name` goes here."""
        ts = self._slots.get(name)
        t = ts[i] if ts else None
        return t if _fits(t, like) else torch.empty_like(like, memory_format=torch.contiguous_format)

    def scratch(self, like: torch.Tensor, k: int = 0) -> torch.Tensor:
        """A temporary shaped like `like` (the k-th, for two alive at once); valid until the next call with this k."""
        while len(self._scratch) <= k:
            self._scratch.append(torch.empty(0, dtype=torch.float32))
        if self._scratch[k].numel() < like.numel():
            self._scratch[k] = torch.empty(like.numel(), dtype=torch.float32)
        return self._scratch[k][:like.numel()].view(like.shape)


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
            raise MalformedMessage(f"{what}: unknown {self.name} hyperparameter(s) {unknown}; expected "
                                   f"{sorted(self.hparams)}")
        out = {}
        for k, (_, lo, hi) in self.hparams.items():
            v = F.get_float(h, k, f"{what} hparams")
            if not (lo <= v <= hi) or (k in self.open_hi and v == hi):
                raise MalformedMessage(f"{what}: hparams['{k}'] = {v} is outside [{lo}, "
                                       f"{hi}{')' if k in self.open_hi else ']'}")
            if not math.isfinite(float(f32(v))):  # the step uses the fp32 value: 1e39 is finite only in float64
                raise MalformedMessage(f"{what}: hparams['{k}'] = {v} is infinite as the fp32 value the step uses")
            out[k] = v
        return out

    def step(self, params: list, grads: list, slots: dict, scalars: dict, h: dict, out: Buffers | None = None,
             math_version: int = MATH_VERSION):
        """Return (new_params, new_slots, new_scalars), written where `out` says (new tensors without it); inputs are
        never modified. `math_version`: the message's arithmetic version (schemas/records.py MATH_VERSION)."""
        raise NotImplementedError


INF = math.inf
