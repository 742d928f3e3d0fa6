"""The checks a follower runs on one message of RUN.updates before its place in the chain matters: the size bound
the adapter's manifest allows, the record's kind, its signature, framing and limits, header against body.

A site (follower.py) and `hilo inspect --offset` (ops/inspect_record.py) both run these, so one record gets one
verdict; what they raise maps to the reason sites log through bad_records.py. The checks of the step itself
(manifest, optimizer, hyperparameters, codec, NaN/Inf) are PolicyReplica.compute's, which both run too.
"""
import logging
import time

from hilo.replica.codecs import update_size_bound
from hilo.replica.replica import PolicyReplica
from hilo.schemas.chunks import Message, Reassembler
from hilo.schemas.errors import HiloError, MalformedMessage
from hilo.schemas.framing import frame_bound, split_trailer
from hilo.schemas.records import KeyRotation, UpdateMessage, decode_record
from hilo.schemas.signing import Verifier

logger = logging.getLogger(__name__)
_warned_unverified = set()  # runs this process follows signed but unverified: said once each


def warn_if_signed(data: bytes, run: str, what: str) -> None:
    """Once per run: a signed record read without a trusted key (the site should be started with --trust)."""
    trailer = split_trailer(data, what)[1]
    if trailer is not None and run not in _warned_unverified:
        _warned_unverified.add(run)
        logger.warning("%s: run %s is signed (key %s) but this reader verifies nothing: start it with --trust "
                       "TRAINER.pub to refuse forged checkpoints and updates", what, run, trailer[:8].hex())


def update_reassembler(run: str, topic: str, manifest) -> Reassembler:
    """A reassembler for `topic` that refuses, before buffering anything, a message larger than any update of
    `manifest`."""
    return Reassembler(run, topic, max_bytes=frame_bound(update_size_bound(manifest)))


def message_what(topic: str, msg: Message) -> str:
    """How errors name a reassembled message: topic, first offset, and the version its headers claim (or "key
    record")."""
    return f"{topic} offset {msg.first_offset} ({'key record' if msg.kind == 'key' else f'v{msg.version}'})"


def unframe_update(replica: PolicyReplica, msg: Message, what: str, timing: dict | None = None) -> UpdateMessage:
    """The update in `msg`: an update record, signed by the replica's trusted key (if it has one), decoded within the
    replica's limits and its manifest's size bound, whose body claims the version its headers do. `timing` gets the
    seconds of "verify" and "decode"."""
    if msg.kind != "update":
        raise MalformedMessage(f"{what}: a {msg.kind!r} record in the updates topic")
    if replica.verifier is None:
        warn_if_signed(msg.data, replica.run, what)
    t0 = time.perf_counter()
    replica.verify(msg.data, what)
    t1 = time.perf_counter()
    upd = replica.decode(msg.data, what)
    if upd.version != msg.version:  # a genuine message re-appended under another version's headers
        raise MalformedMessage(f"{what}: record header says v{msg.version}, message body says v{upd.version}")
    if timing is not None:
        timing |= {"verify": t1 - t0, "decode": time.perf_counter() - t1}
    return upd


def unframe_key(verifier, msg: Message, run: str, what: str) -> KeyRotation:
    """The key rotation in `msg`, signed by `verifier`'s key (when there is one), of run `run`."""
    if verifier is not None:
        verifier.verify(*split_trailer(msg.data, what), what)
    rot = decode_record(msg.data, what)
    if not isinstance(rot, KeyRotation) or rot.run != run:
        raise MalformedMessage(f"{what}: not a key record of run {run!r}")
    return rot


def adopt_rotation(replica: PolicyReplica, msg: Message, what: str) -> KeyRotation | None:
    """Key record `msg` as a site takes it: verified with the key `replica` trusts now (raises what a site skips it for)
    and, when it names a version past the replica's, trusted from then on (`replica.keyring` trusts the new key; a
    replica that verifies nothing stays so). Returns the rotation, or None for one the replica is already past."""
    rot = unframe_key(replica.verifier, msg, replica.run, what)
    if rot.from_version <= replica.version:
        return None  # an old rotation this replica is already past (replaying): trust is already the new key
    if replica.verifier is not None:
        replica.keyring.trust(Verifier.from_raw(rot.public_key))
    return rot


def accepts(replica: PolicyReplica, topic: str):
    """`msg -> bool`: whether a follower of `replica` would take `msg` as a message of its run (an update that passes
    `unframe_update`, or a key record that passes `unframe_key`); never raises. What a reader of the tail
    (log/tail.newest) believes a head by: a record it would skip says nothing about where the run is."""
    def accept(msg: Message) -> bool:
        what = message_what(topic, msg)
        try:
            if msg.kind == "key":
                unframe_key(replica.verifier, msg, replica.run, what)
                return True
            return unframe_update(replica, msg, what).run == replica.run
        except HiloError:
            return False
    return accept
