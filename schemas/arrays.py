"""Tensors on the wire: raw little-endian bytes whose dtype and shape the schema declares (never the sender)."""
import math

import numpy as np
import torch

from .errors import LimitExceeded, MalformedMessage
from .limits import DEFAULT_LIMITS, Limits

# wire dtype name -> (numpy dtype, bytes per element)
DTYPES = {
    "float32": (np.dtype("<f4"), 4),
    "float16": (np.dtype("<f2"), 2),
    "uint32": (np.dtype("<u4"), 4),
    "uint8": (np.dtype("u1"), 1),
    "float64": (np.dtype("<f8"), 8),
}


def nbytes(dtype: str, shape) -> int:
    """Byte length of an array of `dtype` and `shape` on the wire."""
    return DTYPES[dtype][1] * math.prod(shape)


def to_bytes(t: torch.Tensor, dtype: str) -> bytes:
    """Serialise a CPU tensor as raw little-endian `dtype` bytes (C order)."""
    return t.detach().to("cpu").contiguous().numpy().astype(DTYPES[dtype][0], copy=False).tobytes()


def from_bytes(buf, dtype: str, shape, what: str, limits: Limits = DEFAULT_LIMITS, finite: bool = True) -> torch.Tensor:
    """Parse `buf` as `dtype` of `shape` into a new fp32/int64-able tensor; length and finiteness checked first."""
    arr = view_bytes(buf, dtype, shape, what, limits, finite)
    if dtype in ("uint32", "uint8"):
        return torch.from_numpy(arr.astype(np.int64))
    if dtype == "float64":
        return torch.from_numpy(arr.copy())
    return torch.from_numpy(arr.astype(np.float32))  # float16 -> float32 is exact


def view_bytes(buf, dtype: str, shape, what: str, limits: Limits = DEFAULT_LIMITS, finite: bool = True) -> np.ndarray:
    """`buf` as a read-only numpy array of `dtype` and `shape`, no copy; the checks of from_bytes, in its order."""
    if not isinstance(buf, (bytes, bytearray)):
        raise MalformedMessage(f"{what}: expected bin, got {type(buf).__name__}")
    count = math.prod(shape)
    if count > limits.max_block_elements:
        raise LimitExceeded(f"{what}: {count} elements > limit {limits.max_block_elements}")
    want = DTYPES[dtype][1] * count
    if len(buf) != want:
        raise MalformedMessage(f"{what}: {len(buf)} bytes, expected {want} for {dtype}{list(shape)}")
    arr = np.frombuffer(buf, dtype=DTYPES[dtype][0]).reshape(shape)
    if finite and arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise MalformedMessage(f"{what}: contains NaN or Inf")
    return arr
