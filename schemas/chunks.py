"""Splitting one framed message into log records, and reassembling them on the consumer (SPEC.md, "Log records")."""
from dataclasses import dataclass
from functools import cached_property

import xxhash

from . import headers as H
from .errors import ForeignRecord, LimitExceeded, MalformedMessage
from .limits import DEFAULT_LIMITS, Limits

DEFAULT_CHUNK_BYTES = 900 * 1024  # under Kafka's default 1 MiB max.message.bytes, with room for headers


@dataclass(frozen=True)
class Record:
    """One log record as both backends return it."""

    offset: int
    key: bytes | None
    value: bytes
    headers: dict  # str -> str
    # Unix seconds the writer appended it (Kafka's CreateTime, kept by a mirror); None on the file log
    timestamp: float | None = None

    @cached_property
    def parsed(self) -> H.RecordHeaders:
        """Its headers, parsed by the one rule for garbled values (schemas/headers.py)."""
        return H.RecordHeaders.of(self.headers)


@dataclass(frozen=True)
class Message:
    """A reassembled message: its bytes, the offsets it spans, and the header fields of its chunks."""

    data: bytes
    first_offset: int
    last_offset: int
    kind: str
    version: int
    headers: dict
    written_at: float | None = None  # the last chunk's log timestamp (Kafka CreateTime; None on the file log)
    record_bytes: int = 0            # values and headers of its chunks, as the log delivered them

    @cached_property
    def parsed(self) -> H.RecordHeaders:
        """Its headers, parsed by the one rule for garbled values (schemas/headers.py)."""
        return H.RecordHeaders.of(self.headers)


def split(data: bytes, run: str, kind: str, version: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
          extra: dict | None = None) -> list:
    """(key, value, headers) per chunk; every chunk carries the whole message's size and checksum."""
    n = max(1, -(-len(data) // chunk_bytes))
    common = H.chunk_headers(run, kind, version, xxhash.xxh3_64_hexdigest(data), len(data)) | (extra or {})
    key = str(version).encode()
    return [(key, data[i * chunk_bytes:(i + 1) * chunk_bytes], common | {H.CHUNK: f"{i}/{n}"}) for i in range(n)]


def _int(rec, name: str, value: int | None, what: str, hi: int) -> int:
    """A parsed header value that must be there and at most `hi` (MalformedMessage naming the raw value if not)."""
    if value is None or value > hi:
        raise MalformedMessage(f"{what}: header '{name}' = {rec.headers.get(name)!r}, expected a decimal int <= {hi}")
    return value


class Reassembler:
    """Feed records in offset order; returns a Message when its last chunk arrives, else None.

    An incomplete sequence is dropped (and counted in `discarded`) when a chunk 0 of another message
    arrives: the writer died mid-message and the restarted writer sent that version again.
    """

    def __init__(self, run: str, topic: str, limits: Limits = DEFAULT_LIMITS, max_bytes: int | None = None):
        self.run, self.topic, self.limits = run, topic, limits
        # The largest message accepted: the caller's bound (from the manifest) or the global frame limit.
        self.max_bytes = min(max_bytes, limits.max_frame_bytes) if max_bytes else limits.max_frame_bytes
        self.parts, self.head, self.discarded, self.buffered = [], None, 0, 0

    def reset(self) -> None:
        """Forget a partly read message (the reader will read it again from its first chunk)."""
        self.parts, self.head, self.buffered = [], None, 0

    def feed(self, rec: Record) -> Message | None:
        """Add one record; raise LogError/MalformedMessage naming the offset for foreign or broken records."""
        what = f"{self.topic} offset {rec.offset}"
        h = rec.headers
        if H.CHUNK not in h or H.RUN not in h:
            raise ForeignRecord(
                f"{what}: not a hilo-sync record (no hilo-run/hilo-chunk headers; keys {sorted(h)[:6]})")
        if h[H.RUN] != self.run:
            raise ForeignRecord(f"{what}: record of run {h[H.RUN]!r} in the topic of run {self.run!r}")
        p = rec.parsed  # one rule for every header value (schemas/headers.py): a garbled one is absent
        if p.chunk is None or p.chunk[1] > self.limits.max_chunks:
            raise MalformedMessage(f"{what}: header '{H.CHUNK}' = {h[H.CHUNK]!r}, expected i/n with 0 <= i < n <= "
                                   f"{self.limits.max_chunks}")
        i, n = p.chunk
        version = _int(rec, H.VERSION, p.version, what, 1 << 62)
        size = _int(rec, H.SIZE, p.size, what, 1 << 62)
        if size > self.max_bytes:
            raise LimitExceeded(f"{what} (v{version}): message of {size} bytes > limit {self.max_bytes}")
        ident = (h.get(H.SUM), version, n, size)
        if i == 0:
            if self.parts:
                self.discarded += 1
            self.parts, self.head, self.buffered = [], ident, 0
        elif self.head != ident or i != len(self.parts):
            # A continuation without its beginning (we started mid-message, or chunks of a dead writer).
            if self.parts:
                self.discarded += 1
            self.reset()
            return None
        if self.buffered + len(rec.value) > size:  # refuse at the chunk that overflows, before buffering it
            self.reset()
            raise MalformedMessage(f"{what} (v{version}): chunk {i}/{n} brings the message past its declared {size} "
                                   f"bytes")
        self.parts.append(rec)
        self.buffered += len(rec.value)
        if len(self.parts) < n:
            return None
        data = b"".join(p.value for p in self.parts)
        first = self.parts[0].offset
        wire = sum(len(p.value) + sum(len(k) + len(v) for k, v in p.headers.items()) for p in self.parts)
        self.reset()
        if len(data) != size or xxhash.xxh3_64_hexdigest(data) != h.get(H.SUM):
            raise MalformedMessage(f"{self.topic} offsets {first}..{rec.offset} (v{version}): reassembled {len(data)} "
                                   f"bytes do not match header size {size} / checksum {h.get(H.SUM)}")
        return Message(data, first, rec.offset, h.get(H.KIND, ""), version, dict(h), rec.timestamp, wire)
