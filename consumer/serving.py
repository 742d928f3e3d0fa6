"""What a site serves: export the newest version as a PEFT adapter dir, run the hook, load it into vLLM, retry.

After each read of the log only the *newest* applied version is exported and loaded: a site catching up does not
replay a backlog of reloads. If vLLM is down or refuses, the site keeps applying versions, keeps serving the one
vLLM holds, and retries the newest with a backoff (serving_state.py). The served adapter dir is never pruned.
"""
import logging
import time

from .adapter_export import discard_beyond, export_adapter, prune_adapters
from .config import ServingConfig
from .self_check import SelfCheck, SelfCheckFailed
from .serving_state import ServingState
from .shell_hook import run_hook
from .vllm_serving import VllmDown, VllmError, VllmServer

logger = logging.getLogger(__name__)


class Serving:
    """One site's adapter exports and its vLLM server (None: export and hook only). The generator reads
    `version` (what vLLM serves now, or None) and `healthy` (its loads succeed and pass the self-check) and nothing
    else of the site. `export_version` and `adapter_to_load` are seams: a fault-injection harness (ops/faults/lies.py)
    overrides them in a subclass to make a site serve something other than its replica."""

    def __init__(self, cfg: ServingConfig, metrics):
        self.site, self.export, self.dtype, self.keep, self.hook = cfg.site, cfg.export_adapters, cfg.export_dtype, \
            cfg.keep_adapters, cfg.on_version
        self.adapters_dir = f"{cfg.state_dir}/adapters"
        self.server = VllmServer(cfg.vllm, cfg.lora_name) if cfg.vllm else None
        self.checker = SelfCheck(self.server, cfg.self_check_base, cfg.export_dtype, cfg.self_check_tolerance) \
            if self.server is not None and cfg.self_check else None
        self.state = ServingState(cfg.retry_serve_s)
        self.metrics = metrics
        self.timing = {}  # seconds the newest export and vLLM load took: {"version", "export_s", "load_s"}
        metrics.set("serving_version", -1)

    @property
    def version(self) -> int | None:
        """The version vLLM serves now (None before the first load)."""
        return self.state.serving[0] if self.state.serving else None

    @property
    def healthy(self) -> bool:
        """False while vLLM refuses or does not answer the newest load."""
        return not self.state.failing

    def discard_newer(self, version: int) -> None:
        """Adapters newer than the bootstrapped `version` are a dead incarnation's (it died after its snapshot): gone,
        so nothing serves, hooks or prunes by them; the replay exports what is needed again."""
        gone = discard_beyond(self.adapters_dir, version)
        if gone:
            logger.warning("site %s: removed adapter dirs v%d..v%d left beyond the bootstrapped v%d (written before a "
                           "crash; replayed versions are exported again)", self.site, gone[0], gone[-1], version)

    def start(self, replica, url: str) -> bool:
        """Check the server and load `replica`'s version now: a wrong server or adapter fails here, in one line. A
        server that does not answer is retried later. Returns whether it loaded."""
        try:
            version = self.server.check()
        except VllmDown as e:
            logger.warning("site %s: %s; applying versions meanwhile, retrying the newest", self.site, e)
            return self.publish(replica)  # export now; the load is retried
        logger.info("site %s: vLLM %s at %s serves %r", self.site, version, url, self.server.lora_name)
        return self.publish(replica, strict=True)

    def due(self, now: float) -> bool:
        """A failed load's backoff has passed: retry the newest."""
        return self.server is not None and self.state.retry_due(now)

    def publish(self, replica, strict: bool = False) -> bool:
        """Export `replica`'s version (once), run the hook, load it into vLLM; a vLLM that is down is retried later.
        Returns whether vLLM took a new version. strict: raise on any vLLM failure (at start, where a wrong server or
        adapter must stop the site)."""
        if not self.export:
            return False
        t0 = time.perf_counter()
        if self.state.needs_export(replica.version):
            keep = [self.state.serving[1]] if self.state.serving else []
            out = self.export_version(replica, keep)
            self.state.on_exported(replica.version, out)
            self.timing = {"version": replica.version, "export_s": time.perf_counter() - t0}
            self.metrics.observe("stage_seconds", self.timing["export_s"], stage="export")
            if self.hook:
                run_hook(self.hook, replica.version, out, replica.digest.hex())
        if self.server is None or not self.state.needs_load(replica.version):
            return False
        version, out = self.state.exported
        loaded = self.adapter_to_load(out)
        t1 = time.perf_counter()
        try:
            if self.server.version is None:
                self.server.check()
            self.server.load(loaded, version)
            load_s = time.perf_counter() - t1
            if self.checker is not None:
                self.checker.check(replica)
        except VllmError as e:
            if strict and not isinstance(e, VllmDown):
                raise
            self._retry_later(e)
            return False
        except SelfCheckFailed as e:  # vLLM took the load and serves something else: nothing is generated with it
            self.metrics.inc("self_check_failures")
            self.metrics.set("self_check_worst_difference", self.checker.worst)
            self._retry_later(e)
            return False
        if self.checker is not None:
            self.metrics.set("self_check_worst_difference", self.checker.worst)
            self.metrics.observe("stage_seconds", self.checker.seconds, stage="self_check")
            logger.info("site %s: self-check of v%d passed: worst log-probability difference %.3g (tolerance %g)",
                        self.site, version, self.checker.worst, self.checker.tolerance)
        self.state.on_loaded()
        self.timing["load_s"] = load_s  # the self-check's time is its own stage
        self.metrics.observe("stage_seconds", self.timing["load_s"], stage="vllm_reload")
        self.metrics.set("serving_version", version)
        prune_adapters(out.parent, self.keep, protect=[out, loaded])  # the previously served one may go now
        return True

    def export_version(self, replica, protect: list):
        """Write `replica`'s adapter dir (pruning old ones but `protect`); its path. A seam (see the class)."""
        return export_adapter(replica, self.adapters_dir, self.dtype, self.keep, protect=protect)

    def adapter_to_load(self, exported):
        """The adapter dir to load into vLLM for the newest exported version: `exported` itself. A seam (see the
        class)."""
        return exported

    def _retry_later(self, error) -> None:
        wait = self.state.on_failed(time.monotonic())
        if isinstance(error, SelfCheckFailed):
            logger.warning("site %s: self-check failed: %s; generating nothing until a load passes, retrying the "
                           "newest in %.0fs", self.site, error, wait)
            return
        logger.warning("site %s: vLLM did not take v%d (%s); still serving %s, retrying the newest in %.0fs", self.site,
                       self.state.exported[0], error, f"v{self.version}" if self.state.serving else "nothing", wait)
