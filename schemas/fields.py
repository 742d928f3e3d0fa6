"""Typed reads from an unpacked msgpack map; each failure names the record and field."""
import math

from .errors import LimitExceeded, MalformedMessage
from .limits import DEFAULT_LIMITS


def req(d: dict, key: str, what: str):
    """The value at `key`, or MalformedMessage naming the missing field."""
    if not isinstance(d, dict):
        raise MalformedMessage(f"{what}: expected a map, got {type(d).__name__}")
    if key not in d:
        raise MalformedMessage(f"{what}: missing field '{key}'")
    return d[key]


def get_int(d: dict, key: str, what: str, lo: int = 0, hi: int = (1 << 63) - 1) -> int:
    """An int field within [lo, hi]."""
    v = req(d, key, what)
    if not isinstance(v, int) or isinstance(v, bool):
        raise MalformedMessage(f"{what}: field '{key}' is {type(v).__name__}, expected int")
    if not lo <= v <= hi:
        raise MalformedMessage(f"{what}: field '{key}' = {v} is outside [{lo}, {hi}]")
    return v


def get_float(d: dict, key: str, what: str) -> float:
    """A finite float field (ints accepted)."""
    v = req(d, key, what)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise MalformedMessage(f"{what}: field '{key}' is {type(v).__name__}, expected float")
    if not math.isfinite(v):
        raise MalformedMessage(f"{what}: field '{key}' = {v} is not finite")
    return float(v)


def get_str(d: dict, key: str, what: str, max_len: int = DEFAULT_LIMITS.max_name_bytes) -> str:
    """A non-empty str field of at most `max_len` bytes."""
    v = req(d, key, what)
    if not isinstance(v, str):
        raise MalformedMessage(f"{what}: field '{key}' is {type(v).__name__}, expected str")
    if not v or len(v.encode()) > max_len:
        raise MalformedMessage(f"{what}: field '{key}' must be 1..{max_len} bytes, got {len(v.encode())}")
    return v


def get_bytes(d: dict, key: str, what: str, length: int | None = None) -> bytes:
    """A bin field, optionally of an exact length."""
    v = req(d, key, what)
    if not isinstance(v, (bytes, bytearray)):
        raise MalformedMessage(f"{what}: field '{key}' is {type(v).__name__}, expected bin")
    if length is not None and len(v) != length:
        raise MalformedMessage(f"{what}: field '{key}' is {len(v)} bytes, expected {length}")
    return bytes(v)


def get_list(d: dict, key: str, what: str, max_len: int) -> list:
    """An array field of at most `max_len` items."""
    v = req(d, key, what)
    if not isinstance(v, list):
        raise MalformedMessage(f"{what}: field '{key}' is {type(v).__name__}, expected array")
    if len(v) > max_len:
        raise LimitExceeded(f"{what}: field '{key}' has {len(v)} items > limit {max_len}")
    return v


def get_scalar_map(d: dict, key: str, what: str, max_len: int) -> dict:
    """A map of str -> int/float/str (codec parameters, optimizer hyperparameters)."""
    v = req(d, key, what)
    if not isinstance(v, dict):
        raise MalformedMessage(f"{what}: field '{key}' is {type(v).__name__}, expected map")
    if len(v) > max_len:
        raise LimitExceeded(f"{what}: field '{key}' has {len(v)} entries > limit {max_len}")
    for k, x in v.items():
        if not isinstance(x, (int, float, str)) or isinstance(x, bool):
            raise MalformedMessage(f"{what}: {key}['{k}'] is {type(x).__name__}, expected int, float or str")
        if isinstance(x, float) and not math.isfinite(x):
            raise MalformedMessage(f"{what}: {key}['{k}'] = {x} is not finite")
    return dict(v)
