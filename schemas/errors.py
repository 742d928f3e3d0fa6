"""Project exceptions. Every rejection names what was wrong: which record, which field, what was expected."""


class HiloError(Exception):
    """Base class of every error hilo-sync raises on purpose."""


class MalformedMessage(HiloError):
    """Bytes that are not a valid message: bad framing, wrong types, shapes that disagree with the manifest."""


class LimitExceeded(MalformedMessage):
    """A declared size, count or shape is over a configured limit (checked before anything is allocated)."""


class UnsupportedVersion(MalformedMessage):
    """A schema version, codec or optimizer this build does not know."""


class NonFinite(MalformedMessage):
    """Applying the message would leave NaN/Inf in the state: such a state is never adopted."""


class ChainError(HiloError):
    """The message does not continue this replica's hash chain: a gap, a duplicate, a fork or another run."""


class Gap(ChainError):
    """A version whose parent this replica never reached (versions are missing before it)."""


class Fork(ChainError):
    """A message that conflicts with the chain: another digest for an applied version, or another parent."""


class OtherRun(ChainError):
    """A message body of another run."""


class UnfitState(HiloError):
    """A replica state whose buffers the fused apply kernel cannot take (dtype, layout, shape): refused before anything
    is written; the reference path (--apply reference) takes it."""


class DivergenceError(HiloError):
    """Applying the message did not produce the digest it promised: a different kernel, or a forged message."""


class LogError(HiloError):
    """The log (topic) is missing, misconfigured or holds records that do not belong to this run."""


class LogUnavailable(LogError):
    """A log reached before does not answer now (a broker restarting, a network partition): worth waiting out."""


class NotPublished(LogUnavailable):
    """A step's message did not reach the log before its deadline. `in_doubt`: the log could not be read to tell
    whether it holds it (the trainer's next step settles that first); False: it is not on the log."""

    def __init__(self, message: str, in_doubt: bool = False):
        super().__init__(message)
        self.in_doubt = in_doubt


class Expired(LogError):
    """The versions a reader needs next were deleted by retention before it read them."""


class NoSuchTopic(LogError):
    """The topic is not on the log (never created, or deleted)."""


class FencedError(LogError):
    """A newer writer took over the run: this trainer must publish nothing more."""


class LeaseLost(LogError):
    """A site's prompts were handed to another site (its lease expired, or the group rebalanced them away) before it
    settled them: its rollouts for them are discarded, never delivered twice."""


class ForeignRecord(LogError):
    """A record that is not this run's (another run's, or not hilo-sync's at all): it cannot move the replica."""


class StateNotWritten(HiloError):
    """A process could not write its own state (a snapshot) to its disk: no space, an I/O error, no permission. It
    stops; nothing it acknowledged is lost (that is on the log), and a restart resumes once the disk takes the state."""


class ConfigError(HiloError, ValueError):
    """A configuration value is out of range; the message names the field."""


class TrainerError(HiloError):
    """The training loop handed the trainer something it cannot publish (no gradients, NaN/Inf, a foreign layout)."""


class PastVersion(HiloError):
    """A reader told to end at a version its state is already past (it never moves backwards); `hilo` exits 3."""

    exit_code = 3
