"""Fused CPU apply kernels: decode, optimizer step and NaN/Inf check in one pass per block, bit-identical to the torch
path (replica/optimizers, replica/codecs), which stays the specification.

The table below says which optimizer has a kernel (one module per step: sgd.py, adamw.py, lion.py, add.py) and which
codecs the kernel decodes itself (lowrank.py for powersgd/spar/spar4, the message's bytes for dense); any other codec
(topk) is decoded by its reference decode and then stepped by the kernel.

Muon has no kernel: its Newton-Schulz iteration is matrix products over a whole block (from arithmetic version 3
summed in a fixed pairwise order, replica/optimizers/muon.py), not an elementwise pass. It stays on the reference path.

Compiled by numba (pip-installed with the project, no build step) the first time a process needs it, and cached
on disk. If numba is missing or fails, `unavailable()` says why, a replica says so once and runs the reference
path, which computes the same bits.
"""
import logging

from hilo.schemas.errors import ConfigError

logger = logging.getLogger(__name__)

MODES = ("kernel", "reference", "kernel-only")  # PolicyReplica.apply_mode, `hilo consume --apply`
STEPS = ("sgd", "adamw", "lion", "add")          # optimizers with a fused step
DECODES = ("dense", "powersgd", "spar", "spar4")  # codecs whose decode is fused (others decode first, then the kernel)
WHY_NOT = {"muon": "Muon's Newton-Schulz iteration is matrix products over a whole block, not an elementwise pass"}

_modules, _error, _said = None, None, set()


def modules() -> dict | None:
    """{optimizer name: kernel module} once numba and the kernels import, else None (unavailable() says why)."""
    global _modules, _error
    if _modules is None and _error is None:
        try:
            from . import adamw, add, fused, lion, sgd  # noqa: F401  (fused: the kernel itself must import too)
            _modules = {"sgd": sgd, "adamw": adamw, "lion": lion, "add": add}
        except Exception as e:  # numba missing or broken: the reference path computes the same bits
            _error = f"{type(e).__name__}: {e}"
    return _modules


def unavailable(optimizer: str) -> str | None:
    """Why `optimizer` has no fused kernel in this process (None: it has one)."""
    if optimizer not in STEPS:
        return WHY_NOT.get(optimizer, f"no fused kernel for optimizer {optimizer!r}")
    if modules() is None:
        return f"the kernels did not load ({_error})"
    return None


def say_once(optimizer: str, reason: str) -> None:
    """Log, once per process and optimizer, that the reference path runs instead of a kernel, and why."""
    if optimizer not in _said:
        _said.add(optimizer)
        (logger.info if optimizer in WHY_NOT else logger.warning)("apply: %s runs on the reference path: %s", optimizer,
                                                                  reason)


def encoder_check(codec: str):
    """The fused decode + residual of an encoder of `codec` (kernels/apply.self_check), or None where its decode is not
    fused or the kernels did not load: the encoder's reference decode runs then, with the same bits."""
    if codec not in DECODES or codec == "dense" or modules() is None:
        return None
    from .apply import self_check
    return self_check


def pick(mode: str, optimizer: str):
    """The kernel module that runs `optimizer`'s step under apply mode `mode` (MODES), or None for the reference path;
    ConfigError in kernel-only mode where there is none."""
    if mode == "reference":
        return None
    why = unavailable(optimizer)
    if why is None:
        return modules()[optimizer]
    if mode == "kernel-only":
        raise ConfigError(f"apply = kernel-only: {optimizer} has no fused kernel here ({why})")
    say_once(optimizer, why)
    return None
