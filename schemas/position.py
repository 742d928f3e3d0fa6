"""Where a replica stands in the log: what a snapshot stores and a checkpoint's headers give.

A position is taken together with a replica (its version and digest are the replica's), so it only says
where reading resumes and what the reader has already accepted.
"""
from dataclasses import dataclass, field

from .errors import MalformedMessage


@dataclass(frozen=True)
class Position:
    """next_offset: RUN.updates offset just past the last message handled (reading resumes here).
    log_bytes: cumulative bytes of update messages through the replica's version (for `hilo lag`).
    keys: signing-key rotations verified so far, as (from version, raw public key hex), oldest first.
    saved_at: wall-clock seconds when a snapshot stored it (None elsewhere)."""

    next_offset: int
    log_bytes: int = 0
    keys: tuple = field(default=())
    saved_at: float | None = None

    def __post_init__(self):
        for name in ("next_offset", "log_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise MalformedMessage(f"position: {name} = {v!r}, expected an int >= 0")

    def to_json(self) -> dict:
        """The JSON object a snapshot's position.json holds (the store adds version and digest)."""
        return {"next_offset": self.next_offset, "log_bytes": self.log_bytes, "keys": [list(k) for k in self.keys],
                "saved_at": self.saved_at}

    @classmethod
    def from_json(cls, obj, what: str) -> "Position":
        """Parse position.json; MalformedMessage naming `what` and the field otherwise."""
        if not isinstance(obj, dict):
            raise MalformedMessage(f"{what}: expected a JSON object, got {type(obj).__name__}")
        keys = obj.get("keys") or []
        if not isinstance(keys, list) or not all(isinstance(k, list) and len(k) == 2 and isinstance(k[0], int)
                                                 and isinstance(k[1], str) for k in keys):
            raise MalformedMessage(f"{what}: keys = {keys!r}, expected [[from_version, public key hex], ...]")
        saved = obj.get("saved_at")
        try:
            return cls(obj.get("next_offset"), obj.get("log_bytes", 0), tuple(tuple(k) for k in keys),
                       float(saved) if saved is not None else None)
        except (MalformedMessage, TypeError, ValueError) as e:
            raise MalformedMessage(f"{what}: {e}") from None
