"""`hilo topics describe`: each topic of a run: retained offsets, records, messages and versions, retention, and what a
late site can use.

Offsets are the backend's: on Kafka each committed transaction leaves a marker at an offset no reader gets, so the
offset span is not a count. The counts and versions come from the records a reader gets (the topic is read once,
headers only kept), so the same run gives the same numbers on the file log and on Kafka.

A new site joins from the newest checkpoint and replays the updates after it, so it can join while both are
retained: until the earlier of the checkpoint's expiry (its log timestamp + RUN.checkpoints' retention.ms) and the
first update after it's (its timestamp + RUN.updates' retention.ms). Kafka keeps a record at least that long.
"""
import time

from hilo.log import checkpoints_topic, updates_topic
from hilo.log.tail import head_at, records
from hilo.producer.retention_guard import limit_of


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


def joinable(log, run: str, rows: list) -> dict:
    """Whether a new site can join now and until when (unix time; None: nothing can expire), from the newest checkpoint
    and the first update after it; `unkeepable` when RUN.checkpoints' retention.bytes is below one checkpoint."""
    upd, ckpt = rows
    found = head_at(log, checkpoints_topic(run), run)
    if found is None or found[0].updates_offset is None:
        return {"now": False, "until": None, "checkpoint_version": None, "why": "no whole checkpoint is retained"}
    h, written = found
    out = {"checkpoint_version": h.version, "checkpoint_bytes": h.size}
    ms, limit = limit_of(ckpt["retention.ms"]), limit_of(ckpt["retention.bytes"])
    until = [written + ms / 1e3] if ms and written is not None else []
    if limit is not None and h.size is not None and limit < h.size:
        out["unkeepable"] = (f"retention.bytes {limit} is below one checkpoint ({h.size} bytes): no checkpoint can be "
                             f"kept")
    first = h.updates_offset
    if first < upd["begin_offset"]:
        return out | {"now": False, "until": None,
                      "why": f"the updates after checkpoint v{h.version} (from offset {first}) expired"}
    recs = log.read(updates_topic(run), first, timeout_s=5.0, max_bytes=1) if first < upd["end_offset"] else []
    ms = limit_of(upd["retention.ms"])
    if recs and recs[0].timestamp is not None and ms:
        until.append(recs[0].timestamp + ms / 1e3)
    end = min(until, default=None)
    return out | {"now": "unkeepable" not in out and (end is None or time.time() < end), "until": end}


def describe_run(log, run: str) -> list:
    """One dict per topic: name, begin/end offsets, records and complete messages retained, their oldest and newest
    version, retention settings; the checkpoints row also says whether a new site can join ("joinable")."""
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
    rows[1]["joinable"] = joinable(log, run, rows)
    return rows


def _joinable_line(j: dict) -> str:
    """Whether a new site can join, in one line."""
    if "unkeepable" in j:
        return f"new sites: cannot join: {j['unkeepable']}"
    if not j["now"]:
        return (f"new sites: cannot join now: "
                f"{j.get('why', 'the newest checkpoint or the first update after it expired')}")
    when = "no expiry (retention unlimited)" if j["until"] is None else \
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(j["until"])) + f" (in {j['until'] - time.time():.0f}s)"
    return (f"new sites: can join now, from checkpoint v{j['checkpoint_version']}, until {when} without a newer "
            f"checkpoint")


def format_rows(rows: list) -> str:
    """One block per topic, then whether a new site can join."""
    out = []
    for r in rows:
        out.append(f"{r['topic']}: offsets {r['begin_offset']}..{r['end_offset']} ({r['records']} records, "
                   f"{r['messages']} messages), versions {r['oldest_version']}..{r['newest_version']}, "
                   f"retention.ms {r['retention.ms']}, retention.bytes {r['retention.bytes']}")
    out += [_joinable_line(r["joinable"]) for r in rows if "joinable" in r]
    return "\n".join(out)
