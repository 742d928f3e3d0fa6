"""`hilo lag`: where every site of a run stands, laid out like `kafka-consumer-groups --describe`."""
import json
import time

from hilo.log import site_group, updates_topic
from hilo.log.tail import head
from hilo.schemas import headers as H

COLUMNS = ("SITE", "APPLIED-VERSION", "SERVING-VERSION", "HEAD-VERSION", "LAG", "LAG-BYTES", "TRAINER-LAG", "CURRENT-OFFSET",
           "LOG-END-OFFSET", "LAST-APPLIED")


def lag_rows(log, run: str, now: float | None = None) -> list:
    """One dict per site that has committed a position for `run`."""
    now = time.time() if now is None else now
    topic = updates_topic(run)
    h = head(log, topic, run) or {}
    head_version = int(h.get(H.VERSION, 0))
    head_bytes = int(h.get(H.LOG_BYTES, 0))
    # delta mode: how far the head version trails the trainer's master (relative); absent in gradient mode
    trainer_lag = float(h[H.LAG]) if H.LAG in h else None
    end = log.end_offset(topic)
    rows = []
    prefix = site_group(run, "")
    for group in log.groups(prefix):
        c = log.committed(group, topic)
        if c is None:
            continue
        offset, meta = c
        try:
            m = json.loads(meta or "{}")
        except json.JSONDecodeError:
            m = {}
        version = int(m.get("version", -1))
        rows.append({
            "site": m.get("site", group[len(prefix):]), "applied_version": version,
            "serving_version": m.get("serving_version"),  # None: no vLLM configured, or none loaded yet
            "head_version": head_version,
            "lag": head_version - version if version >= 0 else None,
            "lag_bytes": head_bytes - int(m.get("log_bytes", 0)) if version >= 0 else None,
            "trainer_lag": trainer_lag,
            "current_offset": offset, "log_end_offset": end,
            "last_applied_age_s": round(now - m["applied_at"], 1) if "applied_at" in m else None,
            "digest": m.get("digest"),
        })
    return rows


def _age(s):
    if s is None:
        return "-"
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.1f}h ago"


def format_rows(rows) -> str:
    """Fixed-width table."""
    cells = [COLUMNS] + [(r["site"], str(r["applied_version"]), "-" if r["serving_version"] is None else str(r["serving_version"]),
                          str(r["head_version"]), str(r["lag"]), str(r["lag_bytes"]),
                          "-" if r.get("trainer_lag") is None else f"{r['trainer_lag']:.2e}",
                          str(r["current_offset"]), str(r["log_end_offset"]), _age(r["last_applied_age_s"])) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c[i].ljust(widths[i]) for i in range(len(COLUMNS))).rstrip() for c in cells)
