"""Opening a trainer: refusals by reading the log, fencing, the start, and the parts of a HiLoProducer assembled.

`HiLoProducer.open` runs `open_alone` where it alone trains, or on the publishing rank of a torch.distributed job
(rank_launch.py). Every refusal comes before fencing, so a trainer that would be refused never stops the one that
runs; only then is the run fenced, caught up, and the checkpoint its start needs published.
"""
import torch

from hilo.log import open_log, updates_topic
from hilo.log.tail import head
from hilo.replay.history import HistoryWriter
from hilo.replay.snapshot import SnapshotStore
from hilo.schemas import headers as H
from hilo.schemas.errors import ConfigError
from hilo.schemas.keyring import Keyring
from hilo.schemas.metrics import Metrics
from hilo.schemas.position import Position

from . import trainer_state
from .checkpoints import Checkpoints
from .config import ProducerConfig
from .lora_params import lora_weights
from .resume import TrainerStart
from .sync_mode import SYNC_MODES
from .trainer_metrics import count_skips
from .trainer_state import TrainerLedger


def _check_room(config: ProducerConfig, manifest) -> None:
    """A budget must leave room for a payload after the message header."""
    room = config.budget.payload_bytes(manifest)
    if config.codec != "dense" and room <= 0:
        raise ConfigError(f"ProducerConfig.budget: {config.budget.message_bytes(manifest)} bytes per message for this "
                          f"{manifest.adapter_bytes()}-byte adapter leave {room} bytes of payload after the header; "
                          f"raise the budget")


def _start(log, config: ProducerConfig, manifest, params: list, keyring: Keyring, checkpoints: Checkpoints) -> tuple:
    """(store, Resumed, fencing token). Every refusal first, by reading the log only: a trainer that would be refused
    (another model, optimizer, history or key) must not fence the one that runs. Then fence every earlier trainer of
    the run (Kafka: its open transaction is aborted), catch up to the head, and publish the checkpoint the start
    needs."""
    store = SnapshotStore(config.state_dir) if config.state_dir else None
    snapshot, verifier = store.load() if store else None, keyring.root
    site_optimizer = SYNC_MODES[config.mode].site_optimizer(config.optimizer)
    start = TrainerStart(log, config.run, manifest, site_optimizer, config.new_history, config.on_bad_record)
    decided = start.decide(snapshot, verifier)
    # a stray record may say anything
    at = (head(log, updates_topic(config.run), config.run) or H.RecordHeaders()).version or 0
    token = log.become_writer(config.run, at)
    started = start.run(snapshot, params, keyring, decided)
    if started.checkpoint:
        checkpoints.publish(started.replica, started.position.next_offset, started.position.log_bytes)
    return store, started, token


def open_alone(cls, model: torch.nn.Module, config: ProducerConfig, log_backend=None, metrics: Metrics | None = None,
               lora: tuple | None = None):
    """A HiLoProducer (`cls`) of `model`, for this process alone. Open the log, make every refusal by reading it,
    fence earlier trainers of the run, start (genesis, the trainer's snapshot, or the newest checkpoint) and catch
    up to the head. `lora`: the adapter's (manifest, LoraWeights) where the caller has them (a multi-rank job's,
    gathered)."""
    manifest, weights = lora or lora_weights(model, config.adapter)
    _check_room(config, manifest)
    keyring = Keyring.load(signing_key=config.signing_key)
    metrics = metrics or Metrics("trainer", run=config.run)
    log = log_backend or open_log(config.target, chunk_bytes=config.chunk_bytes)
    try:
        log.create_topics(config.run)
        checkpoints = Checkpoints.open(log, config.run, config.checkpoint_every, config.keep_checkpoints,
                                       config.chunk_bytes, keyring, metrics)
        store, started, token = _start(log, config, manifest, weights.values(), keyring, checkpoints)
        ledger = TrainerLedger(Position(started.position.next_offset, started.position.log_bytes),
                               HistoryWriter(config.history) if config.history else None, store)
        producer = cls(model, config, log, keyring, metrics, checkpoints, started, token, ledger,
                       (started.replica.manifest, weights))
    except BaseException:
        if log_backend is None:
            log.close()
        raise
    count_skips(metrics, started.skips)
    metrics.set("published_version", started.replica.version)
    ledger.started(started.replica)
    if started.snapshot_version is not None:
        trainer_state.restore(store, started.snapshot_version, producer.replica, producer.builder.encoder,
                              producer.sync, config.run)
    producer.write_back()
    return producer
