"""Opening a site: the log, its keyring, its parts assembled, the bootstrap, the head, and vLLM loaded.

`Site.open` runs `open_site`. Building a `Site` does no I/O; this is the work done before it runs. A start that fails
or is refused closes what it opened and leaves no state dir it made (nothing was written in it).
"""
import pathlib
import time

from hilo.log import open_log
from hilo.replay.history import HistoryWriter
from hilo.replay.snapshot import SnapshotStore
from hilo.schemas.keyring import Keyring
from hilo.schemas.metrics import Metrics

from .config import SiteConfig


def open_site(cls, cfg: SiteConfig, log_backend=None, clock=time.time, metrics: Metrics | None = None):
    """A Site (`cls`) for `cfg`: open the log (unless `log_backend` is given), wait for the run's first checkpoint,
    bootstrap, and load the bootstrapped version into vLLM. `metrics`: the registry to record into (one a metrics
    endpoint already serves); default: a new one."""
    log = log_backend or open_log(cfg.target)
    keyring = Keyring.load(trust=cfg.trust)
    made = not pathlib.Path(cfg.state_dir).exists()  # a start refused leaves no state dir it made (nothing in it)
    site = cls(cfg, log, SnapshotStore(cfg.state_dir), None, keyring, clock, metrics,
               HistoryWriter(cfg.history) if cfg.history else None)
    try:
        site.owns_log = log_backend is None
        site.adopt(site.start.follower())
        site.serving.discard_newer(site.follower.replica.version)
        site.refresh_head(force=True)
        if site.serving.server and site.serving.start(site.follower.replica, cfg.vllm):
            site.commit()
    except BaseException:
        site.close()
        if made and not any(pathlib.Path(cfg.state_dir).iterdir()):
            pathlib.Path(cfg.state_dir).rmdir()
        raise
    return site
