"""UpdateBuilder: gradients -> a proposal for the next version, committed only once the log has the message.

The trainer is a replica too: it decodes its own message and runs the same optimizer step, so the digest
it puts in the message is the digest every site must reach. Propose, then commit (etcd's Ready/Advance):
`propose` computes the message, the next replica state and the next encoder state in new buffers and
mutates nothing; `commit` adopts them after the log has acknowledged the message.
"""
import collections
import time
from dataclasses import dataclass


from hilo.replica import kernels
from hilo.replica.codecs import Encoder
from hilo.replica.codecs.base import Encoding
from hilo.replica.optimizers import get_optimizer
from hilo.replica.replica import PolicyReplica
from hilo.replica.state import ReplicaState
from hilo.schemas.errors import ConfigError
from hilo.schemas.records import ZERO_DIGEST, UpdateMessage

from .delta import relative_lag


@dataclass(frozen=True)
class Proposal:
    """The next version, computed but not adopted: publish `message`, then `UpdateBuilder.commit` it."""

    message: UpdateMessage
    state: ReplicaState      # the replica state `message` leads to
    encoding: Encoding       # the payload and the encoder state (residual, ...) to adopt with it
    timing: dict             # seconds: {"encode": .., "apply": ..}

    @property
    def version(self) -> int:
        """The version this proposal would make."""
        return self.message.version


class UpdateBuilder:
    """Owns the encoder (error feedback) and the trainer's replica; `propose` one version, `commit` it."""

    def __init__(self, replica: PolicyReplica, encoder: Encoder):
        if encoder.manifest.manifest_id != replica.manifest.manifest_id:
            raise ConfigError("UpdateBuilder: encoder and replica were built for different manifests")
        self.replica = replica
        self.encoder = encoder
        self.optimizer = get_optimizer(replica.state.optimizer)
        # a multi-rank job's: sends each message to the other ranks before the apply (rank_trainer.py)
        self.on_encoded = None

    def propose(self, grads: list, hparams: dict | None = None, meta: dict | None = None,
                target: list | None = None) -> Proposal:
        """Encode `grads` (manifest order) and compute the step they lead to; nothing is mutated. With `target`
        (delta mode's master params), the message's meta records `lag`: how far the sites still trail it."""
        if len(grads) != len(self.replica.manifest.blocks):
            raise ConfigError(f"UpdateBuilder.propose: {len(grads)} gradients for {len(self.replica.manifest.blocks)} "
                              f"blocks")
        h = self.optimizer.defaults() | (hparams or {})
        h = self.optimizer.check_hparams({k: float(v) for k, v in h.items()}, "UpdateBuilder.propose")
        t0 = time.perf_counter()
        # encoded where the gradients are (a GPU's stay there); only the payload and its decode meet the CPU replica
        fused = kernels.encoder_check(self.encoder.name) if self.replica.apply_mode != "reference" else None
        enc = self.encoder.encode([g.detach() for g in grads], fused)
        t1 = time.perf_counter()
        r = self.replica
        msg = UpdateMessage(r.run, r.version + 1, r.digest, ZERO_DIGEST, r.manifest.manifest_id, self.encoder.name,
                            enc.params, self.optimizer.name, h, enc.blocks, dict(meta or {}))
        if self.on_encoded is not None:  # the other ranks apply it while this one does (its digest follows)
            self.on_encoded(msg)
        state = r.compute(msg, f"trainer v{msg.version}", enc.decoded)
        if target is not None:
            msg.meta["lag"] = relative_lag(target, state.params)
        msg.digest = state.digest()
        return Proposal(msg, state, enc, {"encode": t1 - t0, "apply": time.perf_counter() - t1})

    def use_budget(self, budget) -> None:
        """Encode the next proposals within `budget` (a Budget): `--budget auto` fits one per version."""
        self.encoder.budget = budget

    def commit(self, proposal: Proposal) -> None:
        """Adopt a proposal whose message the log holds: the replica's state and the encoder's residual."""
        if proposal.message.parent_digest != self.replica.digest:
            raise ConfigError(f"UpdateBuilder.commit: v{proposal.version} was proposed from another state "
                              f"(parent {proposal.message.parent_digest.hex()[:12]}, replica "
                              f"{self.replica.digest.hex()[:12]})")
        self.replica.commit(proposal.state, proposal.message.digest)
        self.encoder.commit(proposal.encoding)

    def adopt(self, proposal: Proposal) -> tuple:
        """Commit a proposal whose message the log does not hold yet (a pipelined publish, producer/inflight.py);
        returns what `revert` needs to take it back if the log never does."""
        r = self.replica
        undo = (r.state, r.digest, collections.OrderedDict(r.recent), self.encoder.state_dict())
        self.commit(proposal)
        return undo

    def revert(self, undo: tuple) -> None:
        """Take back an adopted proposal: the replica and the encoder return to the state `adopt` found."""
        r = self.replica
        r.state, r.digest, r.recent, encoder_state = undo
        for name, value in encoder_state.items():
            setattr(self.encoder, name, value)

    def step(self, grads: list, hparams: dict | None = None, meta: dict | None = None) -> UpdateMessage:
        """propose + commit with no log in between (benchmarks and tests that hold the only copy)."""
        proposal = self.propose(grads, hparams, meta)
        self.commit(proposal)
        return proposal.message
