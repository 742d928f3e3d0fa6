"""`hilo inspect --offset N`: one record of RUN.updates by offset: its headers, and what a reader makes of it.

The record is reassembled (with the chunks that follow it) and checked as a follower checks it, minus the chain:
signature (with --trust), framing and limits, run. A record a reader skips gets the reason sites log, count
and write to their history (replay/bad_records.py); whether a valid message is the next version (or a gap or
fork) depends on the reader's state and is not judged here.
"""
from hilo.log import updates_topic
from hilo.replay.bad_records import reason_of
from hilo.replica.codecs import update_size_bound
from hilo.schemas import headers as H
from hilo.schemas.chunks import Reassembler
from hilo.schemas.errors import HiloError, LogError, OtherRun
from hilo.schemas.framing import frame_bound, split_trailer
from hilo.schemas.records import Checkpoint, KeyRotation, UpdateMessage, decode_record


def _records(log, topic, offset, most):
    """Up to `most` records from `offset` on."""
    out, pos, end = [], offset, log.end_offset(topic)
    while pos < end and len(out) < most:
        batch = log.read(topic, pos, timeout_s=5.0)
        if not batch:
            break
        out += [r for r in batch if r.offset >= pos][: most - len(out)]
        pos = max(pos + 1, batch.next_offset)
    return out


def inspect_offset(log, run: str, offset: int, verifier=None, manifest=None) -> dict:
    """The record at `offset`: headers, and verdict ("valid" or "skipped") with the reason and the one-line error."""
    topic = updates_topic(run)
    begin, end = log.begin_offset(topic), log.end_offset(topic)
    if not begin <= offset < end:
        raise LogError(f"{topic}: offset {offset} is not retained (offsets {begin}..{end - 1})")
    recs = _records(log, topic, offset, 1)
    if not recs or recs[0].offset != offset:
        raise LogError(f"{topic}: offset {offset} holds no record a reader gets (a transaction marker, or an aborted record)")
    first = recs[0]
    out = {"topic": topic, "offset": offset, "bytes": len(first.value or b""), "headers": dict(first.headers)}
    chunk = first.headers.get(H.CHUNK, "")
    n = int(chunk.partition("/")[2]) if chunk.partition("/")[2].isdigit() else 1
    if chunk and not chunk.startswith("0/"):
        return out | {"verdict": "continuation", "reason": None,
                      "detail": f"chunk {chunk} of a message that starts at an earlier offset (inspect that one)"}
    bound = frame_bound(update_size_bound(manifest)) if manifest is not None else None
    r = Reassembler(run, topic, max_bytes=bound)
    try:
        msg = None
        for rec in _records(log, topic, offset, min(n, 1 << 16)):
            msg = r.feed(rec)
            if msg is not None:
                break
        if msg is None:
            return out | {"verdict": "incomplete", "reason": None, "detail": f"the {n} chunks of the message are not all retained or written"}
        what = f"{topic} offset {offset} (v{msg.version})"
        if verifier is not None:
            verifier.verify(*split_trailer(msg.data, what), what)
        body = decode_record(msg.data, what)
        if body.run != run:
            raise OtherRun(f"{what}: message belongs to run {body.run!r}, not {run!r}")
    except HiloError as e:
        reason = reason_of(e)
        return out | {"verdict": "skipped" if reason else "refused", "reason": reason, "detail": str(e)}
    kind = {UpdateMessage: "update", Checkpoint: "checkpoint", KeyRotation: "key"}.get(type(body), type(body).__name__)
    info = {"kind": kind, "version": msg.version, "offsets": [msg.first_offset, msg.last_offset], "message_bytes": len(msg.data)}
    if isinstance(body, UpdateMessage):
        info |= {"parent_digest": body.parent_digest.hex(), "digest": body.digest.hex(), "codec": body.codec, "optimizer": body.optimizer}
    return out | {"verdict": "valid", "reason": None, "detail": "decodes" + (", signed by the trusted key" if verifier else "")
                  + "; whether it is the next version depends on the reader's state", "message": info}
