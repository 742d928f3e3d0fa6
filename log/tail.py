"""Reading the newest complete message of a topic without scanning it from the start."""
import time

from hilo.schemas import headers as H
from hilo.schemas.chunks import Message, Reassembler
from hilo.schemas.errors import LogError, MalformedMessage


def records(log, topic: str, partition: int = 0, start: int | None = None):
    """Every record of one partition from `start` (default: the oldest retained) to its end as of this call."""
    pos = start if start is not None else (log.begin_offset(topic) if partition == 0 else 0)
    end = log.end_offset(topic, partition)
    while pos < end:
        batch = log.read(topic, pos, timeout_s=5.0, partition=partition)
        yield from batch
        pos = batch.next_offset


def _last_record(log, topic: str, before: int, begin: int):
    """The last record at an offset below `before`, or None. Transaction markers (and aborted records) take offsets
    no reader gets, so the probe starts two offsets back, one read, and widens only past aborted records."""
    width = 2
    while before > begin:
        start = max(begin, before - width)
        last, pos = None, start
        while pos < before:  # one poll may return only part of the window: read it to its end
            batch = log.read(topic, pos, timeout_s=5.0, max_bytes=1 << 20)
            last = next((r for r in reversed(batch) if r.offset < before), last)
            if batch.next_offset <= pos:
                break
            pos = batch.next_offset
        if last is not None:
            return last
        if start == begin:
            return None
        width *= 8
    return None


def _chunk(rec, run: str):
    """(i, n) of a record's "i/n" chunk header if it is this run's, else None."""
    return rec.parsed.chunk if rec.parsed.of_run(run) else None


def last_message(log, topic: str, run: str, before: int | None = None) -> Message | None:
    """The newest complete message ending before offset `before` (default: the log end), or None.

    Chunks of one message are contiguous (one transaction, or one writer's appends), so the last record's "i/n"
    header says where its message starts; a trailing incomplete sequence (a writer that died mid-message) and
    records that are not this run's are skipped (the follower, reading in order, is the one that reports them).
    """
    end = log.end_offset(topic) if before is None else before
    begin = log.begin_offset(topic)
    while end > begin:
        last = _last_record(log, topic, end, begin)
        if last is None:
            return None
        chunk = _chunk(last, run)
        if chunk is None:
            end = last.offset
            continue
        i, n = chunk
        start = last.offset - i
        if start < begin:
            return None  # everything below is this message's head, gone with retention
        if i == n - 1:
            msg = _assemble(log, topic, run, start, last.offset)
            if msg is not None:
                return msg
        end = start  # incomplete or broken: look before it
    return None


def _assemble(log, topic: str, run: str, start: int, last: int) -> Message | None:
    """The message whose chunks lie at offsets start..last, or None if they do not make one."""
    r, pos = Reassembler(run, topic), start
    try:
        while pos <= last:
            batch = log.read(topic, pos, timeout_s=5.0)
            if not batch:
                return None
            for rec in batch:
                if rec.offset > last:
                    return None
                msg = r.feed(rec)
                if msg is not None:
                    return msg if rec.offset == last else None
            pos = batch.next_offset
    except (LogError, MalformedMessage):
        return None
    return None


def head(log, topic: str, run: str) -> H.RecordHeaders | None:
    """Headers of the newest complete message (parsed), reading one record when the log ends on a last chunk. They
    say what the tail claims, not what a follower would accept (`newest` reads that)."""
    found = head_at(log, topic, run)
    return None if found is None else found[0]


def head_at(log, topic: str, run: str) -> tuple | None:
    """(headers, log timestamp of its last chunk: None on the file log) of the newest complete message, as `head`."""
    end, begin = log.end_offset(topic), log.begin_offset(topic)
    if end <= begin:
        return None
    rec = _last_record(log, topic, end, begin)
    if rec is not None:
        if rec.parsed.of_run(run) and rec.parsed.last_chunk:
            return rec.parsed, rec.timestamp
    msg = last_message(log, topic, run)
    return None if msg is None else (msg.parsed, msg.written_at)


NEWEST_WINDOW = 16   # accepted messages `newest` compares at most: a replayed old version at the tail is not the head
NEWEST_SCAN = 256    # messages it reads at most (a flood of junk at the tail costs a bounded read)


def newest(log, topic: str, run: str, accept, window: int = NEWEST_WINDOW, scan: int = NEWEST_SCAN,
           after: int | None = None) -> Message | None:
    """The message of the highest version near the end that `accept(msg)` takes (what a follower would accept:
    verified, decoded, this run's), reading back from the end; None when none is found within `scan`.

    The last record's headers may be anyone's (junk claiming an old version, a genuine old message appended again):
    what a reader believes about the head must come from messages it would apply. Versions only grow along the
    genuine sequence, so the head is the highest accepted version, and it is confirmed once the accepted message
    just before it is its parent version (a genuine tail reads two messages; a replayed one is passed over); at most
    `window` accepted messages are compared. `after`: only messages that start after this offset are read (a caller
    that found a head before reads only what came since)."""
    before, best, accepted, later = None, None, 0, None  # later: the version of the accepted message read just before
    for _ in range(scan):
        msg = last_message(log, topic, run, before)
        if msg is None or (after is not None and msg.first_offset <= after):
            break
        before = msg.first_offset
        if not accept(msg):
            continue
        accepted += 1
        if best is not None and later == best.version and msg.version == best.version - 1:
            break  # the best version so far directly follows its parent: the genuine sequence ends there
        if best is None or msg.version > best.version:
            best = msg
        later = msg.version
        if accepted >= window:
            break
    return best


def _first_record(log, topic: str, run: str, offset: int, end: int):
    """The first record of `run` carrying a version header at or after `offset` (below `end`), or None."""
    while offset < end:
        batch = log.read(topic, offset, timeout_s=1.0, max_bytes=1 << 20)
        for rec in batch:
            if rec.offset < end and rec.parsed.run == run and rec.parsed.version is not None:
                return rec
        if batch.next_offset <= offset:
            return None
        offset = batch.next_offset
    return None


PATIENCE_S = 15.0  # how long a cluster that looks behind the replica is given to show what it holds


def locate(log, topic: str, run: str, version: int, hint: int, patience_s: float = PATIENCE_S, accept=None) -> int:
    """`_locate`, given `patience_s` when the cluster looks behind the replica: a trainer's update and its checkpoint
    commit in one transaction, but Kafka writes the commit marker to each partition separately, so a reader can see
    the checkpoint of v before v itself on RUN.updates; and a mirror may be copying. LogError after that."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return _locate(log, topic, run, version, hint, accept)
        except _Behind as e:
            if time.monotonic() >= deadline:
                raise LogError(str(e)) from None
            time.sleep(0.2)  # waiting on the broker's markers or the mirror: nothing to be notified by


class _Behind(Exception):
    """The cluster holds only versions before the replica's (for now)."""


def _locate(log, topic: str, run: str, version: int, hint: int, accept=None) -> int:
    """The offset to read from on this cluster to get `version` of `run` next (its first chunk, or the end when
    `version` is not written yet). `hint` is a stored offset: right on the cluster it came from (one read confirms
    it; an offset before the version's start, as `--from-offset` gives, is kept too), elsewhere only a guess. A
    mirror copies records but not transaction markers, so the same version sits at another offset there; versions
    only grow along the topic, so a binary search over the records' version headers finds it. LogError when this
    cluster lacks the version (expired); _Behind when it holds less than version - 1.
    `accept` (see `newest`): how far the cluster holds the run is read from messages it takes, not from the tail's
    headers (default: the tail's headers)."""
    begin, end = log.begin_offset(topic), log.end_offset(topic)

    def is_start(rec):
        return rec is not None and rec.parsed.version == version and rec.parsed.first_chunk

    def at_hint(h, newest_version) -> bool:
        """Whether reading from `hint` gets `version` next, given what the cluster holds (up to `newest_version`)."""
        if not begin <= hint <= end:
            return False
        rec = _first_record(log, topic, run, hint, end)
        # at or before the version's start (what is re-read first is an applied version: checked and skipped)
        older = rec is not None and rec.parsed.version < version and newest_version >= version - 1
        # nothing retained at all (every update expired): nothing to compare, the offset is all there is
        return is_start(rec) or older or (rec is None and (newest_version == version - 1 or h is None))

    h = head(log, topic, run)  # the tail's headers: right unless someone appended a record the run never wrote
    newest_version = (h.version if h else None) or 0
    if at_hint(h, newest_version):
        return hint
    if accept is not None:  # the tail may be anyone's: what the cluster holds is what a follower would accept
        found = newest(log, topic, run, accept)
        h, newest_version = (None, 0) if found is None else (found.parsed, found.version)
        if found is not None and found.version == version - 1 and found.last_offset < hint <= end:
            return hint  # nothing newer here: what lies between the head and `hint` is junk the follower skips
        if at_hint(h, newest_version):
            return hint
    lo, hi = begin, end
    while lo < hi:  # the smallest offset whose next record of the run has a version >= `version`
        mid = (lo + hi) // 2
        rec = _first_record(log, topic, run, mid, end)
        if rec is None or rec.parsed.version >= version:
            hi = mid
        else:
            lo = rec.offset + 1
    rec = _first_record(log, topic, run, lo, end)
    if is_start(rec):
        return rec.offset
    if rec is None and newest_version == version - 1:
        return lo
    if rec is None:
        raise _Behind(f"{log.url}: {topic} holds run {run!r} up to v{newest_version}, behind this replica's "
                      f"v{version - 1}: a mirror that lags (wait for it, or use another cluster) or a cluster without "
                      f"this run's history")
    raise LogError(f"{log.url}: v{version} of run {run!r} is not on {topic} (the next version here is "
                   f"v{rec.parsed.version} at offset {rec.offset}): expired, or a cluster that did not copy it")
