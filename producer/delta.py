"""Delta mode's master copy: the trainer's own optimizer on its own parameters, ahead of the sites.

In gradient mode (the default) every replica runs the optimizer on the decoded gradient. In delta mode the
trainer keeps a master copy (params + optimizer state) that takes the exact, uncompressed step, and
publishes the compressed *difference* between the master and the sites' copy; sites apply it with the
stateless `add` step (replica/optimizers/add.py), so they need no optimizer state. The encoder's error
feedback makes what is sent track master - site: feeding it the master's movement each step, its residual
is exactly what the sites still lack (the lag). Propose, then commit, like the rest of the trainer.
"""
from dataclasses import dataclass

import torch

from hilo.replica.optimizers import get_optimizer
from hilo.replica.optimizers.add import Add
from hilo.schemas.errors import ConfigError

ADD = Add.name  # the sites' step in delta mode


@dataclass(frozen=True)
class MasterState:
    """One state of the master copy (proposed or committed)."""

    params: list     # fp32 tensor per block
    slots: dict      # optimizer slot name -> [fp32 tensor per block]
    scalars: dict    # optimizer scalars


class MasterCopy:
    """The trainer's master parameters and optimizer state; `propose` a step, `commit` it once published."""

    def __init__(self, params: list, optimizer: str):
        self.optimizer = get_optimizer(optimizer)
        if self.optimizer.applies_deltas:
            raise ConfigError(f"MasterCopy: {optimizer!r} is a site's step, not an optimizer to train with")
        params = [p.detach().to("cpu", torch.float32).clone() for p in params]
        self.state = MasterState(params, {s: [torch.zeros_like(p) for p in params] for s in self.optimizer.slots},
                                 self.optimizer.init_scalars())

    @property
    def params(self) -> list:
        """The master's parameters."""
        return self.state.params

    def propose(self, grads: list, hparams: dict) -> tuple:
        """(next MasterState, movement per block) for one optimizer step on `grads`; mutates nothing."""
        h = self.optimizer.check_hparams({k: float(v) for k, v in (self.optimizer.defaults() | hparams).items()},
                                         "delta mode hparams")
        s = self.state
        params, slots, scalars = self.optimizer.step(s.params, [g.detach().to("cpu", torch.float32) for g in grads],
                                                     s.slots, s.scalars, h)
        return MasterState(params, slots, scalars), [torch.sub(n, o) for n, o in zip(params, s.params)]

    def commit(self, state: MasterState) -> None:
        """Adopt a proposed state."""
        self.state = state

    def state_dict(self) -> dict:
        """Everything needed to resume the master (trainer-only: never published)."""
        return {"params": self.state.params, "slots": self.state.slots, "scalars": self.state.scalars}

    def load_state_dict(self, d: dict, what: str = "master state") -> None:
        """Restore `state_dict()` output; block shapes and slot names must match."""
        shapes = [tuple(p.shape) for p in self.state.params]
        if [tuple(p.shape)
            for p in d.get("params", [])] != shapes or set(d.get("slots", {})) != set(self.optimizer.slots):
            raise ConfigError(f"{what}: not a {self.optimizer.name} master of this adapter")
        self.state = MasterState([p.float().clone() for p in d["params"]],
                                 {k: [t.float().clone() for t in v] for k, v in d["slots"].items()}, dict(d["scalars"]))


def relative_lag(master: list, site: list) -> float:
    """||master - site|| / ||master|| over all blocks: how far the sites' policy trails the trainer's (0 = equal)."""
    num = sum(float(torch.sub(m, s).double().pow(2).sum()) for m, s in zip(master, site))
    den = sum(float(m.double().pow(2).sum()) for m in master)
    return (num / den) ** 0.5 if den > 0 else 0.0
