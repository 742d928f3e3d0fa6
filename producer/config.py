"""ProducerConfig: everything a trainer is told, checked once, at construction."""
from dataclasses import dataclass

from hilo.log.target import LogTarget
from hilo.replay.bad_records import OnBadRecord
from hilo.replica.codecs import CODECS
from hilo.replica.codecs.budget import AutoBudget, Budget
from hilo.replica.optimizers import OPTIMIZERS
from hilo.schemas.chunks import DEFAULT_CHUNK_BYTES
from hilo.schemas.errors import ConfigError
from hilo.schemas.options import derived, opt

from .sync_mode import SYNC_MODES


@dataclass(frozen=True)
class ProducerConfig:
    """Trainer-side configuration: the run and log it publishes to, how each version is compressed and stepped,
    when checkpoints are written, and how the trainer rides out outages and records it did not write. Every field
    is checked once, at construction; each field's help is in its metadata (`hilo produce --help`, docs/cli.md),
    and `target` is the checked LogTarget of log, run and kafka_config."""

    run: str = opt(help="run id; topics are RUN.updates and RUN.checkpoints")
    log: str = opt("file://./hilo-log", "file://DIR (embedded, one machine) or kafka://HOST:PORT")
    codec: str = opt("spar4",
                     "dense | topk | powersgd | spar | spar4 (replica/codecs/__init__.py); spar4 sends 4-bit factors, "
                     "spar fp16 ones (README: Does it learn as well?)")
    budget: Budget | AutoBudget = opt(Budget(), "bytes per message: 1.6%, 0.016, 2MB or 2000000 (a Budget: a fraction "
                                      "of the bf16 adapter, or bytes); or auto[:SHARE] (an AutoBudget), fitted per "
                                      "version to the slowest "
                                      f"site's measured link so that a version reaches it within SHARE of the step "
                                      f"time (default {AutoBudget.share}; producer/link_budget.py)")
    optimizer: str = opt("adamw", "sgd | adamw | lion | muon")
    hparams: dict = opt(help="optimizer hyperparameter defaults (lr, betas, ...); step(**h) overrides per step",
                        factory=dict)
    checkpoint_every: int = opt(50, "publish a full checkpoint every K versions (bootstrap for late sites)")
    chunk_bytes: int = opt(DEFAULT_CHUNK_BYTES,
                           "largest record value; bigger messages are split. Kafka topics, producer and "
                           "readers are sized to it, and a cluster that cannot take it is refused at start (the "
                           "default, 900 KiB, fits Kafka's 1 MiB default)")
    state_dir: str | None = opt(None, "the trainer's own snapshot, for fast restarts (none: resume from the log)")
    adapter: str = opt("default", "PEFT adapter name")
    new_history: bool = opt(False,
                            "start a new genesis even where the run's earlier records expired (sites of the old one "
                            "refuse it)")
    keep_checkpoints: int = opt(3, "the checkpoints topic keeps the newest K this trainer published (older ones are "
                                "deleted with Kafka's DeleteRecords; the file log keeps everything)")
    signing_key: str | None = opt(None, "Ed25519 private key (PEM, mode 0600; `hilo keys generate`) that signs every "
                                  "update and checkpoint (none: unsigned)")
    kafka_config: str | None = opt(None, "Kafka client .properties file (TLS, SASL; `--kafka-config`) for a kafka:// "
                                   "log (none: plaintext)")
    history: str | None = opt(None, "append (version, digest, offset) of every acknowledged version to this file "
                              "(replay/history.py)")
    mode: str = opt("gradient",
                    "what a message carries (SYNC_MODES). gradient: the compressed gradient; every replica runs "
                    "`optimizer` on it. delta: the trainer runs `optimizer` on its own master copy and publishes the "
                    "compressed difference between the master and the sites' copy; sites apply it with the stateless "
                    "\"add\" step (no optimizer state; their policy trails the master by the lag each message reports)")
    flush_lag: float = opt(1e-3,
                           "`flush()` (delta mode; also run by `close()`) publishes messages until the sites' relative "
                           "lag behind the master is at most this")
    flush_max: int = opt(64, "the most messages one flush publishes")
    on_bad_record: OnBadRecord = opt(OnBadRecord.SKIP,
                                     "skip | stop. What the trainer does with a record on RUN.updates that "
                                     "it did not write and that cannot be a valid message of the run, when it reads "
                                     "the log (start, resync): skip it with one warning and publish after it, or stop. "
                                     "A conflicting message it did sign stops it either way")
    publish_deadline_s: float = opt(600.0,
                                    "how long one step may wait for the log to take its message (a broker restart, a "
                                    "rolling upgrade, a network partition): it retries and waits out the outage "
                                    "meanwhile, saying so once and then every minute. Past it step() raises one line "
                                    "and the trainer stays at its last committed version; a restart resumes exactly. A "
                                    "single broker's restart takes about a minute, a 3-node rolling upgrade a few")
    pipeline: bool = opt(False,
                         "publish off the critical path: step() returns once the version is applied locally and its "
                         "publish is under way on a background thread; the next step() (or flush(), close()) waits for "
                         "it before it publishes, and raises its failure, the trainer back at the last version the log "
                         "holds (producer/inflight.py). Gradient mode; in a torch.distributed job every rank adopts "
                         "the version at once and hears its outcome at the next step(), flush() or close() (call them "
                         "on every rank)")
    publish_rank: int = opt(0, "in a torch.distributed job (torchrun, accelerate launch): the one rank that opens the "
                            "log and publishes. Every rank constructs the same optimizer; the others apply each "
                            "message it publishes and hold the same bits (producer/rank_trainer.py)")
    rank_timeout_s: float | None = opt(None, "in a torch.distributed job: how long a rank waits for the others at "
                                       "start and for the publishing rank's step (its whole publish included) before "
                                       "the job stops with one line; must exceed publish_deadline_s (none: "
                                       "publish_deadline_s + 300)")

    target: LogTarget = derived("log, run and kafka_config, checked together by the one rule trainer and sites share "
                                "(log/target.py); what open_log takes")

    def __post_init__(self):
        # set once here (the dataclass is frozen): the producer opens target, so log, run and kafka_config are
        # checked by the one rule the site uses too, and a bad one is named as ProducerConfig's field
        object.__setattr__(self, "target", LogTarget(self.log, self.run, self.kafka_config, what="ProducerConfig"))
        # a str ("skip", from the CLI or an older caller) becomes the enum
        object.__setattr__(self, "on_bad_record", OnBadRecord.of(self.on_bad_record, "ProducerConfig.on_bad_record"))
        if not self.publish_deadline_s > 0:
            raise ConfigError(f"ProducerConfig.publish_deadline_s = {self.publish_deadline_s}: must be > 0")
        if self.publish_rank < 0:
            raise ConfigError(f"ProducerConfig.publish_rank = {self.publish_rank}: must be >= 0")
        if self.rank_timeout_s is not None and not self.rank_timeout_s > self.publish_deadline_s:
            raise ConfigError(f"ProducerConfig.rank_timeout_s = {self.rank_timeout_s:g}: must exceed "
                              f"publish_deadline_s = {self.publish_deadline_s:g} (a rank waits out the publishing "
                              f"rank's whole publish)")
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
        if self.mode not in SYNC_MODES:
            raise ConfigError(f"ProducerConfig.mode = {self.mode!r}: expected one of {list(SYNC_MODES)}")
        if self.pipeline and self.mode != "gradient":
            raise ConfigError(f"ProducerConfig.pipeline with mode = {self.mode!r}: a pipelined publish runs mode "
                              f"'gradient' only (delta mode's master copy is not taken back when a version is not "
                              f"published)")
        if not 0 <= self.flush_lag < 1:
            raise ConfigError(f"ProducerConfig.flush_lag = {self.flush_lag}: must be in [0, 1)")
        if self.flush_max < 0:
            raise ConfigError(f"ProducerConfig.flush_max = {self.flush_max}: must be >= 0")
        OPTIMIZERS[self.optimizer]().check_hparams(OPTIMIZERS[self.optimizer]().defaults() | self.hparams,
                                                   "ProducerConfig.hparams")
