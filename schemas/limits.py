"""Hard limits checked while decoding, before anything is allocated (no zip bombs, no forged giant headers)."""
from dataclasses import dataclass

from .errors import ConfigError

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class Limits:
    """Upper bounds on what a decoder accepts. Defaults fit a rank-64 adapter of a ~8B model."""

    max_frame_bytes: int = 4 * GiB          # compressed bytes of one reassembled message
    max_decompressed_bytes: int = 4 * GiB   # zstd output; also capped by the manifest-derived bound
    max_blocks: int = 65_536                # LoRA A/B matrices in a manifest
    max_block_elements: int = 1 << 30       # elements of one block (m * n)
    max_name_bytes: int = 512               # module names, run ids, codec/optimizer names
    max_chunks: int = 65_536                # chunk records per message
    max_params: int = 64                    # entries in a codec/optimizer parameter map
    max_prompt_tokens: int = 1 << 17        # token ids of one prompt
    max_completion_tokens: int = 1 << 17    # tokens of one sample (a prompt's max_tokens is at most this)
    max_rollout_bytes: int = 16 * MiB       # decompressed body of one prompt or rollout record

    def __post_init__(self):
        for name, value in self.__dict__.items():
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"Limits.{name} must be a positive int, got {value!r}")


DEFAULT_LIMITS = Limits()
