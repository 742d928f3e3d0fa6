"""One run from a multi-rank trainer: in a torch.distributed job one rank publishes, and every rank holds the replica.

Under torchrun or `accelerate launch` the same user code constructs HiLoOptimizer (or calls HiLoProducer.open) on
every rank. Only ProducerConfig.publish_rank opens the log, so fencing still means "another trainer". The others
hold a PolicyReplica without a log, and the ranks talk over a gloo group of hilo's own (CPU tensors whatever the
job's backend, every collective bounded by rank_timeout_s):

- open: every rank gathers its refusals (a bad publish_rank, a model without LoRA, hyperparameters the run's
  optimizer lacks) and a fingerprint of its config and LoRA layout; any refusal or difference is raised, the same
  line on every rank, before the log is opened. The publishing rank then opens the run (genesis, its snapshot or
  the log head) and broadcasts the outcome and its replica's checkpoint bytes; the others start from them.
- step, propose then commit: the publishing rank encodes its gradients (DDP: already all-reduced) and broadcasts
  the encoded message at once (a "proposed" frame, before its own apply; its digest is not known yet). Every rank
  then computes the step from it, the others while the publishing rank applies and publishes as a lone trainer
  does. Then the publishing rank broadcasts the outcome frame: committed (the version and digest the others'
  computed state must have; the digest proves the bits), or an error's type and line, or how its replica moved
  otherwise (a checkpoint, as when a resync adopted an in-doubt version). The others adopt their computed state
  only on a commit, write the params into their model, and raise the publishing rank's error, if any, word for
  word. A step not published moves no rank; the apply of the other ranks is off the job's critical path.
- the encoder's error feedback is trainer-only state: it lives on the publishing rank (its snapshot, its
  state_dict), as the log writer does. Sending it each step would cost an fp32 adapter per step per rank.

A byte frame is broadcast as a length, then a uint8 tensor (docs/design.md, "One run from a multi-rank trainer").
"""
import builtins
import dataclasses
import datetime
import functools
import logging
import os
import re
import time

import msgpack
import torch
import torch.distributed as dist

from hilo.replica.optimizers import get_optimizer
from hilo.replica.replica import PolicyReplica
from hilo.schemas import errors
from hilo.schemas.errors import ConfigError, DivergenceError, TrainerError
from hilo.schemas.records import decode_record

from .lora_params import lora_weights

logger = logging.getLogger(__name__)
SLACK_S = 300.0  # rank_timeout_s's default beyond publish_deadline_s: a step's encode and apply, with room


def in_job() -> bool:
    """Whether this process is one rank of a torch.distributed job of more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The PEFT model inside DistributedDataParallel / DataParallel (their parameters are the model's)."""
    while isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        model = model.module
    return model


def _join_launch(config) -> None:
    """A launcher (torchrun, accelerate launch) started several ranks and nothing initialized torch.distributed: the
    same code on every rank would open the run as trainers of their own, each fencing the last. Initialize it from
    the launcher's environment (gloo; NCCL for CUDA tensors where there is a GPU), so that one rank publishes."""
    world = os.environ.get("WORLD_SIZE", "")
    if not (world.isdigit() and int(world) > 1) or not dist.is_available() or dist.is_initialized():
        return
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        raise ConfigError(f"WORLD_SIZE={world} (a multi-rank launch) without {', '.join(missing)}, and torch.distributed is not "
                          f"initialized: every rank would open the run as a trainer of its own and fence the others. Call "
                          f"torch.distributed.init_process_group() (or create the Accelerator) before the optimizer")
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    timeout = config.rank_timeout_s or config.publish_deadline_s + SLACK_S
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    if dist.get_rank() == config.publish_rank:
        logger.warning("run %s: this is rank %d of a %s-rank launch and torch.distributed was not initialized; hilo initialized "
                       "it (%s) so that this rank alone publishes and every rank holds its policy. Unless the model is "
                       "wrapped in DistributedDataParallel, each step is this rank's gradients alone", config.run,
                       dist.get_rank(), world, backend)


def refuse_sharded(model: torch.nn.Module, weights, job: bool) -> None:
    """LoRA parameters sharded in a way hilo cannot gather are refused: FSDP (1) flattens them into its own buffers,
    DeepSpeed ZeRO-3 partitions them behind its hooks. FSDP2's DTensor shards are gathered (LoraWeights), in a job
    of several ranks; a one-rank FSDP2 model holds everything anyway and is refused with the way out."""
    how = None
    if weights.sharded and not job:
        how = "sharded by FSDP2 (fully_shard) in a one-rank job, where nothing is gained by it"
    elif any(type(m).__name__ == "FullyShardedDataParallel" for m in model.modules()):
        how = "inside FSDP (FullyShardedDataParallel flattens and shards them)"
    elif any(hasattr(p, "ds_id") for p in weights.params):
        how = "partitioned by DeepSpeed ZeRO-3"
    if how:
        raise ConfigError(f"the LoRA parameters are {how}: not supported. Shard the model with FSDP2's fully_shard in a job "
                          f"of several ranks, or wrap it in DistributedDataParallel (a LoRA adapter is small: replicating it "
                          f"is what DDP does)")


def _error_of(e: BaseException) -> list:
    """[type name, its line, in_doubt]: what the other ranks need to raise the same error."""
    return [type(e).__name__, str(e), bool(getattr(e, "in_doubt", False))]


def _raise_as(error: list) -> None:
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


def _shown(value) -> str:
    """A config value as the fingerprint compares it."""
    return repr(sorted(value.items())) if isinstance(value, dict) else repr(value)


def fingerprint(config, manifest, extra: dict | None = None) -> dict:
    """{what: value} every rank of the job must share: each ProducerConfig field, the LoRA layout, and `extra`."""
    out = {f"ProducerConfig.{f.name}": _shown(getattr(config, f.name)) for f in dataclasses.fields(config)}
    out["LoRA layout"] = (f"({manifest.base_model}, LoRA rank {manifest.rank}, {len(manifest.blocks)} blocks, "
                          f"manifest {manifest.manifest_id.hex()[:12]})")
    return out | (extra or {})


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
        return TrainerError(f"run {self.run}: rank {self.rank} of {self.world}, {what}: {who} stopped or did not answer within "
                            f"rank_timeout_s = {self.timeout_s:g}s ({type(e).__name__}: {cause}); the job stops here: restart "
                            f"it (every rank resumes from the log)")

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
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if self.publishes else torch.empty(int(n), dtype=torch.uint8)
            dist.broadcast(buf, self.publish_rank, group=self.group)
        except Exception as e:  # noqa: BLE001
            raise self._lost(what, e) from e
        return data if self.publishes else buf.numpy().tobytes()


def _pack(frame: dict) -> bytes:
    return msgpack.packb(frame, use_bin_type=True)


def _unpack(data: bytes) -> dict:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _refuse(gathered: list, ranks: Ranks) -> None:
    """Raise, the same line on every rank, the first refusal a rank made or the first way a rank differs from the
    publishing one; nothing has touched the log yet."""
    for rank, (refusal, _) in enumerate(gathered):
        if refusal is not None:
            _raise_as([refusal[0], f"rank {rank} of {ranks.world}: {refusal[1]}", refusal[2]])
    p = int(gathered[0][1]["ProducerConfig.publish_rank"])  # rank 0's word, so that every rank names the same one
    ours = gathered[p][1]
    for rank, (_, theirs) in enumerate(gathered):
        for what in ours:
            if theirs.get(what) != ours[what]:
                raise ConfigError(f"torch.distributed job: rank {rank}'s {what} is {theirs.get(what)}, the publishing rank "
                                  f"{p}'s is {ours[what]}; every rank must open the run with the same config and LoRA "
                                  f"layout (nothing was published)")


def open_producer(open_here, model, config, log_backend=None, metrics=None, check=None):
    """`open_here(model, config, log_backend, metrics)` (HiLoProducer's own open) outside a torch.distributed job;
    in one, a RankProducer on every rank, the log opened by the publishing rank only. `check()`: the caller's
    refusals, run on every rank before anything else; it returns more {what: value} every rank must share."""
    model = unwrap(model)
    _join_launch(config)
    if not in_job():
        refuse_sharded(model, lora_weights(model, config.adapter)[1], job=False)
        if check is not None:
            check()
        return open_here(model, config, log_backend, metrics)
    timeout = config.rank_timeout_s or config.publish_deadline_s + SLACK_S
    ranks = Ranks(config.run, config.publish_rank, timeout)
    refusal, fp, manifest, weights = None, None, None, None
    try:
        manifest, weights = lora_weights(model, config.adapter)
        refuse_sharded(model, weights, job=True)
        extra = check() if check is not None else None
        if config.publish_rank >= ranks.world:
            raise ConfigError(f"ProducerConfig.publish_rank = {config.publish_rank}: this job's ranks are 0..{ranks.world - 1}")
        if config.pipeline:
            raise ConfigError("ProducerConfig.pipeline: a torch.distributed job publishes in line (each rank applies the version "
                              "once the publishing rank has committed it); pipelining across ranks is not built yet")
        if config.mode != "gradient":
            raise ConfigError(f"ProducerConfig.mode = {config.mode!r}: a torch.distributed job runs mode 'gradient' only (delta "
                              f"mode's master copy, which the model trains on, is not replicated across ranks yet)")
        fp = fingerprint(config, manifest, (extra or {}) | {"LoRA sharding": "FSDP2" if weights.sharded else "none"})
    except Exception as e:  # noqa: BLE001  (every rank must hear of it, or the others wait for this one)
        refusal = _error_of(e)
    _refuse(ranks.gather((refusal, fp), "comparing the ranks' configs"), ranks)
    weights.gather(grads=False)  # FSDP2: every rank all-gathers the params (the publishing rank's genesis reads them)
    if ranks.publishes:
        try:
            inner = open_here(model, config, log_backend, metrics, lora=(manifest, weights))
        except BaseException as e:
            ranks.share(_pack({"error": _error_of(e)}), "opening the run")
            raise
        r = inner.replica
        try:
            ranks.share(_pack({"error": None, "checkpoint": r.checkpoint().to_bytes(), "recent": list(r.recent.items())}),
                        "opening the run (sending the start state)")
        except BaseException:
            inner.close(flush=False)
            raise
        return RankProducer(ranks, model, config, inner.manifest, weights, inner)  # the run's (its digest version)
    frame = _unpack(ranks.share(None, "opening the run"))
    if frame["error"] is not None:
        _raise_as(frame["error"])
    where = f"rank {ranks.rank}: the start state of the publishing rank {ranks.publish_rank}"
    replica = PolicyReplica.from_checkpoint(decode_record(frame["checkpoint"], where), where)
    _remember(replica, [(int(v), bytes(d)) for v, d in frame["recent"]])
    producer = RankProducer(ranks, model, config, replica.manifest, weights, None, replica)
    producer.write_back()
    return producer


def _remember(replica: PolicyReplica, recent: list) -> None:
    """Set the (version, digest) pairs `replica` remembers (oldest first; the fork check of a resume reads them)."""
    replica.recent.clear()
    replica.recent.update((v, d) for v, d in recent if v <= replica.version)
    replica.recent[replica.version] = replica.digest


def open_on_one_rank(open_here):
    """HiLoProducer.open's decorator: in a torch.distributed job, the log is opened by one rank (open_producer).
    `check`: a callable run on every rank before anything else (HiLoOptimizer's refusals)."""
    @functools.wraps(open_here)
    def open(cls, model, config, log_backend=None, metrics=None, check=None):
        return open_producer(functools.partial(open_here, cls), model, config, log_backend, metrics, check)
    return classmethod(open)


class _Remembers:
    """The publishing rank's Publisher, remembering the message of the last publish that returned (the one the
    other ranks apply); everything else is the Publisher's."""

    def __init__(self, publisher):
        self.publisher, self.message = publisher, None

    def __getattr__(self, name):
        return getattr(self.publisher, name)

    def publish(self, msg, *args, **kwargs):
        published = self.publisher.publish(msg, *args, **kwargs)
        self.message = msg
        return published


class RankProducer:
    """HiLoProducer's interface on every rank of a torch.distributed job. On the publishing rank it wraps the
    HiLoProducer that writes the run; on the others it holds a replica without a log that applies what that one
    publishes. Every call that can move the replica (step, rotate_key, resync) is a collective: call it on every rank."""

    def __init__(self, ranks: Ranks, model, config, manifest, weights, inner=None, replica=None):
        self.ranks, self.model, self.config, self.manifest, self.weights = ranks, model, config, manifest, weights
        self.params = weights.params
        self.inner, self._replica = inner, replica
        self.rule = get_optimizer(config.optimizer)
        self.master = None  # gradient mode only
        self._last_step, self._fenced = {}, False
        self.follow_s = 0.0  # a non-publishing rank's last step: the broadcast message's decode, apply and write-back
        if inner is not None:
            inner.publisher = _Remembers(inner.publisher)
            inner.builder.on_encoded = self._propose
        self._proposed = None  # the publishing rank: the version whose message it sent before the apply

    def _propose(self, msg) -> None:
        """The publishing rank: send `msg` to the other ranks as soon as it is encoded (they compute its step meanwhile)."""
        self.ranks.share(_pack({"proposed": msg.to_bytes()}), f"step (sending v{msg.version}'s message before its apply)")
        self._proposed = msg.version

    def __getattr__(self, name):
        inner = self.__dict__.get("inner")
        if inner is not None:
            return getattr(inner, name)
        raise AttributeError(f"HiLoProducer.{name}: rank {self.ranks.rank} does not publish (the publishing rank is "
                             f"{self.ranks.publish_rank}); only that rank's producer has it")

    @property
    def publishes(self) -> bool:
        """Whether this rank writes the run."""
        return self.inner is not None

    @property
    def replica(self) -> PolicyReplica:
        """This rank's replica (the publishing rank's: its trainer's)."""
        return self.inner.replica if self.inner is not None else self._replica

    @property
    def version(self) -> int:
        """Last published (committed) version, the same on every rank."""
        return self.replica.version

    @property
    def builder(self):
        """The publishing rank's UpdateBuilder (encoder and error feedback); None on the others."""
        return self.inner.builder if self.inner is not None else None

    @property
    def last_step(self) -> dict:
        """The publishing rank's account of the last step (version, bytes, chunks, seconds), on every rank."""
        return self.inner.last_step if self.inner is not None else self._last_step

    @property
    def fenced(self) -> bool:
        """Whether another trainer took the run over."""
        return self.inner.fenced if self.inner is not None else self._fenced

    def write_back(self) -> None:
        """Copy the replica's fp32 params into this rank's model (its dtype)."""
        if self.inner is not None:
            return self.inner.write_back()
        self.weights.write(self._replica.state.params)

    def step(self, meta: dict | None = None, zero_grad: bool = True, **hparams) -> int:
        """HiLoProducer.step on the publishing rank (its gradients, its hyperparameters); every rank then holds the
        version it published, or raises its error unchanged. Returns the version. FSDP2: every rank first
        all-gathers the gradients (the publishing rank encodes them whole)."""
        self.weights.gather(grads=True)
        self._together("step", lambda: self.inner.step(meta, zero_grad, **hparams))
        if zero_grad and self.inner is None:
            self.weights.zero_grad()
        return self.version

    def flush(self, lag: float | None = None, max_messages: int | None = None) -> int:
        """Gradient mode sends nothing (every rank's replica is the sites')."""
        return 0

    def lag(self) -> float:
        """Gradient mode: the sites do not trail."""
        return 0.0

    def resync(self) -> None:
        """Settle an in-doubt publish (HiLoProducer.resync) on the publishing rank; every rank follows."""
        self._together("resync", lambda: self.inner.resync())

    def rotate_key(self, new_key_path: str) -> None:
        """HiLoProducer.rotate_key on the publishing rank (the key is read there only); every rank hears the outcome."""
        self._together("rotate_key", lambda: self.inner.rotate_key(new_key_path))

    def save_snapshot(self) -> None:
        """The publishing rank's trainer snapshot (the others keep none)."""
        if self.inner is not None:
            self.inner.save_snapshot()

    def close(self, flush: bool = True) -> None:
        """The publishing rank saves its snapshot and releases the log; the others hold nothing to release."""
        if self.inner is not None:
            self.inner.close(flush)

    def _together(self, what: str, fn) -> None:
        """Run `fn` on the publishing rank, then bring every rank to its replica and raise its error everywhere."""
        if self.inner is None:
            frame, proposal = _unpack(self.ranks.share(None, what)), None
            while "proposed" in frame:  # compute its step while the publishing rank applies and publishes; adopt on commit
                proposal = self._compute(frame["proposed"], what)
                frame = _unpack(self.ranks.share(None, what))
            return self._follow(frame, what, proposal)
        inner = self.inner
        before = (inner.version, inner.replica.digest)
        inner.publisher.message, self._proposed = None, None
        error = None
        try:
            fn()
        except BaseException as e:  # noqa: BLE001  (the other ranks raise it too, after the frame)
            error = e
        frame = self._frame(before, error)
        try:
            self.ranks.share(_pack(frame), f"{what} (sending v{frame['version']} to the ranks)")
        except TrainerError as lost:
            raise lost from error
        if error is not None:
            raise error

    def _frame(self, before: tuple, error) -> dict:
        """What the other ranks need: the outcome, and the message (or a checkpoint) that moved the replica."""
        inner, r = self.inner, self.inner.replica
        frame = {"version": r.version, "digest": r.digest, "fenced": inner.fenced, "last_step": dict(inner.last_step),
                 "error": None if error is None else _error_of(error)}
        if (r.version, r.digest) != before:
            msg = inner.publisher.message
            if (msg is not None and msg.version == before[0] + 1 == r.version and msg.parent_digest == before[1]
                    and msg.digest == r.digest):
                if self._proposed == msg.version:
                    frame["commit"] = True  # the others computed it from the proposed frame
                else:
                    frame["message"] = msg.to_bytes()
            else:  # the replica moved some other way (a resync adopted a version): send the whole state
                frame["checkpoint"] = r.checkpoint().to_bytes()
        return frame

    def _compute(self, data: bytes, what: str):
        """A non-publishing rank: (message, the state it leads to) from the proposed frame's message, or the error
        computing it raised (raised after the outcome frame, so that the ranks' collectives stay in step)."""
        t0 = time.perf_counter()
        where = f"rank {self.ranks.rank}: {what}, the message proposed by the publishing rank {self.ranks.publish_rank}"
        try:
            msg = self._replica.decode(data, where)
            self._replica.classify(msg, where)
            return msg, self._replica.compute(msg, where), time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001
            return e

    def _follow(self, frame: dict, what: str, proposal=None) -> None:
        """Move this rank's replica as the publishing rank's moved (adopting `proposal`, what _compute made, on a
        commit), then raise its error (if any)."""
        where = f"rank {self.ranks.rank}: {what} v{frame['version']} from the publishing rank {self.ranks.publish_rank}"
        t0 = time.perf_counter()
        if frame.get("commit"):
            if isinstance(proposal, Exception):
                raise proposal
            msg, state, computed_s = proposal
            t0, digest = t0 - computed_s, state.digest()
            if (msg.version, digest) != (frame["version"], bytes(frame["digest"])):
                raise DivergenceError(f"{where}: this rank computed v{msg.version} ({digest.hex()[:12]}), the publishing rank "
                                      f"committed v{frame['version']} ({bytes(frame['digest']).hex()[:12]})")
            self._replica.commit(state, digest)
        elif "message" in frame:
            self._replica.apply(self._replica.decode(frame["message"], where), where)
        elif "checkpoint" in frame:
            older = [(v, d) for v, d in self._replica.recent.items()]
            self._replica = PolicyReplica.from_checkpoint(decode_record(frame["checkpoint"], where), where)
            _remember(self._replica, older + list(self._replica.recent.items()))
        if (self._replica.version, self._replica.digest) != (frame["version"], bytes(frame["digest"])):
            raise DivergenceError(f"{where}: this rank holds v{self._replica.version} ({self._replica.digest.hex()[:12]}), the "
                                  f"publishing rank v{frame['version']} ({bytes(frame['digest']).hex()[:12]})")
        if frame.get("commit") or "message" in frame or "checkpoint" in frame:
            self.write_back()
        self.follow_s = time.perf_counter() - t0
        self._last_step, self._fenced = frame["last_step"], frame["fenced"]
        if frame["error"] is not None:
            _raise_as(frame["error"])
