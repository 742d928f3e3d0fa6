"""`hilo lag`: where every site of a run stands, laid out like `kafka-consumer-groups --describe`."""
import time

from hilo.log import updates_topic
from hilo.log.site_reports import site_reports
from hilo.log.tail import head, locate
from hilo.schemas import headers as H
from hilo.schemas.errors import HiloError

MIRROR_COLUMNS = ("CLUSTER", "NEWEST-VERSION", "SOURCE-HEAD", "LAG", "LAG-SECONDS")
COLUMNS = ("SITE", "APPLIED-VERSION", "SERVING-VERSION", "HEAD-VERSION", "LAG", "LAG-BYTES", "TRAINER-LAG",
           "CURRENT-OFFSET",
           "LOG-END-OFFSET", "LAST-APPLIED")


def lag_rows(log, run: str, now: float | None = None) -> list:
    """One dict per site that has committed a position for `run`."""
    now = time.time() if now is None else now
    topic = updates_topic(run)
    h = head(log, topic, run) or H.RecordHeaders()
    head_version, head_bytes = h.version or 0, h.log_bytes or 0
    # delta mode: how far the head version trails the trainer's master (relative); None in gradient mode
    trainer_lag = h.lag
    end = log.end_offset(topic)
    rows = []
    for _, offset, r in site_reports(log, run):
        version = r.version
        rows.append({
            "site": r.site, "applied_version": version,
            "serving_version": r.serving_version,  # None: no vLLM configured, or none loaded yet
            "head_version": head_version,
            "lag": head_version - version if version >= 0 else None,
            "lag_bytes": head_bytes - r.log_bytes if version >= 0 else None,
            "trainer_lag": trainer_lag,
            "current_offset": offset, "log_end_offset": end,
            "last_applied_age_s": round(now - r.applied_at, 1) if r.applied_at is not None else None,
            "digest": r.digest,
        })
    return rows


def _age(s):
    if s is None:
        return "-"
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.1f}h ago"


def format_rows(rows) -> str:
    """Fixed-width table."""
    cells = [COLUMNS] + [(r["site"], str(r["applied_version"]),
                          "-" if r["serving_version"] is None else str(r["serving_version"]),
                          str(r["head_version"]), str(r["lag"]), str(r["lag_bytes"]),
                          "-" if r.get("trainer_lag") is None else f"{r['trainer_lag']:.2e}",
                          str(r["current_offset"]), str(r["log_end_offset"]), _age(r["last_applied_age_s"]))
                         for r in rows]
    return _table(cells[0], cells[1:])


def _table(header, cells) -> str:
    """Fixed-width columns, the header first."""
    rows = [header] + cells
    widths = [max(len(c[i]) for c in rows) for i in range(len(header))]
    return "\n".join("  ".join(c[i].ljust(widths[i]) for i in range(len(header))).rstrip() for c in rows)


def _newest(log, topic: str, run: str) -> int | None:
    """The newest version of `run` on `log` (0: none yet), None when the cluster does not hold the run."""
    try:
        h = head(log, topic, run)
    except HiloError:
        return None
    return (h.version if h else None) or 0


def mirror_rows(source, mirrors: dict, run: str, now: float | None = None) -> list:
    """One dict per mirror ({url: log}) of `run`: the newest version it holds against the source's head, and how long
    ago the first version it lacks was written on the source (record timestamps; MirrorMaker keeps them)."""
    now = time.time() if now is None else now
    topic = updates_topic(run)
    src_head = _newest(source, topic, run)
    rows = []
    for url, log in mirrors.items():
        newest = _newest(log, topic, run)
        lag = None if newest is None or src_head is None else src_head - newest
        lag_s = 0.0 if lag is not None and lag <= 0 else None
        if lag is not None and lag > 0:
            # a hint past the end: locate searches by version on the source
            at = locate(source, topic, run, newest + 1, source.end_offset(topic) + 1, patience_s=0)
            rec = next(iter(source.read(topic, at, timeout_s=5.0)), None)
            lag_s = round(now - rec.timestamp, 1) if rec is not None and rec.timestamp is not None else None
        rows.append({"cluster": url, "newest_version": newest, "source_head": src_head, "lag": lag, "lag_s": lag_s})
    return rows


def region_site_rows(source, mirrors: dict, run: str, now: float | None = None) -> list:
    """Every site of `run` on the source and on each mirror (groups are per cluster), with its lag behind the source's
    head (LAG stays the lag behind its own cluster's head)."""
    src_head = _newest(source, updates_topic(run), run)
    rows = []
    for url, log in {source.url: source, **mirrors}.items():
        for r in lag_rows(log, run, now):
            v = r["applied_version"]
            rows.append(r | {"cluster": url,
                             "lag_vs_source": src_head - v if v >= 0 and src_head is not None else None})
    return rows


def format_regions(mirrors: list, sites: list) -> str:
    """The mirrors table, then the sites of every cluster with their lag behind the source."""
    dash = lambda v: "-" if v is None else str(v)  # noqa: E731
    m = _table(MIRROR_COLUMNS, [(r["cluster"], dash(r["newest_version"]), dash(r["source_head"]), dash(r["lag"]),
                                dash(r["lag_s"])) for r in mirrors])
    s = _table(("CLUSTER", "SITE", "APPLIED-VERSION", "LAG", "LAG-VS-SOURCE", "LAST-APPLIED"),
              [(r["cluster"], r["site"], str(r["applied_version"]), dash(r["lag"]), dash(r["lag_vs_source"]),
                _age(r["last_applied_age_s"])) for r in sites])
    return m + "\n\n" + s
