"""HiLoProducer: the trainer side. After loss.backward(), `step()` publishes the compressed gradient.

    producer = HiLoProducer(peft_model, ProducerConfig(run="exp1", log="kafka://127.0.0.1:9092"))
    for batch in data:
        loss = model(**batch).loss; loss.backward()
        version = producer.step(lr=schedule(step))   # encode -> publish -> apply locally -> params into model

The trainer is a replica: its LoRA params are whatever the decoded messages make them, so every site
that applies the same messages holds the same policy, bit for bit.
"""
import logging
import re
import time
from dataclasses import dataclass, field

import torch

from hilo.consumer.follower import Follower, bootstrap_from_log
from hilo.ops.log import checkpoints_topic, open_log, updates_topic
from hilo.ops.log.tail import head, last_message
from hilo.replica.codecs import CODECS, Budget, make_encoder
from hilo.replica.optimizers import OPTIMIZERS
from hilo.replica.replica import PolicyReplica
from hilo.replica.snapshot import SnapshotStore
from hilo.schemas.chunks import DEFAULT_CHUNK_BYTES, split
from hilo.schemas.errors import ConfigError, LogError

from .lora_params import lora_parameters
from .update_builder import UpdateBuilder

log = logging.getLogger(__name__)
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")


@dataclass(frozen=True)
class ProducerConfig:
    """Trainer-side configuration. Every field is checked at construction.

    run: run id; topics are RUN.updates and RUN.checkpoints.
    log: file://DIR (embedded, one machine) or kafka://HOST:PORT. Default: file://./hilo-log
    codec: dense | topk | powersgd | spar. Default: spar
    budget: bytes per message (Budget(fraction=...) of the bf16 adapter, or Budget(bytes=...)). Default: 1.6%
    optimizer: sgd | adamw | lion | muon. Default: adamw
    hparams: optimizer hyperparameter defaults (lr, betas, ...); step(**h) overrides per step.
    checkpoint_every: publish a full checkpoint every K versions (bootstrap for late sites). Default: 50
    chunk_bytes: largest record value; bigger messages are split. Default: 900 KiB (Kafka's 1 MiB limit)
    state_dir: the trainer's own snapshot, for fast restarts. Default: None (resume from the log)
    adapter: PEFT adapter name. Default: "default"
    """

    run: str
    log: str = "file://./hilo-log"
    codec: str = "spar"
    budget: Budget = Budget()
    optimizer: str = "adamw"
    hparams: dict = field(default_factory=dict)
    checkpoint_every: int = 50
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    state_dir: str | None = None
    adapter: str = "default"

    def __post_init__(self):
        if not RUN_NAME.match(self.run):
            raise ConfigError(f"ProducerConfig.run = {self.run!r}: use letters, digits, '.', '_', '-' (topic names derive from it)")
        if self.codec not in CODECS:
            raise ConfigError(f"ProducerConfig.codec = {self.codec!r}: expected one of {sorted(CODECS)}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"ProducerConfig.optimizer = {self.optimizer!r}: expected one of {sorted(OPTIMIZERS)}")
        if self.checkpoint_every < 1:
            raise ConfigError(f"ProducerConfig.checkpoint_every = {self.checkpoint_every}: must be >= 1")
        if not 1024 <= self.chunk_bytes <= 64 << 20:
            raise ConfigError(f"ProducerConfig.chunk_bytes = {self.chunk_bytes}: must be in [1 KiB, 64 MiB]")
        OPTIMIZERS[self.optimizer]().check_hparams(OPTIMIZERS[self.optimizer]().defaults() | self.hparams, "ProducerConfig.hparams")


class HiLoProducer:
    """Publishes one update per `step()`; starts from genesis or resumes from the log head."""

    def __init__(self, model: torch.nn.Module, config: ProducerConfig, log_backend=None):
        self.config = config
        self.model = model
        self.log = log_backend or open_log(config.log)
        self.manifest, self.params = lora_parameters(model, config.adapter)
        self.updates, self.checkpoints = updates_topic(config.run), checkpoints_topic(config.run)
        self.log.create_topics(config.run)
        self.store = SnapshotStore(config.state_dir) if config.state_dir else None
        replica, self.log_bytes, self.next_offset = self._start()
        self.builder = UpdateBuilder(replica, make_encoder(config.codec, self.manifest, config.budget))
        self._write_back()

    @property
    def replica(self) -> PolicyReplica:
        """The trainer's own replica."""
        return self.builder.replica

    @property
    def version(self) -> int:
        """Last published version."""
        return self.replica.version

    def _start(self):
        """(replica, cumulative update bytes, next updates offset): genesis on an empty log, else resume."""
        run = self.config.run
        if last_message(self.log, self.checkpoints, run) is None:
            if self.log.end_offset(self.updates) > self.log.begin_offset(self.updates):
                raise LogError(f"{self.log.url}: {self.updates} has records but {self.checkpoints} has no checkpoint; refusing to start a second history")
            replica = PolicyReplica.genesis(run, self.manifest, [p.detach() for p in self.params], self.config.optimizer)
            offset = self.log.end_offset(self.updates)
            self._publish_checkpoint(replica, offset, 0)
            log.info("run %s: published genesis checkpoint (%d params, digest %s)", run, self.manifest.numel, replica.digest.hex()[:12])
            return replica, 0, offset
        local = self.store.load() if self.store else None
        replica, position = local if local else bootstrap_from_log(self.log, run)
        if replica.manifest.manifest_id != self.manifest.manifest_id:
            raise LogError(f"run {run}: the model's LoRA adapter does not match the run's manifest "
                           f"(model: {self.manifest.base_model}, rank {self.manifest.rank}, {len(self.manifest.blocks)} blocks; "
                           f"run: {replica.manifest.base_model}, rank {replica.manifest.rank}, {len(replica.manifest.blocks)} blocks)")
        if replica.state.optimizer != self.config.optimizer:
            raise ConfigError(f"run {run} uses optimizer {replica.state.optimizer!r}, config says {self.config.optimizer!r}")
        follower = Follower(self.log, run, replica, position["next_offset"], position.get("log_bytes", 0))
        follower.catch_up()
        head = last_message(self.log, self.updates, run)
        if head is not None and (head.version != replica.version or head.headers.get("hilo-digest") != replica.digest.hex()):
            raise LogError(f"run {run}: resumed at v{replica.version} but the log head is v{head.version}; another trainer may be writing")
        log.info("run %s: resumed at v%d (digest %s) from %s", run, replica.version, replica.digest.hex()[:12],
                 "local snapshot" if local else "the log")
        return replica, follower.log_bytes, follower.next_offset

    def _publish_checkpoint(self, replica, updates_offset, log_bytes):
        data = replica.checkpoint().to_bytes()
        extra = {"hilo-digest": replica.digest.hex(), "hilo-updates-offset": str(updates_offset), "hilo-log-bytes": str(log_bytes)}
        self.log.append(self.checkpoints, split(data, self.config.run, "checkpoint", replica.version, self.config.chunk_bytes, extra))

    def _write_back(self):
        """Copy the replica's fp32 params into the training model (its dtype)."""
        with torch.no_grad():
            for p, src in zip(self.params, self.replica.state.params):
                p.copy_(src.to(p.dtype))

    def step(self, meta: dict | None = None, **hparams) -> int:
        """Encode the LoRA grads, publish, apply locally, write params back, zero the grads. Returns the version."""
        t0 = time.perf_counter()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        h = self.config.hparams | hparams
        r, enc = self.replica, self.builder.encoder
        before = (r.state, r.digest, enc.residual)
        msg = self.builder.build(grads, h, meta)
        data = msg.to_bytes()
        extra = {"hilo-digest": msg.digest.hex(), "hilo-log-bytes": str(self.log_bytes + len(data))}
        try:
            offsets = self.log.append(self.updates, split(data, self.config.run, "update", msg.version, self.config.chunk_bytes, extra))
        except Exception:
            # The broker may have stored the message even though we saw an error: the log decides.
            h_ = head(self.log, self.updates, self.config.run) or {}
            if h_.get("hilo-version") != str(msg.version) or h_.get("hilo-digest") != msg.digest.hex():
                r.state, r.digest, enc.residual = before  # not published: as if this step never ran
                r.recent.pop(msg.version, None)
                raise
            offsets = [self.log.end_offset(self.updates) - 1]
        self.log_bytes += len(data)
        self.next_offset = offsets[-1] + 1
        self._write_back()
        for p in self.params:
            p.grad = None
        if msg.version % self.config.checkpoint_every == 0:
            self._publish_checkpoint(self.replica, self.next_offset, self.log_bytes)
            if self.store:
                self.store.save(self.replica, {"next_offset": self.next_offset, "log_bytes": self.log_bytes})
        self.last_step = {"version": msg.version, "bytes": len(data), "chunks": len(offsets),
                          "encode_s": self.builder.timing["encode"], "apply_s": self.builder.timing["apply"],
                          "total_s": time.perf_counter() - t0}
        return msg.version

    def close(self):
        """Release the log."""
        self.log.close()
