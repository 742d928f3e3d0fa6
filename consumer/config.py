"""SiteConfig: everything a rollout site is told, checked once, at construction."""
from dataclasses import dataclass

from hilo.log.base import check_run
from hilo.log.kafka_config import check_kafka_config
from hilo.replay.bad_records import POLICIES
from hilo.schemas.errors import ConfigError

from .adapter_export import DTYPES


@dataclass(frozen=True)
class SiteConfig:
    """Rollout-site configuration; checked at construction.

    log, run, site, state_dir: where to read, which run, this site's name, where its state lives.
    snapshot_every: snapshot the state every K applied versions (and on exit). Default: 10
    export_adapters: write a PEFT adapter dir per version under STATE_DIR/adapters. Default: True
    export_dtype: bfloat16 | float16 | float32. Default: bfloat16
    keep_adapters: newest N adapter dirs kept. Default: 3
    on_version: shell command run after each export of the newest version (HILO_VERSION, HILO_ADAPTER_DIR,
        HILO_DIGEST); for engines other than vLLM. Default: None
    vllm: base URL of a vLLM server to load each newest version into (needs export_adapters; the server runs with
        --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, as ops/vllm/start.sh starts it). Default: None
    lora_name: the adapter name requests to that server use. Default: policy
    retry_serve_s: first wait before retrying a load vLLM could not take (doubles up to 60 s). Default: 2
    trust: the trainer's Ed25519 public key (PEM); only records it signed are applied. Default: None (verify nothing)
    from_offset: start reading RUN.updates here (already-applied versions are checked and skipped). Default: None
    from_version: ignore the snapshot; bootstrap from the newest checkpoint <= V and replay. Default: None
    until_version: exit 0 once this version is applied. Default: None (follow forever)
    idle_exit_s: exit 0 after this long with nothing new. Default: None (follow forever)
    wait_checkpoint_s: how long to wait for the producer's first checkpoint. Default: 600
    kafka_config: Kafka client .properties file (TLS, SASL; `--kafka-config`) for a kafka:// log. Default: None (plaintext)
    history: append (version, digest, offset) of every applied version to this file, for a history check
        (replay/history.py). Default: None
    on_bad_record: skip | stop. skip: a record that cannot be a valid message of this run (does not decode, breaks a
        limit, unsigned or signed by another key in a signed run, another run's) is skipped with one warning, counted
        and written to the history; the site stops only if a later version shows it was needed. stop: the first such
        record stops the site (fail-stop; an operator must remove it). Default: skip
    prefetch: fetch the next version while this one is verified, decoded and applied (a second log client, one
        thread; over a slow link the fetch then costs nothing a version waits for). Default: True
    """

    log: str
    run: str
    site: str
    state_dir: str
    snapshot_every: int = 10
    export_adapters: bool = True
    export_dtype: str = "bfloat16"
    keep_adapters: int = 3
    on_version: str | None = None
    vllm: str | None = None
    lora_name: str = "policy"
    retry_serve_s: float = 2.0
    trust: str | None = None
    from_offset: int | None = None
    from_version: int | None = None
    until_version: int | None = None
    idle_exit_s: float | None = None
    wait_checkpoint_s: float = 600.0
    kafka_config: str | None = None
    history: str | None = None
    on_bad_record: str = "skip"
    prefetch: bool = True

    def __post_init__(self):
        check_run(self.run, "SiteConfig.run")
        check_kafka_config(self.log, self.kafka_config)
        if self.on_bad_record not in POLICIES:
            raise ConfigError(f"SiteConfig.on_bad_record = {self.on_bad_record!r}: expected one of {list(POLICIES)}")
        if self.snapshot_every < 1:
            raise ConfigError(f"SiteConfig.snapshot_every = {self.snapshot_every}: must be >= 1")
        if self.export_dtype not in DTYPES:
            raise ConfigError(f"SiteConfig.export_dtype = {self.export_dtype!r}: expected one of {sorted(DTYPES)}")
        if self.keep_adapters < 1:
            raise ConfigError(f"SiteConfig.keep_adapters = {self.keep_adapters}: must be >= 1")
        if self.from_offset is not None and self.from_offset < 0:
            raise ConfigError(f"SiteConfig.from_offset = {self.from_offset}: must be >= 0")
        if not self.site or "/" in self.site:
            raise ConfigError(f"SiteConfig.site = {self.site!r}: must be a non-empty name without '/'")
        if self.vllm is not None and not self.export_adapters:
            raise ConfigError("SiteConfig.vllm: vLLM loads exported adapter directories; it cannot be used with export_adapters=False")
        if self.vllm is not None and not self.vllm.startswith(("http://", "https://")):
            raise ConfigError(f"SiteConfig.vllm = {self.vllm!r}: expected an http:// or https:// URL")
        if not self.lora_name or "/" in self.lora_name:
            raise ConfigError(f"SiteConfig.lora_name = {self.lora_name!r}: must be a non-empty name without '/'")


