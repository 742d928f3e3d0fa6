"""The codec registry: a table of small records (name, encoder class, decode, max payload), found by name.

Each codec module holds its Encoder class (trainer side) and its `decode` (every replica); low-rank payloads
(powersgd, spar, spar4) share the format in lowrank.py. The CLI's --codec choices and the tests read this table.
"""
from dataclasses import dataclass
from collections.abc import Callable

from hilo.schemas.errors import UnsupportedVersion
from hilo.schemas.limits import DEFAULT_LIMITS

from . import dense, lowrank, powersgd, spar, topk
from .base import Encoder  # noqa: F401  (re-exported: the codec interface)
from .budget import DEFAULT_BUDGET, AutoBudget, Budget, parse_budget  # noqa: F401  (re-exported: the budget kinds)


@dataclass(frozen=True)
class Codec:
    """One registered codec."""

    name: str
    encoder: type                      # Encoder subclass: (manifest, budget, **kwargs) -> stateful encoder
    decode: Callable                   # (manifest, codec_params, blocks, what, limits) -> [fp32 tensor per block]
    max_payload_bytes: Callable        # (manifest) -> largest legitimate payload, bytes

    @property
    def lossy(self) -> bool:
        """Whether the encoder keeps an error-feedback residual."""
        return self.encoder.lossy


CODECS = {c.name: c for c in (
    Codec("dense", dense.DenseEncoder, dense.decode, dense.max_payload_bytes),
    Codec("topk", topk.TopKEncoder, topk.decode, topk.max_payload_bytes),
    Codec("powersgd", powersgd.PowerSGDEncoder, lowrank.decode, lowrank.max_payload_bytes),
    Codec("spar", spar.SparEncoder, lowrank.decode, lowrank.max_payload_bytes),
    Codec("spar4", spar.Spar4Encoder, lowrank.decode, lowrank.max_payload_bytes),
)}


def get_codec(name: str, what: str = "codec") -> Codec:
    """The codec registered as `name`, or UnsupportedVersion naming the known ones."""
    if name not in CODECS:
        raise UnsupportedVersion(f"{what}: unknown codec {name!r}; this build knows {sorted(CODECS)}")
    return CODECS[name]


def make_encoder(name: str, manifest, budget: Budget = DEFAULT_BUDGET, **kwargs) -> Encoder:
    """A fresh encoder (zero residual) for `manifest`."""
    return get_codec(name, "make_encoder").encoder(manifest, budget, **kwargs)


def decode(name: str, manifest, params: dict, blocks: list, what: str, limits=DEFAULT_LIMITS) -> list:
    """Decoded fp32 gradient per manifest block; raises MalformedMessage naming the block and field."""
    return get_codec(name, what).decode(manifest, params, blocks, what, limits)


def update_size_bound(manifest) -> int:
    """Largest decompressed update any codec can legitimately produce for `manifest` (+ header room)."""
    return max(c.max_payload_bytes(manifest) for c in CODECS.values()) + (1 << 16)
