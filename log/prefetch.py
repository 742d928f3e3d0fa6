"""Reading ahead: a second client fetches a topic's next records while the caller applies the last ones.

A site's time per version is fetch + verify + decode + apply. Over a slow link the fetch of version v+1 can
run while v is applied. `Prefetcher` reads one topic on a log client of its own (a Kafka consumer is not
safe to share between threads), in one thread, one batch ahead of the caller. A read is served from what
was fetched ahead only when the caller asks for exactly the offset that batch was read from; anything else
(the caller moved: it re-reads a half-read message, or seeks) drops the read-ahead and fetches from there.
It holds nothing durable: a batch fetched and never applied is simply read again after a restart.
"""
import threading
import time

from . import threads
from .base import Batch

AHEAD = 2  # batches held at most: the one the caller will ask for next and one beyond it


class Prefetcher:
    """A read-only view of one topic, `read` with the log's signature, fed by a thread on `client`."""

    def __init__(self, client, topic: str, max_bytes: int = 16 << 20, poll_s: float = 0.5):
        self.client, self.topic, self.max_bytes, self.poll_s = client, topic, max_bytes, poll_s
        self._cv = threading.Condition()
        self._ready = {}         # offset read from -> Batch (with .started and .fetched wall times)
        self._want = None        # the offset the thread fetches next; None until the first read
        self._closed = False
        self._error = None       # what the thread's client raised: re-raised to the caller, who decides
        self.hits = 0            # reads served from the read-ahead
        self.misses = 0          # reads that had to wait for a fetch of their own
        self._thread = threads.start(self._loop, f"prefetch {topic}")

    def read(self, topic: str, offset: int, timeout_s: float = 1.0, max_bytes: int | None = None,
             partition: int = 0) -> Batch:
        """The records at `offset` on (possibly none within `timeout_s`), like Log.read; the next batch is fetched
        in the background as soon as this one is handed over."""
        if topic != self.topic or partition != 0:
            raise ValueError(f"Prefetcher of {self.topic} asked for {topic} partition {partition}")
        deadline = time.monotonic() + timeout_s
        with self._cv:
            if offset in self._ready:
                self.hits += 1
            else:
                self.misses += 1
                self._ready = {}  # read from elsewhere: the caller moved (a half-read message again, a seek)
                self._want = offset
                self._cv.notify_all()
                while offset not in self._ready and self._error is None and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return Batch((), offset)
                    self._cv.wait(left)
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            if self._closed:
                raise ValueError(f"Prefetcher of {self.topic} is closed")
            batch = self._ready.pop(offset)
            if batch and self._want is None:
                self._want = batch.next_offset
            self._cv.notify_all()
            return batch

    def ahead(self, offset: int, timeout_s: float) -> bool:
        """Whether the batch at `offset` is fetched, waiting up to `timeout_s` for it (what a caller can check before
        it asks; tests use it to see the read-ahead happen)."""
        with self._cv:
            return self._cv.wait_for(lambda: offset in self._ready, timeout_s)

    def _loop(self):
        while True:
            with self._cv:
                while not self._closed and (self._want is None or self._want in self._ready or len(self._ready) >= AHEAD
                                            or self._error is not None):
                    self._cv.wait()
                if self._closed:
                    return
                pos = self._want
            started = time.time()
            try:
                batch = self.client.read(self.topic, pos, timeout_s=self.poll_s, max_bytes=self.max_bytes)
            except Exception as e:  # noqa: BLE001 - handed to the caller's thread, which knows what to do with it
                with self._cv:
                    self._error = e
                    self._cv.notify_all()
                continue
            batch.started, batch.fetched = started, time.time()
            with self._cv:
                if self._want == pos:  # the caller did not move meanwhile
                    self._ready[pos] = batch
                    # read ahead past a batch with records; an empty one is handed over as it is (nothing new yet)
                    self._want = batch.next_offset if batch else None
                    self._cv.notify_all()

    def close(self) -> None:
        """Stop the thread and close the client (once; later calls do nothing)."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=self.poll_s + 10)
        self.client.close()
