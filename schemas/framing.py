"""Frame = magic + schema version + kind + flags + declared size + zstd(msgpack(body)) [+ signature trailer].

See SPEC.md, "Framing". Flag bit 0: the frame ends with a 72-byte trailer (key id + Ed25519 signature over
everything before it); signing.py makes and checks it.
"""
import struct

import msgpack
import zstandard

from .errors import LimitExceeded, MalformedMessage, UnsupportedVersion
from .limits import DEFAULT_LIMITS, Limits

MAGIC = b"HILO"
SCHEMA_VERSION = 2  # 2: flags byte (was reserved) and the optional signature trailer
FLAG_SIGNED = 1
TRAILER_BYTES = 72  # signing.KEY_ID_BYTES + signing.SIGNATURE_BYTES: key id (8) + Ed25519 signature (64)
KIND_UPDATE = 1
KIND_CHECKPOINT = 2
KIND_KEY = 3  # the run's next signing key, signed by the current one (SPEC.md, "Key rotation")
KIND_PROMPT = 4   # the trainer's prompt (rollouts.py)
KIND_ROLLOUT = 5  # a site's rollout (rollouts.py)
KIND_NAMES = {KIND_UPDATE: "update", KIND_CHECKPOINT: "checkpoint", KIND_KEY: "key", KIND_PROMPT: "prompt",
              KIND_ROLLOUT: "rollout"}
_HEADER = struct.Struct("<4sHBBQ")  # magic, schema version, kind, flags, decompressed size
HEADER_BYTES = _HEADER.size          # 16
ZSTD_LEVEL = 3


def frame_bound(decompressed: int) -> int:
    """Largest framed record a body of `decompressed` bytes can legitimately become (header + zstd's worst case)."""
    return HEADER_BYTES + decompressed + (decompressed >> 8) + (64 << 10) + TRAILER_BYTES


def frame(kind: int, body: dict, level: int = ZSTD_LEVEL, signer=None) -> bytes:
    """Serialise `body` with msgpack, compress with zstd, prepend the 16-byte header; signed by `signer` if given."""
    raw = msgpack.packb(body, use_bin_type=True)
    comp = zstandard.ZstdCompressor(level=level, write_content_size=True).compress(raw)
    data = _HEADER.pack(MAGIC, SCHEMA_VERSION, kind, FLAG_SIGNED if signer else 0, len(raw)) + comp
    return data + signer.sign(data) if signer else data


def split_trailer(data: bytes, what: str) -> tuple:
    """(signed part, trailer or None): a signed frame without its trailer (a view, not a copy), and the trailer."""
    if len(data) < HEADER_BYTES:
        raise MalformedMessage(f"{what}: {len(data)} bytes is shorter than the {HEADER_BYTES}-byte header")
    if not data[7] & FLAG_SIGNED:
        return data, None
    if len(data) < HEADER_BYTES + TRAILER_BYTES:
        raise MalformedMessage(
            f"{what}: flagged as signed but too short for the {TRAILER_BYTES}-byte signature trailer")
    return memoryview(data)[:-TRAILER_BYTES], bytes(data[-TRAILER_BYTES:])


PEEK_LIMIT = 16 << 20  # bytes of a body read to find a leading field before anything large is decompressed


def peek_field(data: bytes, key: str, what: str, limits: Limits = DEFAULT_LIMITS):
    """The value of `key` in a record's body map, streaming only as far as it (writers put small fields first).

    Decompresses at most PEEK_LIMIT bytes of the body, so a forged declared size costs nothing here.
    Raises MalformedMessage when `key` is not among the fields within that prefix.
    """
    data, _ = split_trailer(data, what)
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=PEEK_LIMIT, max_bin_len=PEEK_LIMIT,
                                max_str_len=1 << 20, max_array_len=max(limits.max_blocks, limits.max_chunks),
                                max_map_len=max(limits.max_params, 64), max_ext_len=0)
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(memoryview(data)[HEADER_BYTES:], read_across_frames=False)
        fed, entries, seen = 0, None, 0
        while fed < PEEK_LIMIT:
            chunk = reader.read(1 << 16)
            if not chunk:
                break
            unpacker.feed(chunk)
            fed += len(chunk)
            try:
                if entries is None:
                    entries = unpacker.read_map_header()
                while seen < entries:
                    k = unpacker.unpack()
                    if k == key:
                        return unpacker.unpack()
                    unpacker.skip()
                    seen += 1
                break
            except msgpack.OutOfData:
                continue
    except (zstandard.ZstdError, ValueError, TypeError, msgpack.exceptions.UnpackException) as e:
        raise MalformedMessage(f"{what}: body is invalid before field {key!r} ({type(e).__name__}: {e})") from None
    raise MalformedMessage(f"{what}: no field {key!r} in the first {PEEK_LIMIT >> 20} MiB of the body (writers put it "
                           f"first)")


def unframe(data: bytes, what: str, limits: Limits = DEFAULT_LIMITS, max_decompressed: int | None = None):
    """Check the header, decompress at most the declared size and unpack; returns (kind, body dict).

    `what` names the record in errors (e.g. "offset 17"). `max_decompressed` is a tighter bound the
    caller derives from the manifest; it is checked before any allocation.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise MalformedMessage(f"{what}: expected bytes, got {type(data).__name__}")
    if len(data) > limits.max_frame_bytes:
        raise LimitExceeded(f"{what}: frame is {len(data)} bytes > limit {limits.max_frame_bytes}")
    if len(data) < HEADER_BYTES:
        raise MalformedMessage(f"{what}: {len(data)} bytes is shorter than the {HEADER_BYTES}-byte header")
    magic, version, kind, flags, size = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise MalformedMessage(f"{what}: magic {bytes(magic)!r} != {MAGIC!r} (not a hilo-sync record)")
    if version == 1:
        raise UnsupportedVersion(f"{what}: schema version 1 (unsigned frames of hilo-sync 0.1); this build reads "
                                 f"{SCHEMA_VERSION}: start the run again with a current trainer")
    if version != SCHEMA_VERSION:
        raise UnsupportedVersion(f"{what}: schema version {version}, this build reads {SCHEMA_VERSION}")
    if kind not in KIND_NAMES:
        raise MalformedMessage(f"{what}: unknown kind {kind} (expected one of {sorted(KIND_NAMES)})")
    if flags & ~FLAG_SIGNED:
        raise MalformedMessage(f"{what}: unknown header flags {flags:#04x} (this build knows {FLAG_SIGNED:#04x}, "
                               f"signed)")
    data, _ = split_trailer(data, what)  # verification, where wanted, happened before (PolicyReplica.parse)
    cap = limits.max_decompressed_bytes if max_decompressed is None \
        else min(max_decompressed, limits.max_decompressed_bytes)
    if size > cap:
        raise LimitExceeded(f"{what}: declared decompressed size {size} > limit {cap}")
    try:
        # Streaming read with an explicit cap: the zstd frame's own size field is not trusted.
        reader = zstandard.ZstdDecompressor().stream_reader(memoryview(data)[HEADER_BYTES:], read_across_frames=False)
        raw = reader.read(size + 1)
    except zstandard.ZstdError as e:
        raise MalformedMessage(f"{what}: zstd payload is corrupt ({e})") from None
    if len(raw) != size:
        raise MalformedMessage(f"{what}: decompressed {len(raw)}{'+' if len(raw) > size else ''} bytes, header "
                               f"declares {size}")
    try:
        body = msgpack.unpackb(
            raw, raw=False, strict_map_key=True, use_list=True,
            max_bin_len=size, max_str_len=min(size, 1 << 20), max_array_len=max(limits.max_blocks, limits.max_chunks),
            max_map_len=max(limits.max_params, 64), max_ext_len=0,
        )
    except (ValueError, TypeError, msgpack.exceptions.ExtraData, msgpack.exceptions.UnpackException) as e:
        raise MalformedMessage(f"{what}: msgpack body is invalid ({type(e).__name__}: {e})") from None
    if not isinstance(body, dict):
        raise MalformedMessage(f"{what}: body is a {type(body).__name__}, expected a map")
    return kind, body
