"""Optimizers every replica runs identically, found by name."""
from hilo.schemas.errors import UnsupportedVersion

from .add import Add
from .adamw import AdamW
from .base import Optimizer
from .lion import Lion
from .muon import Muon
from .sgd import SGD

STEPS = {cls.name: cls for cls in (SGD, AdamW, Lion, Muon, Add)}   # every step a replica can run, by name
OPTIMIZERS = {n: cls for n, cls in STEPS.items() if not cls.applies_deltas}  # what a trainer trains with


def get_optimizer(name: str, what: str = "optimizer") -> Optimizer:
    """The optimizer registered as `name`, or UnsupportedVersion naming the known ones."""
    if name not in STEPS:
        raise UnsupportedVersion(f"{what}: unknown optimizer {name!r}; this build knows {sorted(STEPS)}")
    return STEPS[name]()
