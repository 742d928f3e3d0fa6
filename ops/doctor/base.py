"""What a `hilo doctor` check takes (DoctorConfig, through a Session that opens each client once) and gives
(Results)."""
import enum
from dataclasses import dataclass

from hilo.schemas.errors import ConfigError
from hilo.schemas.options import opt


class Status(enum.Enum):
    """A check's verdict; only FAIL makes `hilo doctor` exit 1."""

    OK = "OK"
    WARN = "WARN"      # works, but slower or less safe than it should be; or the doctor cannot tell
    FAIL = "FAIL"      # the trainer or a site would stop on it
    SKIP = "SKIP"      # not checked: a check it builds on failed


@dataclass(frozen=True)
class Result:
    """One line of the report: the check, its verdict, what it found and what to do about it."""

    check: str
    status: Status
    found: str
    fix: str = ""

    def line(self) -> str:
        """`FAIL  topics      ...; fix: ...` (one line, whatever the found text held)."""
        text = f"{self.status.value:<4}  {self.check:<12} {self.found}" + (f"; fix: {self.fix}" if self.fix else "")
        return " ".join(text.split("\n"))

    def as_dict(self) -> dict:
        """For --json."""
        return {"check": self.check, "status": self.status.value, "found": self.found, "fix": self.fix}


def ok(check: str, found: str) -> Result:
    """An OK line."""
    return Result(check, Status.OK, found)


def warn(check: str, found: str, fix: str = "") -> Result:
    """A WARN line."""
    return Result(check, Status.WARN, found, fix)


def fail(check: str, found: str, fix: str = "") -> Result:
    """A FAIL line."""
    return Result(check, Status.FAIL, found, fix)


ROLES = ("site", "trainer")


@dataclass(frozen=True)
class DoctorConfig:
    """What to check; each check runs when the options it needs are given (the machine's checks always run)."""

    log: str | None = opt(None,
                          "the log to check: kafka://HOST:PORT[,HOST:PORT] (the broker answers with --kafka-config's "
                          "settings) or file://DIR")
    run: str | None = opt(None,
                          "the run whose topics, their settings and this principal's ACLs are checked (needs --log)")
    kafka_config: str | None = opt(None,
                                   "Kafka client .properties (security.protocol, sasl.*, ssl.*): parsed, then used "
                                   "to reach --log")
    role: str = opt("site", "whose ACLs the principal of --kafka-config must hold: a site's or the trainer's")
    vllm: str | None = opt(None,
                           "base URL of the vLLM server a site loads into: its version, runtime LoRA loading, the "
                           "hilo-sync plugin, the base model it serves")
    base: str | None = opt(None,
                           "the base model the vLLM server must serve: its directory or name (compared by the last "
                           "path component); without it the served base is only reported")
    state_dir: str | None = opt(None,
                                "a site's state dir: free space there, and its newest exported adapter is what the "
                                "plugin check loads into vLLM")
    min_free_gb: float = opt(5.0, "WARN when the state dir or the file log's directory has less free space (GB)")
    connect_timeout_s: float = opt(10.0, "how long the first connection to the broker may take")

    def __post_init__(self):
        if self.run is not None and self.log is None:
            raise ConfigError("DoctorConfig.run: a run's topics live on a log; give --log too")
        if self.role not in ROLES:
            raise ConfigError(f"DoctorConfig.role = {self.role!r}: expected one of {', '.join(ROLES)}")
        if not self.min_free_gb >= 0 or not self.connect_timeout_s > 0:
            raise ConfigError(f"DoctorConfig.min_free_gb / connect_timeout_s = {self.min_free_gb} / "
                              f"{self.connect_timeout_s}: must be >= 0 / > 0")


class Session:
    """The config and the clients the checks share (one broker connection for all of them); close() closes them."""

    def __init__(self, config: DoctorConfig):
        self.config = config
        self._log = None

    @property
    def kafka(self) -> bool:
        """Whether --log names a Kafka cluster."""
        return (self.config.log or "").startswith("kafka://")

    def log(self):
        """The log of --log, opened once (a Kafka log with --kafka-config's settings)."""
        if self._log is None:
            from hilo.log import open_log
            c = self.config
            self._log = open_log(c.log, kafka_config=c.kafka_config, connect_timeout_ms=int(c.connect_timeout_s * 1000))
        return self._log

    def vllm(self, lora_name: str = "hilo-doctor"):
        """A client of --vllm (short timeouts: a doctor waits on nothing)."""
        from hilo.consumer.vllm_serving import VllmServer
        return VllmServer(self.config.vllm, lora_name=lora_name, timeout_s=30.0)

    def close(self) -> None:
        """Close the log's clients."""
        if self._log is not None:
            self._log.close()
            self._log = None
