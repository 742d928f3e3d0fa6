"""`hilo topics describe`: each topic of a run: retained offsets and versions, retention, what a late site can use."""
from hilo.log import checkpoints_topic, updates_topic


def _version_at(log, topic, offset):
    recs = log.read(topic, offset, timeout_s=5.0, max_bytes=1)
    return recs[0].parsed.version if recs and recs[0].offset == offset else None


def describe_run(log, run: str) -> list:
    """One dict per topic: name, begin/end offsets, oldest/newest retained version, retention settings."""
    rows = []
    for topic in (updates_topic(run), checkpoints_topic(run)):
        begin, end = log.begin_offset(topic), log.end_offset(topic)
        rows.append({"topic": topic, "begin_offset": begin, "end_offset": end, "records": end - begin,
                     "oldest_version": _version_at(log, topic, begin) if end > begin else None,
                     "newest_version": _version_at(log, topic, end - 1) if end > begin else None, **log.retention(topic)})
    return rows


def format_rows(rows: list) -> str:
    """One block per topic."""
    out = []
    for r in rows:
        out.append(f"{r['topic']}: offsets {r['begin_offset']}..{r['end_offset']} ({r['records']} records), versions "
                   f"{r['oldest_version']}..{r['newest_version']}, retention.ms {r['retention.ms']}, "
                   f"retention.bytes {r['retention.bytes']}")
    return "\n".join(out)
