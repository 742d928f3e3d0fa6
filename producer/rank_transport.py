"""The ranks' transport: a gloo group of hilo's own (CPU tensors whatever the job's backend, every collective bounded
by rank_timeout_s), byte frames broadcast from the publishing rank (a length, then a uint8 tensor; msgpack inside),
and errors carried across ranks by type name and line so that every rank raises the same one.
"""
import builtins
import datetime
import re

import msgpack
import torch
import torch.distributed as dist

from hilo.schemas import errors
from hilo.schemas.errors import TrainerError


def error_of(e: BaseException) -> list:
    """[type name, its line, in_doubt]: what the other ranks need to raise the same error."""
    return [type(e).__name__, str(e), bool(getattr(e, "in_doubt", False))]


def raise_as(error: list) -> None:
    """Raise the error another rank raised: the same hilo or builtin type with the same line (else a TrainerError)."""
    name, text, in_doubt = error
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.NotPublished):
        raise cls(text, in_doubt=in_doubt)
    if isinstance(cls, type) and issubclass(cls, errors.HiloError):
        raise cls(text)
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        raise cls(text)
    raise TrainerError(f"{name}: {text}")


class Ranks:
    """This rank, the world, the publishing rank, and a gloo group of hilo's own whose collectives time out after
    `timeout_s` (a dead or stuck rank stops the job with one line)."""

    def __init__(self, run: str, publish_rank: int, timeout_s: float):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.run, self.publish_rank, self.timeout_s = run, publish_rank, timeout_s
        self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))

    @property
    def publishes(self) -> bool:
        """Whether this rank is the one that publishes."""
        return self.rank == self.publish_rank

    def _lost(self, what: str, e: BaseException) -> TrainerError:
        """The one line a failed collective becomes: gloo says a peer closed its connection, or the timeout passed."""
        cause = re.sub(r"^\[[^\]]*\]\s*", "", (str(e).strip().splitlines() or [""])[0]).split(". ")[0][:200]
        who = "a rank" if self.publishes else f"the publishing rank {self.publish_rank}"
        return TrainerError(f"run {self.run}: rank {self.rank} of {self.world}, {what}: {who} stopped or did not "
                            f"answer within rank_timeout_s = {self.timeout_s:g}s ({type(e).__name__}: {cause}); the "
                            f"job stops here: restart it (every rank resumes from the log)")

    def gather(self, obj, what: str) -> list:
        """Every rank's `obj` (picklable), in rank order."""
        out = [None] * self.world
        try:
            dist.all_gather_object(out, obj, group=self.group)
        except Exception as e:  # noqa: BLE001  (gloo raises RuntimeError subclasses for a peer gone or a timeout)
            raise self._lost(what, e) from e
        return out

    def share(self, data: bytes | None, what: str) -> bytes:
        """The publishing rank's `data` on every rank: its length, then its bytes, broadcast as uint8 tensors."""
        try:
            n = torch.tensor([len(data) if self.publishes else 0], dtype=torch.int64)
            dist.broadcast(n, self.publish_rank, group=self.group)
            buf = torch.frombuffer(bytearray(data),
                                   dtype=torch.uint8) if self.publishes else torch.empty(int(n), dtype=torch.uint8)
            dist.broadcast(buf, self.publish_rank, group=self.group)
        except Exception as e:  # noqa: BLE001
            raise self._lost(what, e) from e
        return data if self.publishes else buf.numpy().tobytes()


def outcome_frame(inner, before: tuple, error, proposed) -> dict:
    """The publishing rank's outcome frame, what the other ranks need after a call: the outcome (version, digest,
    error) and how its replica moved from `before` (version, digest): by the message `proposed` to every rank before
    the apply ("commit": adopt what you computed), by another one-step message, or some other way (a checkpoint).
    `inner`: the publishing rank's HiLoProducer, after the call."""
    r = inner.replica
    frame = {"version": r.version, "digest": r.digest, "fenced": inner.fenced, "last_step": dict(inner.last_step),
             "error": None if error is None else error_of(error)}
    if (r.version, r.digest) != before:
        sent = inner.publisher.last_message

        def one_step(msg) -> bool:
            return (msg is not None and msg.version == before[0] + 1 == r.version
                    and msg.parent_digest == before[1] and msg.digest == r.digest)
        if one_step(proposed):
            frame["commit"] = True  # the others computed it from the proposed frame (pipelined: adopt it)
        elif one_step(sent):
            frame["message"] = sent.to_bytes()
        else:  # the replica moved some other way (a resync adopted a version; pipelined: a version in flight was not
            # published and the rank went back): send the whole state
            frame["checkpoint"] = r.checkpoint().to_bytes()
    return frame


def pack(frame: dict) -> bytes:
    """A frame's bytes."""
    return msgpack.packb(frame, use_bin_type=True)


def unpack(data: bytes) -> dict:
    """A frame from its bytes."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)
