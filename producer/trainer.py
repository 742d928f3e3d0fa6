"""Trainer: what a training loop drives, one rank or many (HiLoOptimizer holds one; HiLoProducer.open returns one).

Two implementations meet it: HiLoProducer (producer.py, the trainer that writes the run) and RankProducer
(rank_trainer.py, every rank of a torch.distributed job: the publishing rank's wraps a HiLoProducer, the others hold a
replica without a log). A loop written against this Protocol runs unchanged on one rank and on many.
"""
from typing import Protocol, runtime_checkable

from hilo.replica.replica import PolicyReplica

from .config import ProducerConfig


@runtime_checkable
class Trainer(Protocol):
    """One step publishes one version; every replica, and the training model's LoRA params, then hold it."""

    config: ProducerConfig
    params: list  # the training model's LoRA parameters, in manifest order
    last_step: dict  # the last step's account: version, bytes, chunks, seconds
    rule: object  # the optimizer that step()'s hyperparameters are for (the run's, or delta mode's master's)
    master: object  # delta mode's master copy (None in gradient mode, and in a job of several ranks)
    builder: object  # the UpdateBuilder (encoder, error feedback) of the rank that publishes; None on the others

    @property
    def replica(self) -> PolicyReplica:
        """The replica this trainer (this rank) holds: its params are the model's, bit for bit, after each step."""

    @property
    def version(self) -> int:
        """The last committed version."""

    @property
    def fenced(self) -> bool:
        """Whether another trainer took the run over (nothing more is published)."""

    def step(self, meta: dict | None = None, zero_grad: bool = True, **hparams) -> int:
        """Encode the LoRA gradients, publish, commit; returns the version (an error leaves every rank unchanged)."""

    def flush(self, lag: float | None = None, max_messages: int | None = None) -> int:
        """Delta mode: publish until the sites trail by at most `lag`; returns how many messages were sent."""

    def lag(self) -> float:
        """How far the sites' policy trails the trainer's (0 in gradient mode)."""

    def resync(self) -> None:
        """Settle an in-doubt publish from the log."""

    def rotate_key(self, new_key_path: str) -> None:
        """Sign from now on with the key at `new_key_path` (the rotation is a record on the log)."""

    def write_back(self) -> None:
        """Copy the replica's fp32 params into the training model (its dtype)."""

    def save_snapshot(self) -> None:
        """Save the trainer's snapshot (state_dir)."""

    def close(self, flush: bool = True) -> None:
        """Flush (delta mode), save the snapshot, release the log."""
