"""`hilo topics describe`: each topic of a run: retained offsets, records, messages and versions, retention.

Offsets are the backend's: on Kafka each committed transaction leaves a marker at an offset no reader gets, so the
offset span is not a count. The counts and versions come from the records a reader gets (the topic is read once,
headers only kept), so the same run gives the same numbers on the file log and on Kafka.
"""
from hilo.log import checkpoints_topic, updates_topic
from hilo.log.tail import records


class _Messages:
    """Counts the complete messages of `run` among records fed in offset order, by their chunk headers (chunks 0..n-1
    of one checksum, contiguous: what a reader assembles), and the oldest and newest version among them."""

    def __init__(self, run: str):
        self.run, self.count, self.records = run, 0, 0
        self.oldest = self.newest = None
        self._expect = None  # (checksum, version, n, next chunk index) of the message being read

    def feed(self, rec) -> None:
        """One record a reader got."""
        self.records += 1
        p = rec.parsed
        if not p.of_run(self.run) or p.version is None:
            self._expect = None
            return
        i, n = p.chunk
        if i == 0:
            self._expect = (p.checksum, p.version, n, 0)
        if self._expect != (p.checksum, p.version, n, i):
            self._expect = None  # a continuation without its beginning: a writer that died mid-message
            return
        self._expect = (p.checksum, p.version, n, i + 1)
        if i == n - 1:
            self.count += 1
            self.oldest = p.version if self.oldest is None else min(self.oldest, p.version)
            self.newest = p.version if self.newest is None else max(self.newest, p.version)


def describe_run(log, run: str) -> list:
    """One dict per topic: name, begin/end offsets, records and complete messages retained, their oldest and newest
    version, retention settings."""
    rows = []
    for topic in (updates_topic(run), checkpoints_topic(run)):
        begin, end = log.begin_offset(topic), log.end_offset(topic)
        seen = _Messages(run)
        for rec in records(log, topic, start=begin):
            if rec.offset < end:  # what was committed when describe began
                seen.feed(rec)
        rows.append({"topic": topic, "begin_offset": begin, "end_offset": end, "records": seen.records,
                     "messages": seen.count, "oldest_version": seen.oldest, "newest_version": seen.newest,
                     **log.retention(topic)})
    return rows


def format_rows(rows: list) -> str:
    """One block per topic."""
    out = []
    for r in rows:
        out.append(f"{r['topic']}: offsets {r['begin_offset']}..{r['end_offset']} ({r['records']} records, "
                   f"{r['messages']} messages), versions {r['oldest_version']}..{r['newest_version']}, "
                   f"retention.ms {r['retention.ms']}, retention.bytes {r['retention.bytes']}")
    return "\n".join(out)
