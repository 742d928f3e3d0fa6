"""Optimizers every replica runs identically, found by name."""
from hilo.schemas.errors import UnsupportedVersion

from .adamw import AdamW
from .base import Optimizer
from .lion import Lion
from .muon import Muon
from .sgd import SGD

OPTIMIZERS = {cls.name: cls for cls in (SGD, AdamW, Lion, Muon)}


def get_optimizer(name: str, what: str = "optimizer") -> Optimizer:
    """The optimizer registered as `name`, or UnsupportedVersion naming the known ones."""
    if name not in OPTIMIZERS:
        raise UnsupportedVersion(f"{what}: unknown optimizer {name!r}; this build knows {sorted(OPTIMIZERS)}")
    return OPTIMIZERS[name]()
