"""A rollout site: bootstrap, follow the run's updates, export adapters, snapshot, commit, repeat.

    hilo consume --log kafka://trainer:9092 --run exp1 --site eu-1 --state-dir /var/lib/hilo/eu-1

Bootstrap order: --from-version (newest checkpoint <= V), else the local snapshot, else the newest
checkpoint on RUN.checkpoints (waiting for the producer if there is none yet). The snapshot (state +
next offset) is replaced atomically every K versions and on exit, so a crash at any instant restarts
from a whole snapshot and replays the rest; replay is deterministic, so it reaches the same digests.

After each read of the log, the *newest* applied version is exported, handed to the hook and loaded
into vLLM: a site catching up does not replay a backlog of reloads. If vLLM is down, the site keeps
applying versions and retries the newest one; the served adapter directory is never pruned.
"""
import collections
import json
import logging
import signal
import statistics
import sys
import time
from dataclasses import replace

from tqdm import tqdm

from hilo.log import checkpoints_topic, crashpoints, open_log, retry, site_group, updates_topic
from hilo.log.prefetch import Prefetcher
from hilo.log.outage import Outage
from hilo.log.site_reports import LINK_BPS
from hilo.log.tail import head, newest
from hilo.replay.bad_records import Skipped
from hilo.replay.checks import accepts
from hilo.replay.follower import Applied, Follower
from hilo.replay.history import HistoryWriter
from hilo.replay.snapshot import SnapshotStore
from hilo.replay.start import Source, choose_start
from hilo.schemas import headers as H
from hilo.schemas.errors import ConfigError, Expired, HiloError, LogError, LogUnavailable, NoSuchTopic
from hilo.schemas.metrics import Metrics
from hilo.schemas.position import Position
from hilo.schemas.signing import Signer, Verifier

from .config import SiteConfig
from .adapter_export import discard_beyond, export_adapter, prune_adapters
from .group_commit import GroupCommitter
from .lag_view import LagView
from .serving_state import ServingState
from .shell_hook import run_hook
from .vllm_serving import VllmDown, VllmError, VllmServer

logger = logging.getLogger(__name__)


class _NotYet(Exception):
    """The run's first checkpoint is not there yet (args[0]: the NoSuchTopic, when the topic is missing too)."""


class Site:
    """One site's follower plus its side effects (adapter export, hook, snapshot, group commit).

    Building one does no I/O; `Site.open(config)` opens the log, waits for the run, bootstraps and checks vLLM.
    """

    def __init__(self, cfg: SiteConfig, log, store: SnapshotStore, follower: Follower, verifier=None, clock=time.time,
                 metrics: Metrics | None = None):
        self.cfg, self.clock = cfg, clock
        self.log, self.store, self.follower, self.verifier = log, store, follower, verifier
        self.group = site_group(cfg.run, cfg.site)
        self.stopping = False
        self.history = HistoryWriter(cfg.history) if cfg.history else None
        self.since_snapshot = 0
        self.timing = {}              # seconds the newest export and vLLM load took: {"version", "export_s", "load_s"}
        self.committer = None         # the background group committer, started by the first commit
        self.server = VllmServer(cfg.vllm, cfg.lora_name) if cfg.vllm else None
        self.state = ServingState(cfg.retry_serve_s)
        self.metrics = metrics or Metrics("site", run=cfg.run, site=cfg.site)
        self.stop_reason = None       # the error that stopped the site, once one has
        self.view = LagView.at(0, 0)  # head and applied position, replaced whole (a scrape reads one consistent view)
        self.head_checked = 0.0       # monotonic time of the newest head refresh
        self.head_seen = (-1, None, -1, 0)  # (log end, first offset, version, log bytes) of the newest accepted message found
        self.outage = Outage(f"site {cfg.site}", self.metrics)  # the log reached before and unreachable now
        self.last_applied_at = clock()
        self.deliveries = collections.deque(maxlen=8)  # bytes/s of the last messages written while it waited (Applied.delivery)
        self.generator = None         # answers the run's prompts between versions, once `generate` is called
        self.metrics.set_function("seconds_since_applied", lambda: self.clock() - self.last_applied_at)
        self.metrics.set("serving_version", -1)
        self.metrics.set_view(lambda: self.view.gauges(), LagView.GAUGES)

    @classmethod
    def open(cls, cfg: SiteConfig, log_backend=None, clock=time.time, metrics: Metrics | None = None) -> "Site":
        """Open the log, wait for the run's first checkpoint, bootstrap, and load the bootstrapped version into vLLM.
        `metrics`: the registry to record into (one a metrics endpoint already serves); default: a new one."""
        log = log_backend or open_log(cfg.log, kafka_config=cfg.kafka_config)
        store = SnapshotStore(cfg.state_dir)
        verifier = Verifier.load(cfg.trust) if cfg.trust else None
        site = cls(cfg, log, store, None, verifier, clock, metrics)
        site.follower = site._bootstrap()
        site._discard_newer_adapters()
        site.view = LagView.at(site.follower.replica.version, site.follower.log_bytes)
        site.refresh_head(force=True)
        if site.history:
            r = site.follower.replica
            site.history.record(r.version, r.digest, site.follower.next_offset, start=True)
        if site.server:
            site._start_serving()
        return site

    @property
    def adapters_dir(self) -> str:
        """Where the exported adapter directories live."""
        return f"{self.cfg.state_dir}/adapters"

    def _discard_newer_adapters(self):
        """Adapters newer than the bootstrapped version are a dead incarnation's (it died after its snapshot): gone,
        so nothing serves, hooks or prunes by them; the replay exports what is needed again."""
        version = self.follower.replica.version
        gone = discard_beyond(self.adapters_dir, version)
        if gone:
            logger.warning("site %s: removed adapter dirs v%d..v%d left beyond the bootstrapped v%d (written before a crash; "
                           "replayed versions are exported again)", self.cfg.site, gone[0], gone[-1], version)

    def _start_serving(self):
        """Check the server and load the bootstrapped version now: a wrong server or adapter fails here, in one line."""
        try:
            version = self.server.check()
        except VllmDown as e:
            logger.warning("site %s: %s; applying versions meanwhile, retrying the newest", self.cfg.site, e)
            self.publish_newest()  # export now; the load is retried
            return
        logger.info("site %s: vLLM %s at %s serves %r", self.cfg.site, version, self.cfg.vllm, self.cfg.lora_name)
        self.publish_newest(strict=True)

    def _bootstrap(self, held=None) -> Follower:
        """The follower to start with: from the snapshot, a checkpoint or --from-version at start; from the newest
        checkpoint when a running site's next versions expired (`held`: its (replica, position))."""
        cfg = self.cfg
        if held is None:
            self._wait_for_topics()
            local = None if cfg.from_version is not None else self.store.load()
            if local is not None and local[0].run != cfg.run:
                raise ConfigError(f"site {cfg.site}: state dir {cfg.state_dir} holds a snapshot of run {local[0].run!r}, not of run "
                                  f"{cfg.run!r}: give each run its own state dir")
            if local is not None:
                self._same_history(*local)
        else:
            local = held
        start = choose_start(self.log, cfg.run, local, self.verifier, cfg.from_version if held is None else None)
        replica, pos = start.replica, start.position
        self.metrics.set("bootstrap_info", 1, source=start.source.name.lower())
        if start.source is Source.CHECKPOINT_OVER_EXPIRED:
            old = start.set_aside
            if replica.genesis != old.genesis:
                raise LogError(f"site {cfg.site}: holds v{old.version} of history {old.genesis.hex()[:12]}; the log holds another "
                               f"history of run {cfg.run} ({replica.genesis.hex()[:12]}, v{replica.version}): refusing to switch "
                               f"histories (remove {cfg.state_dir} to follow the new one)")
            if replica.version < old.version:
                raise LogError(f"site {cfg.site}: holds v{old.version}, whose next versions expired; the newest checkpoint on the "
                               f"log is v{replica.version}, older: nothing on the log can bring this site forward, and it never "
                               f"moves backwards. Restart it once the trainer publishes a newer checkpoint (every checkpoint_every "
                               f"versions, and when it restarts), or remove {cfg.state_dir} to follow from v{replica.version}")
            if replica.version == old.version and replica.digest != old.digest:
                raise LogError(f"site {cfg.site}: holds v{old.version} (digest {old.digest.hex()[:12]}); the log's checkpoint of "
                               f"v{replica.version} has digest {replica.digest.hex()[:12]}: a fork, refusing it")
            logger.warning("site %s: snapshot v%d is older than the retained log; bootstrapping from the newest checkpoint v%d",
                           cfg.site, old.version, replica.version)
        replica.recycle = True  # read only between versions (export, snapshot), never kept: apply reuses its buffers
        replica.verifier = self.verifier  # a snapshot was checked when its versions were applied; what follows is checked now
        if self.verifier is not None and pos.keys:  # key rotations this site verified before its restart
            replica.verifier = Verifier.from_raw(bytes.fromhex(pos.keys[-1][1]))
        if cfg.from_offset is not None and held is None:
            pos = replace(pos, next_offset=cfg.from_offset)
        logger.info("site %s: bootstrapped v%d (digest %s) from %s; reading %s from offset %d",
                    cfg.site, replica.version, replica.digest.hex()[:12], start.source.value, updates_topic(cfg.run), pos.next_offset)
        reader = Prefetcher(open_log(cfg.log, kafka_config=cfg.kafka_config), updates_topic(cfg.run)) if cfg.prefetch else None
        return Follower(self.log, cfg.run, replica, pos, cfg.on_bad_record, reader)

    def _same_history(self, replica, pos: Position):
        """A local snapshot must belong to the history the log holds: same genesis, and a log at least as far."""
        cfg, topic = self.cfg, updates_topic(self.cfg.run)
        h = head(self.log, checkpoints_topic(cfg.run), cfg.run) or {}
        theirs = h.get(H.GENESIS)
        if theirs is not None and theirs != replica.genesis.hex():
            raise LogError(f"site {cfg.site}: its snapshot v{replica.version} is of history {replica.genesis.hex()[:12]}, the log's "
                           f"checkpoints are of history {theirs[:12]} (another history: the run was started again under the same name): refusing "
                           f"it (remove {cfg.state_dir} to follow the new history)")
        # by version, not offset: a mirror of the run holds the same versions at smaller offsets (no transaction markers);
        # with every update expired there is no version to compare, and the offset is all there is. Only messages this
        # site would accept count: anyone who can write the topic can append a record that claims an old version.
        claimed = (head(self.log, topic, cfg.run) or {}).get(H.VERSION, "")
        if claimed.isdigit() and int(claimed) >= replica.version:
            return  # not behind, whoever wrote the tail (a junk record ahead is the follower's to skip)
        found = newest(self.log, topic, cfg.run, accepts(replica, topic))
        if found is None and pos.next_offset > self.log.end_offset(topic):
            raise LogError(f"site {cfg.site}: its snapshot has read {topic} up to offset {pos.next_offset}, the log ends at "
                           f"{self.log.end_offset(topic)} (the topic was deleted and made again?): refusing to move backwards "
                           f"(remove {cfg.state_dir} to start over)")
        newest_version = found.version if found is not None else replica.version
        if newest_version < replica.version:
            raise LogError(f"site {cfg.site}: its snapshot is at v{replica.version}, {topic} on {self.log.url} holds up to "
                           f"v{newest_version} (offset {found.first_offset}; a mirror that lags, or the topic was deleted and "
                           f"made again): refusing to move backwards (wait for the mirror, point --log at another cluster of "
                           f"the run, or remove {cfg.state_dir} to start over)")

    def _wait_for_topics(self):
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
                logger.info("site %s: waiting up to %.0fs for run %s's first checkpoint", cfg.site, cfg.wait_checkpoint_s, cfg.run)
        try:  # waiting on another process (the producer): polled every 0.2 s
            retry.call(ready, retriable=lambda e: isinstance(e, _NotYet), attempts=None, within_s=cfg.wait_checkpoint_s,
                       first_s=0.2, longest_s=0.2, on_retry=announce)
        except _NotYet as e:
            if e.args[0] is not None:
                try:
                    runs = self.log.runs()
                except LogError:  # no log at all: its own error says so
                    raise e.args[0] from None
                raise NoSuchTopic(f"site {cfg.site}: {self.log.url} holds no run {cfg.run!r} after {cfg.wait_checkpoint_s:g} s "
                                  f"(it holds {', '.join(runs[:8]) + (' ...' if len(runs) > 8 else '') if runs else 'no run'}): "
                                  f"the wrong cluster, a mirror not configured for this run, or the producer has not "
                                  f"started ({e.args[0]})") from None

    def generate(self, cfg) -> None:
        """Also answer the run's prompts (a GenerateConfig) with the policy vLLM serves, between versions."""
        from .generator import Generator
        if self.server is None:
            raise ConfigError(f"site {self.cfg.site}: generating needs a vLLM server (--vllm URL)")
        self.generator = Generator(cfg, lambda: self.log.prompt_queue(self.cfg.run, self.cfg.site, cfg.lease_s), self.server, self.cfg.run, self.cfg.site,
                                   lambda: self.state.serving[0] if self.state.serving else None, self.verifier,
                                   Signer.load(cfg.signing_key) if cfg.signing_key else None, self.metrics,
                                   serving_ok=lambda: not self.state.failing)
        logger.info("site %s: generating for run %s (reward %s, %d prompts at a time)", self.cfg.site, self.cfg.run,
                    cfg.reward, cfg.batch_prompts)

    # -- per version ---------------------------------------------------------------------------
    def on_event(self, event):
        """What the follower handed back: an applied version, or a skipped record."""
        if isinstance(event, Skipped):
            self.metrics.inc("records_refused", reason=event.reason)
            if self.history:
                self.history.skip(event.offset, event.reason)
            return
        self.on_applied(event)

    def on_applied(self, applied: Applied):
        """Bookkeeping after each applied version: snapshot every K, commit the position."""
        if self.history:
            work = sum(applied.timing.get(k, 0.0) for k in ("verify", "decode", "apply"))
            self.history.record(applied.version, applied.digest, applied.last_offset, w=applied.written_at,
                                b=applied.record_bytes, a=round(work, 5))
        m = self.metrics
        self.view = self.view.applied(applied.version, self.follower.log_bytes)
        m.inc("versions_applied")
        self.last_applied_at = self.clock()
        m.set("last_applied_timestamp_seconds", self.last_applied_at)
        m.inc("update_bytes_read", applied.record_bytes)
        if applied.delivery and applied.delivery[1] > 0:  # <= 0: the trainer's clock is ahead of this one
            self.deliveries.append(applied.delivery[0] / applied.delivery[1])
            m.set("link_bytes_per_second", statistics.median(self.deliveries))
        if applied.written_at is not None:
            m.observe("freshness_seconds", max(0.0, self.last_applied_at - applied.written_at))
        for stage, seconds in applied.timing.items():
            m.observe("stage_seconds", seconds, stage=stage)
        self.since_snapshot += 1
        if self.since_snapshot >= self.cfg.snapshot_every:
            self.snapshot()
        self.commit()
        logger.debug("site %s: applied v%d digest %s (offset %d)", self.cfg.site, applied.version, applied.digest.hex()[:12],
                     applied.last_offset)

    def publish_newest(self, strict: bool = False):
        """Export the newest version (once), run the hook, load it into vLLM; a vLLM that is down is retried later.

        strict: raise on any vLLM failure (at start, where a wrong server or adapter must stop the site).
        """
        r, cfg = self.follower.replica, self.cfg
        if not cfg.export_adapters:
            return
        t0 = time.perf_counter()
        if self.state.needs_export(r.version):
            keep = [self.state.serving[1]] if self.state.serving else []
            out = export_adapter(r, self.adapters_dir, cfg.export_dtype, cfg.keep_adapters, protect=keep)
            self.state.on_exported(r.version, out)
            self.timing = {"version": r.version, "export_s": time.perf_counter() - t0}
            self.metrics.observe("stage_seconds", self.timing["export_s"], stage="export")
            if cfg.on_version:
                run_hook(cfg.on_version, r.version, out, r.digest.hex())
        if self.server is None or not self.state.needs_load(r.version):
            return
        version, out = self.state.exported
        t1 = time.perf_counter()
        try:
            if self.server.version is None:
                self.server.check()
            self.server.load(out, version)
        except VllmDown as e:
            self._retry_later(e)
            return
        except VllmError as e:
            if strict:
                raise
            self._retry_later(e)
            return
        self.state.on_loaded()
        self.timing["load_s"] = time.perf_counter() - t1
        self.metrics.observe("stage_seconds", self.timing["load_s"], stage="vllm_reload")
        self.metrics.set("serving_version", version)
        prune_adapters(out.parent, cfg.keep_adapters, protect=[out])  # the previously served one may go now
        self.commit()

    def _retry_later(self, error):
        wait = self.state.on_failed(time.monotonic())
        logger.warning("site %s: vLLM did not take v%d (%s); still serving %s, retrying the newest in %.0fs", self.cfg.site,
                       self.state.exported[0], error, f"v{self.state.serving[0]}" if self.state.serving else "nothing", wait)

    def snapshot(self):
        """Atomically save state + position."""
        t0 = time.perf_counter()
        self.store.save(self.follower.replica, self.follower.position(saved_at=self.clock()))
        self.metrics.observe("stage_seconds", time.perf_counter() - t0, stage="snapshot")
        self.since_snapshot = 0

    def refresh_head(self, force: bool = False) -> None:
        """Read where the log's head stands (at most once a second) and update the view the lag gauges show.

        A site that has read everything the log holds is at the head whatever the last record's headers claim.
        Otherwise the head is the newest message it would accept (log/tail.newest): a record it would skip (junk, a
        replayed old version) says nothing of the head. Only messages past the last head found are read again.
        """
        now = time.monotonic()
        if not force and now - self.head_checked < 1.0:
            return
        self.head_checked = now
        f = self.follower
        version, log_bytes = f.replica.version, f.log_bytes
        end = self.log.end_offset(f.topic)
        if f.read_offset < end and end != self.head_seen[0]:
            found = newest(self.log, f.topic, self.cfg.run, accepts(f.replica, f.topic), after=self.head_seen[1])
            if found is not None and found.version > self.head_seen[2]:
                h = found.headers.get(H.LOG_BYTES, "")
                self.head_seen = (end, found.first_offset, found.version, int(h) if h.isdigit() else 0)
            else:
                self.head_seen = (end, *self.head_seen[1:])
        if f.read_offset < end:
            version, log_bytes = max(version, self.head_seen[2]), max(log_bytes, self.head_seen[3])
        self.view = self.view.with_head(version, log_bytes)

    def readiness(self, max_lag: int) -> tuple:
        """(ready, why): bootstrapped, not stopped by an error, at most `max_lag` versions behind the head."""
        view = self.view
        if self.stop_reason is not None:
            return False, f"stopped: {self.stop_reason}"
        if self.outage.down:
            return False, f"v{view.applied_version}: {self.outage.reason()}"
        if view.lag_versions > max_lag:
            return False, f"v{view.applied_version} is {view.lag_versions} versions behind the head v{view.head_version} (bound {max_lag})"
        return True, f"v{view.applied_version}, {view.lag_versions} behind the head"

    def commit(self):
        """Hand the position (and what it means) to the background committer of this site's consumer group.

        Advisory: the site's own snapshot is its truth, so a failing commit (a group coordinator moving, a broker
        down) never stops or slows applying and serving; it is reported once and retried (group_commit.py).
        """
        f = self.follower
        meta = {"site": self.cfg.site, "version": f.replica.version, "digest": f.replica.digest.hex(),
                "log_bytes": f.log_bytes, "applied_at": round(self.clock(), 3)}
        if self.deliveries:  # what `--budget auto` sizes messages by (producer/link_budget.py)
            meta[LINK_BPS] = round(statistics.median(self.deliveries))
        if self.server is not None:
            meta["serving_version"] = self.state.serving[0] if self.state.serving else None
        crashpoints.reach("site.committing")
        if self.committer is None:
            self.committer = GroupCommitter(self.log, self.group, updates_topic(self.cfg.run), self.cfg.site)
        self.committer.submit(f.next_offset, json.dumps(meta, separators=(",", ":")))

    # -- loop ----------------------------------------------------------------------------------
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
            # The replica only ever holds a fully applied, digest-checked version: saving it is always safe.
            self.snapshot()
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
        self.follower = self._bootstrap(held)
        r = self.follower.replica
        self.metrics.inc("rebootstraps")
        self.view = self.view.applied(r.version, self.follower.log_bytes)
        self.head_seen = (-1, None, -1, 0)
        if self.history:
            self.history.record(r.version, r.digest, self.follower.next_offset, start=True)
        self.snapshot()  # a crash from here restarts from the checkpoint's state, not from the expired position
        self.publish_newest()
        logger.warning("site %s: bootstrapped again at v%d (from v%d)", self.cfg.site, r.version, held[0].version)

    def _follow_once(self, start_head: int, bar) -> int:
        """One read: apply what it brought, serve the newest, refresh the head, answer prompts; versions applied."""
        cfg, f, n = self.cfg, self.follower, 0
        for event in f.updates(timeout_s=0.05 if self.generator else 1.0):
            self.on_event(event)
            if isinstance(event, Skipped):
                continue
            n += 1
            if event.version <= start_head:
                self.metrics.inc("versions_replayed")
            if self.stopping or (cfg.until_version is not None and event.version >= cfg.until_version):
                break
        if n or (self.server and self.state.retry_due(time.monotonic())):
            self.publish_newest()
        if n:
            bar.update(min(n, max(0, bar.total - bar.n)))
            logger.info("site %s: v%d digest %s", cfg.site, f.replica.version, f.replica.digest.hex()[:12])
        self.refresh_head(force=bool(n) or self.outage.down)
        if self.generator is not None and not self.stopping:
            self.generator.step()
        return n

    def close(self) -> None:
        """Let the last committed position land (bounded), stop the read-ahead, close the prompt queue. The log is
        the caller's. Idempotent: `run()` ends with it; a site that is only polled calls it itself."""
        if self.committer is not None:
            self.committer.close()
            self.committer = None
        self.follower.close()
        if self.generator is not None and self.generator.queue is not None:
            self.generator.queue.close()

    def install_signal_handlers(self):
        """SIGTERM/SIGINT stop the loop between versions."""
        def handler(signum, frame):
            logger.info("site %s: signal %d, stopping after the current version", self.cfg.site, signum)
            self.stopping = True
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
