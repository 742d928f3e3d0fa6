"""The trainer's checkpoints: when a version carries one, its records, keeping the newest K, and key rotation.

A checkpoint is how a late site joins: it bootstraps from the newest one and replays the updates after it. One is
due every `checkpoint_every` versions, after one failed (retried with the next version), and whenever the newest one
or the updates after it could expire before the next (producer/retention_guard.py, which follows both topics' limits).
Older ones only make a bootstrap's replay longer, so the topic keeps the newest `keep_checkpoints` this trainer
published.
"""
import logging

from hilo.log import checkpoints_topic, updates_topic
from hilo.schemas import headers as H
from hilo.schemas.chunks import split
from hilo.schemas.errors import LogError
from hilo.schemas.records import KeyRotation

from .retention_guard import RetentionGuard

logger = logging.getLogger(__name__)


class Checkpoints:
    """Cadence, records and trimming of one run's checkpoints; they are signed with `keyring`'s signer (the
    trainer's)."""

    def __init__(self, log, run: str, every: int, keep: int, chunk_bytes: int, keyring, metrics,
                 retention: RetentionGuard):
        """Store the parts (no I/O); `Checkpoints.open` is how a trainer makes one. `keyring`: a
        schemas.keyring.Keyring."""
        self.log, self.run, self.every, self.keep, self.chunk_bytes = log, run, every, keep, chunk_bytes
        self.keyring, self.metrics = keyring, metrics
        self.topic, self.updates = checkpoints_topic(run), updates_topic(run)
        self.retention = retention  # checkpoints before it, or the updates it needs, expire
        self.retry_due = False   # a checkpoint publish failed; retried with the next version
        self.starts = []         # first offsets of the checkpoints this process published (for trimming)
        self.last_bytes = None   # bytes of the newest checkpoint record made

    @classmethod
    def open(cls, log, run: str, every: int, keep: int, chunk_bytes: int, keyring, metrics) -> "Checkpoints":
        """Read both topics' retention limits from `log` and register the `joinable` gauges in `metrics`."""
        retention = RetentionGuard(log, run)
        metrics.set_function("joinable", retention.joinable)
        metrics.set_function("joinable_until_timestamp_seconds", retention.joinable_until)
        return cls(log, run, every, keep, chunk_bytes, keyring, metrics, retention)

    def due(self, version: int) -> bool:
        """Whether `version` carries a checkpoint (its cadence, one failed before, or retention)."""
        if version % self.every == 0 or self.retry_due:
            return True
        why = self.retention.due()
        if why:
            logger.info("run %s: checkpoint with v%d, before the newest one or the updates after it can expire: %s",
                        self.run, version, why)
        return why is not None

    def of(self, proposal, genesis: bytes):
        """None when `proposal`'s version carries no checkpoint; else records(updates_offset, log_bytes) of the
        checkpoint of the state it leads to, to publish in the same transaction."""
        if not self.due(proposal.version):
            return None
        msg = proposal.message

        def records(updates_offset: int, log_bytes: int) -> list:
            return self.records(proposal.state.to_checkpoint(self.run, genesis, msg.digest), updates_offset, log_bytes)
        return records

    def settled(self, published, version: int, wanted: bool) -> bool:
        """After `version` is on the log: whether its checkpoint is too (then the trainer snapshot is saved). One that
        was `wanted` and is not (a non-transactional log, a publish settled as committed) is retried next version."""
        if published.checkpoint_offsets is not None:
            self.published(published.checkpoint_offsets[0], self.last_bytes)
            return True
        self.updated(published.nbytes)
        if wanted:
            self.missed(version)
        return False

    def records(self, ckpt, updates_offset: int, log_bytes: int) -> list:
        """The chunk records of checkpoint `ckpt`, whose replay starts at `updates_offset` of the updates topic."""
        data = ckpt.to_bytes(self.keyring.signer)
        self.last_bytes = len(data)
        extra = H.checkpoint_headers(ckpt.digest, updates_offset, log_bytes, ckpt.genesis)
        return split(data, self.run, "checkpoint", ckpt.version, self.chunk_bytes, extra)

    def publish(self, replica, updates_offset: int, log_bytes: int) -> None:
        """Append a checkpoint of `replica` on its own (a start, a key rotation); raises what the log raised."""
        records = self.records(replica.checkpoint(), updates_offset, log_bytes)
        self.published(self.log.append(self.topic, records)[0], self.last_bytes)

    def try_publish(self, replica, updates_offset: int, log_bytes: int) -> None:
        """`publish`, where a failure only delays it: retried with the next version."""
        try:
            self.publish(replica, updates_offset, log_bytes)
        except Exception as e:  # noqa: BLE001  (a missing checkpoint only makes bootstrap replay longer)
            self.retry_due = True
            logger.warning("run %s: checkpoint at v%d not published (%s); retrying after the next version", self.run,
                           replica.version, e)

    def missed(self, version: int) -> None:
        """`version` is published and its checkpoint is not (a non-transactional log): the next version carries one."""
        self.retry_due = True
        logger.warning("run %s: checkpoint at v%d not published; retrying with the next version", self.run, version)

    def updated(self, nbytes: int) -> None:
        """An update without a checkpoint is on the log."""
        self.retention.on_update(nbytes)

    def published(self, first_offset: int, nbytes: int | None = None) -> None:
        """A checkpoint (of `nbytes`) is on the log at `first_offset`: keep only the newest `keep`."""
        self.metrics.inc("checkpoints_published")
        self.retention.on_checkpoint(nbytes)
        self.retry_due = False
        self.starts.append(first_offset)
        if len(self.starts) > self.keep:  # bounded storage: older checkpoints only make bootstrap replay longer
            before = self.starts[-self.keep]
            try:
                if self.log.trim(self.topic, before):
                    logger.info("run %s: checkpoints before offset %d deleted (keeping the newest %d)", self.run,
                                before, self.keep)
                self.starts = self.starts[-self.keep:]
            except LogError as e:  # the checkpoint itself is published; the trim is retried after the next one
                logger.warning("run %s: deleting old checkpoints failed (%s); retried after the next checkpoint",
                               self.run, e)

    def rotate_key(self, new, replica, log_bytes: int) -> int:
        """Move the run to signer `new`: a 'next key' record signed by the current key (sites that trust it follow),
        then the keyring's one rotation (everything holding it signs with `new`), then (by the caller, at the returned
        updates end offset) a checkpoint signed by the new one."""
        rot = KeyRotation(self.run, replica.version + 1, new.public_bytes())
        extra = H.key_headers(replica.digest, log_bytes)
        self.log.append(self.updates, split(rot.to_bytes(self.keyring.signer), self.run, "key", replica.version,
                                            self.chunk_bytes, extra))
        old = self.keyring.rotate(new)
        logger.warning("run %s: from v%d signed by key %s (was %s)", self.run, replica.version + 1, new.key_id.hex(),
                       old.key_id.hex())
        return self.log.end_offset(self.updates)
