"""ReplicaState: fp32 LoRA params + optimizer state + version, and its xxh3-128 digest."""
from dataclasses import dataclass, field

from hilo.replica.digest import state_digest
from hilo.schemas.arrays import from_bytes, to_bytes
from hilo.schemas.errors import DivergenceError
from hilo.schemas.records import Checkpoint, Manifest


@dataclass
class ReplicaState:
    """Everything `apply` reads and writes. Tensors are CPU fp32, one per manifest block, manifest order."""

    manifest: Manifest
    optimizer: str
    version: int
    params: list            # [Tensor (shape of block)]
    slots: dict             # slot name -> [Tensor per block]; insertion order is the digest order
    scalars: dict           # name -> float (kept as float64; e.g. running beta powers)
    # digest version 3's piece hashes, as the fused kernel computed them while writing these tensors: the first
    # digest() takes them and drops them, so any later digest (a second opinion, a snapshot's) reads the memory again
    known: list | None = field(default=None, repr=False, compare=False)

    def digest(self) -> bytes:
        """xxh3-128 over version, manifest id, optimizer, params, slots and scalars, in canonical order
        (replica/digest.py)."""
        known, self.known = self.known, None
        return state_digest(self.manifest, self.optimizer, self.version, self.params, self.slots, self.scalars, known)

    def to_checkpoint(self, run: str, genesis: bytes, digest: bytes | None = None, nonce: bytes = b"") -> Checkpoint:
        """Serialise the full state (bootstrap record / local snapshot) of history `genesis`; `digest` if already known;
        `nonce`: the history's nonce (v0 only)."""
        return Checkpoint(run, self.version, digest or self.digest(), self.manifest, self.optimizer,
                          [to_bytes(t, "float32") for t in self.params], list(self.slots),
                          [[to_bytes(t, "float32") for t in ts] for ts in self.slots.values()], dict(self.scalars),
                          genesis, nonce if self.version == 0 else b"")

    @staticmethod
    def from_checkpoint(ckpt: Checkpoint, what: str) -> "ReplicaState":
        """Rebuild a state and verify it hashes to the checkpoint's digest."""
        shapes = [b.shape for b in ckpt.manifest.blocks]
        keys = [b.key for b in ckpt.manifest.blocks]
        state = ReplicaState(
            ckpt.manifest, ckpt.optimizer, ckpt.version,
            [from_bytes(buf, "float32", s, f"{what} params '{k}'") for buf, s, k in zip(ckpt.params, shapes, keys)],
            {name: [from_bytes(buf, "float32", s, f"{what} {name} '{k}'") for buf, s, k in zip(bufs, shapes, keys)]
             for name, bufs in zip(ckpt.slots, ckpt.slot_tensors)},
            dict(ckpt.scalars))
        if state.digest() != ckpt.digest:
            raise DivergenceError(f"{what}: checkpoint v{ckpt.version} content hashes to {state.digest().hex()}, "
                                  f"record says {ckpt.digest.hex()}")
        return state

