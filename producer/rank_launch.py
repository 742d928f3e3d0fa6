"""Opening a trainer in a torch.distributed job: join the launch, compare the ranks, open the log on one rank.

Under torchrun or `accelerate launch` the same user code constructs HiLoOptimizer (or calls HiLoProducer.open) on
every rank. Only ProducerConfig.publish_rank opens the log, so fencing still means "another trainer". Every rank
gathers its refusals (a bad publish_rank, a model without LoRA, hyperparameters the run's optimizer lacks) and a
fingerprint of its config and LoRA layout; any refusal or difference is raised, the same line on every rank, before
the log is opened. The publishing rank then opens the run (genesis, its snapshot or the log head) and broadcasts the
outcome and its replica's checkpoint bytes; the others start from them (rank_trainer.py).
"""
import dataclasses
import datetime
import logging
import os

import torch
import torch.distributed as dist

from hilo.replica.replica import PolicyReplica
from hilo.schemas.errors import ConfigError
from hilo.schemas.records import decode_record

from .lora_params import lora_weights
from .rank_trainer import RankProducer, remember
from .rank_transport import Ranks, error_of, pack, raise_as, unpack

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


def join_launch(config) -> None:
    """A launcher (torchrun, accelerate launch) started several ranks and nothing initialized torch.distributed: the
    same code on every rank would open the run as trainers of their own, each fencing the last. Initialize it from
    the launcher's environment (gloo; NCCL for CUDA tensors where there is a GPU), so that one rank publishes."""
    world = os.environ.get("WORLD_SIZE", "")
    if not (world.isdigit() and int(world) > 1) or not dist.is_available() or dist.is_initialized():
        return
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        raise ConfigError(f"WORLD_SIZE={world} (a multi-rank launch) without {', '.join(missing)}, and "
                          f"torch.distributed is not initialized: every rank would open the run as a trainer of its "
                          f"own and fence the others. Call torch.distributed.init_process_group() (or create the "
                          f"Accelerator) before the optimizer")
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    timeout = config.rank_timeout_s or config.publish_deadline_s + SLACK_S
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    if dist.get_rank() == config.publish_rank:
        logger.warning("run %s: this is rank %d of a %s-rank launch and torch.distributed was not initialized; hilo "
                       "initialized it (%s) so that this rank alone publishes and every rank holds its policy. Unless "
                       "the model is wrapped in DistributedDataParallel, each step is this rank's gradients alone",
                       config.run, dist.get_rank(), world, backend)


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
        raise ConfigError(f"the LoRA parameters are {how}: not supported. Shard the model with FSDP2's fully_shard in "
                          f"a job of several ranks, or wrap it in DistributedDataParallel (a LoRA adapter is small: "
                          f"replicating it is what DDP does)")


def _shown(value) -> str:
    """A config value as the fingerprint compares it."""
    return repr(sorted(value.items())) if isinstance(value, dict) else repr(value)


def fingerprint(config, manifest, extra: dict | None = None) -> dict:
    """{what: value} every rank of the job must share: each ProducerConfig field, the LoRA layout, and `extra`."""
    out = {f"ProducerConfig.{f.name}": _shown(getattr(config, f.name)) for f in dataclasses.fields(config)}
    out["LoRA layout"] = (f"({manifest.base_model}, LoRA rank {manifest.rank}, {len(manifest.blocks)} blocks, "
                          f"manifest {manifest.manifest_id.hex()[:12]})")
    return out | (extra or {})


def refuse_differences(gathered: list, ranks: Ranks) -> None:
    """Raise, the same line on every rank, the first refusal a rank made or the first way a rank differs from the
    publishing one; nothing has touched the log yet."""
    for rank, (refusal, _) in enumerate(gathered):
        if refusal is not None:
            raise_as([refusal[0], f"rank {rank} of {ranks.world}: {refusal[1]}", refusal[2]])
    p = int(gathered[0][1]["ProducerConfig.publish_rank"])  # rank 0's word, so that every rank names the same one
    ours = gathered[p][1]
    for rank, (_, theirs) in enumerate(gathered):
        for what in ours:
            if theirs.get(what) != ours[what]:
                raise ConfigError(f"torch.distributed job: rank {rank}'s {what} is {theirs.get(what)}, the publishing "
                                  f"rank {p}'s is {ours[what]}; every rank must open the run with the same config and "
                                  f"LoRA layout (nothing was published)")


def open_trainer(open_here, model, config, log_backend=None, metrics=None, check=None):
    """`open_here(model, config, log_backend, metrics)` (HiLoProducer's own open) outside a torch.distributed job;
    in one, a RankProducer on every rank, the log opened by the publishing rank only. `check()`: the caller's
    refusals, run on every rank before anything else; it returns more {what: value} every rank must share."""
    model = unwrap(model)
    join_launch(config)
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
            raise ConfigError(f"ProducerConfig.publish_rank = {config.publish_rank}: this job's ranks are "
                              f"0..{ranks.world - 1}")
        if config.mode != "gradient":
            raise ConfigError(f"ProducerConfig.mode = {config.mode!r}: a torch.distributed job runs mode 'gradient' "
                              f"only (delta mode's master copy, which the model trains on, is not replicated across "
                              f"ranks yet)")
        fp = fingerprint(config, manifest, (extra or {}) | {"LoRA sharding": "FSDP2" if weights.sharded else "none"})
    except Exception as e:  # noqa: BLE001  (every rank must hear of it, or the others wait for this one)
        refusal = error_of(e)
    refuse_differences(ranks.gather((refusal, fp), "comparing the ranks' configs"), ranks)
    weights.gather(grads=False)  # FSDP2: every rank all-gathers the params (the publishing rank's genesis reads them)
    if ranks.publishes:
        try:
            inner = open_here(model, config, log_backend, metrics, lora=(manifest, weights))
        except BaseException as e:
            ranks.share(pack({"error": error_of(e)}), "opening the run")
            raise
        r = inner.replica
        try:
            ranks.share(pack({"error": None, "checkpoint": r.checkpoint().to_bytes(),
                              "recent": list(r.recent.items())}),
                        "opening the run (sending the start state)")
        except BaseException:
            inner.close(flush=False)
            raise
        return RankProducer(ranks, model, config, inner.manifest, weights, inner)  # the run's (its digest version)
    frame = unpack(ranks.share(None, "opening the run"))
    if frame["error"] is not None:
        raise_as(frame["error"])
    where = f"rank {ranks.rank}: the start state of the publishing rank {ranks.publish_rank}"
    replica = PolicyReplica.from_checkpoint(decode_record(frame["checkpoint"], where), where)
    remember(replica, [(int(v), bytes(d)) for v, d in frame["recent"]])
    producer = RankProducer(ranks, model, config, replica.manifest, weights, None, replica)
    producer.write_back()
    return producer
