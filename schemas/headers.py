"""Record header names: the one table (SPEC.md, "Log records"). Values are always decimal or hex strings.

Every record a hilo-sync writer appends carries the chunk headers; update and checkpoint records add the
position headers a reader of the topic's tail (`hilo lag`, bootstrap) needs without decoding the body.
"""
from dataclasses import dataclass

# On every chunk (schemas/chunks.py)
RUN = "hilo-run"                        # run id; a record of another run is foreign
KIND = "hilo-kind"                      # update | checkpoint | key
VERSION = "hilo-version"                # policy version of the message
CHUNK = "hilo-chunk"                    # "i/n": chunk i of n
SIZE = "hilo-size"                      # bytes of the whole message
SUM = "hilo-sum"                        # xxh3-64 hex of the whole message

# Position headers on update and checkpoint records
DIGEST = "hilo-digest"                  # state digest after the version (hex)
LOG_BYTES = "hilo-log-bytes"            # cumulative update bytes through the version
UPDATES_OFFSET = "hilo-updates-offset"  # checkpoint: the RUN.updates offset its replay starts at
GENESIS = "hilo-genesis"                # checkpoint: digest of the run's genesis state (which history)
LAG = "hilo-lag"                        # delta mode: the sites' relative lag behind the trainer's master

# On prompt and rollout records (the return path)
PROMPT = "hilo-prompt"                  # prompt id
SITE = "hilo-site"                      # rollout: the site that generated it
# rollout on the embedded log: the lease it settles (its prompts are then answered)
LEASE = "hilo-lease"

CHUNK_HEADERS = (RUN, KIND, VERSION, CHUNK, SIZE, SUM)
ALL = CHUNK_HEADERS + (DIGEST, LOG_BYTES, UPDATES_OFFSET, GENESIS, LAG, PROMPT, SITE, LEASE)


# -- written values -----------------------------------------------------------------------------------------------
# One constructor per record kind: every writer builds its headers here, with the types `RecordHeaders` reads back.
# Each returns name -> str in the order the writers have always used (the file log stores the dict as it is given).


def chunk_headers(run: str, kind: str, version: int, checksum: str, size: int) -> dict:
    """What every chunk of a message carries but its "i/n" (schemas/chunks.split adds that): `checksum` is xxh3-64
    hex."""
    return {RUN: run, KIND: kind, VERSION: str(version), SUM: checksum, SIZE: str(size)}


def update_headers(digest: bytes, log_bytes: int, lag: float | None = None) -> dict:
    """An update's position headers: the state digest after it, log bytes through it, and (delta mode) the sites'
    lag."""
    return {DIGEST: digest.hex(), LOG_BYTES: str(log_bytes)} | ({} if lag is None else {LAG: lag_text(lag)})


def checkpoint_headers(digest: bytes, updates_offset: int, log_bytes: int, genesis: bytes) -> dict:
    """A checkpoint's position headers: its digest, the updates offset its replay starts at, log bytes, its history."""
    return {DIGEST: digest.hex(), UPDATES_OFFSET: str(updates_offset), LOG_BYTES: str(log_bytes),
            GENESIS: genesis.hex()}


def key_headers(digest: bytes, log_bytes: int) -> dict:
    """A key-rotation record's position headers: those of the version it follows (what `head` readers expect)."""
    return {DIGEST: digest.hex(), LOG_BYTES: str(log_bytes)}


def prompt_headers(run: str, prompt_id: str) -> dict:
    """A prompt record's headers (RUN.prompts)."""
    return {RUN: run, KIND: "prompt", PROMPT: prompt_id}


def rollout_headers(run: str, prompt_id: str, site: str, version: int) -> dict:
    """A rollout record's headers (RUN.rollouts): the prompt it answers, the site and the version that generated it."""
    return {RUN: run, KIND: "rollout", PROMPT: prompt_id, SITE: site, VERSION: str(version)}


# -- parsed values ------------------------------------------------------------------------------------------------
# Headers are read before anything is verified: a forged or garbled value must never raise or mislead a reader.
# The one rule: a value that is not canonical (decimal digits, hex of the right length, a chunk "i/n" with i < n)
# is absent (None), exactly as if the writer had not set it.
_MAX_DIGITS = 19  # fits an int64, which is what Kafka offsets and every count here are
_DIGEST_HEX = 32  # an xxh3-128 state digest (records.DIGEST_BYTES), hex


def _decimal(v) -> int | None:
    return int(v) if isinstance(v, str) and 0 < len(v) <= _MAX_DIGITS and v.isascii() and v.isdigit() else None


def _hex(v, chars: int) -> str | None:
    ok = isinstance(v, str) and len(v) == chars and all(c in "0123456789abcdef" for c in v)
    return v if ok else None


def _chunk(v) -> tuple | None:
    i, sep, n = v.partition("/") if isinstance(v, str) else ("", "", "")
    i, n = _decimal(i), _decimal(n)
    return (i, n) if sep and i is not None and n is not None and i < n else None


def lag_text(lag: float) -> str:
    """The `hilo-lag` value writers write: the float64 in C's `%.16e` (17 significant digits: it reads back exactly, and
    each value has one form). Readers take any finite decimal float: writers before it wrote `%.6g`."""
    return f"{float(lag):.16e}"


def _float(v) -> float | None:
    try:
        x = float(v) if isinstance(v, str) and len(v) <= 32 else None
    except ValueError:
        return None
    return x if x is not None and x == x and abs(x) != float("inf") else None


@dataclass(frozen=True)
class RecordHeaders:
    """One record's (or message's) headers, parsed once; every field is None where the header is missing or garbled."""

    run: str | None = None
    kind: str | None = None
    version: int | None = None
    chunk: tuple | None = None          # (i, n): chunk i of n
    size: int | None = None             # bytes of the whole message
    checksum: str | None = None         # xxh3-64 of the whole message, hex
    digest: str | None = None           # hex
    log_bytes: int | None = None
    updates_offset: int | None = None
    genesis: str | None = None          # hex
    lag: float | None = None

    @classmethod
    def of(cls, raw: dict | None) -> "RecordHeaders":
        """Parse `raw` (name -> str) by the one rule above."""
        raw = raw or {}
        text = lambda name: raw.get(name) if isinstance(raw.get(name), str) else None  # noqa: E731
        return cls(run=text(RUN), kind=text(KIND), version=_decimal(raw.get(VERSION)), chunk=_chunk(raw.get(CHUNK)),
                   size=_decimal(raw.get(SIZE)), checksum=_hex(raw.get(SUM), 16),
                   digest=_hex(raw.get(DIGEST), _DIGEST_HEX), log_bytes=_decimal(raw.get(LOG_BYTES)),
                   updates_offset=_decimal(raw.get(UPDATES_OFFSET)), genesis=_hex(raw.get(GENESIS), _DIGEST_HEX),
                   lag=_float(raw.get(LAG)))

    @property
    def first_chunk(self) -> bool:
        """Whether this is chunk 0 of its message."""
        return self.chunk is not None and self.chunk[0] == 0

    @property
    def last_chunk(self) -> bool:
        """Whether this is the last chunk of its message."""
        return self.chunk is not None and self.chunk[0] == self.chunk[1] - 1

    def of_run(self, run: str) -> bool:
        """Whether the record says it is a chunk of `run`'s (what a reader may look at further)."""
        return self.run == run and self.chunk is not None
