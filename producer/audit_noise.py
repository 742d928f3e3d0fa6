"""How far an honest site's log-probabilities sit from the trainer's, per (engine, adapter dtype): the audit's defaults.

    noise = honest_noise("vllm 0.32.0", "bfloat16")    # Noise(abs_mean, abs_sd, worst, tolerance, measured)
    z = noise_z(total, tokens, noise, headroom)          # the statistical verdict's z over a site's audited tokens

An engine serving bf16 computes log-probabilities that differ from the trainer's fp32 forward pass by ~1e-3 a token
(the "training-inference mismatch"): a per-token tolerance wide enough for that lets a site serving v-1 or a perturbed
block through one token at a time. So the audit decides per site from all its audited tokens: the sum of their
|difference| minus the honest mean, in units of the honest spread, grows like sqrt(tokens) for a site whose differences
are larger than honest ones and stays near 0 (or below) for an honest site. `headroom` scales the measured mean and
spread up (the registry was measured on the random tiny base; a sharper base, like the pretrained student, shows
larger honest differences: worst 1.02e-5 against 1.1e-6 at fp32).

Measured by `hilo bench audit --served` (docs/results/audit-served.json, docs/benchmarks.md) on vLLM 0.32.0 CPU with
the sites' adapters exported in the served dtype; a GPU deployment measures its own and passes --audit-tolerance.
An engine not listed is held to vLLM's numbers; float16 to bfloat16's (said once by the auditor).
"""
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Noise:
    """An engine's honest per-token |log-probability difference| at one adapter dtype: its mean, standard deviation and
    worst over `measured` tokens, and the per-token tolerance the audit applies (a token past it fails its rollout)."""

    abs_mean: float
    abs_sd: float
    worst: float
    tolerance: float
    measured: int


# (engine family, adapter dtype) -> Noise. Tolerances: fp32 the long-standing 1e-4 (the student base's honest worst,
# 1.02e-5, with a 10x margin); bf16 about 4x the worst honest token measured (1.17e-2).
NOISE = {
    ("vllm", "float32"): Noise(1.95e-7, 1.56e-7, 9.86e-7, 1e-4, 3633),
    ("vllm", "bfloat16"): Noise(2.03e-3, 1.61e-3, 1.17e-2, 5e-2, 3634),
}


def honest_noise(engine: str | None, dtype: str) -> Noise:
    """The registry's entry for `engine` ("vllm 0.32.0": its first word) serving adapters in `dtype`."""
    family = (engine or "vllm").split()[0].lower()
    dtype = "bfloat16" if dtype == "float16" else dtype
    return NOISE.get((family, dtype)) or NOISE["vllm", dtype]


def known(engine: str | None, dtype: str) -> bool:
    """Whether the registry measured this engine at this dtype (else honest_noise lends another's numbers)."""
    return ((engine or "vllm").split()[0].lower(), dtype) in NOISE


def noise_z(total: float, tokens: int, noise: Noise, headroom: float) -> float:
    """The standardized excess of a site's audited tokens: (sum |d| - tokens x mean) / (spread x sqrt(tokens)), with the
    measured mean and spread times `headroom`."""
    if tokens == 0:
        return 0.0
    return (total - tokens * headroom * noise.abs_mean) / (headroom * noise.abs_sd * math.sqrt(tokens))
