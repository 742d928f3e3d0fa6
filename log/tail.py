"""Reading the newest complete message of a topic without scanning it from the start."""
from hilo.schemas.chunks import Message, Reassembler
from hilo.schemas.errors import LogError, MalformedMessage


def last_message(log, topic: str, run: str, before: int | None = None) -> Message | None:
    """The newest complete message ending before offset `before` (default: the log end), or None.

    Chunks of one message are contiguous, so the last record's "i/n" header says where its message
    starts; a trailing incomplete sequence (a writer that died mid-message) and records that are not
    this run's are skipped (the follower, reading in order, is the one that reports them).
    """
    end = log.end_offset(topic) if before is None else before
    begin = log.begin_offset(topic)
    while end > begin:
        last = log.read(topic, end - 1, timeout_s=5.0, max_bytes=1)
        if not last or last[0].offset != end - 1:
            return None
        i, _, n = last[0].headers.get("hilo-chunk", "").partition("/")
        if not (i.isdigit() and n.isdigit()) or last[0].headers.get("hilo-run") != run:
            end -= 1
            continue
        start = end - 1 - int(i)
        if int(i) == int(n) - 1 and start >= begin:
            r = Reassembler(run, topic)
            msg, pos = None, start
            try:
                while msg is None and pos < end:
                    recs = log.read(topic, pos, timeout_s=5.0)
                    if not recs:
                        break
                    for rec in recs[: end - pos]:
                        msg = r.feed(rec)
                    pos = recs[min(len(recs), end - pos) - 1].offset + 1
            except (LogError, MalformedMessage):
                msg = None
            if msg is not None:
                return msg
        end = start if start < end - 1 else end - 1
    return None


def head(log, topic: str, run: str) -> dict | None:
    """Headers of the newest complete message, reading one record when the log ends on a last chunk."""
    end = log.end_offset(topic)
    if end <= log.begin_offset(topic):
        return None
    rec = log.read(topic, end - 1, timeout_s=5.0, max_bytes=1)
    if rec and rec[0].offset == end - 1:
        i, _, n = rec[0].headers.get("hilo-chunk", "").partition("/")
        if i.isdigit() and n.isdigit() and int(i) == int(n) - 1 and rec[0].headers.get("hilo-run") == run:
            return dict(rec[0].headers)
    msg = last_message(log, topic, run)
    return None if msg is None else msg.headers
