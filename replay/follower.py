"""The follower: read the updates topic from an offset, reassemble chunks, apply each version in order.

Used by every site (consumer/site.py) and by a restarting trainer to catch up to the log head. It never calls
back into its caller (raft's Ready/Advance): `updates()` yields each version as it is applied, the caller
acts on it (snapshot, commit, export) and asks for the next one, or stops iterating to stop between versions.
"""
import collections
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from hilo.replica.replica import PolicyReplica
from hilo.schemas import headers as H
from hilo.schemas.errors import DivergenceError, Expired, Gap, HiloError, LogError, MalformedMessage
from hilo.schemas.framing import split_trailer
from hilo.schemas.keyring import Keyring
from hilo.schemas.position import Position
from hilo.schemas.records import Checkpoint, UpdateMessage, decode_record
from hilo.schemas.signing import SignatureError, Verifier

from hilo.schemas import crash_points
from hilo.log.base import checkpoints_topic, updates_topic
from hilo.log.tail import last_message

from .bad_records import OnBadRecord, Skipped, reason_of
from .checks import adopt_rotation, message_what, unframe_update, update_reassembler, warn_if_signed
from .follow_from import next_version_offset, trusted_keyring

logger = logging.getLogger(__name__)


def bootstrap_from_log(log_backend, run: str, max_version: int | None = None, verifier=None):
    """(replica, position) from the newest valid checkpoint on RUN.checkpoints (at most `max_version`).

    A checkpoint that does not decode or verify is reported and the previous one is tried: a corrupt newest
    checkpoint costs a longer replay, not the site. With `verifier` (a signing.Verifier) only checkpoints the
    trusted key signed are used, and the replica then refuses every update that key did not sign.
    """
    topic = checkpoints_topic(run)
    before, skipped = None, None
    while True:
        msg = last_message(log_backend, topic, run, before)
        if msg is None:
            if skipped is not None:
                raise skipped  # every checkpoint in reach is unusable: report the newest one's problem
            raise _no_checkpoint(log_backend, topic, run, max_version)
        before = msg.first_offset
        if max_version is not None and msg.version > max_version:
            continue
        what = f"{topic} offset {msg.first_offset} (checkpoint v{msg.version})"
        try:
            if verifier is not None:
                verifier.verify(*split_trailer(msg.data, what), what)
            else:
                warn_if_signed(msg.data, run, what)
            ckpt = decode_record(msg.data, what)
            if not isinstance(ckpt, Checkpoint) or ckpt.run != run:
                raise LogError(f"{what}: not a checkpoint of run {run!r}")
            if msg.parsed.updates_offset is None:
                raise MalformedMessage(f"{what}: header '{H.UPDATES_OFFSET}' missing or not a decimal offset")
            replica = PolicyReplica.from_checkpoint(ckpt, what)
        except (MalformedMessage, DivergenceError, LogError, SignatureError) as e:
            logger.warning("%s; falling back to the previous checkpoint", e)
            skipped = skipped or e
            continue
        if skipped is not None:
            logger.warning("%s: bootstrapped from it instead (more versions to replay)", what)
        replica.keyring.trust(verifier)
        return replica, Position(msg.parsed.updates_offset, msg.parsed.log_bytes or 0)


def _no_checkpoint(log_backend, topic: str, run: str, max_version: int | None) -> LogError:
    """Why no checkpoint of `run` was found on `topic`: none written, expired, or retained but not read; only what is
    true."""
    begin, end = log_backend.begin_offset(topic), log_backend.end_offset(topic)
    which = "checkpoint" + ("" if max_version is None else f" at or before v{max_version}")
    if end == 0:
        return LogError(f"{log_backend.url}: no {which} on {topic} (has the producer started?)")
    if begin == 0:  # nothing expired: the records are there, and none was read as one
        return LogError(f"{log_backend.url}: no {which} of run {run!r} was read from {topic}, which retains every "
                        f"offset it has had (0..{end - 1}): they hold none, or a read of them returned nothing in time")
    held = f"offsets {begin}..{end - 1} are retained" if end > begin \
        else f"none of its offsets 0..{end - 1} is retained"
    return LogError(f"{log_backend.url}: every {which} on {topic} has expired ({held}): nothing here can rebuild the "
                    f"run's state until the trainer publishes a fresh checkpoint, at its next checkpoint_every version "
                    f"or when it restarts with its state dir")


@dataclass(frozen=True)
class Applied:
    """One version the follower just applied: the replica now holds `update.version` with digest `digest`."""

    update: UpdateMessage
    first_offset: int
    last_offset: int
    headers: dict
    digest: bytes
    # seconds per stage: fetch (reads that returned records, since the previous version), verify, decode, apply
    timing: dict
    written_at: float | None = None  # when its last record was written (the log's timestamp; None on the file log)
    record_bytes: int = 0            # bytes of its records (values and headers) this reader fetched
    # (record bytes, seconds from its first record's log timestamp to the read that completed it) for a message written
    # while this reader was already waiting for it: what the link delivers; None otherwise (it waited for the reader)
    delivery: tuple | None = None

    @property
    def version(self) -> int:
        """The version applied."""
        return self.update.version


class Follower:
    """Applies RUN.updates to a replica. `next_offset` is always just past the last complete message handled.

    Each message is classified as a replica does: the next version is applied, a harmless duplicate of an
    applied one is skipped, a fork or divergence stops it (raises). A record that cannot be a valid message of
    this run (bad_records.py) is skipped with one warning and handed to the caller as a Skipped, so one stray or
    hostile write does not halt every site and the trainer; with on_bad_record=OnBadRecord.STOP it raises instead. A gap
    right after a skip stops with a line that names the skipped record.
    """

    def __init__(self, log_backend, run: str, replica: PolicyReplica, position: Position,
                 on_bad_record: OnBadRecord = OnBadRecord.SKIP, reader=None, trust: Keyring | Verifier | None = None):
        """`trust`: the reader's keyring (a Verifier: the run's key as configured; None: an unsigned run). The replica
        shares it, and trusts the newest key rotation `position` records (this reader verified it before a restart),
        else the keyring's root (schemas/keyring.py); then every rotation the follower applies moves the keyring."""
        self.log, self.run, self.replica = log_backend, run, replica
        self.keyring = trusted_keyring(trust, position)
        replica.keyring = self.keyring
        # where update records are read (a log.prefetch.Prefetcher reads the next version while this one applies);
        # offsets, heads and everything else come from log_backend
        self.reader = reader if reader is not None else log_backend
        self.topic = updates_topic(run)
        next_offset = position.next_offset
        self.next_offset = next_offset     # resume point: a snapshot stores this
        self.read_offset = next_offset     # where the next read starts (may be inside a message)
        self.log_bytes = position.log_bytes  # cumulative bytes of update messages through the replica's version
        # No update of this adapter can be larger: a first chunk declaring more is refused before anything is buffered.
        self.reassembler = update_reassembler(run, self.topic, replica.manifest)
        if not isinstance(on_bad_record, OnBadRecord):  # converted once, where it was configured (OnBadRecord.of)
            raise TypeError(f"Follower: on_bad_record = {on_bad_record!r}: an OnBadRecord (OnBadRecord.of converts a "
                            f"string)")
        self.on_bad_record = on_bad_record
        self.skips = collections.Counter()  # reason -> records skipped
        self.skipped_since_applied = []    # Skipped records since the last applied version (a gap then names them)
        self.fetch_s = 0.0                 # time in reads that returned records since the last applied version
        self._read_start = self._read_wall = 0.0  # wall times the current read began and returned
        # (first record's log timestamp, written while this reader waited) of a message
        self._first = None
        # Key rotations seen (from version, raw public key): the replica's trusted key follows them, and a
        # snapshot keeps them (position "keys"), so a restart trusts what this site already verified.
        self.rotations = list(position.keys)
        # the stored offset is another cluster's when this log is a mirror: the next version is looked up here
        self.next_offset = self.read_offset = next_version_offset(self.log, self.topic, run, replica, position)

    @property
    def foreign(self) -> int:
        """Records skipped because they are not this run's."""
        return self.skips["foreign"]

    def updates(self, timeout_s: float = 1.0) -> Iterator[Applied | Skipped]:
        """Read once; yield each version as it is applied, and each record skipped. Stopping the iteration early
        stops between versions: a half-read message is dropped and read again by the next call."""
        t0, self._read_start = time.perf_counter(), time.time()
        batch = self.reader.read(self.topic, self.read_offset, timeout_s)
        if (batch[0].offset if batch else batch.next_offset) > self.read_offset:
            self._check_retained()  # records past where it asked: markers, aborted records, or expired ones
        self._read_wall = time.time()
        # a batch fetched ahead carries when its fetch ran: what a message's delivery is measured against
        self._read_start, self._read_wall = (getattr(batch, "started", self._read_start),
                                              getattr(batch, "fetched", self._read_wall))
        if batch:
            self.fetch_s += time.perf_counter() - t0
            crash_points.reach("follower.fetched")
        finished = False
        try:
            for rec in batch:
                self.read_offset = rec.offset + 1
                event = self._feed(rec)
                if event is not None:
                    yield event
            finished = True
        finally:
            if not finished:  # the caller stopped (or a record raised): resume at the last whole message
                self.read_offset = self.next_offset
                self.reassembler.reset()
        # Past what the batch returned: transaction markers and aborted records take offsets no reader gets.
        self.read_offset = max(self.read_offset, batch.next_offset)
        if not self.reassembler.parts:  # no message half-read: resuming from here loses nothing
            self.next_offset = max(self.next_offset, self.read_offset)

    def _check_retained(self) -> None:
        """Expired when what this follower reads next was deleted (a Kafka reader whose position is gone restarts at
        the log start, which only the digest chain would notice, as a gap): said where it is read."""
        begin = self.log.begin_offset(self.topic)
        if self.next_offset < begin:
            raise Expired(f"{self.topic}: v{self.replica.version + 1} (from offset {self.next_offset}) has expired: "
                          f"the log now begins at offset {begin}; versions v{self.replica.version + 1}.. can only come "
                          f"from a newer checkpoint")

    def poll(self, timeout_s: float = 1.0) -> int:
        """Read once and apply every complete message; returns how many versions were applied."""
        return sum(isinstance(e, Applied) for e in self.updates(timeout_s))

    def _feed(self, rec) -> Applied | Skipped | None:
        """One record: reassemble; apply a complete update (returns it), skip (returns a Skipped) what cannot be a
        valid message of this run, or raise what must stop the follower."""
        if rec.parsed.first_chunk:
            ts = rec.timestamp
            self._first = (ts, ts is not None and ts >= self._read_start)
        try:
            msg = self.reassembler.feed(rec)
        except HiloError as e:
            return self._bad(rec.offset, e)
        if msg is None:
            return None
        try:
            return self._handle(msg)
        except HiloError as e:
            return self._bad(msg.first_offset, e)

    def _bad(self, offset: int, error: HiloError) -> Skipped:
        """Skip a record that cannot be a valid message of this run; raise anything else (or everything, under
        "stop")."""
        reason = reason_of(error)
        if isinstance(error, Gap) and self.skipped_since_applied:
            first = self.skipped_since_applied[0]
            raise Gap(f"{error}; the record skipped at offset {first.offset} ({first.reason}: {first.detail}) was "
                      f"probably the missing version: stopping (if it was genuine, a limit or a trusted key is set "
                      f"wrong here)") from None
        if reason is None or self.on_bad_record is OnBadRecord.STOP:
            raise error
        skipped = Skipped(offset, reason, str(error))
        self.skips[reason] += 1
        self.skipped_since_applied.append(skipped)
        logger.warning("%s: skipped (%s): it cannot be a valid message of run %s, so it cannot move the policy; the "
                       "replica stays at v%d", error, reason, self.run, self.replica.version)
        return skipped

    def _handle(self, msg) -> Applied | None:
        """A complete message: rotate keys, or apply the next version."""
        what = message_what(self.topic, msg)
        if msg.kind == "key":
            self._rotate(msg, what)
            return None
        timing = {"fetch": self.fetch_s}
        upd: UpdateMessage = unframe_update(self.replica, msg, what, timing)  # the checks `hilo inspect` runs too
        crash_points.reach("follower.applying")
        t2 = time.perf_counter()
        if not self.replica.apply(upd, what):  # a duplicate of an applied version
            self.next_offset = max(self.next_offset, msg.last_offset + 1)
            return None
        timing["apply"] = time.perf_counter() - t2
        self.fetch_s = 0.0
        crash_points.reach("follower.applied")
        said = msg.parsed.log_bytes  # a verified message's; absent only from writers before the header existed
        self.log_bytes = said if said is not None else self.log_bytes + len(msg.data)
        self.next_offset = msg.last_offset + 1
        self.skipped_since_applied = []
        delivery = None
        if self._first is not None and self._first[0] is not None and self._first[1]:
            delivery = (msg.record_bytes, self._read_wall - self._first[0])
        return Applied(upd, msg.first_offset, msg.last_offset, msg.headers, self.replica.digest, timing, msg.written_at,
                       msg.record_bytes, delivery)

    def position(self, saved_at: float | None = None) -> Position:
        """Where this follower stands: what a snapshot of its replica stores."""
        return Position(self.next_offset, self.log_bytes, tuple(self.rotations), saved_at)

    def _rotate(self, msg, what):
        """A signed 'next key' record: verified with the key trusted now, it moves trust to the new key."""
        verifier = self.replica.verifier
        rot = adopt_rotation(self.replica, msg, what)
        if rot is None:
            return
        if verifier is None:
            logger.warning("%s: run %s moves to key %s from v%d; this reader verifies nothing", what, self.run,
                           Verifier.from_raw(rot.public_key).key_id.hex(), rot.from_version)
            return
        self.rotations.append((rot.from_version, rot.public_key.hex()))
        logger.info("%s: from v%d the run is signed by key %s (rotation signed by %s)", what, rot.from_version,
                    self.replica.verifier.key_id.hex(), verifier.key_id.hex())

    def close(self) -> None:
        """Close the reader when it is one of its own (a Prefetcher); the log is the caller's."""
        if self.reader is not self.log:
            self.reader.close()

    def catch_up(self) -> Iterator[Applied | Skipped]:
        """Apply everything up to the current log end, yielding each version applied and each record skipped."""
        end = self.log.end_offset(self.topic)
        while self.read_offset < end:
            yield from self.updates(timeout_s=5.0)

    def catch_up_all(self) -> int:
        """`catch_up` for a caller with nothing to do per version; returns how many versions were applied."""
        return sum(isinstance(e, Applied) for e in self.catch_up())
