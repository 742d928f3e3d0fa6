"""HiLoProducer: the trainer side. After loss.backward(), `step()` publishes the compressed gradient.

    producer = HiLoProducer.open(peft_model, ProducerConfig(run="exp1", log="kafka://127.0.0.1:9092"))
    for batch in data:
        loss = model(**batch).loss; loss.backward()
        version = producer.step(lr=schedule(step))   # encode -> publish -> apply locally -> params into model

The trainer is a replica: its LoRA params are whatever the decoded messages make them, so every site
that applies the same messages holds the same policy, bit for bit. Its parts: opening it (trainer_open.py), where it
starts (resume.py),
putting a version on the log (publisher.py), its checkpoints (checkpoints.py), what it proposes (update_builder.py),
committing only what the log acknowledged, in line or pipelined (committer.py, inflight.py).
"""
import functools
import logging
import time

import torch

from hilo.log import checkpoints_topic, updates_topic
from hilo.log.outage import Outage
from hilo.replica.codecs import AutoBudget, Budget, make_encoder
from hilo.replica.replica import PolicyReplica
from hilo.schemas.errors import ConfigError
from hilo.schemas.metrics import Metrics
from hilo.schemas.keyring import Keyring
from hilo.schemas.signing import Signer

from .trainer_state import TrainerLedger
from .checkpoints import Checkpoints
from .committer import Committer
from .config import ProducerConfig
from .link_budget import LinkBudget
from .lora_params import lora_gradients
from .publisher import Publisher
from .rank_launch import open_trainer
from .resume import Resumed
from .sync_mode import SYNC_MODES
from .trainer import Trainer
from .trainer_open import open_alone
from .update_builder import UpdateBuilder

logger = logging.getLogger(__name__)


class HiLoProducer:
    """Publishes one update per `step()`; `HiLoProducer.open` starts it from genesis or resumes it from the log head.

    Propose, then commit: a step's next state is adopted only after the log acknowledges its message. When the
    outcome cannot be told (the publish failed and the log cannot be read either), the trainer stays at its last
    committed version and the next `step()` first resyncs, adopting the proposal only if the log holds it."""

    def __init__(self, model: torch.nn.Module, config: ProducerConfig, log, keyring: Keyring, metrics: Metrics,
                 checkpoints: Checkpoints, started: Resumed, fencing_token: int, ledger: TrainerLedger, lora: tuple):
        """Assemble a trainer that `started` (no I/O); `HiLoProducer.open` is how one is made. `lora`: (manifest,
        LoraWeights). `keyring`: the run's signing keys, shared with its checkpoints (and a RolloutExchange given it):
        schemas/keyring.py."""
        self.config, self.model, self.log, self.keyring, self.metrics = config, model, log, keyring, metrics
        self.checkpoints, self.fencing_token, self.ledger = checkpoints, fencing_token, ledger
        self.manifest, self.weights = lora
        self.params = self.weights.params
        self.outage = Outage(f"run {config.run}: trainer", metrics)  # publishes waiting for a log reached before
        self.publisher = Publisher(log, config.run, updates_topic(config.run), checkpoints_topic(config.run),
                                   config.chunk_bytes, config.publish_deadline_s, metrics, self.outage)
        replica = started.replica
        replica.keyring = keyring  # the trainer's replica trusts what it signs with (a resync's follower shares it too)
        auto = isinstance(config.budget, AutoBudget)
        self.link_budget = LinkBudget(config.budget, log, config.run, self.manifest.adapter_bytes()) if auto else None
        self.builder = UpdateBuilder(replica, make_encoder(config.codec, self.manifest,
                                                          Budget(config.budget.start) if auto else config.budget))
        self.sync = SYNC_MODES[config.mode](config.optimizer, replica.state.params)
        # publishes each proposal and commits what the log acknowledges; holds what is in flight or in doubt
        self.commits = Committer(config, self.publisher, self.builder, self.sync, keyring, ledger, checkpoints, metrics,
                                 self.manifest, self.write_back, self.save_snapshot)

    @classmethod
    def open(cls, model: torch.nn.Module, config: ProducerConfig, log_backend=None, metrics: Metrics | None = None,
             check=None) -> Trainer:
        """The trainer of `model`: a HiLoProducer; in a torch.distributed job a RankProducer on every rank, the log
        opened by the publishing rank alone (rank_launch.py). `metrics`: the registry to record into (one a metrics
        endpoint already serves; served by `hilo produce --metrics-port` or ops/metrics_server.py). `check()`: the
        caller's refusals, run on every rank first (HiLoOptimizer's)."""
        return open_trainer(functools.partial(open_alone, cls), model, config, log_backend, metrics, check)

    @property
    def rule(self):
        """The optimizer step() hyperparameters are for: the run's (gradient mode) or the master's (delta mode)."""
        return self.sync.rule(self.builder)

    @property
    def master(self):
        """Delta mode's master copy (None in gradient mode)."""
        return self.sync.master

    @property
    def fenced(self) -> bool:
        """Whether another trainer took the run over (this one publishes nothing more)."""
        return self.publisher.fenced

    @property
    def replica(self) -> PolicyReplica:
        """The trainer's own replica."""
        return self.builder.replica

    @property
    def version(self) -> int:
        """The version the trainer holds: the last committed one (pipeline: the last applied, its publish maybe under
        way)."""
        return self.replica.version

    @property
    def in_doubt(self):
        """The proposal whose publish ended with its outcome unknown (None: none); the next step() resyncs first."""
        return self.commits.in_doubt

    @property
    def last_step(self) -> dict:
        """The last committed step's account: version, bytes, chunks, seconds (pipeline: wait_s, publish_s too)."""
        return self.commits.last_step

    def save_snapshot(self):
        """The trainer's own snapshot: replica, position, and the trainer-only state (never published), atomically."""
        self.settle()  # a snapshot holds committed versions only
        self.ledger.save(self.replica, self.builder.encoder, self.sync)

    def resync(self) -> None:
        """Settle a publish whose outcome was unknown: read the log from the last committed offset, adopt what it
        holds."""
        self.commits.resync()

    def rotate_key(self, new_key_path: str) -> None:
        """Move the run to a new signing key: a 'next key' record signed by the current key (sites that trust it
        follow), then a checkpoint signed by the new one (so a trainer restarted with the new key resumes from it)."""
        if self.keyring.signer is None:
            raise ConfigError(f"run {self.config.run}: rotate_key needs a signing_key to sign the rotation with")
        self.settle()
        self.ledger.moved(self.checkpoints.rotate_key(Signer.load(new_key_path), self.replica, self.ledger.log_bytes))
        self.checkpoints.try_publish(self.replica, self.ledger.next_offset, self.ledger.log_bytes)
        self.save_snapshot()

    def write_back(self):
        """Copy the trainer's fp32 params (the replica's; delta mode: the master's) into the training model (its
        dtype)."""
        self.weights.write(self.sync.policy(self.replica))

    def lag(self) -> float:
        """How far the sites' policy trails the trainer's: ||master - site|| / ||master|| (0 in gradient mode)."""
        return self.sync.lag(self.replica)

    def step(self, meta: dict | None = None, zero_grad: bool = True, **hparams) -> int:
        """Encode the LoRA grads, publish, then commit: apply locally, write params back (and zero the grads
        unless `zero_grad=False`, as torch optimizers leave them). Returns the version.
        Delta mode: the master takes the optimizer step and the message carries the compressed master - site."""
        t0 = time.perf_counter()
        if self.in_doubt is not None:
            self.resync()
        if self.link_budget is not None:  # fitted to the slowest site's link; the message's meta says why
            self.settle()  # it reads the log, which only one thread uses at a time
            budget, why = self.link_budget.choose()
            self.builder.use_budget(budget)
            meta = dict(meta or {}) | {f"budget_{k}": v for k, v in why.items()}
        grads = lora_gradients(self.weights.grads(), self.manifest, self.config.run, self.config.adapter)
        proposal, pending = self.sync.propose(self.builder, grads, self.config.hparams | hparams, meta)
        version = self.commits.publish(proposal, pending, t0)
        if self.link_budget is not None:
            self.link_budget.observe(self.builder.encoder.budget.fraction,
                                     proposal.timing["encode"] + proposal.timing["apply"])
        if zero_grad:
            self.weights.zero_grad()
        return version

    def flush(self, lag: float | None = None, max_messages: int | None = None) -> int:
        """Delta mode: publish messages carrying no new step until the sites trail the master by at most `lag`
        (default flush_lag), at most `max_messages` (default flush_max) of them; returns how many. Gradient mode
        sends nothing: every replica already holds the trainer's state."""
        self.settle()
        if not self.sync.flushes:
            return 0
        tol = self.config.flush_lag if lag is None else lag
        most = self.config.flush_max if max_messages is None else max_messages
        sent, start = 0, self.lag()
        while sent < most and self.lag() > tol:
            t0 = time.perf_counter()
            if self.in_doubt is not None:
                self.resync()
            self.commits.publish(self.sync.flush_proposal(self.builder), None, t0)
            sent += 1
        if sent or start > tol:
            log = logger.warning if self.lag() > tol else logger.info
            log("run %s: flush sent %d message(s) to v%d; the sites' lag went from %.2e to %.2e (target %.0e)",
                self.config.run, sent, self.version, start, self.lag(), tol)
        return sent

    def settle(self) -> None:
        """Pipeline: wait for the version in flight (if any) and commit what its acknowledgement decides; if it is not
        on the log, return the trainer to the last version that is, and raise its error."""
        self.commits.settle()

    def close(self, flush: bool = True):
        """Flush (delta mode, unless `flush=False`), save the trainer's snapshot (a clean stop leaves one at the head)
        and release the log."""
        try:
            self.settle()
            if flush and self.in_doubt is None:
                self.flush()
        finally:
            try:
                if self.in_doubt is None:
                    self.save_snapshot()
            finally:  # a disk that refuses the snapshot (StateNotWritten) still releases the log
                self.ledger.close()
                self.log.close()
