"""The budget kinds: how many bytes one update message may take.

Budget is fixed (a fraction of the bf16 adapter, or a byte count); AutoBudget is refitted every version to the
slowest site's measured link (the fitting, which reads the sites' reports, is producer/link_budget.py's
LinkBudget). `parse_budget` reads either from the text `--budget` takes, and `describe()` writes it back.
"""
from dataclasses import dataclass

from hilo.schemas.errors import ConfigError
from hilo.schemas.records import Manifest

HEADER_RESERVE = 1024  # bytes of message header (run, digests, hparams, meta) + zstd framing, reserved in budgets
MAX_FRACTION = 4       # a message of 4x the bf16 adapter is more than any codec needs: a larger value is a typo
BYTE_SUFFIXES = (("KB", 1e3), ("MB", 1e6), ("GB", 1e9), ("B", 1))
SYNTAX = "expected a fraction (0.016), a percentage (1.6%), bytes (2MB, 2000000) or auto[:SHARE]"


@dataclass(frozen=True)
class Budget:
    """Bytes one update message may take: absolute, or a fraction of the bf16 adapter."""

    fraction: float | None = 0.016   # of the bf16 adapter size (the paper's 1.6%)
    bytes: int | None = None         # overrides `fraction` when set

    def __post_init__(self):
        if self.bytes is None and (self.fraction is None or not 0 < self.fraction <= MAX_FRACTION):
            raise ConfigError(f"Budget.fraction must be in (0, {MAX_FRACTION}], got {self.fraction!r}")
        if self.bytes is not None and self.bytes <= HEADER_RESERVE:
            raise ConfigError(f"Budget.bytes must exceed the {HEADER_RESERVE}-byte header reserve, got {self.bytes}")

    def describe(self) -> str:
        """As `--budget` takes it: '1.6%' or a byte count."""
        return f"{100 * self.fraction:g}%" if self.bytes is None else str(self.bytes)

    def message_bytes(self, manifest: Manifest) -> int:
        """The whole message's byte budget for this adapter."""
        return self.bytes if self.bytes is not None else int(self.fraction * manifest.adapter_bytes())

    def payload_bytes(self, manifest: Manifest) -> int:
        """What the per-block payloads may use: the message budget less the header and zstd reserve."""
        total = self.message_bytes(manifest)
        return int(total * 0.998) - HEADER_RESERVE  # zstd may expand incompressible data by ~0.1%


DEFAULT_BUDGET = Budget()  # the encoders' default (frozen: one instance serves every call)


@dataclass(frozen=True)
class AutoBudget:
    """`--budget auto` (ProducerConfig.budget): each version's budget fitted to the slowest site's link, as
    fractions of the bf16 adapter. `share` is the part of the trainer's step time a version may take to cross
    that link: in strict on-policy training the transfer adds to every step (`hilo bench wan` measures what a
    larger share costs); raise it where the sync overlaps the trainer's compute."""

    start: float = 0.016      # the budget until a site reports its link
    share: float = 0.05       # of the step time a version may take to reach the slowest site
    floor: float = 0.002      # the smallest budget chosen
    ceiling: float = 0.25     # the largest budget chosen
    refresh_s: float = 10.0   # seconds between reads of the sites' reports
    max_age_s: float = 600.0  # a report whose site applied nothing for this long is ignored (a site that left)

    def __post_init__(self):
        for name in ("start", "floor", "ceiling"):
            if not 0 < getattr(self, name) <= MAX_FRACTION:
                raise ConfigError(f"AutoBudget.{name} = {getattr(self, name)!r}: a fraction of the adapter in (0, "
                                  f"{MAX_FRACTION}]")
        if not self.floor <= self.start <= self.ceiling:
            raise ConfigError(f"AutoBudget.start = {self.start}: must lie in [floor {self.floor}, ceiling "
                              f"{self.ceiling}]")
        if not 0 < self.share <= 1:
            raise ConfigError(f"AutoBudget.share = {self.share!r}: a share of the step time in (0, 1]")
        if self.refresh_s < 0 or self.max_age_s <= 0:
            raise ConfigError(f"AutoBudget.refresh_s / max_age_s = {self.refresh_s} / {self.max_age_s}: must be >= 0 / "
                              f"> 0")

    def describe(self) -> str:
        """As `--budget` takes it: 'auto', or 'auto:SHARE' when the share is not the default."""
        return "auto" if self.share == AutoBudget.share else f"auto:{self.share!r}"

    def message_bytes(self, manifest: Manifest) -> int:
        """The smallest message it may choose (what the producer checks leaves room for a payload)."""
        return Budget(self.floor).message_bytes(manifest)

    def payload_bytes(self, manifest: Manifest) -> int:
        """The payload of the smallest message it may choose."""
        return Budget(self.floor).payload_bytes(manifest)


def parse_budget(text: str, what: str = "budget") -> Budget | AutoBudget:
    """A budget from text: '0.016' or '1.6%' (of the bf16 adapter), '2MB' or '2000000' (bytes), 'auto' or 'auto:SHARE'.

    A bare number up to MAX_FRACTION is a fraction, above it a byte count (no message is 4 bytes). ConfigError
    names `what` and the text."""
    t = text.strip().upper()
    try:
        if t == "AUTO":
            return AutoBudget()
        if t.startswith("AUTO:"):
            return AutoBudget(share=float(t[5:]))
        if t.endswith("%"):
            return Budget(fraction=float(t[:-1]) / 100)
        for suffix, mult in BYTE_SUFFIXES:
            if t.endswith(suffix):
                return Budget(fraction=None, bytes=int(float(t[: -len(suffix)]) * mult))
        v = float(t)
        return Budget(fraction=v) if v <= MAX_FRACTION else Budget(fraction=None, bytes=int(v))
    except ValueError as e:
        # ConfigError is a ValueError too: keep its words; float()'s own ("could not convert") say less than SYNTAX
        raise ConfigError(f"{what} {text!r}: {e if isinstance(e, ConfigError) else SYNTAX}") from None
