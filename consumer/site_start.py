"""Where a site starts: wait for the run, check its snapshot against the log, bootstrap, and the follower.

Bootstrap order: --from-version (newest checkpoint <= V), else the local snapshot, else the newest checkpoint on
RUN.checkpoints (waiting for the producer if there is none yet). With --until-version N no checkpoint past N is used,
one whose replay to N expired is refused, and so is a snapshot already past N. A snapshot must belong to the history the
log holds and must not be ahead of it; a snapshot whose next versions expired is replaced by the newest checkpoint of
the same history, never an older one.
"""
import logging
from dataclasses import replace

from hilo.log import checkpoints_topic, open_log, retry, updates_topic
from hilo.log.prefetch import Prefetcher
from hilo.log.tail import head, newest
from hilo.replay.checks import accepts
from hilo.replay.follower import Follower
from hilo.replay.start import Source, choose_start
from hilo.replica import kernels
from hilo.schemas import headers as H
from hilo.schemas.errors import ConfigError, LogError, NoSuchTopic, PastVersion
from hilo.schemas.position import Position

logger = logging.getLogger(__name__)


class _NotYet(Exception):
    """The run's first checkpoint is not there yet (args[0]: the NoSuchTopic, when the topic is missing too)."""


class SiteStart:
    """Bootstraps site `cfg.site` (a SiteConfig) from `log`, its snapshot `store` and the site's `keyring`."""

    def __init__(self, cfg, log, store, keyring, metrics):
        self.cfg, self.log, self.store, self.keyring, self.metrics = cfg, log, store, keyring, metrics

    def follower(self, held=None) -> Follower:
        """The follower to start with: from the snapshot, a checkpoint or --from-version at start; from the newest
        checkpoint when a running site's next versions expired (`held`: its (replica, position))."""
        cfg = self.cfg
        if held is None:
            self.wait_for_topics()
            local = None if cfg.from_version is not None else self.store.load()
            if local is not None and local[0].run != cfg.run:
                raise ConfigError(f"site {cfg.site}: state dir {cfg.state_dir} holds a snapshot of run "
                                  f"{local[0].run!r}, not of run {cfg.run!r}: give each run its own state dir")
            if local is not None:
                self.same_history(*local)
                self.not_past(local[0])
        else:
            local = held
        start = choose_start(self.log, cfg.run, local, self.keyring.root, cfg.from_version if held is None else None,
                             cfg.until_version)
        replica, pos = start.replica, start.position
        self.metrics.set("bootstrap_info", 1, source=start.source.name.lower())
        if start.source is Source.CHECKPOINT_OVER_EXPIRED:
            old = start.set_aside
            if replica.genesis != old.genesis:
                raise LogError(f"site {cfg.site}: holds v{old.version} of history {old.genesis.hex()[:12]}; the log "
                               f"holds another history of run {cfg.run} ({replica.genesis.hex()[:12]}, "
                               f"v{replica.version}): refusing to switch histories (remove {cfg.state_dir} to follow "
                               f"the new one)")
            if replica.version < old.version:
                raise LogError(f"site {cfg.site}: holds v{old.version}, whose next versions expired; the newest "
                               f"checkpoint on the log is v{replica.version}, older: nothing on the log can bring this "
                               f"site forward, and it never moves backwards. Restart it once the trainer publishes a "
                               f"newer checkpoint (every checkpoint_every versions, and when it restarts), or remove "
                               f"{cfg.state_dir} to follow from v{replica.version}")
            if replica.version == old.version and replica.digest != old.digest:
                raise LogError(f"site {cfg.site}: holds v{old.version} (digest {old.digest.hex()[:12]}); the log's "
                               f"checkpoint of v{replica.version} has digest {replica.digest.hex()[:12]}: a fork, "
                               f"refusing it")
            logger.warning("site %s: snapshot v%d is older than the retained log; bootstrapping from the newest "
                           "checkpoint v%d",
                           cfg.site, old.version, replica.version)
        replica.recycle = True  # read only between versions (export, snapshot), never kept: apply reuses its buffers
        replica.apply_mode = cfg.apply
        why = kernels.unavailable(replica.state.optimizer)
        if why and cfg.apply == "kernel-only":
            raise ConfigError(f"site {cfg.site}: --apply kernel-only, but {replica.state.optimizer} has no fused "
                              f"kernel here ({why})")
        if why and cfg.apply == "kernel":
            kernels.say_once(replica.state.optimizer, why)
        if cfg.from_offset is not None and held is None:
            pos = replace(pos, next_offset=cfg.from_offset)
        logger.info("site %s: bootstrapped v%d (digest %s) from %s; reading %s from offset %d",
                    cfg.site, replica.version, replica.digest.hex()[:12], start.source.value, updates_topic(cfg.run),
                    pos.next_offset)
        reader = Prefetcher(open_log(cfg.target), updates_topic(cfg.run)) if cfg.prefetch else None
        # a snapshot was checked when its versions were applied; what follows is checked now, by the follower
        return Follower(self.log, cfg.run, replica, pos, cfg.on_bad_record, reader, trust=self.keyring)

    def not_past(self, replica) -> None:
        """With --until-version N, a snapshot already past N is refused (PastVersion): a site never moves backwards."""
        until = self.cfg.until_version
        if until is not None and replica.version > until:
            raise PastVersion(f"site {self.cfg.site}: its snapshot in {self.cfg.state_dir} is at v{replica.version}, "
                              f"past --until-version {until}, and a site never moves backwards: left as it is (a new "
                              f"--state-dir rebuilds v{until} from the log)")

    def same_history(self, replica, pos: Position):
        """A local snapshot must belong to the history the log holds: same genesis, and a log at least as far."""
        cfg, topic = self.cfg, updates_topic(self.cfg.run)
        theirs = (head(self.log, checkpoints_topic(cfg.run), cfg.run) or H.RecordHeaders()).genesis
        if theirs is not None and theirs != replica.genesis.hex():
            raise LogError(f"site {cfg.site}: its snapshot v{replica.version} is of history "
                           f"{replica.genesis.hex()[:12]}, the log's checkpoints are of history {theirs[:12]} (another "
                           f"history: the run was started again under the same name): refusing it (remove "
                           f"{cfg.state_dir} to follow the new history)")
        # by version, not offset: a mirror of the run holds the same versions at smaller offsets (no transaction
        # markers); with every update expired there is no version to compare, and the offset is all there is. Only
        # messages this site would accept count: anyone who can write the topic can append a record that claims an old
        # version.
        claimed = (head(self.log, topic, cfg.run) or H.RecordHeaders()).version
        if claimed is not None and claimed >= replica.version:
            return  # not behind, whoever wrote the tail (a junk record ahead is the follower's to skip)
        found = newest(self.log, topic, cfg.run, accepts(replica, topic))
        if found is None and pos.next_offset > self.log.end_offset(topic):
            raise LogError(f"site {cfg.site}: its snapshot has read {topic} up to offset {pos.next_offset}, the log "
                           f"ends at {self.log.end_offset(topic)} (the topic was deleted and made again?): refusing to "
                           f"move backwards (remove {cfg.state_dir} to start over)")
        newest_version = found.version if found is not None else replica.version
        if newest_version < replica.version:
            raise LogError(f"site {cfg.site}: its snapshot is at v{replica.version}, {topic} on {self.log.url} holds "
                           f"up to v{newest_version} (offset {found.first_offset}; a mirror that lags, or the topic "
                           f"was deleted and made again): refusing to move backwards (wait for the mirror, point --log "
                           f"at another cluster of the run, or remove {cfg.state_dir} to start over)")

    def wait_for_topics(self):
        """Wait (up to wait_checkpoint_s) for the run's first checkpoint; a topic still missing then is NoSuchTopic, a
        checkpoint still missing is left to bootstrap's clear error, anything else (a refused ACL) is raised at once."""
        cfg, topic = self.cfg, checkpoints_topic(self.cfg.run)

        def ready():
            try:
                self.log.check_topic(topic)
            except NoSuchTopic as e:  # not made yet
                raise _NotYet(e) from None
            if head(self.log, topic, cfg.run) is None:
                raise _NotYet(None)

        def announce(e, attempt):
            if attempt == 1:
                logger.info("site %s: waiting up to %.0fs for run %s's first checkpoint", cfg.site,
                            cfg.wait_checkpoint_s, cfg.run)
        try:  # waiting on another process (the producer): polled every 0.2 s
            retry.call(ready, retriable=lambda e: isinstance(e, _NotYet), attempts=None, within_s=cfg.wait_checkpoint_s,
                       first_s=0.2, longest_s=0.2, on_retry=announce)
        except _NotYet as e:
            if e.args[0] is not None:
                try:
                    runs = self.log.runs()
                except LogError:  # no log at all: its own error says so
                    raise e.args[0] from None
                raise NoSuchTopic(f"site {cfg.site}: {self.log.url} holds no run {cfg.run!r} after "
                                  f"{cfg.wait_checkpoint_s:g} s (it holds "
                                  f"{', '.join(runs[:8]) + (' ...' if len(runs) > 8 else '') if runs else 'no run'}): "
                                  f"the wrong cluster, a mirror not configured for this run, or the producer has not "
                                  f"started ({e.args[0]})") from None
