"""UpdateBuilder: gradients -> the next update message, applied to the trainer's own replica first.

The trainer is a replica too: it decodes its own message and runs the same optimizer step, so the digest
it puts in the message is the digest every site must reach.
"""
import time

import torch

from hilo.replica.codecs import Encoder
from hilo.replica.optimizers import get_optimizer
from hilo.replica.replica import PolicyReplica
from hilo.schemas.errors import ConfigError
from hilo.schemas.records import UpdateMessage


class UpdateBuilder:
    """Owns the encoder (error feedback) and the trainer's replica; `build` makes and applies one version."""

    def __init__(self, replica: PolicyReplica, encoder: Encoder):
        if encoder.manifest.manifest_id != replica.manifest.manifest_id:
            raise ConfigError("UpdateBuilder: encoder and replica were built for different manifests")
        self.replica = replica
        self.encoder = encoder
        self.optimizer = get_optimizer(replica.state.optimizer)
        self.timing = {}  # seconds spent by the last build: {"encode": .., "apply": ..}

    def build(self, grads: list, hparams: dict | None = None, meta: dict | None = None) -> UpdateMessage:
        """Encode `grads` (manifest order), apply the decoded step locally, return the message with its digests."""
        if len(grads) != len(self.replica.manifest.blocks):
            raise ConfigError(f"UpdateBuilder.build: {len(grads)} gradients for {len(self.replica.manifest.blocks)} blocks")
        h = self.optimizer.defaults() | (hparams or {})
        h = self.optimizer.check_hparams({k: float(v) for k, v in h.items()}, "UpdateBuilder.build")
        t0 = time.perf_counter()
        blocks, params, decoded = self.encoder.encode([g.detach().to("cpu", torch.float32) for g in grads])
        t1 = time.perf_counter()
        r = self.replica
        msg = UpdateMessage(r.run, r.version + 1, r.digest, b"\0" * 16, r.manifest.manifest_id, self.encoder.name,
                            params, self.optimizer.name, h, blocks, dict(meta or {}))
        state = r.compute(msg, f"trainer v{msg.version}", decoded)
        msg.digest = state.digest()
        r.commit(state, msg.digest)
        self.timing = {"encode": t1 - t0, "apply": time.perf_counter() - t1}
        return msg
