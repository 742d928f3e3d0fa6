"""The codec interface: a stateful encoder on the trainer, a stateless decode that every replica runs.

An encoder turns gradients into per-block payload maps. Lossy encoders keep an error-feedback residual
e: they compress c = g + e and keep e <- c - decode(payload), computed from the *decoded* values, so
what compression drops now is sent later (sum of decoded == sum of true gradients - final residual).
"""
from dataclasses import dataclass

import msgpack
import torch
import zstandard

from hilo.schemas import fields as F
from hilo.schemas.errors import ConfigError, MalformedMessage
from hilo.schemas.framing import ZSTD_LEVEL
from hilo.schemas.limits import DEFAULT_LIMITS
from hilo.schemas.records import Manifest

from .budget import DEFAULT_BUDGET, Budget

BLOCK_OVERHEAD = 32   # bytes of msgpack framing per present block (keys, ints), reserved in budgets


@dataclass(frozen=True)
class Encoding:
    """One encoded gradient, proposed: the payload, what every replica will decode from it, and the
    encoder state to adopt if (and only if) the message is committed to the log."""

    blocks: list    # per-block payload maps
    params: dict    # codec params that travel in the message
    decoded: list   # fp32 tensor per manifest block: exactly what a replica decodes from `blocks`
    state: dict     # attribute name -> next value (residual, warm starts, cursors)


class Encoder:
    """Trainer-side state and `encode`. Subclasses set `name`, `decoder` and implement `compress`."""

    name = ""
    lossy = True
    decoder = None              # staticmethod: the codec's decode(manifest, params, blocks, what, limits)
    state_names = ("residual",)  # attributes that are this encoder's state: what a commit sets, what state_dict keeps

    def __init__(self, manifest: Manifest, budget: Budget = DEFAULT_BUDGET):
        # Configuration
        self.manifest = manifest
        self.budget = budget
        # State (trainer only; never on the wire)
        self.residual = [torch.zeros(b.shape) for b in manifest.blocks] if self.lossy else None

    def params(self) -> dict:
        """Codec parameters that travel in the message (decode may need them)."""
        return {}

    def compress(self, grads: list) -> tuple:
        """(per-block payload maps, {attribute: next value}) for the error-corrected `grads`; mutates nothing."""
        raise NotImplementedError

    def encode(self, grads: list, fused=None) -> Encoding:
        """Compress `grads` with error feedback; the residual update is proposed in the result, not applied. The work
        runs where the gradients are (a GPU trainer's stay there, with the residual); the payload and `decoded` are
        on the CPU. `fused`: kernels.encoder_check's decode + residual in one pass, for CPU gradients (same bits)."""
        grads = [g.detach().to(torch.float32) for g in grads]
        device = grads[0].device if grads else torch.device("cpu")
        corrected = [torch.add(g, e.to(device)) for g, e in zip(grads, self.residual)] if self.lossy else grads
        blocks, state = self.compress(corrected)
        params, what = self.params(), f"{self.name} encoder self-check"
        if self.lossy and fused is not None and device.type == "cpu":
            decoded, residual = fused(self.name, self.manifest, params, blocks, corrected, what, DEFAULT_LIMITS)
            return Encoding(blocks, params, decoded, state | {"residual": residual})
        # on the CPU: what every replica decodes
        decoded = self.decoder(self.manifest, params, blocks, what, DEFAULT_LIMITS)
        if self.lossy:
            state = state | {"residual": [torch.sub(c, d.to(device)) for c, d in zip(corrected, decoded)]}
        return Encoding(blocks, params, decoded, state)

    def commit(self, encoding: Encoding) -> None:
        """Adopt the state of an encoding whose message the log has acknowledged."""
        for name, value in encoding.state.items():
            setattr(self, name, value)

    def state_dict(self) -> dict:
        """The encoder's state (residual, warm starts, cursors): trainer-only, never on the wire."""
        return {n: getattr(self, n) for n in self.state_names}

    def load_state_dict(self, state: dict, what: str = "encoder state") -> None:
        """Restore `state_dict()` output; names and tensor shapes must match this encoder's."""
        if set(state) != set(self.state_names):
            raise ConfigError(f"{what}: has {sorted(state)}, a {self.name} encoder keeps {sorted(self.state_names)}")
        for n in self.state_names:
            mine, theirs = getattr(self, n), state[n]
            if isinstance(mine, list):
                if not isinstance(theirs, list) or [tuple(x.shape) for x in theirs] != [tuple(x.shape) for x in mine]:
                    raise ConfigError(f"{what}: '{n}' does not have this adapter's block shapes")
                theirs = [x.detach().to("cpu", torch.float32).clone() for x in theirs]
            elif type(theirs) is not type(mine):
                raise ConfigError(f"{what}: '{n}' is a {type(theirs).__name__}, expected {type(mine).__name__}")
            setattr(self, n, theirs)


def payload_size(blocks: list) -> int:
    """Exact msgpack size of a payload list (what the budget is charged for)."""
    return len(msgpack.packb(blocks, use_bin_type=True))


def compressed_size(blocks: list) -> int:
    """Bytes the payload list takes in a framed message: msgpack, then zstd at the wire's level."""
    return len(zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(msgpack.packb(blocks, use_bin_type=True)))


def fit_to_budget(build, budget: int, nominal: float, rounds: int = 6, shrink_rounds: int = 40) -> list:
    """Blocks from `build(nominal)` (a payload cut to `nominal` raw bytes) filling `budget` compressed bytes.

    Compression shrinks some payloads (quantised values, delta-coded indices) by an amount known only after
    the fact, so the nominal size is rescaled by budget / measured a few times; the largest build that fits
    wins, and one over budget after every round is cut down (at most `shrink_rounds` times, 0.9x each)
    until it fits. A budget too small for any build gets an empty payload: error feedback keeps it all.
    """
    best, best_size = None, -1
    for _ in range(rounds):
        blocks = build(nominal)
        size = compressed_size(blocks)
        if best_size < size <= budget:
            best, best_size = blocks, size
        if budget * 0.99 <= size <= budget or size == 0:
            break
        nominal = nominal * budget / size * (0.995 if size > budget else 1.0)
    for _ in range(shrink_rounds if best is None else 0):
        nominal *= 0.9
        blocks = build(nominal)
        if compressed_size(blocks) <= budget or not blocks:
            return blocks
    return [] if best is None else best


def block_entries(manifest: Manifest, blocks: list, what: str, require_all: bool) -> list:
    """Validate the block list: maps with unique, ascending, in-range "i". Returns [(index, map)]."""
    out, last = [], -1
    for pos, entry in enumerate(blocks):
        i = F.get_int(entry, "i", f"{what} blocks[{pos}]", 0, len(manifest.blocks) - 1)
        if i <= last:
            raise MalformedMessage(f"{what}: blocks[{pos}] index {i} is not ascending (previous {last})")
        last = i
        out.append((i, entry))
    if require_all and len(out) != len(manifest.blocks):
        raise MalformedMessage(f"{what}: {len(out)} blocks, manifest has {len(manifest.blocks)} (this codec sends all)")
    return out


def block_what(what: str, manifest: Manifest, i: int) -> str:
    """Error prefix naming a block: "offset 9 (update v3), block 12 'model.layers.1.mlp.up_proj.lora_B'"."""
    return f"{what}, block {i} '{manifest.blocks[i].key}'"
