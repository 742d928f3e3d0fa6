"""Kafka client security from a standard client .properties file (`--kafka-config FILE`), for kafka-python.

The keys are the ones Kafka users already write for the Java client or librdkafka; each maps to one
kafka-python option. Unknown keys are refused by name, and secrets (passwords) never appear in a repr,
a log line or an error: errors name the file and the key, never a value of a secret key.

    security.protocol=SASL_SSL
    ssl.ca.location=/etc/hilo/ca.pem              # or ssl.cafile
    sasl.mechanism=SCRAM-SHA-512                  # PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
    sasl.username=site
    sasl.password.file=/etc/hilo/site.password    # or sasl.password=..., or
                                                    sasl.jaas.config=... username=".." password="..";
"""
import io
import os
import re
import stat
from dataclasses import dataclass, field

from jproperties import Properties

from hilo.schemas.errors import ConfigError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# property key -> KafkaClientConfig field. Aliases: the Java client's name, librdkafka's, kafka-python's dotted.
KEYS = {
    "security.protocol": "security_protocol",
    "ssl.ca.location": "ssl_cafile", "ssl.cafile": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile", "ssl.certfile": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile", "ssl.keyfile": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl.endpoint.identification.algorithm": "ssl_check_hostname",
    "sasl.mechanism": "sasl_mechanism", "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_username",
    "sasl.password": "sasl_password",
    "sasl.password.file": "sasl_password",
    "sasl.jaas.config": "sasl_password",
}
# Keys a Java client file often has that kafka-python cannot use as written: say what to write instead.
HINTS = {
    "ssl.truststore.location": "kafka-python reads PEM: export the CA with `keytool -exportcert -rfc -alias CA "
                               "-keystore FILE` and give it as ssl.ca.location",
    "ssl.keystore.location": "kafka-python reads PEM: give the client certificate and key as ssl.certificate.location "
                             "and ssl.key.location",
}
_JAAS = re.compile(r'(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')


class Secret(str):
    """A password as kafka-python needs it (a str), whose repr is masked: kafka-python logs its whole config at
    DEBUG, and a dict shows its values by repr."""

    def __repr__(self):
        return "'***'"


@dataclass(frozen=True)
class KafkaClientConfig:
    """How this client connects to the brokers; every field is checked at construction.

    security_protocol: PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL. Default: PLAINTEXT
    ssl_cafile: PEM CA bundle the brokers' certificates are checked against. Default: the system's
    ssl_certfile / ssl_keyfile / ssl_password: client certificate (mutual TLS) and its key's password
    ssl_check_hostname: check the broker's certificate names the host dialled. Default: True
    sasl_mechanism: PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512 (required with SASL_*)
    sasl_username / sasl_password: the principal's credentials (required with SASL_*)
    source: the file this came from, named in errors
    """

    security_protocol: str = "PLAINTEXT"
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = field(default=None, repr=False)
    ssl_check_hostname: bool = True
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    source: str = "KafkaClientConfig"

    def __post_init__(self):
        where = self.source
        if self.security_protocol not in PROTOCOLS:
            raise ConfigError(f"{where}: security.protocol = {self.security_protocol!r}: expected one of "
                              f"{', '.join(PROTOCOLS)}")
        sasl = self.security_protocol.startswith("SASL_")
        if sasl:
            if self.sasl_mechanism not in MECHANISMS:
                raise ConfigError(f"{where}: sasl.mechanism = {self.sasl_mechanism!r}: {self.security_protocol} needs "
                                  f"one of {', '.join(MECHANISMS)}")
            if not self.sasl_username or not self.sasl_password:
                missing = "sasl.username" if not self.sasl_username else "sasl.password (or sasl.password.file)"
                raise ConfigError(f"{where}: {self.security_protocol} needs {missing}")
        elif self.sasl_mechanism or self.sasl_username or self.sasl_password:
            raise ConfigError(f"{where}: sasl.* keys are set but security.protocol is {self.security_protocol}; "
                              f"use SASL_SSL (or SASL_PLAINTEXT) to authenticate")
        tls = self.security_protocol in ("SSL", "SASL_SSL")
        for name, key in (("ssl_cafile", "ssl.ca.location"), ("ssl_certfile", "ssl.certificate.location"),
                          ("ssl_keyfile", "ssl.key.location")):
            path = getattr(self, name)
            if path is not None:
                if not tls:
                    raise ConfigError(f"{where}: {key} is set but security.protocol is {self.security_protocol} (no "
                                      f"TLS)")
                if not os.path.isfile(path) or not os.access(path, os.R_OK):
                    raise ConfigError(f"{where}: {key} = {path!r}: no such readable file")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ConfigError(f"{where}: mutual TLS needs both ssl.certificate.location and ssl.key.location")

    @property
    def authenticated(self) -> bool:
        """Whether this client proves who it is (SASL or a client certificate)."""
        return self.security_protocol.startswith("SASL_") or self.ssl_certfile is not None

    def client_kwargs(self) -> dict:
        """The kafka-python options for KafkaProducer, KafkaConsumer and KafkaAdminClient."""
        kw = {"security_protocol": self.security_protocol}
        if self.security_protocol in ("SSL", "SASL_SSL"):
            kw |= {"ssl_cafile": self.ssl_cafile, "ssl_certfile": self.ssl_certfile, "ssl_keyfile": self.ssl_keyfile,
                   "ssl_password": None if self.ssl_password is None else Secret(self.ssl_password),
                   "ssl_check_hostname": self.ssl_check_hostname}
        if self.security_protocol.startswith("SASL_"):
            kw |= {"sasl_mechanism": self.sasl_mechanism, "sasl_plain_username": self.sasl_username,
                   "sasl_plain_password": Secret(self.sasl_password)}
        return kw

    @classmethod
    def load(cls, path: str) -> "KafkaClientConfig":
        """Parse a .properties file; ConfigError naming the file and the key for anything it cannot use."""
        try:
            raw = open(path, "rb").read()
        except OSError as e:
            raise ConfigError(f"--kafka-config {path!r}: cannot read it ({e.strerror})") from None
        props = Properties()
        try:
            props.load(io.BytesIO(raw), "utf-8")
        except Exception as e:  # jproperties raises its own parse errors; the message quotes no value
            raise ConfigError(f"--kafka-config {path!r}: not a .properties file ({type(e).__name__})") from None
        values, seen = {}, {}
        for key, (value, _meta) in props.items():
            if key in HINTS:
                raise ConfigError(f"{path}: key {key!r} is not supported: {HINTS[key]}")
            if key not in KEYS:
                raise ConfigError(f"{path}: unknown key {key!r}; supported: {', '.join(sorted(KEYS))}")
            name = KEYS[key]
            if name in seen:
                raise ConfigError(f"{path}: {key!r} and {seen[name]!r} both set {name}; keep one")
            seen[name] = key
            values[name] = _value(path, key, value.strip())
        if "sasl_username" not in values and seen.get("sasl_password") == "sasl.jaas.config":
            values["sasl_username"] = _jaas(path, props["sasl.jaas.config"].data)["username"]
        return cls(**values, source=path)

    def __str__(self):
        """What a log line may show: protocol, mechanism and user, never a secret."""
        who = f" as {self.sasl_username} ({self.sasl_mechanism})" if self.sasl_username else ""
        return f"{self.security_protocol}{who}"


def _value(path: str, key: str, value: str):
    """The field value of one property; secrets read from files are checked to be private."""
    if key == "ssl.endpoint.identification.algorithm":
        if value.lower() not in ("https", "", "none"):
            raise ConfigError(f"{path}: {key} = {value!r}: expected https (check the broker's name) or empty (do not)")
        return value.lower() == "https"
    if key == "security.protocol":
        return value.upper()
    if key == "sasl.mechanisms" or key == "sasl.mechanism":
        return value.upper()
    if key == "sasl.password.file":
        return _secret_file(path, key, value)
    if key == "sasl.jaas.config":
        return _jaas(path, value)["password"]
    if key in ("ssl.ca.location", "ssl.cafile", "ssl.certificate.location", "ssl.certfile", "ssl.key.location",
               "ssl.keyfile"):
        return os.path.join(os.path.dirname(os.path.abspath(path)), os.path.expanduser(value))  # relative to the file
    return value


def _secret_file(path: str, key: str, name: str) -> str:
    """The first line of a password file that only its owner can read (the file named, never its contents)."""
    name = os.path.join(os.path.dirname(os.path.abspath(path)), os.path.expanduser(name))
    try:
        st = os.stat(name)
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(f"{path}: {key} = {name!r} is readable by others (mode {stat.S_IMODE(st.st_mode):o}); "
                              f"chmod 600 it")
        text = open(name, encoding="utf-8").readline().rstrip("\r\n")
    except OSError as e:
        raise ConfigError(f"{path}: {key} = {name!r}: cannot read it ({e.strerror})") from None
    if not text:
        raise ConfigError(f"{path}: {key} = {name!r} is empty")
    return text


def _jaas(path: str, text: str) -> dict:
    """username and password of a Plain/Scram LoginModule line (sasl.jaas.config), as Java clients write it."""
    found = {k: v.replace('\\"', '"') for k, v in _JAAS.findall(text)}
    if not ("PlainLoginModule" in text or "ScramLoginModule" in text) or set(found) != {"username", "password"}:
        raise ConfigError(f"{path}: sasl.jaas.config: expected a PlainLoginModule or ScramLoginModule line with "
                          f"username=\"...\" password=\"...\"")
    return found


def client_config(config) -> KafkaClientConfig:
    """A KafkaClientConfig from a path, an existing config, or None (plaintext)."""
    if config is None:
        return KafkaClientConfig()
    if isinstance(config, KafkaClientConfig):
        return config
    return KafkaClientConfig.load(os.fspath(config))



def check_kafka_config(url: str, config) -> None:
    """ConfigError if `config` (a path or KafkaClientConfig) is given for a non-Kafka log, or cannot be used."""
    if config is None:
        return
    if not url.startswith("kafka://"):
        raise ConfigError(f"--kafka-config {config}: applies to kafka:// logs, and --log is {url}")
    client_config(config)
