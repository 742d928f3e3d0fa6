"""Codecs found by name: each module has an Encoder class (trainer) and `decode` (every replica)."""
from hilo.schemas.errors import UnsupportedVersion
from hilo.schemas.limits import DEFAULT_LIMITS

from . import dense, powersgd, spar, topk
from .base import Budget, Encoder

CODECS = {
    "dense": (dense.DenseEncoder, dense),
    "topk": (topk.TopKEncoder, topk),
    "powersgd": (powersgd.PowerSGDEncoder, powersgd),
    "spar": (spar.SparEncoder, spar),
}


def _module(name, what):
    if name not in CODECS:
        raise UnsupportedVersion(f"{what}: unknown codec {name!r}; this build knows {sorted(CODECS)}")
    return CODECS[name][1]


def make_encoder(name: str, manifest, budget: Budget = Budget(), **kwargs) -> Encoder:
    """A fresh encoder (zero residual) for `manifest`."""
    _module(name, "make_encoder")
    return CODECS[name][0](manifest, budget, **kwargs)


def decode(name: str, manifest, params: dict, blocks: list, what: str, limits=DEFAULT_LIMITS) -> list:
    """Decoded fp32 gradient per manifest block; raises MalformedMessage naming the block and field."""
    return _module(name, what).decode(manifest, params, blocks, what, limits)


def update_size_bound(manifest) -> int:
    """Largest decompressed update any codec can legitimately produce for `manifest` (+ header room)."""
    return max(m.max_payload_bytes(manifest) for _, m in CODECS.values()) + (1 << 16)
