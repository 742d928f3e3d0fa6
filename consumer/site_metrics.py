"""What a site records about each applied version (the "site" rows of schemas/metrics.py), and its link's speed."""
import collections
import statistics


class LinkMeter:
    """The link's throughput as this site measures it: the median bytes/s of the last messages that were written
    while it waited (Applied.delivery); what `--budget auto` sizes messages by (producer/link_budget.py)."""

    def __init__(self, keep: int = 8):
        self.samples = collections.deque(maxlen=keep)

    def add(self, delivery) -> None:
        """One applied message's (bytes, seconds) delivery, when it has one."""
        if delivery and delivery[1] > 0:  # <= 0: the trainer's clock is ahead of this one
            self.samples.append(delivery[0] / delivery[1])

    @property
    def bps(self) -> float | None:
        """Median bytes/s, None before any measurement."""
        return statistics.median(self.samples) if self.samples else None


def observe_applied(metrics, applied, now: float, link: LinkMeter) -> None:
    """The metrics of a version the site applied at wall time `now`."""
    m = metrics
    m.inc("versions_applied")
    m.set("last_applied_timestamp_seconds", now)
    m.inc("update_bytes_read", applied.record_bytes)
    link.add(applied.delivery)
    if link.bps is not None and applied.delivery:
        m.set("link_bytes_per_second", link.bps)
    if applied.written_at is not None:
        m.observe("freshness_seconds", max(0.0, now - applied.written_at))
    for stage, seconds in applied.timing.items():
        m.observe("stage_seconds", seconds, stage=stage)
