"""`--budget auto`: each version's byte budget fitted to the slowest site's link (AutoBudget's settings are in
replica/codecs/budget.py; LinkBudget here applies them).

Sites measure what their link delivers. For each message written while a site was already waiting for it (its
first record's log timestamp, Kafka's CreateTime on the trainer's clock, is after the site's read began), the site
times it from that timestamp to the read that completed it, and reports the median bytes/s of its last such
messages with its committed position (replay/follower.py `Applied.delivery`, log/site_reports.py). That is an
effective rate: the link's latency and the transaction commit are in it, so it is low for small messages and never
flatters a link. Before each version the trainer reads the reports (at most every `refresh_s`), takes the slowest
recent one, and gives the message what that site receives in `share` of the trainer's step time (the median
interval between its last steps):

    fraction = share * step_s / (adapter_bytes / slowest_bytes_per_s + cpu_s_per_fraction), within [floor, ceiling]

where cpu_s_per_fraction is the trainer's own encode + step seconds per unit of budget, a line fitted through the
versions it published (counted once their fractions differ; a site's apply grows with the budget too and is not
counted). Without it the rule buys, on a fast link, bytes whose encoding costs more than their transfer.

Until a site reports (none yet; the file log has no timestamps; a message that waited for a busy or catching-up
site measures nothing) the budget is `start`. Each message's meta says what was chosen and why ("budget_*"); the
trainer logs a change of over 10%. Sites need nothing new: a message's size is the codec's business, and every
replica decodes it the same. Trainer and site clocks are assumed NTP-close (a skew of s seconds shifts each
measurement by s).
"""
import collections
import logging
import statistics
import time

from hilo.log.site_reports import site_reports
from hilo.replica.codecs.budget import AutoBudget, Budget
from hilo.schemas.errors import HiloError

logger = logging.getLogger(__name__)
STEPS_KEPT = 8  # step intervals the step time is the median of
CPU_KEPT = 16   # (fraction, trainer CPU seconds) pairs the CPU slope is fitted to
MIN_SPREAD = 1.5  # the largest fraction seen must be this many times the smallest before a slope is fitted


def cpu_slope(samples) -> float | None:
    """The trainer's CPU seconds (encode + its own step) per unit of budget fraction, a least-squares line through
    (fraction, seconds) pairs; None until the fractions seen differ enough to tell (all at `start`, say)."""
    fs = [f for f, _ in samples]
    if len(fs) < 2 or max(fs) < MIN_SPREAD * min(fs):
        return None
    return max(0.0, statistics.linear_regression(fs, [s for _, s in samples]).slope)


def fit(cfg: AutoBudget, step_s: float, link_bps: float, adapter_bytes: int, cpu_s_per_fraction: float = 0.0) -> tuple:
    """(fraction, rule): the budget whose bytes cost at most `share` of `step_s`, crossing a `link_bps` link and,
    when known, in the trainer's CPU; within [floor, ceiling]. rule names which bound decided ("link", "floor" or
    "ceiling"). Counting the CPU matters on fast links, where encoding more costs more than sending it."""
    want = cfg.share * step_s / (adapter_bytes / link_bps + cpu_s_per_fraction)
    fraction = min(cfg.ceiling, max(cfg.floor, want))
    return fraction, "link" if fraction == want else ("ceiling" if want > cfg.ceiling else "floor")


class LinkBudget:
    """Chooses each version's Budget by the AutoBudget rule from the run's site reports."""

    def __init__(self, cfg: AutoBudget, log, run: str, adapter_bytes: int, clock=time.monotonic, wall=time.time):
        self.cfg, self.log, self.run, self.adapter_bytes = cfg, log, run, adapter_bytes
        self.clock, self.wall = clock, wall
        self.steps = collections.deque(maxlen=STEPS_KEPT)
        self.last_step = None
        self.links, self.read_at = {}, None  # site -> bytes/s, from the last read of the reports
        self.fraction = cfg.start
        self.cpu = collections.deque(maxlen=CPU_KEPT)  # (fraction, trainer CPU seconds) of the last versions

    def observe(self, fraction: float, cpu_s: float) -> None:
        """What a published version at `fraction` cost the trainer's CPU (encode + its own step)."""
        self.cpu.append((fraction, cpu_s))

    def _read(self) -> dict:
        """site -> reported bytes/s, for the sites that applied something within max_age_s."""
        now, out = self.wall(), {}
        try:
            reports = site_reports(self.log, self.run)
        except HiloError as e:  # the reports are advisory: keep the last ones
            logger.warning("run %s: --budget auto could not read the sites' reports (%s); keeping the last", self.run,
                           e)
            return self.links
        for _, _, report in reports:
            if report.link_bps is not None and now - (report.applied_at or 0.0) <= self.cfg.max_age_s:
                out[report.site] = report.link_bps
        return out

    def choose(self) -> tuple:
        """(Budget, why): the next version's budget and the facts it came from (what the message's meta carries)."""
        cfg, now = self.cfg, self.clock()
        if self.last_step is not None:
            self.steps.append(now - self.last_step)
        self.last_step = now
        if self.read_at is None or now - self.read_at >= cfg.refresh_s:
            self.links, self.read_at = self._read(), now
        if not self.links or not self.steps:
            fraction = cfg.start
            why = {"rule": "start", "reason": "no site has reported its link yet" if not self.links else "first step"}
        else:
            site, bps = min(self.links.items(), key=lambda kv: kv[1])
            step_s, slope = statistics.median(self.steps), cpu_slope(self.cpu)
            fraction, rule = fit(cfg, step_s, bps, self.adapter_bytes, slope or 0.0)
            # 4 significant digits, not fixed decimals: a reader recomputes the fraction from these within 1e-3 even
            # when a step takes milliseconds
            why = {"rule": rule, "site": site, "link_bps": round(bps), "step_s": float(f"{step_s:.4g}"),
                   "share": cfg.share}
            if slope is not None:
                why["cpu_s_per_fraction"] = float(f"{slope:.4g}")
        why["fraction"] = round(fraction, 6)
        if abs(fraction - self.fraction) > 0.1 * self.fraction:
            logger.info("run %s: --budget auto: %.3f%% of the adapter (was %.3f%%): %s", self.run, 100 * fraction,
                        100 * self.fraction, why)
        self.fraction = fraction
        return Budget(fraction=fraction), why
