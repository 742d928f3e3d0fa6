"""HiLoProducer: the trainer side. After loss.backward(), `step()` publishes the compressed gradient.

    producer = HiLoProducer(peft_model, ProducerConfig(run="exp1", log="kafka://127.0.0.1:9092"))
    for batch in data:
        loss = model(**batch).loss; loss.backward()
        version = producer.step(lr=schedule(step))   # encode -> publish -> apply locally -> params into model

The trainer is a replica: its LoRA params are whatever the decoded messages make them, so every site
that applies the same messages holds the same policy, bit for bit.
"""
import enum
import logging
import time

import torch

from hilo.log import checkpoints_topic, crashpoints, open_log, retry, updates_topic
from hilo.log.outage import Outage
from hilo.log.tail import head
from hilo.replay.history import HistoryWriter
from hilo.replay.snapshot import SnapshotStore
from hilo.replica.codecs import Budget, make_encoder
from hilo.replica.replica import PolicyReplica
from hilo.schemas import headers as H
from hilo.schemas.chunks import split
from hilo.schemas.errors import ConfigError, FencedError, LogError, LogUnavailable, TrainerError
from hilo.schemas.metrics import Metrics
from hilo.schemas.position import Position
from hilo.schemas.records import KeyRotation
from hilo.schemas.signing import Signer

from . import trainer_state
from .config import ProducerConfig
from .link_budget import AutoBudget, LinkBudget
from .lora_params import lora_parameters
from .resume import TrainerStart, catch_up
from .retention_guard import RetentionGuard
from .sync_mode import SYNC_MODES
from .update_builder import Proposal, UpdateBuilder

logger = logging.getLogger(__name__)


class Outcome(enum.Enum):
    """What a failed publish turned out to be, asked of the log afterwards."""

    COMMITTED = "committed"        # the log holds the message after all
    NOT_ON_LOG = "not on the log"  # safe to publish it again
    IN_DOUBT = "in doubt"          # the log could not be read: the next step resyncs before anything else


class _NotOnLog(Exception):
    """A publish failed and the log does not hold it (args[0]: the transport's error): safe to try again."""


class _Deadline(Exception):
    """A publish failed and the log could not be read before the deadline (args[0]: the transport's error)."""


# A publish the log does not hold is tried again, a fresh producer each time, waiting 0.25 s, 0.5 s, ... 4 s between
# tries, until ProducerConfig.publish_deadline_s. On Kafka one try waits at most writer.ATTEMPT_TIMEOUT_S on the cluster.


class HiLoProducer:
    """Publishes one update per `step()`; starts from genesis or resumes from the log head.

    Propose, then commit: a step's next state is adopted only after the log acknowledges its message. When
    the outcome cannot be told (the publish failed and the log head cannot be read either), the trainer
    stays at its last committed version and the next `step()` first resyncs from the log, adopting the
    proposal only if the log turns out to hold it. The trainer never holds a version the log does not have.
    """

    def __init__(self, model: torch.nn.Module, config: ProducerConfig, log_backend=None, metrics: Metrics | None = None):
        self.config = config
        self.model = model
        self.signer = Signer.load(config.signing_key) if config.signing_key else None
        self.log = log_backend or open_log(config.log, chunk_bytes=config.chunk_bytes, kafka_config=config.kafka_config)
        self.manifest, self.params = lora_parameters(model, config.adapter)
        room = config.budget.payload_bytes(self.manifest)
        if config.codec != "dense" and room <= 0:
            raise ConfigError(f"ProducerConfig.budget: {config.budget.message_bytes(self.manifest)} bytes per message for this "
                              f"{self.manifest.adapter_bytes()}-byte adapter leave {room} bytes of payload after the header; raise the budget")
        self.updates, self.checkpoints = updates_topic(config.run), checkpoints_topic(config.run)
        self.log.create_topics(config.run)
        self.retention = RetentionGuard.of(self.log, self.updates)  # checkpoints before the updates they need expire
        self.store = SnapshotStore(config.state_dir) if config.state_dir else None
        self.in_doubt: Proposal | None = None   # published with an unknown outcome; settled by the next resync
        self.checkpoint_due = False              # a checkpoint publish failed; retried after the next version
        self.checkpoint_starts = []              # first offsets of the checkpoints this process published (for trimming)
        # served by `hilo produce --metrics-port`, or by ops/metrics_server.py from the user's own loop
        self.metrics = metrics or Metrics("trainer", run=config.run)
        self.fenced = False
        self.outage = Outage(f"run {config.run}: trainer", self.metrics)  # publishes waiting for a log reached before
        # Every refusal first, by reading the log only: a trainer that would be refused (another model, optimizer,
        # history or key) must not fence the one that runs. Then fence every earlier trainer of the run (Kafka: its
        # open transaction is aborted), then publish what the start needs and catch up to the head.
        snapshot, verifier = self.store.load() if self.store else None, self.signer and self.signer.verifier()
        start = TrainerStart(self.log, config, self.manifest, self.site_optimizer, self._publish_checkpoint)
        decided = start.decide(snapshot, verifier)
        at = str((head(self.log, self.updates, config.run) or {}).get(H.VERSION, 0))  # a stray record may say anything
        at = int(at) if at.isdigit() else 0
        self.fencing_token = self.log.become_writer(config.run, at)
        started = start.run(snapshot, self.params, verifier, decided)
        replica, self.log_bytes, self.next_offset = started.replica, started.position.log_bytes, started.position.next_offset
        self.snapshot_version = started.snapshot_version  # the trainer snapshot this start used, if any
        self._count_skips(started.skips)
        self.metrics.set("published_version", replica.version)
        auto = isinstance(config.budget, AutoBudget)
        self.link_budget = LinkBudget(config.budget, self.log, config.run, self.manifest.adapter_bytes()) if auto else None
        self.builder = UpdateBuilder(replica, make_encoder(config.codec, self.manifest,
                                                          Budget(config.budget.start) if auto else config.budget))
        self.sync = SYNC_MODES[config.mode](config.optimizer, replica.state.params)
        self.pending = None  # the trainer-only state of the proposal in flight (or in doubt): delta mode's master
        self.history = HistoryWriter(config.history) if config.history else None
        if self.history:
            self.history.record(replica.version, replica.digest, self.next_offset, start=True)
        if self.snapshot_version is not None:
            trainer_state.restore(self.store, self.snapshot_version, self.replica, self.builder.encoder, self.sync, config.run)
        self.write_back()

    @property
    def site_optimizer(self) -> str:
        """The step every replica of the run applies: the optimizer (gradient mode) or "add" (delta mode)."""
        return SYNC_MODES[self.config.mode].site_optimizer(self.config.optimizer)

    @property
    def rule(self):
        """The optimizer step() hyperparameters are for: the run's (gradient mode) or the master's (delta mode)."""
        return self.sync.rule(self.builder)

    @property
    def master(self):
        """Delta mode's master copy (None in gradient mode)."""
        return self.sync.master

    @property
    def replica(self) -> PolicyReplica:
        """The trainer's own replica."""
        return self.builder.replica

    @property
    def version(self) -> int:
        """Last published (committed) version."""
        return self.replica.version

    def save_snapshot(self):
        """The trainer's own snapshot: replica, position, and the trainer-only state (never published), atomically."""
        trainer_state.save(self.store, self.replica, Position(self.next_offset, self.log_bytes), self.builder.encoder, self.sync)

    def resync(self) -> None:
        """Settle a publish whose outcome was unknown: read the log from the last committed offset, adopt what it holds."""
        pending, before = self.in_doubt, self.version
        follower = catch_up(self.log, self.config.run, self.replica, Position(self.next_offset, self.log_bytes),
                            self.config.on_bad_record)
        self.log_bytes, self.next_offset = follower.log_bytes, follower.next_offset
        self._count_skips(follower.skips)
        ours = pending is not None and self.version == pending.version and self.replica.digest == pending.message.digest
        if self.version != before and not ours:  # the log moved, and not by this trainer's message
            self._fenced()
            raise FencedError(f"run {self.config.run}: the log moved from v{before} to v{self.version} (digest "
                              f"{self.replica.digest.hex()[:12]}) without this trainer's proposal: another trainer writes "
                              f"this run; this one publishes nothing more")
        if ours:
            self.builder.encoder.commit(pending.encoding)  # the log has our message: keep its error feedback
            self.sync.commit(self.pending)
            if self.history:
                self.history.record(self.version, self.replica.digest, self.next_offset - 1)
            logger.warning("run %s: v%d, whose publish was in doubt, is on the log; continuing from it", self.config.run, pending.version)
        elif pending is not None:
            logger.warning("run %s: v%d, whose publish was in doubt, is not on the log; it will be proposed again", self.config.run, pending.version)
        self.in_doubt = self.pending = None
        self.write_back()

    def _checkpoint_records(self, ckpt, updates_offset, log_bytes) -> list:
        """The chunk records of a checkpoint whose replay starts at `updates_offset` of the updates topic."""
        data = ckpt.to_bytes(self.signer)
        extra = {H.DIGEST: ckpt.digest.hex(), H.UPDATES_OFFSET: str(updates_offset), H.LOG_BYTES: str(log_bytes),
                 H.GENESIS: ckpt.genesis.hex()}
        return split(data, self.config.run, "checkpoint", ckpt.version, self.config.chunk_bytes, extra)

    def _publish_checkpoint(self, replica, updates_offset, log_bytes):
        offsets = self.log.append(self.checkpoints, self._checkpoint_records(replica.checkpoint(), updates_offset, log_bytes))
        self._checkpointed(offsets[0])

    def _checkpointed(self, first_offset):
        """A checkpoint is on the log at `first_offset`: keep only the newest `keep_checkpoints`."""
        self.metrics.inc("checkpoints_published")
        self.retention.on_checkpoint()
        self.checkpoint_starts.append(first_offset)
        keep = self.config.keep_checkpoints
        if len(self.checkpoint_starts) > keep:  # bounded storage: older checkpoints only make bootstrap replay longer
            before = self.checkpoint_starts[-keep]
            try:
                if self.log.trim(self.checkpoints, before):
                    logger.info("run %s: checkpoints before offset %d deleted (keeping the newest %d)", self.config.run, before, keep)
                self.checkpoint_starts = self.checkpoint_starts[-keep:]
            except LogError as e:  # the checkpoint itself is published; the trim is retried after the next one
                logger.warning("run %s: deleting old checkpoints failed (%s); retried after the next checkpoint", self.config.run, e)

    def rotate_key(self, new_key_path: str) -> None:
        """Move the run to a new signing key: a 'next key' record signed by the current key (sites that trust it
        follow), then a checkpoint signed by the new one (so a trainer restarted with the new key resumes from it)."""
        if self.signer is None:
            raise ConfigError(f"run {self.config.run}: rotate_key needs a signing_key to sign the rotation with")
        new = Signer.load(new_key_path)
        rot = KeyRotation(self.config.run, self.version + 1, new.public_bytes())
        extra = {H.DIGEST: self.replica.digest.hex(), H.LOG_BYTES: str(self.log_bytes)}  # what `head` readers expect
        self.log.append(self.updates, split(rot.to_bytes(self.signer), self.config.run, "key", self.version, self.config.chunk_bytes, extra))
        logger.warning("run %s: from v%d signed by key %s (was %s)", self.config.run, self.version + 1, new.key_id.hex(),
                       self.signer.key_id.hex())
        self.signer = new
        self.replica.verifier = new.verifier()  # its own later messages, read back by a resync
        self.next_offset = self.log.end_offset(self.updates)
        self._checkpoint()

    def write_back(self):
        """Copy the trainer's fp32 params (the replica's; delta mode: the master's) into the training model (its dtype)."""
        with torch.no_grad():
            for p, src in zip(self.params, self.sync.policy(self.replica)):
                p.copy_(src.to(p.dtype))

    def _settle(self, proposal: Proposal, error: Exception, deadline: float) -> tuple:
        """After a failed publish, ask the log what happened: (Outcome, offsets of `proposal` when COMMITTED). A log
        that cannot be read is asked again until `deadline` (monotonic) and is IN_DOUBT after it. FencedError when the
        log holds another message for that version (another trainer writes the run)."""
        msg = proposal.message
        while True:
            try:
                h = head(self.log, self.updates, self.config.run) or {}
                landed = h.get(H.VERSION) == str(msg.version) and h.get(H.DIGEST) == msg.digest.hex()
                end = self.log.end_offset(self.updates) if landed else None
                break
            except Exception as e:  # noqa: BLE001  (any failure here leaves the outcome unknown)
                if time.monotonic() >= deadline:
                    logger.warning("run %s: publishing v%d failed (%s) and the log head cannot be read (%s): staying at v%d, "
                                   "the next step resyncs from the log", self.config.run, msg.version, error, e, self.version)
                    return Outcome.IN_DOUBT, None
                self.outage.wait(e)
        found = h.get(H.VERSION, "")
        if not landed and found.isdigit() and int(found) >= msg.version:  # someone else moved the run meanwhile
            raise FencedError(f"run {self.config.run}: publishing v{msg.version} failed ({error}), and the log holds another "
                              f"v{found} (digest {h.get(H.DIGEST, '?')[:12]}): another trainer writes this run; "
                              f"this one publishes nothing more") from None
        if not landed:
            return Outcome.NOT_ON_LOG, None
        logger.warning("run %s: publishing v%d reported %s, but the log holds it; continuing", self.config.run, msg.version, error)
        return Outcome.COMMITTED, [end - 1]

    def gradients(self) -> list:
        """The LoRA params' .grad in manifest order (zeros for a block outside the graph); refuses none at all, or NaN/Inf."""
        if all(p.grad is None for p in self.params):
            raise TrainerError(f"run {self.config.run}: no LoRA parameter has a gradient (call loss.backward() first; "
                               f"is adapter {self.config.adapter!r} trainable?)")
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        for b, g in zip(self.manifest.blocks, grads):
            if not bool(torch.isfinite(g).all()):
                raise TrainerError(f"run {self.config.run}: the gradient of '{b.key}' has NaN/Inf values; nothing was published "
                                   f"(skip this step, as a grad scaler does, or lower the learning rate)")
        return grads

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
            self.builder.encoder.budget, why = self.link_budget.choose()
            meta = dict(meta or {}) | {f"budget_{k}": v for k, v in why.items()}
        proposal, pending = self.sync.propose(self.builder, self.gradients(), self.config.hparams | hparams, meta)
        version = self._publish(proposal, pending, t0)
        if self.link_budget is not None:
            self.link_budget.observe(self.builder.encoder.budget.fraction, self.last_step["encode_s"] + self.last_step["apply_s"])
        if zero_grad:
            for p in self.params:
                p.grad = None
        return version

    def flush(self, lag: float | None = None, max_messages: int | None = None) -> int:
        """Delta mode: publish messages carrying no new step until the sites trail the master by at most `lag`
        (default flush_lag), at most `max_messages` (default flush_max) of them; returns how many. Gradient mode
        sends nothing: every replica already holds the trainer's state."""
        if not self.sync.flushes:
            return 0
        tol = self.config.flush_lag if lag is None else lag
        most = self.config.flush_max if max_messages is None else max_messages
        sent, start = 0, self.lag()
        while sent < most and self.lag() > tol:
            t0 = time.perf_counter()
            if self.in_doubt is not None:
                self.resync()
            self._publish(self.sync.flush_proposal(self.builder), None, t0)
            sent += 1
        if sent or start > tol:
            log = logger.warning if self.lag() > tol else logger.info
            log("run %s: flush sent %d message(s) to v%d; the sites' lag went from %.2e to %.2e (target %.0e)",
                self.config.run, sent, self.version, start, self.lag(), tol)
        return sent

    def _publish(self, proposal, pending, t0: float) -> int:
        """Publish `proposal` (with its checkpoint when due), then commit it and `pending` (the sync mode's state)."""
        self.pending = pending
        crashpoints.reach("trainer.encoded")
        msg = proposal.message
        t_sign = time.perf_counter()
        data = msg.to_bytes(self.signer)
        t_tx = time.perf_counter()
        extra = {H.DIGEST: msg.digest.hex(), H.LOG_BYTES: str(self.log_bytes + len(data))}
        if "lag" in msg.meta:  # `hilo lag` reads it from the head's headers
            extra[H.LAG] = f"{msg.meta['lag']:.6g}"
        checkpoint = msg.version % self.config.checkpoint_every == 0 or self.checkpoint_due
        why = None if checkpoint else self.retention.due()
        if why:
            checkpoint = True
            logger.info("run %s: checkpoint with v%d, before the updates after the newest one can expire: %s", self.config.run,
                        msg.version, why)
        deadline = time.monotonic() + self.config.publish_deadline_s

        def attempt():
            try:
                return self._append(proposal, data, extra, checkpoint)
            except FencedError:
                raise  # certain: nothing more will be written
            except Exception as e:  # noqa: BLE001  (whatever the transport raised, the broker may hold it: the log decides)
                outcome, offsets = self._settle(proposal, e, deadline)
                if outcome is Outcome.COMMITTED:
                    return offsets, None
                if outcome is Outcome.IN_DOUBT:
                    self.in_doubt = proposal
                    raise _Deadline(e) from None
                raise _NotOnLog(e) from e

        def again(e, n):
            self.metrics.inc("publish_retries", cause=type(e.args[0]).__name__)
            self.outage.failed(e.args[0])  # said once, then every minute, while it lasts
            logger.debug("run %s: publishing v%d failed (%s) and the log does not hold it; try %d", self.config.run,
                         msg.version, e.args[0], n + 1)
        try:  # each try with a fresh producer (the writer drops a failed one)
            offsets, checkpoint_offsets = retry.call(attempt, retriable=lambda e: isinstance(e, _NotOnLog), attempts=None,
                                                     within_s=self.config.publish_deadline_s, first_s=0.25, longest_s=4.0,
                                                     on_retry=again)
        except (_NotOnLog, _Deadline) as e:
            where = "it is not on the log" if isinstance(e, _NotOnLog) else "whether the log holds it is not known yet"
            raise LogUnavailable(f"run {self.config.run}: v{msg.version} was not published within publish_deadline_s = "
                                 f"{self.config.publish_deadline_s:g}s ({where}; last error: {e.args[0]}); the trainer stays "
                                 f"at v{self.version}: the next step (or a restart) resumes from the log") from None
        except FencedError:
            self._fenced()
            raise
        self.outage.over()
        self._observe(proposal, len(data), sign_s=t_tx - t_sign, transaction_s=time.perf_counter() - t_tx)
        self.builder.commit(proposal)
        self.sync.commit(pending)
        self.pending = None
        self.log_bytes += len(data)
        self.next_offset = offsets[-1] + 1
        if self.history:
            self.history.record(msg.version, msg.digest, offsets[-1])
        self.write_back()
        if checkpoint_offsets is None:
            self.retention.on_update(len(data))
        if checkpoint_offsets is not None:
            self._checkpointed(checkpoint_offsets[0])
            self.checkpoint_due = False
            if self.store:
                self.save_snapshot()
        elif checkpoint:  # the version is published, its checkpoint is not (a non-transactional log): next version
            self.checkpoint_due = True
            logger.warning("run %s: checkpoint at v%d not published; retrying with the next version", self.config.run, msg.version)
        self.last_step = {"version": msg.version, "bytes": len(data), "chunks": len(offsets),
                          "encode_s": proposal.timing["encode"], "apply_s": proposal.timing["apply"],
                          "total_s": time.perf_counter() - t0, "lag": msg.meta.get("lag", 0.0)}
        return msg.version

    def _observe(self, proposal, nbytes: int, sign_s: float, transaction_s: float) -> None:
        """The metrics of a version the log now holds."""
        m, enc = self.metrics, proposal.encoding
        m.set("published_version", proposal.version)
        m.inc("versions_published")
        m.set("last_published_timestamp_seconds", time.time())
        for stage, seconds in (("encode", proposal.timing["encode"]), ("sign", sign_s), ("transaction", transaction_s)):
            m.observe("stage_seconds", seconds, stage=stage)
        m.observe("message_bytes", nbytes)
        m.set("adapter_fraction", nbytes / self.manifest.adapter_bytes())
        residual = enc.state.get("residual")
        if residual is not None:  # what the encoder kept back over what it was asked to send (residual + sent)
            dot = lambda x, y: float(torch.dot(x.reshape(-1), y.reshape(-1)))  # no adapter-sized temporaries
            left = sum(dot(r, r) for r in residual)
            whole = left + sum(2 * dot(r, d) + dot(d, d) for r, d in zip(residual, enc.decoded))
            m.set("residual_ratio", (left / whole) ** 0.5 if whole > 0 else 0.0)

    def _fenced(self) -> None:
        self.fenced = True
        self.metrics.set("fenced", 1)

    def _count_skips(self, skips: dict | None) -> None:
        for reason, n in (skips or {}).items():
            self.metrics.inc("records_refused", n, reason=reason)

    def _append(self, proposal, data: bytes, extra: dict, checkpoint: bool) -> tuple:
        """One transaction on the log: the version's chunks and, when due, its checkpoint's become visible together,
        or not at all. Returns (update offsets, checkpoint offsets or None)."""
        msg, checkpoint_offsets = proposal.message, None
        with self.log.transaction() as tx:
            offsets = tx.append(self.updates, split(data, self.config.run, "update", msg.version, self.config.chunk_bytes, extra))
            if checkpoint:
                ckpt = proposal.state.to_checkpoint(self.config.run, self.replica.genesis, msg.digest)
                checkpoint_offsets = tx.append(self.checkpoints, self._checkpoint_records(ckpt, offsets[-1] + 1,
                                                                                         self.log_bytes + len(data)))
            crashpoints.reach("trainer.in-transaction")
        crashpoints.reach("trainer.committed")
        return offsets, checkpoint_offsets

    def _checkpoint(self):
        """Publish a checkpoint of the committed state (and save the local snapshot); a failure is retried next version."""
        try:
            self._publish_checkpoint(self.replica, self.next_offset, self.log_bytes)
            self.checkpoint_due = False
        except Exception as e:  # noqa: BLE001  (a missing checkpoint only makes bootstrap replay longer)
            self.checkpoint_due = True
            logger.warning("run %s: checkpoint at v%d not published (%s); retrying after the next version", self.config.run, self.version, e)
        if self.store:
            self.save_snapshot()

    def close(self, flush: bool = True):
        """Flush (delta mode, unless `flush=False`), save the trainer's snapshot (a clean stop leaves one at the head)
        and release the log."""
        try:
            if flush and self.in_doubt is None:
                self.flush()
        finally:
            if self.store and self.in_doubt is None:
                self.save_snapshot()
            self.log.close()
