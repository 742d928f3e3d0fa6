"""Connecting kafka-python clients, and what a failed connection means.

A cluster never reached is a wrong address, wrong credentials or no broker: the error is kept and said again at
once by every later use (no second 10 s wait). A cluster reached once and then not is restarting: a failed
reconnect is worth retrying, and the reader treats it as an empty read.
"""
import enum

from kafka.errors import KafkaError
from kafka.net import KafkaNetClient

from hilo.schemas.errors import LogError, LogUnavailable

from . import causes

# kafka-python's default (30 s) is reached after about ten failed reconnects: a client that waited out a 45-s broker
# restart slept up to 30 s more after the broker was back, and the trainer or a site with it (Java's default is 1 s)
RECONNECT_BACKOFF_MAX_MS = 1_000


class Reach(enum.Enum):
    """What this client knows of the cluster."""

    NEVER = "never reached yet"
    REACHED = "reached"              # a later failed reconnect is a restarting cluster
    UNREACHABLE = "unreachable"      # the first connection failed: the error is kept


class Connector:
    """Makes connected kafka-python clients for `bootstrap` with the TLS/SASL settings of `config`.

    bootstrap: HOST:PORT[,HOST:PORT], the servers dialled (public: a test points it at a dead port to play a
        cluster that went away).
    security: the kafka-python keyword arguments of the security settings (no secrets in any error).
    connect_timeout_ms: how long the first connection may take. Default: 10000
    """

    def __init__(self, bootstrap: str, config, connect_timeout_ms: int = 10_000):
        self.bootstrap, self.config, self.connect_timeout_ms = bootstrap, config, connect_timeout_ms
        self.security = config.client_kwargs()
        self.url = f"kafka://{bootstrap}"
        self.reach, self.error = Reach.NEVER, None

    def check(self) -> None:
        """Raise the kept error of a cluster never reached."""
        if self.reach is Reach.UNREACHABLE:
            raise self.error

    def connect(self, client, **kwargs):
        """A connected `client` (KafkaAdminClient, KafkaProducer, KafkaConsumer), or LogError saying why not
        (refused credentials, an untrusted certificate, the wrong security.protocol, or no broker)."""
        self.check()
        made = []  # the network client the constructor makes, so a failed one can be closed

        def network_client(**config):
            made.append(KafkaNetClient(**config))
            return made[-1]
        with causes.watch() as lines:
            try:
                connected = client(bootstrap_servers=self.bootstrap,
                                   **({"bootstrap_timeout_ms": self.connect_timeout_ms,
                                      "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS} | self.security
                                                                        | kwargs | {"kafka_client": network_client}))
            except KafkaError as e:
                # kafka-python starts the client's I/O thread before it bootstraps and leaves it running when that
                # fails: one idle thread per failed connect (a reader reconnecting through an outage made one every few
                # seconds)
                for net in made:
                    _close_quietly(net)
                cause = causes.explain(lines, self.config)
                if cause is None:
                    cause = (f"cannot connect within {self.connect_timeout_ms / 1000:.0f}s ({type(e).__name__}); is "
                             f"the broker running and reachable? (ops/kafka/start.sh starts a local one)")
                # a cluster reached before is restarting (or cut off): its callers wait; one never reached is a wrong
                # address
                failure = (LogUnavailable if self.reach is Reach.REACHED else LogError)(f"{self.url}: {cause}")
                if self.reach is Reach.NEVER:
                    self.reach, self.error = Reach.UNREACHABLE, failure
                raise failure from None
        self.reach = Reach.REACHED
        return connected

    @property
    def reached(self) -> bool:
        """Whether a client ever connected (a failed reconnect is then a restarting cluster)."""
        return self.reach is Reach.REACHED


def _close_quietly(net) -> None:
    """Close a network client whose constructor failed (stops its I/O thread)."""
    try:
        net.close()
    except Exception:  # noqa: BLE001  (closing what never connected; nothing to report)
        pass
