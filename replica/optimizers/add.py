"""add: the stateless step of a delta-mode site. The decoded payload is the parameter change itself: p = p + d.

In delta mode (producer/delta.py) the trainer runs the real optimizer on its master copy and publishes the
compressed difference between the master and the sites' copy; a site needs no optimizer state, only this add.
"""
import torch

from hilo.schemas.records import MATH_VERSION

from .base import Buffers, Optimizer


class Add(Optimizer):
    """p = p + d (one fp32 add per element: bit-identical everywhere)."""

    name = "add"
    applies_deltas = True

    def coefficients(self, scalars, h):
        """(no scalars, the next scalar state): shared with replica/kernels/add.py."""
        return {}, {"t": scalars["t"] + 1.0}

    def step(self, params, grads, slots, scalars, h, out=None, math_version=MATH_VERSION):
        """Add the decoded change; results written where `out` says."""
        out = out or Buffers()
        return [torch.add(p, d, out=out.param(i, p))
                for i, (p, d) in enumerate(zip(params, grads))], {}, self.coefficients(scalars, h)[1]
