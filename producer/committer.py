"""Propose, then commit: each version the trainer proposes is put on the log, and only what the log acknowledges is
committed (the sync mode's state, the trainer's position and history, its snapshot, the published metrics).

The publish runs in line, or (ProducerConfig.pipeline) on a thread while the trainer computes the next step
(producer/inflight.py). A publish whose outcome cannot be told (it failed and the log could not be read either) is
held in doubt; `resync` settles it by reading the log, adopting the version only if the log holds it.
"""
import functools
import logging
import time

from hilo.schemas import crash_points
from hilo.schemas.errors import NotPublished

from .inflight import PipelinedPublish
from .trainer_metrics import count_skips, observe_published

logger = logging.getLogger(__name__)


class Committer:
    """HiLoProducer's propose-then-commit: publishes each proposal, commits what the log's acknowledgement decides, and
    holds what is not settled yet: the version in flight, the one in doubt, and the sync mode's state proposed with
    it."""

    def __init__(self, config, publisher, builder, sync, keyring, ledger, checkpoints, metrics, manifest, write_back,
                 save_snapshot):
        """The trainer's parts this commits to (no I/O). `write_back()`: copies the trainer's params into the model;
        `save_snapshot()`: the trainer's snapshot (HiLoProducer's)."""
        self.config, self.publisher, self.builder, self.sync, self.keyring = config, publisher, builder, sync, keyring
        self.ledger, self.checkpoints, self.metrics, self.manifest = ledger, checkpoints, metrics, manifest
        self.write_back, self.save_snapshot = write_back, save_snapshot
        self.in_doubt = None  # a Proposal published with an unknown outcome; settled by the next resync
        self.pending = None   # the trainer-only state of the proposal in flight (or in doubt): delta mode's master
        # ProducerConfig.pipeline: the version whose publish runs on its thread
        self.pipeline = PipelinedPublish(builder, write_back)
        self.last_step = {}

    def publish(self, proposal, pending, t0: float) -> int:
        """Publish `proposal` (with its checkpoint when due), then commit it and `pending` (the sync mode's state).
        Pipeline: first settle the version in flight, then adopt `proposal` and start its publish on a thread."""
        self.settle()  # the version before first: its failure is raised here, before anything newer is published
        self.pending, msg = pending, proposal.message
        crash_points.reach("trainer.encoded")
        replica = self.builder.replica
        checkpoint = self.checkpoints.of(proposal, replica.genesis)  # None: this version carries none
        send = functools.partial(self.publisher.publish, msg, self.keyring.signer, self.ledger.log_bytes, checkpoint,
                                 replica.version)
        if self.config.pipeline:
            self.pipeline.start(proposal, checkpoint is not None, t0, send)
            return msg.version
        try:
            published = send()
        except NotPublished as e:
            if e.in_doubt:
                self.in_doubt = proposal
            raise
        self.builder.commit(proposal)
        self._committed(proposal, published, checkpoint is not None, time.perf_counter() - t0)
        self.write_back()  # after the commit: delta mode writes back the master, which the commit moves
        return msg.version

    def settle(self) -> None:
        """Pipeline: wait for the version in flight (if any) and commit what its acknowledgement decides; if it is not
        on the log, return the trainer to the last version that is, and raise its error."""
        inflight = self.pipeline.inflight
        if inflight is None:
            return
        try:
            published, waited = self.pipeline.settle()
        except BaseException as e:
            if isinstance(e, NotPublished) and e.in_doubt:
                self.in_doubt = inflight.proposal  # as in line: the next step resyncs before anything else
            else:
                self.pending = None
            raise
        self._committed(inflight.proposal, published, inflight.wanted_checkpoint, inflight.critical_s, waited)

    def _committed(self, proposal, published, wanted_checkpoint: bool, total_s: float,
                   extra: dict | None = None) -> None:
        """What the log's acknowledgement of `proposal` decides: the sync state, position, history, metrics,
        snapshot."""
        msg = proposal.message
        observe_published(self.metrics, proposal, published.nbytes, self.manifest.adapter_bytes(), published.sign_s,
                          published.transaction_s)
        self.sync.commit(self.pending)
        self.pending = None
        # pipeline: at it until the next adopt
        self.ledger.committed(self.builder.replica, published.offsets[-1], published.nbytes)
        if self.checkpoints.settled(published, msg.version, wanted=wanted_checkpoint):
            self.save_snapshot()
        self.last_step = {"version": msg.version, "bytes": published.nbytes, "chunks": len(published.offsets),
                          "encode_s": proposal.timing["encode"], "apply_s": proposal.timing["apply"],
                          "total_s": total_s, "lag": msg.meta.get("lag", 0.0)} | (extra or {})

    def resync(self) -> None:
        """Settle a publish whose outcome was unknown: read the log from the last committed offset, adopt what it
        holds."""
        self.settle()
        pending, run, replica = self.in_doubt, self.config.run, self.builder.replica
        follower, ours = self.publisher.replay(replica, self.ledger.position, pending, self.config.on_bad_record,
                                               self.keyring)
        self.ledger.caught_up(follower, replica, ours)
        count_skips(self.metrics, follower.skips)
        if ours:
            self.builder.encoder.commit(pending.encoding)  # the log has our message: keep its error feedback
            self.sync.commit(self.pending)
            logger.warning("run %s: v%d, whose publish was in doubt, is on the log; continuing from it", run,
                           pending.version)
        elif pending is not None:
            logger.warning("run %s: v%d, whose publish was in doubt, is not on the log; it will be proposed again", run,
                           pending.version)
        self.in_doubt = self.pending = None
        self.write_back()
