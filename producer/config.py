"""ProducerConfig: everything a trainer is told, checked once, at construction."""
from dataclasses import dataclass, field

from hilo.log.base import check_run
from hilo.log.kafka_config import check_kafka_config
from hilo.replay.bad_records import POLICIES
from hilo.replica.codecs import CODECS, Budget
from hilo.replica.optimizers import OPTIMIZERS
from hilo.schemas.chunks import DEFAULT_CHUNK_BYTES
from hilo.schemas.errors import ConfigError

from .delta import MODES
from .link_budget import AutoBudget


@dataclass(frozen=True)
class ProducerConfig:
    """Trainer-side configuration. Every field is checked at construction.

    run: run id; topics are RUN.updates and RUN.checkpoints.
    log: file://DIR (embedded, one machine) or kafka://HOST:PORT. Default: file://./hilo-log
    codec: dense | topk | powersgd | spar | spar4 (replica/codecs/__init__.py). Default: spar4 (4-bit factors; `spar` sends fp16 ones, see README "Does it learn as well?")
    budget: bytes per message (Budget(fraction=...) of the bf16 adapter, or Budget(bytes=...)), or AutoBudget():
        each version's budget fitted to the slowest site's measured link (`--budget auto`, producer/link_budget.py).
        Default: 1.6%
    optimizer: sgd | adamw | lion | muon. Default: adamw
    hparams: optimizer hyperparameter defaults (lr, betas, ...); step(**h) overrides per step.
    checkpoint_every: publish a full checkpoint every K versions (bootstrap for late sites). Default: 50
    chunk_bytes: largest record value; bigger messages are split. Kafka topics, producer and readers are sized
        to it, and a cluster that cannot take it is refused at start. Default: 900 KiB (Kafka's 1 MiB default)
    state_dir: the trainer's own snapshot, for fast restarts. Default: None (resume from the log)
    adapter: PEFT adapter name. Default: "default"
    new_history: start a new genesis even where the run's earlier records expired (sites of the old one refuse it). Default: False
    keep_checkpoints: the checkpoints topic keeps the newest K this trainer published (older ones are deleted with
        Kafka's DeleteRecords; the file log keeps everything). Default: 3
    signing_key: Ed25519 private key (PEM, mode 0600; `hilo keys generate`) that signs every update and checkpoint.
        Default: None (unsigned)
    kafka_config: Kafka client .properties file (TLS, SASL; `--kafka-config`) for a kafka:// log. Default: None (plaintext)
    history: append (version, digest, offset) of every acknowledged version to this file (replay/history.py). Default: None
    mode: what a message carries (MODES). "gradient": the compressed gradient; every replica runs `optimizer` on it.
        "delta": the trainer runs `optimizer` on its own master copy and publishes the compressed difference between
        the master and the sites' copy; sites apply it with the stateless "add" step (no optimizer state; their
        policy trails the master by the lag each message reports). Default: gradient
    flush_lag: `flush()` (delta mode; also run by `close()`) publishes messages until the sites' relative lag behind
        the master is at most this. Default: 0.001
    flush_max: the most messages one flush publishes. Default: 64
    publish_deadline_s: how long one step may wait for the log to take its message (a broker restart, a rolling upgrade,
        a network partition): it retries and waits out the outage meanwhile, saying so once and then every minute. Past
        it step() raises one line and the trainer stays at its last committed version; a restart resumes exactly.
        Default: 600 (a single broker's restart takes about a minute, a 3-node rolling upgrade a few)
    on_bad_record: skip | stop. What the trainer does with a record on RUN.updates that it did not write and that
        cannot be a valid message of the run, when it reads the log (start, resync): skip it with one warning and
        publish after it, or stop. A conflicting message it did sign stops it either way. Default: skip
    """

    run: str
    log: str = "file://./hilo-log"
    codec: str = "spar4"
    budget: Budget | AutoBudget = Budget()
    optimizer: str = "adamw"
    hparams: dict = field(default_factory=dict)
    checkpoint_every: int = 50
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    state_dir: str | None = None
    adapter: str = "default"
    new_history: bool = False
    keep_checkpoints: int = 3
    signing_key: str | None = None
    kafka_config: str | None = None
    history: str | None = None
    mode: str = "gradient"
    flush_lag: float = 1e-3
    flush_max: int = 64
    on_bad_record: str = "skip"
    publish_deadline_s: float = 600.0

    def __post_init__(self):
        check_run(self.run, "ProducerConfig.run")
        if not self.publish_deadline_s > 0:
            raise ConfigError(f"ProducerConfig.publish_deadline_s = {self.publish_deadline_s}: must be > 0")
        check_kafka_config(self.log, self.kafka_config)
        if not isinstance(self.budget, (Budget, AutoBudget)):
            raise ConfigError(f"ProducerConfig.budget = {self.budget!r}: expected a Budget or an AutoBudget")
        if self.codec not in CODECS:
            raise ConfigError(f"ProducerConfig.codec = {self.codec!r}: expected one of {sorted(CODECS)}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"ProducerConfig.optimizer = {self.optimizer!r}: expected one of {sorted(OPTIMIZERS)}")
        if self.keep_checkpoints < 1:
            raise ConfigError(f"ProducerConfig.keep_checkpoints = {self.keep_checkpoints}: must be >= 1")
        if self.checkpoint_every < 1:
            raise ConfigError(f"ProducerConfig.checkpoint_every = {self.checkpoint_every}: must be >= 1")
        if not 1024 <= self.chunk_bytes <= 64 << 20:
            raise ConfigError(f"ProducerConfig.chunk_bytes = {self.chunk_bytes}: must be in [1 KiB, 64 MiB]")
        if self.on_bad_record not in POLICIES:
            raise ConfigError(f"ProducerConfig.on_bad_record = {self.on_bad_record!r}: expected one of {list(POLICIES)}")
        if self.mode not in MODES:
            raise ConfigError(f"ProducerConfig.mode = {self.mode!r}: expected one of {list(MODES)}")
        if not 0 <= self.flush_lag < 1:
            raise ConfigError(f"ProducerConfig.flush_lag = {self.flush_lag}: must be in [0, 1)")
        if self.flush_max < 0:
            raise ConfigError(f"ProducerConfig.flush_max = {self.flush_max}: must be >= 0")
        OPTIMIZERS[self.optimizer]().check_hparams(OPTIMIZERS[self.optimizer]().defaults() | self.hparams, "ProducerConfig.hparams")


