"""Every metric hilo-sync exports: the one table (docs/operations.md's metrics table and the Grafana test read it).

Names follow Prometheus conventions: `hilo_<role>_<key>`, base units (seconds, bytes), counters end in
`_total` on the wire (prometheus_client adds it). Every metric of a role carries that role's identity
labels (`run`, and `site` at a site) so one Prometheus can scrape a fleet; a few add their own label.

    m = Metrics("site", run="exp1", site="eu-1")
    m.set("applied_version", 41); m.inc("records_refused", reason="limit");
    m.observe("stage_seconds", 0.2, stage="apply")
"""
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from .errors import ConfigError

ROLES = {"site": ("run", "site"), "trainer": ("run",)}   # role -> identity labels
# Per-version stage times span 1 ms (verify a tiny update) to minutes (a vLLM reload on a busy server).
STAGE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BYTE_BUCKETS = tuple(float(4 ** i * 1024) for i in range(1, 12))   # 4 KiB .. 4 GiB
KINDS = {"gauge": Gauge, "counter": Counter, "histogram": Histogram}


@dataclass(frozen=True)
class Metric:
    """One exported metric: role, key (the name is hilo_ROLE_KEY), kind, help, its own labels, histogram buckets."""

    role: str
    key: str
    kind: str
    help: str
    labels: tuple = ()
    buckets: tuple | None = None

    @property
    def name(self) -> str:
        """The metric's name as prometheus_client is given it (counters get `_total` on the wire)."""
        return f"hilo_{self.role}_{self.key}"

    @property
    def series(self) -> tuple:
        """The names of the series a scrape shows for it."""
        n = self.name
        return {"gauge": (n,), "counter": (f"{n}_total",),
                "histogram": (f"{n}_bucket", f"{n}_sum", f"{n}_count")}[self.kind]


def _site(key, kind, help, labels=(), buckets=None):
    return Metric("site", key, kind, help, labels, buckets)


def _trainer(key, kind, help, labels=(), buckets=None):
    return Metric("trainer", key, kind, help, labels, buckets)

def _outage(role, who):
    return (Metric(role, "log_unavailable", "gauge",
                   f"1 while the {who}'s log, reached before, does not answer (it waits)."),
            Metric(role, "log_outages", "counter", f"Outages of the log the {who} waited out (or is waiting out)."),
            Metric(role, "log_outage_seconds", "histogram", f"Length of each ended outage the {who} waited out.", (),
                   STAGE_BUCKETS + (300.0, 900.0, 3600.0)))


TABLE = (
    _site("applied_version", "gauge", "Newest version applied to the site's replica."),
    _site("serving_version", "gauge", "Version vLLM serves (-1: none loaded, or no vLLM configured)."),
    _site("head_version", "gauge", "Newest version on the run's updates topic, as last seen by the site."),
    _site("lag_versions", "gauge", "head_version - applied_version (the three are read together at each scrape)."),
    _site("lag_bytes", "gauge", "Update bytes on the log past the applied version."),
    _site("last_applied_timestamp_seconds", "gauge", "Unix time the newest version was applied."),
    _site("seconds_since_applied", "gauge", "Seconds since the newest version was applied (computed at scrape)."),
    _site("freshness_seconds", "histogram", "Seconds from a version's last record being written (its log timestamp, "
          "the writer's clock; a mirror keeps it) to applied here.", (), STAGE_BUCKETS),
    _site("update_bytes_read", "counter", "Bytes of update records (values and headers) this site read: its share of "
          "the cluster's egress."),
    _site("link_bytes_per_second", "gauge",
          "Median bytes/s of the site's last 8 messages written while it waited: a message's "
          "record bytes over the seconds from its first record's log timestamp to having it all (the writer's clock "
          "against this one). What the site reports for --budget auto."),
    _site("versions_applied", "counter", "Versions applied since the process started (replayed ones included)."),
    _site("versions_replayed", "counter", "Versions applied while catching up to the head seen at start."),
    _site("stage_seconds", "histogram", "Time per version and stage: fetch (reads that returned records), verify "
          "(signature), decode (unframe), apply (gradient decode, optimizer step, digest), snapshot_copy (the apply "
          "loop's stall: the state copied for a background snapshot), snapshot (writing it, on the writer thread; on "
          "exit, in the loop; counted once it is whole on disk, before it is put in place, so every snapshot the "
          "state dir holds is counted), export, vllm_reload, self_check (the probe scored by vLLM and by the replica).",
          ("stage",), STAGE_BUCKETS),
    _site("snapshots_deferred", "counter", "Snapshots that came due while the previous one was still being written: "
          "taken at the first version after it finished."),
    _site("snapshot_failures", "counter", "Background snapshot writes that failed (the previous snapshot stays whole; "
          "the site then stops)."),
    _site("records_refused", "counter", "Records skipped by reason (SPEC.md, Records a reader skips); reason=foreign "
          "counts records of other runs.", ("reason",)),
    _site("bootstrap_info", "gauge", "1 for the source this process bootstrapped from.", ("source",)),
    _site("stopped", "gauge", "1 once the site stopped on an error (a gap after a skip, a fork, a divergence)."),
    _site("rollouts_generated", "counter",
          "Rollouts this site generated and settled (its prompts answered with them)."),
    _site("prompts_refused", "counter", "Prompts taken and not answered, by reason (malformed, other-run, "
          "engine-refused: vLLM refused the request, lease_lost: the prompts went to another site before this one "
          "settled).", ("reason",)),
    *_outage("site", "site"),
    _site("self_check_failures", "counter",
          "Loads whose self-check failed: vLLM's log-probabilities of the probe differed "
          "from the site's own forward pass of the version by more than the tolerance (nothing generated with them; "
          "the load is retried)."),
    _site("self_check_worst_difference", "gauge",
          "The newest self-check's worst per-token |log-probability difference| "
          "between vLLM and the site's replica."),
    _site("rebootstraps", "counter", "Times a running site fell behind retention (its next versions expired) and "
          "bootstrapped again from the newest checkpoint."),
    _trainer("published_version", "gauge", "Newest version the trainer published (committed on the log)."),
    _trainer("last_published_timestamp_seconds", "gauge", "Unix time of the newest publish."),
    _trainer("versions_published", "counter", "Versions published since the process started."),
    _trainer("checkpoints_published", "counter", "Checkpoints published since the process started."),
    _trainer("joinable", "gauge",
             "1 while a new site can join now (the newest checkpoint and the first update after it "
             "are retained), 0 when it cannot, -1 when unknown (a restarted trainer before its first checkpoint); from "
             "what the trainer wrote and both topics' retention, read again as it changes (computed at scrape)."),
    _trainer("joinable_until_timestamp_seconds", "gauge", "Unix time until which a new site can join without a newer "
             "checkpoint: the earlier expiry of the newest checkpoint and of the first update after it (+Inf: nothing "
             "can expire; NaN: unknown)."),
    _trainer("stage_seconds", "histogram", "Time per version and stage: encode (compress + self-check decode), "
             "sign (frame and sign), transaction (append and commit on the log, retries included).", ("stage",),
             STAGE_BUCKETS),
    _trainer("message_bytes", "histogram", "Bytes of each published update message.", (), BYTE_BUCKETS),
    _trainer("adapter_fraction", "gauge", "The newest message's bytes as a fraction of the bf16 adapter."),
    _trainer("residual_ratio", "gauge", "Error feedback: ||residual|| / ||residual + sent|| after the newest "
             "version (0 for a lossless codec)."),
    _trainer("fenced", "gauge", "1 once a newer trainer of the run fenced this one."),
    _trainer("publish_retries", "counter", "Publish attempts retried, by the error's type.", ("cause",)),
    _trainer("records_refused", "counter", "Records the trainer skipped while catching up, by reason.", ("reason",)),
    _trainer("rollouts_accepted", "counter", "Rollouts accepted into a group (a group is trained on once complete)."),
    _trainer("rollouts_dropped", "counter", "Rollouts not trained on, by reason (stale, duplicate, unknown-prompt, "
             "malformed, unsigned, forged, ...).", ("reason",)),
    _trainer("rollout_staleness", "histogram", "Trainer version minus the sample's policy version, per accepted "
             "sample.", (), tuple(float(i) for i in range(0, 9))),
    _trainer("prompts_in_flight", "gauge", "Prompts issued and not yet complete or dropped (admission control keeps "
             "it <= (S + 1) * B)."),
    _trainer("rollouts_audited", "counter",
             "Rollouts whose behaviour log-probabilities the trainer recomputed under the "
             "version they claim, by site and result (passed, failed).", ("site", "result")),
    _trainer("audit_worst_difference", "gauge", "The worst per-token |log-probability difference| between a site's "
             "rollouts and the trainer's recomputation, over that site's audited rollouts.", ("site",)),
    _trainer("site_quarantined", "gauge", "1 while a site is quarantined (its audits failed past the threshold; its "
             "rollouts are dropped until its probe passes).", ("site",)),
    _trainer("audit_seconds", "histogram",
             "Trainer time spent auditing one rollout (its forward pass under the claimed "
             "version).", (), STAGE_BUCKETS),
    _trainer("importance_truncated_fraction", "gauge", "Share of tokens whose importance weight was capped, in "
             "the newest group."),
    *_outage("trainer", "trainer"),
)


class Metrics:
    """One role's metrics in their own registry, bound to this process's identity labels."""

    def __init__(self, role: str, **identity):
        if role not in ROLES:
            raise ConfigError(f"Metrics.role = {role!r}: expected one of {sorted(ROLES)}")
        if set(identity) != set(ROLES[role]):
            raise ConfigError(f"Metrics({role!r}): identity labels {sorted(identity)}, expected {list(ROLES[role])}")
        self.role, self.identity = role, {k: str(v) for k, v in identity.items()}
        self.registry = CollectorRegistry()
        self._specs, self._metrics = {}, {}
        for spec in TABLE:
            if spec.role != role:
                continue
            extra = {"buckets": spec.buckets} if spec.buckets else {}
            metric = KINDS[spec.kind](spec.name, spec.help, labelnames=ROLES[role] + spec.labels,
                                      registry=self.registry, **extra)
            self._specs[spec.key], self._metrics[spec.key] = spec, metric
            if not spec.labels:  # shown (at 0) from the start: an alert on a missing series never fires
                metric.labels(**self.identity)

    def _child(self, key: str, labels: dict):
        spec = self._specs.get(key)
        if spec is None:
            raise ConfigError(f"Metrics({self.role!r}): no metric {key!r}; the table has {sorted(self._specs)}")
        if set(labels) != set(spec.labels):
            raise ConfigError(f"{spec.name}: labels {sorted(labels)}, expected {list(spec.labels)}")
        return self._metrics[key].labels(**self.identity, **{k: str(v) for k, v in labels.items()})

    def set(self, key: str, value: float, **labels) -> None:
        """Set a gauge."""
        self._child(key, labels).set(value)

    def set_function(self, key: str, fn, **labels) -> None:
        """A gauge computed when scraped."""
        self._child(key, labels).set_function(fn)

    def set_view(self, fn, keys) -> None:
        """Gauges computed together at scrape: `fn()` -> {key: value} is called once per scrape, so they agree."""
        for key in keys:
            self._child(key, {})  # known, unlabelled gauges only
            self.registry.unregister(self._metrics[key])
        self.registry.register(_View(self, tuple(keys), fn))

    def inc(self, key: str, amount: float = 1.0, **labels) -> None:
        """Add to a counter."""
        self._child(key, labels).inc(amount)

    def observe(self, key: str, value: float, **labels) -> None:
        """One observation of a histogram."""
        self._child(key, labels).observe(value)


class _View:
    """A prometheus_client collector for `Metrics.set_view`: one call of `fn` per scrape yields every gauge of
    `keys`."""

    def __init__(self, metrics: Metrics, keys: tuple, fn):
        self.metrics, self.keys, self.fn = metrics, keys, fn

    def _families(self, values: dict | None):
        m = self.metrics
        for key in self.keys:
            spec = m._specs[key]
            family = GaugeMetricFamily(spec.name, spec.help, labels=list(m.identity))
            if values is not None:
                family.add_metric(list(m.identity.values()), values[key])
            yield family

    def describe(self):
        """The families without values (what registering asks for)."""
        return list(self._families(None))

    def collect(self):
        """The families, from one call of `fn`."""
        return list(self._families(self.fn()))


def markdown_table() -> str:
    """The metrics table of docs/operations.md."""
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for spec in TABLE:
        labels = ", ".join(ROLES[spec.role] + spec.labels)
        rows.append(f"| `{spec.series[0] if spec.kind == 'counter' else spec.name}` | {spec.kind} | {labels} | "
                    f"{spec.help} |")
    return "\n".join(rows)
