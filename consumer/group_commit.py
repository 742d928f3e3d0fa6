"""A site's consumer-group commit, in the background: applying and serving never wait on a group coordinator.

The site's own snapshot is its truth; the group offset is what `hilo lag` and Kafka's tools read. So the
newest position is handed to a thread that commits it, and a failed commit (a coordinator moving, a broker
down for a while) is reported once per streak and retried with backoff, newer positions replacing older
ones. `close` gives the last position a bounded time to land.
"""
import logging
import threading

from hilo.log import threads
from hilo.log.retry import Backoff
from hilo.schemas.errors import HiloError

logger = logging.getLogger(__name__)
# first and longest wait between failed commits: a position is true within ~20 s of a fault's end
BACKOFF_S = (0.5, 10.0)


class GroupCommitter:
    """Commits the newest submitted (offset, metadata) of `group` on `topic`, off the caller's thread."""

    def __init__(self, log, group: str, topic: str, site: str):
        self.log, self.group, self.topic, self.site = log, group, topic, site
        self.failing = False     # the last attempt failed (reported once per streak)
        self.committed = None    # the last (offset, metadata) that landed
        self._pending, self._stop = None, False
        self._cv = threading.Condition()
        self._thread = threads.start(self._loop, f"hilo-commit-{site}")

    def submit(self, offset: int, metadata: str) -> None:
        """Commit this position as soon as possible (replacing any older one not yet committed)."""
        with self._cv:
            self._pending = (offset, metadata)
            self._cv.notify()

    def _loop(self):
        backoff = Backoff(*BACKOFF_S)
        while True:
            with self._cv:
                while self._pending is None and not self._stop:
                    self._cv.wait()
                if self._pending is None:
                    return
                item, self._pending = self._pending, None
            try:
                self.log.commit(self.group, self.topic, *item)
            except HiloError as e:
                if not self.failing:
                    logger.warning("site %s: committing its position failed (%s); applying and serving go on, the "
                                   "commit is retried in the background (hilo lag shows the last committed position "
                                   "meanwhile)", self.site, e)
                self.failing = True
                with self._cv:
                    if self._pending is None:
                        self._pending = item  # retry this one unless a newer one came
                    if self._stop:
                        return
                    self._cv.wait(backoff.next())  # a stop or a newer position wakes it early
                continue
            if self.failing:
                logger.info("site %s: position committed again (offset %d)", self.site, item[0])
            self.failing, self.committed = False, item
            backoff.reset()

    def close(self, timeout_s: float = 30.0) -> None:
        """Let the newest position land (one more try if the last failed), then stop; bounded by `timeout_s`."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout_s)
