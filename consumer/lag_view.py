"""Where a site stands against the log's head, as one value: the lag gauges and /readyz read the same one.

Replaced whole (never edited in place) when a version is applied or the head is read again, so a scrape that reads
it once sees lag_versions == head_version - applied_version, whatever the apply loop is doing meanwhile.
"""
from dataclasses import dataclass, replace
from typing import ClassVar


@dataclass(frozen=True)
class LagView:
    """The head (version, update bytes through it) and the applied position; the head is never behind what is
    applied."""

    head_version: int
    head_bytes: int
    applied_version: int
    applied_bytes: int
    GAUGES: ClassVar[tuple] = ("applied_version", "head_version", "lag_versions", "lag_bytes")  # the metrics it sets

    @classmethod
    def at(cls, version: int, log_bytes: int) -> "LagView":
        """A site at `version` that knows of no newer one."""
        return cls(version, log_bytes, version, log_bytes)

    def applied(self, version: int, log_bytes: int) -> "LagView":
        """After applying `version`, whose messages through it total `log_bytes`."""
        return replace(self, applied_version=version, applied_bytes=log_bytes,
                       head_version=max(self.head_version, version), head_bytes=max(self.head_bytes, log_bytes))

    def with_head(self, version: int, log_bytes: int) -> "LagView":
        """After reading the head again."""
        return replace(self, head_version=max(version, self.applied_version),
                       head_bytes=max(log_bytes, self.applied_bytes))

    @property
    def lag_versions(self) -> int:
        """Versions on the log past the applied one."""
        return self.head_version - self.applied_version

    @property
    def lag_bytes(self) -> int:
        """Update bytes on the log past the applied version."""
        return self.head_bytes - self.applied_bytes

    def gauges(self) -> dict:
        """{metric key: value} of GAUGES."""
        return {"applied_version": self.applied_version, "head_version": self.head_version,
                "lag_versions": self.lag_versions, "lag_bytes": self.lag_bytes}

    def readiness(self, max_lag: int, stopped: str | None = None, outage: str | None = None) -> tuple:
        """(ready, why): not `stopped` by an error, not in an `outage`, at most `max_lag` versions behind the head."""
        if stopped is not None:
            return False, f"stopped: {stopped}"
        if outage is not None:
            return False, f"v{self.applied_version}: {outage}"
        if self.lag_versions > max_lag:
            return False, (f"v{self.applied_version} is {self.lag_versions} versions behind the head "
                           f"v{self.head_version} (bound {max_lag})")
        return True, f"v{self.applied_version}, {self.lag_versions} behind the head"
