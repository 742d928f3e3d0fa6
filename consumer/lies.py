"""Test hooks that make a site lie about what it served, so the trainer's audit can be shown to catch it.

    HILO_LIE=previous hilo consume ... --no-self-check    # serves the previously loaded adapter under each new version
    HILO_LIE=perturb  hilo consume ... --no-self-check    # serves each version with one block scaled by 1 + 1e-3
    HILO_LIE=logprobs hilo consume ...                     # reports made-up behaviour log-probabilities (x 0.99)
    HILO_LIE=sharpen  hilo consume ...                     # samples at a quarter of the prompt's temperature
    HILO_LIE=span     hilo consume ...                     # made-up log-probabilities, stamped version_end = start + 1

Unset (the normal case) a site is honest. `previous` and `perturb` are what a stale vLLM adapter cache or a corrupted
load look like; the site's own self-check catches them (consumer/self_check.py) unless it is turned off, as a site
that lies on purpose would. `logprobs` is a site sending rollouts under its valid key with log-probabilities that
vLLM never computed. The trainer's audit (producer/rollout_audit.py) catches all three per rollout. `sharpen` is a
site that samples from another policy (a sharper one) and reports the right log-probabilities of what it sampled
(vLLM's raw ones): every per-token check passes, and only the audit's sampling test can catch it, statistically.
`span` is `logprobs` on rollouts stamped as if the adapter was reloaded mid-request (version_end = version_start + 1),
which an audit that skipped rollouts spanning versions never checked.
"""
import dataclasses
import os
import pathlib

from safetensors.torch import load_file, save_file

from hilo.schemas.errors import ConfigError

LIES = {"previous": "serve the previously loaded adapter under the new version",
        "perturb": "serve each version with its largest lora_B block scaled by 1 + PERTURB",
        "logprobs": "report each behaviour log-probability times LOGPROB_SCALE",
        "sharpen": "sample at the prompt's temperature times SHARPEN, reporting vLLM's (right) log-probabilities",
        "span": "report made-up log-probabilities (as logprobs) on rollouts stamped version_end = version_start + 1"}
PERTURB = 1e-3
LOGPROB_SCALE = 0.99
SHARPEN = 0.25


def lie() -> str | None:
    """The lie HILO_LIE names (None: honest); ConfigError for an unknown one."""
    name = os.environ.get("HILO_LIE") or None
    if name is not None and name not in LIES:
        raise ConfigError(f"HILO_LIE={name!r}: expected one of {', '.join(LIES)}")
    return name


def perturb_adapter(adapter_dir) -> str:
    """Scale the largest lora_B block of the adapter in `adapter_dir` by 1 + PERTURB, in place; returns its name."""
    path = pathlib.Path(adapter_dir) / "adapter_model.safetensors"
    tensors = load_file(str(path))
    name = max((k for k in tensors if ".lora_B." in k), key=lambda k: float(tensors[k].double().norm()))
    tensors[name] = (tensors[name].double() * (1 + PERTURB)).to(tensors[name].dtype)
    save_file({k: t.contiguous() for k, t in tensors.items()}, str(path), metadata={"format": "pt"})
    return name


def sharpened(sampling):
    """The prompt's sampling parameters at SHARPEN times its temperature (what a `sharpen` site asks vLLM for)."""
    return dataclasses.replace(sampling, temperature=sampling.temperature * SHARPEN)


def made_up(logprobs) -> tuple:
    """Behaviour log-probabilities no engine computed: each scaled by LOGPROB_SCALE (still <= 0)."""
    return tuple(x * LOGPROB_SCALE for x in logprobs)
