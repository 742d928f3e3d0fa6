"""Where a trainer starts: genesis on an empty log, its own snapshot, or the newest checkpoint; then the log head.

`decide` reads the log and makes every refusal before the trainer takes the run's transactional id, so a trainer
that would be refused never fences the running one; `run` comes after fencing, so no earlier trainer writes while
this one catches up. The decision:
- no checkpoint on the log: genesis (published as the first checkpoint), unless the log once held the run and
  everything expired, where only the trainer's snapshot (or new_history) may go on;
- otherwise the shared start decision (replay/start.py): the snapshot if the log still holds what follows it,
  else the newest checkpoint; then every update to the log head is applied, as a site applies them.
A checkpoint whose updates expired is replaced by a fresh one, so late sites can always bootstrap.
"""
import dataclasses
import logging
import os
from dataclasses import dataclass

from hilo.log import checkpoints_topic, updates_topic
from hilo.log.site_reports import site_reports
from hilo.log.tail import head
from hilo.replay.bad_records import OnBadRecord
from hilo.replay.follower import Follower
from hilo.replay.start import Source, Start, choose_start
from hilo.replica.replica import PolicyReplica
from hilo.schemas.errors import ConfigError, LogError
from hilo.schemas.position import Position
from hilo.schemas.records import NONCE_BYTES

from .delta import ADD

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resumed:
    """The trainer's replica at the log head, the position after it, and the version of the trainer snapshot used
    (its encoder state applies only if the log had not moved past it)."""

    replica: PolicyReplica
    position: Position
    snapshot_version: int | None
    skips: dict | None = None   # reason -> records skipped while catching up
    checkpoint: bool = False    # the caller publishes a checkpoint of `replica` at `position` before anything else


def catch_up(log, run: str, replica, position: Position, on_bad_record: OnBadRecord = OnBadRecord.SKIP,
             trust=None) -> Follower:
    """Apply the log from `position` to its end on `replica`, classifying every record as a site does:
    duplicates skipped, records that cannot be the run's skipped loudly, a gap or fork raises (another writer).
    `trust`: the trainer's keyring (a signed run applies only what its keys signed; the replica shares it)."""
    follower = Follower(log, run, replica, position, on_bad_record, trust=trust)
    follower.catch_up_all()
    return follower


@dataclass(frozen=True)
class Decision:
    """How a trainer will start, decided by reading the log only: "genesis", "expired" (continue an expired log from
    the snapshot) or "resume" (from `start`). `checkpoints_end` is where RUN.checkpoints ended when it was decided."""

    how: str
    checkpoints_end: int
    start: Start | None = None
    had: int = 0   # genesis: the highest offset the run's topics ever reached (0: a new run)


class TrainerStart:
    """The start decision of one trainer of run `run`, for a model of `manifest` whose sites apply `site_optimizer`.

    `decide` makes every refusal by reading the log only, so a trainer that would be refused is refused before it
    fences the one that runs; `run` then (after fencing) catches up and says which checkpoint the start needs."""

    def __init__(self, log, run: str, manifest, site_optimizer: str, new_history: bool = False,
                 on_bad_record: OnBadRecord = OnBadRecord.SKIP):
        self.log, self.run_id, self.manifest, self.site_optimizer = log, run, manifest, site_optimizer
        self.new_history, self.on_bad_record = new_history, on_bad_record
        self.updates, self.checkpoints = updates_topic(run), checkpoints_topic(run)

    def decide(self, snapshot, verifier=None) -> Decision:
        """Every check against the log (history, manifest, optimizer, signing key, retention), writing nothing."""
        run, log = self.run_id, self.log
        end = log.end_offset(self.checkpoints)
        if snapshot is not None and snapshot[0].run != run:
            raise ConfigError(f"run {run}: the trainer's state dir holds a snapshot of run {snapshot[0].run!r}: give "
                              f"each run its own state dir")
        if snapshot is not None:
            self.check_layout(snapshot[0])
        if head(log, self.checkpoints, run) is None:  # headers only: a checkpoint can be GBs
            if log.end_offset(self.updates) > log.begin_offset(self.updates):
                raise LogError(f"{log.url}: {self.updates} has records but {self.checkpoints} has no checkpoint; "
                               f"refusing to start a second history")
            had = max(log.end_offset(self.updates), end)  # offsets survive retention
            if had and snapshot is not None:
                self._check_no_site_ahead(snapshot[0])
                return Decision("expired", end)
            if had and not self.new_history:
                raise LogError(f"run {run}: this log held a history of the run (offsets up to {had}) whose records "
                               f"have all expired, and this trainer has no snapshot of it (state_dir); a new genesis "
                               f"under the same name would fork every site. Restart with the trainer's state dir to "
                               f"continue it, or pass new_history=True (--new-history) to start over (sites that "
                               f"followed the old history refuse the new one until their state is reset)")
            return Decision("genesis", end, had=had)
        theirs = head(log, self.checkpoints, run).genesis
        if snapshot is not None and theirs is not None and theirs != snapshot[0].genesis.hex():
            raise ConfigError(f"run {run}: the trainer's state dir holds v{snapshot[0].version} of history "
                              f"{snapshot[0].genesis.hex()[:12]}, the log's checkpoints are of history {theirs[:12]} "
                              f"(another trainer started the run again): give this trainer the state dir of the "
                              f"history on the log, or none")
        begin = log.begin_offset(self.updates)
        start = choose_start(log, run, snapshot, verifier=verifier)  # a checkpoint another key signed is refused here
        if start.source is not Source.SNAPSHOT:
            replica, position = start.replica, start.position
            self.check_layout(replica)
            if not log.retained(self.updates, position.next_offset):
                raise LogError(f"run {run}: the updates after checkpoint v{replica.version} (offsets "
                               f"{position.next_offset}..{begin - 1}) have expired; the versions after "
                               f"v{replica.version} cannot be rebuilt without a trainer snapshot taken after them "
                               f"(state_dir, saved at every checkpoint and on close). Restart with that state dir, or "
                               f"start over with new_history=True (--new-history)")
        return Decision("resume", end, start)

    def run(self, snapshot, params: list, keyring=None, decided: Decision | None = None) -> Resumed:
        """Start from `snapshot` ((replica, Position) of the trainer's state dir, or None) and the model's `params`;
        `decided` (by `decide`, before fencing) is used when no checkpoint was published since, else decided again.
        Writes nothing: where the start needs a checkpoint published, the result says so (Resumed.checkpoint).
        `keyring`: the trainer's (schemas/keyring.py; its replica shares it)."""
        run, log = self.run_id, self.log
        if decided is None or decided.checkpoints_end != log.end_offset(self.checkpoints):
            decided = self.decide(snapshot, keyring.root if keyring is not None else None)
        if decided.how == "expired":
            return self._continue_expired(*snapshot)
        if decided.how == "genesis":
            # A fresh nonce: a history started again from the same weights (the same seed) is still another history.
            replica = PolicyReplica.genesis(run, self.manifest, [p.detach() for p in params], self.site_optimizer,
                                            nonce=os.urandom(NONCE_BYTES))
            if decided.had:
                logger.warning(
                    "run %s: STARTING A NEW HISTORY (history %s) over an expired one, as asked (new_history)", run,
                               replica.genesis.hex()[:12])
            logger.info("run %s: genesis (%d params, digest %s), published as the first checkpoint", run,
                        self.manifest.numel, replica.digest.hex()[:12])
            return Resumed(replica, Position(log.end_offset(self.updates), 0), None, checkpoint=True)
        start = decided.start
        replica, position = start.replica, start.position
        snapshot_version = replica.version if start.source is Source.SNAPSHOT else None
        # a signed run: the trainer applies only what its key signed, whatever it started from
        follower = catch_up(log, run, replica, position, self.on_bad_record, trust=keyring)
        logger.info("run %s: resumed at v%d (digest %s) from %s", run, replica.version, replica.digest.hex()[:12],
                    start.source.value)
        # no site could bootstrap from it
        stale = not log.retained(self.updates, head(log, self.checkpoints, run).updates_offset or 0)
        if stale:
            logger.warning("run %s: the newest checkpoint's updates have expired; a fresh checkpoint at v%d is "
                           "published", run,
                           replica.version)
        return Resumed(replica, follower.position(), snapshot_version, dict(follower.skips), checkpoint=stale)

    def check_layout(self, replica):
        """The model and config must be the run's: same adapter layout, same optimizer."""
        run, manifest = self.run_id, self.manifest
        # The digest definition is the run's, fixed at its genesis, whichever one this build gives new runs (the trainer
        # goes on under the run's manifest: HiLoProducer.open hands on started.replica.manifest).
        if replica.manifest.manifest_id != dataclasses.replace(manifest,
                                                               digest_version=replica.manifest.digest_version).manifest_id:
            raise LogError(f"run {run}: the model's LoRA adapter does not match the run's manifest "
                           f"(model: {manifest.base_model}, rank {manifest.rank}, {len(manifest.blocks)} blocks; "
                           f"run: {replica.manifest.base_model}, rank {replica.manifest.rank}, "
                           f"{len(replica.manifest.blocks)} blocks)")
        if replica.state.optimizer != self.site_optimizer:
            def says(o):
                return "mode delta (sites apply 'add')" if o == ADD else f"mode gradient, optimizer {o!r}"
            raise ConfigError(f"run {run} is a {says(replica.state.optimizer)} run; this config says "
                              f"{says(self.site_optimizer)}")

    def _check_no_site_ahead(self, replica):
        """Continuing an expired log from `replica` must not fork a site that is already past it."""
        run = self.run_id
        for group, _, report in site_reports(self.log, run):  # sites' committed positions outlive the records
            if report.version > replica.version:
                raise LogError(f"run {run}: site group {group} is at v{report.version}, beyond this trainer's snapshot "
                               f"v{replica.version}; continuing from the snapshot would fork it. Use the trainer's "
                               f"newest state dir")

    def _continue_expired(self, replica, position):
        """Every record expired, but this trainer's snapshot holds the history: re-publish it as a checkpoint, go on."""
        logger.warning("run %s: the log's records have expired; continuing from this trainer's snapshot v%d (a fresh "
                       "checkpoint is published)", self.run_id, replica.version)
        return Resumed(replica, Position(self.log.end_offset(self.updates), position.log_bytes), replica.version,
                       checkpoint=True)
