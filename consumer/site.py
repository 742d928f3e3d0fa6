"""A rollout site: the loop. Follow the run's updates, serve the newest, snapshot, commit, repeat.

    hilo consume --log kafka://trainer:9092 --run exp1 --site eu-1 --state-dir /var/lib/hilo/eu-1

Its parts: opening it (site_open.py), where it starts (site_start.py), what it serves (serving.py), where the head
stands (head_watch.py), its committed position (group_commit.py), the prompts it answers (generator.py). The snapshot
(state + next offset) is replaced atomically every K versions and on exit, so a crash at any instant restarts from a
whole snapshot and replays the rest; replay is deterministic, so it reaches the same digests.
"""
import logging
import sys
import time

from tqdm import tqdm

from hilo.log import site_group, updates_topic
from hilo.log.outage import Outage
from hilo.replay.bad_records import Skipped
from hilo.replay.follower import Applied, Follower
from hilo.replay.history import HistoryWriter
from hilo.replay.snapshot import SnapshotStore
from hilo.schemas import crash_points
from hilo.schemas.errors import ConfigError, Expired, HiloError, LogUnavailable
from hilo.schemas.metrics import Metrics
from hilo.schemas.keyring import Keyring
from hilo.schemas.signing import Signer
from hilo.schemas.site_report import SiteReport

from .config import SiteConfig
from .generator import Generator
from .group_commit import GroupCommitter
from .head_watch import HeadWatch
from .lag_view import LagView
from .serving import Serving
from .site_metrics import LinkMeter, observe_applied
from .site_open import open_site
from .site_start import SiteStart
from .snapshots import Snapshots

logger = logging.getLogger(__name__)


class Site:
    """One site's follower plus its side effects (serving, snapshots, group commit), and its loop. Building one does
    no I/O; `Site.open(config)` opens the log, waits for the run, bootstraps and checks vLLM."""

    # seams: the classes a site builds its serving and generator from; ops/faults/lies.py sets lying subclasses, the
    # product never
    serving_type = Serving
    generator_type = Generator

    def __init__(self, cfg: SiteConfig, log, store: SnapshotStore, follower: Follower, keyring: Keyring | None = None,
                 clock=time.time, metrics: Metrics | None = None, history: HistoryWriter | None = None):
        """`keyring`: whom the site trusts (schemas/keyring.py), shared by its follower, replica and generator."""
        self.cfg, self.clock = cfg, clock
        self.keyring = keyring if keyring is not None else Keyring()
        self.log, self.store, self.follower, self.history = log, store, follower, history
        self.committer = None         # the background group committer, started by the first commit
        self.metrics = metrics or Metrics("site", run=cfg.run, site=cfg.site)
        self.serving = self.serving_type(cfg.serving, self.metrics)
        self.snapshots = Snapshots(store, cfg.snapshot_every, self.metrics, cfg.snapshot_every_s)
        self.start = SiteStart(cfg, log, store, self.keyring, self.metrics)
        self.heads = HeadWatch(log, cfg.run)
        self.stopping, self.stop_reason = False, None  # stop_reason: the error that stopped the site, once one has
        self.owns_log = False         # Site.open opened the log: close() closes it
        self.view = LagView.at(0, 0)  # head and applied position, replaced whole (a scrape reads one consistent view)
        self.outage = Outage(f"site {cfg.site}", self.metrics)  # the log reached before and unreachable now
        self.last_applied_at = clock()
        self.link = LinkMeter()
        self.generator = None         # answers the run's prompts between versions, once `generate` is called
        self.metrics.set_function("seconds_since_applied", lambda: self.clock() - self.last_applied_at)
        self.metrics.set_view(lambda: self.view.gauges(), LagView.GAUGES)

    @classmethod
    def open(cls, cfg: SiteConfig, log_backend=None, clock=time.time, metrics: Metrics | None = None) -> "Site":
        """Open the log, wait for the run's first checkpoint, bootstrap, and load the bootstrapped version into vLLM
        (site_open.py). `metrics`: the registry to record into; default: a new one."""
        return open_site(cls, cfg, log_backend, clock, metrics)

    def adopt(self, follower: Follower) -> None:
        """Follow on with `follower` (from a bootstrap): the view, a fresh head, the history's start line."""
        self.follower, r = follower, follower.replica
        self.view = self.view.applied(r.version, follower.log_bytes)
        self.heads.reset()
        if self.history:
            self.history.record(r.version, r.digest, follower.next_offset, start=True)

    def generate(self, cfg) -> None:
        """Also answer the run's prompts (a GenerateConfig) with the policy vLLM serves, between versions."""
        if self.serving.server is None:
            raise ConfigError(f"site {self.cfg.site}: generating needs a vLLM server (--vllm URL)")
        self.generator = self.generator_type(cfg, self.log, self.serving, self.cfg.run, self.cfg.site, self.keyring,
                                   Signer.load(cfg.signing_key) if cfg.signing_key else None, self.metrics)
        logger.info("site %s: generating for run %s (reward %s, %d prompts at a time)", self.cfg.site, self.cfg.run,
                    cfg.reward, cfg.batch_prompts)

    def on_event(self, event: Applied | Skipped):
        """Bookkeeping after what the follower handed back: a skipped record is counted; after an applied version,
        the metrics, a snapshot every K versions, and the position committed."""
        if isinstance(event, Skipped):
            self.metrics.inc("records_refused", reason=event.reason)
            if self.history:
                self.history.skip(event.offset, event.reason)
            return
        if self.history:
            self.history.applied(event)
        self.view = self.view.applied(event.version, self.follower.log_bytes)
        self.last_applied_at = self.clock()
        observe_applied(self.metrics, event, self.last_applied_at, self.link)
        self.snapshots.applied(self.follower, self.last_applied_at)
        if self.history:
            self.history.notes(self.snapshots.drain())
        self.commit()
        logger.debug("site %s: applied v%d digest %s (offset %d)", self.cfg.site, event.version,
                     event.digest.hex()[:12], event.last_offset)

    def publish_newest(self, strict: bool = False) -> None:
        """Export the newest version (once), run the hook, load it into vLLM; a load commits the position."""
        if self.serving.publish(self.follower.replica, strict):
            self.commit()

    def snapshot(self):
        """Atomically save state + position now (after the snapshot being written in the background, if one is)."""
        self.snapshots.save(self.follower, self.clock())

    def refresh_head(self, force: bool = False) -> None:
        """Read where the log's head stands (head_watch.py) and update the view the lag gauges show."""
        self.view = self.heads.refresh(self.follower, self.view, force)

    def readiness(self, max_lag: int) -> tuple:
        """(ready, why): bootstrapped, not stopped by an error, at most `max_lag` versions behind the head."""
        return self.view.readiness(max_lag, self.stop_reason, self.outage.reason() if self.outage.down else None)

    def commit(self):
        """Hand the position and its SiteReport to the background committer of this site's consumer group. Advisory:
        the snapshot is the site's truth, so a failing commit never stops or slows it; it is retried
        (group_commit.py)."""
        f, bps = self.follower, self.link.bps
        report = SiteReport(self.cfg.site, f.replica.version, f.replica.digest.hex(), f.log_bytes,
                            round(self.clock(), 3),
                            # link: what `--budget auto` sizes by
                            self.serving.version, None if bps is None else round(bps))
        crash_points.reach("site.committing")
        if self.committer is None:
            self.committer = GroupCommitter(self.log, site_group(self.cfg.run, self.cfg.site),
                                            updates_topic(self.cfg.run), self.cfg.site)
        self.committer.submit(f.next_offset, report.to_json())

    def run(self, progress: bool | None = None) -> int:
        """Follow until SIGTERM, --until-version or --idle-exit; returns the final version."""
        cfg = self.cfg  # self.follower is read each time: falling behind retention replaces it (_rebootstrap)
        self.refresh_head(force=True)
        start_head = self.view.head_version
        behind = max(0, start_head - self.follower.replica.version)
        bar = tqdm(total=behind, desc=f"{cfg.site} catching up", unit="v", file=sys.stderr,
                   disable=(not behind) if progress is None else not progress)
        last_new = time.monotonic()
        self.commit()
        try:
            while not self.stopping:
                if cfg.until_version is not None and self.follower.replica.version >= cfg.until_version:
                    break
                try:
                    n = self._follow_once(start_head, bar)
                except LogUnavailable as e:  # a log reached before: wait it out, never exit for it
                    self.outage.wait(e, lambda: self.stopping)
                    continue
                except Expired as e:  # fell behind retention: catch up from the newest checkpoint, as a restart would
                    self._rebootstrap(e)
                    continue
                self.outage.over()
                if n:
                    last_new = time.monotonic()
                elif cfg.idle_exit_s is not None and time.monotonic() - last_new > cfg.idle_exit_s:
                    logger.info("site %s: idle for %.0fs, exiting", cfg.site, cfg.idle_exit_s)
                    break
        except HiloError as e:  # a gap after a skip, a fork, a divergence: the state stays at the last good version
            self.stop_reason = str(e)
            self.metrics.set("stopped", 1)
            raise
        finally:
            bar.close()
            try:
                self.snapshot()  # always safe: the replica holds only whole, digest-checked versions
            finally:  # a disk that refuses it still leaves the position committed and every client closed
                self.commit()
                self.close()
        return self.follower.replica.version

    def _rebootstrap(self, error: Expired) -> None:
        """The versions after this site's expired while it ran: bootstrap again from the newest checkpoint (which must
        be of the same history and not behind it), snapshot that, and go on."""
        f = self.follower
        logger.warning("site %s: %s; bootstrapping again from the newest checkpoint", self.cfg.site, error)
        held = (f.replica, f.position(saved_at=self.clock()))
        f.close()
        self.adopt(self.start.follower(held))
        self.metrics.inc("rebootstraps")
        self.snapshot()  # a crash from here restarts from the checkpoint's state, not from the expired position
        self.publish_newest()
        logger.warning("site %s: bootstrapped again at v%d (from v%d)", self.cfg.site, self.follower.replica.version,
                       held[0].version)

    def _follow_once(self, start_head: int, bar) -> int:
        """One read: apply what it brought, serve the newest, refresh the head, answer prompts; versions applied."""
        cfg, f, n = self.cfg, self.follower, 0
        self.snapshots.check()  # a background snapshot that failed stops the site now, not at its next version
        for event in f.updates(timeout_s=0.05 if self.generator else 1.0):
            self.on_event(event)
            if isinstance(event, Skipped):
                continue
            n += 1
            if event.version <= start_head:
                self.metrics.inc("versions_replayed")
            if self.stopping or (cfg.until_version is not None and event.version >= cfg.until_version):
                break
        if n or self.serving.due(time.monotonic()):
            self.publish_newest()
        if n:
            bar.update(min(n, max(0, bar.total - bar.n)))
            logger.info("site %s: v%d digest %s", cfg.site, f.replica.version, f.replica.digest.hex()[:12])
        self.refresh_head(force=bool(n) or self.outage.down)
        if self.generator is not None and not self.stopping:
            self.generator.step()
        return n

    def close(self) -> None:
        """Idempotent end (`run()`'s; a polled site calls it): snapshot, last commit, read-ahead, prompt queue, and the
        log if `Site.open` opened it (one passed in is the caller's)."""
        self.snapshots.close(self.follower, self.clock())  # waits for the write in flight, then leaves one at the head
        if self.committer is not None:
            self.committer.close()
            self.committer = None
        if self.follower is not None:
            self.follower.close()
        if self.generator is not None and self.generator.queue is not None:
            self.generator.queue.close()
        if self.owns_log:
            self.log.close()
            self.owns_log = False
