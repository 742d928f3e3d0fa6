"""The NaN/Inf check of a new state: a state with one is never adopted, whatever its digest, and both apply paths
refuse it in the same words, in the same order (every decoded gradient, then the params, then each slot)."""
import math

import numpy as np
import torch

from hilo.schemas.errors import NonFinite
from hilo.schemas.records import Manifest, UpdateMessage


def all_finite(t: torch.Tensor) -> bool:
    """No NaN/Inf in `t`: its min and max in one pass (a NaN propagates into both), no tensor-sized temporary; 6x
    faster than isfinite(t).all() on the 1.7B adapter, where the check of a new state took longer than the step."""
    if not t.numel():
        return True
    lo, hi = torch.aminmax(t.reshape(-1))
    return math.isfinite(lo.item()) and math.isfinite(hi.item())


def check(kind: str, tensors: list, manifest: Manifest, msg: UpdateMessage, what: str) -> None:
    """NonFinite naming the first block of `tensors` with a NaN/Inf."""
    for b, t in zip(manifest.blocks, tensors):
        if not all_finite(t):
            raise refusal(kind, b.key, msg, what)


def check_flags(bits: np.ndarray, slots: tuple, manifest: Manifest, msg: UpdateMessage, what: str) -> None:
    """The same refusal from a kernel's NaN/Inf bits per block (1: gradient, 2: params, 4 << j: slot j)."""
    kinds = [(1, "decoded gradient"), (2, "params")] + [(4 << j, f"optimizer state '{n}'") for j, n in enumerate(slots)]
    for bit, kind in kinds:
        bad = np.flatnonzero(bits & bit)
        if len(bad):
            raise refusal(kind, manifest.blocks[bad[0]].key, msg, what)


def refusal(kind: str, key: str, msg: UpdateMessage, what: str) -> NonFinite:
    """The one refusal of a NaN/Inf, whichever path found it."""
    return NonFinite(f"{what}: version {msg.version} would leave NaN/Inf in the {kind} of '{key}'; refused "
                     f"(the replica stays at v{msg.version - 1})")
