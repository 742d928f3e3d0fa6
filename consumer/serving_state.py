"""What a site has exported and what its inference server serves: one small state machine.

    exported(v, dir) -> loaded(v) | failed(error)          (failed: retry the newest export after a backoff)

The newest export is what the next load takes (a site catching up loads only the newest version); a failed
load keeps serving the previous version and doubles the wait before the next try, up to `MAX_WAIT_S`.
"""
from dataclasses import dataclass, field

from hilo.log.retry import Backoff

MAX_WAIT_S = 60.0


@dataclass
class ServingState:
    """exported / serving: (version, adapter dir) or None. first_wait_s: the first backoff after a failed load."""

    first_wait_s: float
    exported: tuple | None = None
    serving: tuple | None = None
    served_versions: list = field(default_factory=list)   # every version loaded, in order
    retry_at: float = 0.0                                 # monotonic time of the next retry of a failed load

    def __post_init__(self):
        self.backoff = Backoff(self.first_wait_s, MAX_WAIT_S)

    def on_exported(self, version: int, out) -> None:
        """The newest version was written to `out`."""
        self.exported = (version, out)

    def needs_export(self, version: int) -> bool:
        """Whether `version` is not yet exported."""
        return self.exported is None or self.exported[0] != version

    def needs_load(self, version: int) -> bool:
        """Whether the server does not serve `version` yet."""
        return self.serving is None or self.serving[0] != version

    def retry_due(self, now: float) -> bool:
        """A failed load's backoff has passed and the server still lacks the newest export."""
        return self.serving != self.exported and now >= self.retry_at

    @property
    def failing(self) -> bool:
        """The newest load failed and none has succeeded since (the server is down or refuses)."""
        return self.backoff.failures > 0

    def on_loaded(self) -> None:
        """The server took the newest export."""
        self.serving = self.exported
        self.backoff.reset()
        self.served_versions.append(self.exported[0])

    def on_failed(self, now: float) -> float:
        """The load failed: schedule the retry; returns the wait chosen."""
        wait = self.backoff.next()
        self.retry_at = now + wait
        return wait
