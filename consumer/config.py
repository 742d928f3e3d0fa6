"""SiteConfig: everything a rollout site is told, checked once, at construction."""
from dataclasses import dataclass, fields

from hilo.log.target import LogTarget
from hilo.replay.bad_records import OnBadRecord
from hilo.replica.forward import LOGPROB_TOLERANCE
from hilo.replica.kernels import MODES as APPLY_MODES
from hilo.schemas.errors import ConfigError
from hilo.schemas.options import derived, opt

from .adapter_export import DTYPES


@dataclass(frozen=True)
class ServingConfig:
    """What serving reads of a SiteConfig (serving.py): where adapters are exported and how, the vLLM server and its
    self-check, the shell hook, the retry pace. Derived by SiteConfig (its `serving`), which checks each field."""

    site: str
    state_dir: str
    export_adapters: bool
    export_dtype: str
    keep_adapters: int
    on_version: str | None
    vllm: str | None
    lora_name: str
    self_check: bool
    self_check_base: str | None
    self_check_tolerance: float
    retry_serve_s: float


@dataclass(frozen=True)
class SiteConfig:
    """Rollout-site configuration: the run it follows and where its state lives, how each version is exported and
    served (adapter directories, a vLLM server, a shell hook), where reading starts and ends, and what to do with
    records that cannot be valid. Checked once, at construction; each field's help is in its metadata (`hilo consume
    --help`, docs/cli.md), and `target` is the checked LogTarget of log, run and kafka_config."""

    log: str = opt(help="where to read: file://DIR (embedded log) or kafka://HOST:PORT")
    run: str = opt(help="the run id to follow")
    site: str = opt(help="this site's name (its consumer group is hilo.RUN.SITE)")
    state_dir: str = opt(help="where this site's state lives: its snapshot and exported adapters")
    snapshot_every: int = opt(10, "snapshot the state every K applied versions (and on exit)")
    snapshot_every_s: float | None = opt(None,
                                         "also snapshot once S seconds have passed since the last one (at the next "
                                         "applied version; whichever bound comes first; none: versions only)")
    export_adapters: bool = opt(True, "write a PEFT adapter dir per version under STATE_DIR/adapters")
    export_dtype: str = opt("bfloat16", "bfloat16 | float16 | float32")
    keep_adapters: int = opt(3, "newest N adapter dirs kept")
    on_version: str | None = opt(None, "shell command run after each export of the newest version (HILO_VERSION, "
                                 "HILO_ADAPTER_DIR, HILO_DIGEST); for engines other than vLLM")
    vllm: str | None = opt(None,
                           "base URL of a vLLM server to load each newest version into (needs export_adapters; the "
                           "server runs with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, as "
                           "ops/vllm/start.sh starts it)")
    lora_name: str = opt("policy", "the adapter name requests to that server use")
    self_check: bool = opt(True,
                           "after each vLLM load, compare vLLM's log-probabilities of a fixed probe with the site's "
                           "own forward pass of that version; a difference over the tolerance: no generating with it, "
                           "one line, the load retried (consumer/self_check.py)")
    self_check_base: str | None = opt(None,
                                      "the base model directory for the self-check's forward pass (none: the path "
                                      "vLLM reports serving, which must then be a local directory)")
    self_check_tolerance: float = opt(LOGPROB_TOLERANCE,
                                      "the largest per-token |log-probability difference| the self-check accepts "
                                      "(vLLM CPU server, fp32 base: honest differences measured up to 7e-7 on the "
                                      "random tiny base and 1.02e-5 on the pretrained student base). A GPU or bf16 "
                                      "deployment measures and sets its own")
    retry_serve_s: float = opt(2.0, "first wait before retrying a load vLLM could not take (doubles up to 60 s)")
    trust: str | None = opt(None,
                            "the trainer's Ed25519 public key (PEM); only records it signed are applied (none: verify "
                            "nothing)")
    from_offset: int | None = opt(None,
                                  "start reading RUN.updates here (already-applied versions are checked and skipped)")
    from_version: int | None = opt(None, "ignore the snapshot; bootstrap from the newest checkpoint <= V and replay")
    until_version: int | None = opt(None,
                                    "end at exactly this version: exit 0 once it is applied (none: follow forever). "
                                    "A site without a snapshot bootstraps from the newest checkpoint <= N whose "
                                    "updates to N are retained; where the log can no longer give N, one line naming "
                                    "the oldest version it can, exit 1; a snapshot already past N, one line, exit 3 "
                                    "(the state dir is left as it is in both)")
    idle_exit_s: float | None = opt(None, "exit 0 after this long with nothing new (none: follow forever)")
    wait_checkpoint_s: float = opt(600.0, "how long to wait for the producer's first checkpoint")
    kafka_config: str | None = opt(None, "Kafka client .properties file (TLS, SASL; `--kafka-config`) for a kafka:// "
                                   "log (none: plaintext)")
    history: str | None = opt(None,
                              "append (version, digest, offset) of every applied version to this file, for a history "
                              "check (replay/history.py)")
    on_bad_record: OnBadRecord = opt(OnBadRecord.SKIP,
                                     "skip | stop. skip: a record that cannot be a valid message of this run "
                                     "(does not decode, breaks a limit, unsigned or signed by another key in a signed "
                                     "run, another run's) is skipped with one warning, counted and written to the "
                                     "history; the site stops only if a later version shows it was needed. stop: the "
                                     "first such record stops the site (fail-stop; an operator must remove it)")
    apply: str = opt("kernel",
                     "kernel | reference | kernel-only. kernel: the fused CPU kernel (replica/kernels/) where the "
                     "run's optimizer has one, else the torch path, said once; reference: the torch path (the "
                     "specification; the same bits, slower); kernel-only: refuse to start without a kernel for the "
                     "run's optimizer")
    prefetch: bool = opt(True, "fetch the next version while this one is verified, decoded and applied (a second log "
                         "client, one thread; over a slow link the fetch then costs nothing a version waits for)")

    target: LogTarget = derived("log, run and kafka_config, checked together by the one rule trainer and sites share "
                                "(log/target.py); what open_log takes")
    serving: ServingConfig = derived("the fields serving reads (ServingConfig), handed to Serving whole")

    def __post_init__(self):
        # set once here (the dataclass is frozen): the site opens target, checked by the rule the trainer uses too
        object.__setattr__(self, "target", LogTarget(self.log, self.run, self.kafka_config, what="SiteConfig"))
        # a str ("skip", from the CLI or an older caller) becomes the enum
        object.__setattr__(self, "on_bad_record", OnBadRecord.of(self.on_bad_record, "SiteConfig.on_bad_record"))
        object.__setattr__(self, "serving",
                           ServingConfig(**{f.name: getattr(self, f.name) for f in fields(ServingConfig)}))
        if self.snapshot_every < 1:
            raise ConfigError(f"SiteConfig.snapshot_every = {self.snapshot_every}: must be >= 1")
        if self.snapshot_every_s is not None and not self.snapshot_every_s > 0:  # `not >`: NaN is refused too
            raise ConfigError(f"SiteConfig.snapshot_every_s = {self.snapshot_every_s}: must be > 0 (or none)")
        if self.apply not in APPLY_MODES:
            raise ConfigError(f"SiteConfig.apply = {self.apply!r}: expected one of {list(APPLY_MODES)}")
        if self.export_dtype not in DTYPES:
            raise ConfigError(f"SiteConfig.export_dtype = {self.export_dtype!r}: expected one of {sorted(DTYPES)}")
        if self.keep_adapters < 1:
            raise ConfigError(f"SiteConfig.keep_adapters = {self.keep_adapters}: must be >= 1")
        if self.from_offset is not None and self.from_offset < 0:
            raise ConfigError(f"SiteConfig.from_offset = {self.from_offset}: must be >= 0")
        if not self.site or "/" in self.site:
            raise ConfigError(f"SiteConfig.site = {self.site!r}: must be a non-empty name without '/'")
        if self.vllm is not None and not self.export_adapters:
            raise ConfigError("SiteConfig.vllm: vLLM loads exported adapter directories; it cannot be used with "
                              "export_adapters=False")
        if self.vllm is not None and not self.vllm.startswith(("http://", "https://")):
            raise ConfigError(f"SiteConfig.vllm = {self.vllm!r}: expected an http:// or https:// URL")
        if not self.self_check_tolerance > 0:
            raise ConfigError(f"SiteConfig.self_check_tolerance = {self.self_check_tolerance}: must be > 0")
        if not self.lora_name or "/" in self.lora_name:
            raise ConfigError(f"SiteConfig.lora_name = {self.lora_name!r}: must be a non-empty name without '/'")
