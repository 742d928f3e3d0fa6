"""Which records a follower skips instead of stopping: those that cannot be a valid message of this run.

Kafka users know this as the poison-pill problem (Kafka Streams' deserialization exception handler, Spring's
dead-letter topics). Skipping is safe because of the digest chain: only a message whose parent is this replica's
digest can move it, so a skipped record that was needed shows itself as a gap at the next valid version, and
only then does the follower stop, naming what it skipped. A fork (a message that decodes, verifies and conflicts
with the chain) and a divergence (a digest this replica does not reproduce) still stop at once.

OnBadRecord: SKIP ("skip", the default) or STOP ("stop": fail-stop, the first bad record stops the follower).
"""
from dataclasses import dataclass
from enum import Enum

from hilo.schemas.errors import (ConfigError, ForeignRecord, LimitExceeded, MalformedMessage, NonFinite, OtherRun,
                                 UnsupportedVersion)
from hilo.schemas.signing import BadSignature, OtherKey, Unsigned


class OnBadRecord(str, Enum):
    """What a follower does with a record that cannot be a valid message of its run (str-valued: "skip" == SKIP)."""

    # enum.StrEnum's behaviour, spelled out: it is Python 3.11+, and the package supports 3.10
    __str__ = str.__str__
    __format__ = str.__format__

    SKIP = "skip"
    STOP = "stop"

    @classmethod
    def of(cls, value, what: str = "on_bad_record") -> "OnBadRecord":
        """`value` (an OnBadRecord or its string) as an OnBadRecord; else ConfigError naming `what`."""
        try:
            return cls(value)
        except (ValueError, TypeError):
            raise ConfigError(f"{what} = {value!r}: expected one of {[p.value for p in cls]}") from None




# (error type, reason), most specific first: the reason is what the warning, the counters and the history say.
SKIPPABLE = (
    (ForeignRecord, "foreign"),            # not a hilo-sync record of this run (headers)
    (OtherRun, "other-run"),               # the body names another run
    (Unsigned, "unsigned"),                # a signed run's reader got an unsigned record
    (OtherKey, "other-key"),               # signed, by a key this reader does not trust
    (BadSignature, "bad-signature"),       # changed after signing
    (LimitExceeded, "limit"),              # a size or count over a limit (zstd bombs, absurd shapes)
    (NonFinite, "non-finite"),             # would put NaN/Inf in the state
    (UnsupportedVersion, "unsupported"),   # a schema, codec or optimizer this build does not know
    (MalformedMessage, "malformed"),       # does not decode, or disagrees with itself or the manifest
)


def reason_of(error: Exception) -> str | None:
    """The skip reason of `error`, or None when it must stop the follower (a gap, a fork, a divergence)."""
    return next((reason for kind, reason in SKIPPABLE if isinstance(error, kind)), None)


@dataclass(frozen=True)
class Skipped:
    """A record the follower skipped; the replica is untouched."""

    offset: int
    reason: str
    detail: str   # the one-line error
