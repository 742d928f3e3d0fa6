"""`hilo inspect --offset N`: one record of RUN.updates by offset: its headers, and what a site makes of it.

The record is reassembled (with the chunks that follow it) and put through every check a site's follower runs that
needs no chain, with the site's code (replay/checks.py, PolicyReplica.compute), limits and memory bound: the size its
adapter's manifest allows, kind, signature (with --trust), framing, header against body, run, manifest, optimizer,
hyperparameters, codec, NaN/Inf. Like a new site, it takes the manifest and the state from the newest checkpoint it can
verify, and trusts the keys of the rotations a site replaying from there verifies before the record
(replay/checks.adopt_rotation); the step is computed from that state (a site steps from the record's parent: a state
made non-finite only by one particular parent is not seen). A record a site skips gets the reason sites log, count
and write to their history (replay/bad_records.py) and the same one-line error; whether a valid message is the next
version (or a gap or fork) depends on the reader's state and is not judged here.
"""
from hilo.log import updates_topic
from hilo.log.tail import records
from hilo.replay.bad_records import reason_of
from hilo.replay.checks import adopt_rotation, message_what, unframe_key, unframe_update, update_reassembler
from hilo.replay.follower import bootstrap_from_log
from hilo.schemas.errors import Fork, Gap, HiloError, LogError
from hilo.schemas.records import UpdateMessage


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


def follow_rotations(log, run: str, replica, start: int, end: int) -> list:
    """Move `replica`'s trust along the key records at offsets `start`..`end - 1` as a site replaying them does
    (replay/checks.adopt_rotation: verified with the key trusted then); other records are passed over, a key record a
    site skips is skipped. Returns the rotations adopted."""
    topic, adopted = updates_topic(run), []
    if replica.verifier is None:
        return adopted
    r = update_reassembler(run, topic, replica.manifest)
    for rec in records(log, topic, start=max(start, log.begin_offset(topic))):
        if rec.offset >= end:
            break
        if rec.parsed.kind != "key" or not rec.parsed.of_run(run):
            r.reset()  # key records are contiguous chunks: anything between them ends the message
            continue
        try:
            msg = r.feed(rec)
            rot = None if msg is None else adopt_rotation(replica, msg, message_what(topic, msg))
        except HiloError:
            continue  # what a site skips moves no trust
        if rot is not None:
            adopted.append(rot)
    return adopted


def check_message(replica, msg, run: str, what: str):
    """The message `msg` holds if a follower at `replica` would take it as its next version; raises what it would
    skip."""
    if msg.kind == "key":
        return unframe_key(replica.verifier, msg, run, what)
    upd = unframe_update(replica, msg, what)
    try:
        replica.classify(upd, what)  # another run's message is refused here, before the chain
    except (Gap, Fork):
        pass  # where it sits in the chain depends on the reader's state, not on the record
    replica.compute(upd, what)  # manifest, optimizer, hyperparameters, codec, NaN/Inf: the step a site would take
    return upd


def inspect_offset(log, run: str, offset: int, verifier=None) -> dict:
    """The record at `offset`: headers, and verdict ("valid" or "skipped") with the reason and the one-line error."""
    topic = updates_topic(run)
    begin, end = log.begin_offset(topic), log.end_offset(topic)
    if not begin <= offset < end:
        raise LogError(f"{topic}: offset {offset} is not retained (offsets {begin}..{end - 1})")
    recs = _records(log, topic, offset, 1)
    if not recs or recs[0].offset != offset:
        raise LogError(f"{topic}: offset {offset} holds no record a reader gets (a transaction marker, or an aborted "
                       f"record)")
    first = recs[0]
    out = {"topic": topic, "offset": offset, "bytes": len(first.value or b""), "headers": dict(first.headers)}
    chunk = first.parsed.chunk
    n = chunk[1] if chunk else 1
    if chunk and not first.parsed.first_chunk:
        return out | {"verdict": "continuation", "reason": None,
                      "detail": f"chunk {chunk[0]}/{chunk[1]} of a message that starts at an earlier offset (inspect "
                                f"that one)"}
    try:
        # what a new site starts from, and its limits
        replica, position = bootstrap_from_log(log, run, verifier=verifier)
    except HiloError as e:  # says what is true of the checkpoints; this says what it means here
        raise LogError(f"{topic} offset {offset}: no verdict, for a site judges a record by the manifest and state of "
                       f"a checkpoint, and none could be used: {e}") from None
    rotations = follow_rotations(log, run, replica, position.next_offset, offset)  # the key a site trusts by `offset`
    r = update_reassembler(run, topic, replica.manifest)
    try:
        msg = None
        for rec in _records(log, topic, offset, min(n, 1 << 16)):
            msg = r.feed(rec)
            if msg is not None:
                break
        if msg is None:
            return out | {"verdict": "incomplete", "reason": None,
                          "detail": f"the {n} chunks of the message are not all retained or written"}
        body = check_message(replica, msg, run, message_what(topic, msg))
    except HiloError as e:
        reason = reason_of(e)
        return out | {"verdict": "skipped" if reason else "refused", "reason": reason, "detail": str(e)}
    kind = "update" if isinstance(body, UpdateMessage) else "key"
    info = {"kind": kind, "version": msg.version, "offsets": [msg.first_offset, msg.last_offset],
            "message_bytes": len(msg.data)}
    if isinstance(body, UpdateMessage):
        info |= {"parent_digest": body.parent_digest.hex(), "digest": body.digest.hex(), "codec": body.codec,
                 "optimizer": body.optimizer}
    checked = (f"passes every check a site runs before the chain (the step from checkpoint v{replica.version} is "
               f"finite)") \
        if kind == "update" else "a key record of this run"
    trusted = "" if verifier is None else ", signed by the trusted key" + (
        f" {replica.verifier.key_id.hex()}, trusted from v{rotations[-1].from_version} by a verified rotation"
        if rotations else "")
    return out | {"verdict": "valid", "reason": None, "detail": checked + trusted
                  + "; whether it is the next version depends on the reader's state", "message": info}
