"""Why a Kafka connection failed, in one line: kafka-python reports only "Unable to bootstrap" and logs the cause.

While a client connects, `watch()` collects kafka-python's error log lines (without showing them unless the
user asked for them), and `explain()` turns the first telling one into a sentence that names the setting to
check. Nothing here ever sees a password: kafka-python's lines do not contain one.
"""
import logging
from contextlib import contextmanager


class _Collect(logging.Handler):
    """Keeps the messages of ERROR records."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@contextmanager
def watch():
    """Collect kafka-python's error lines during the block; yields the list they go to."""
    kafka = logging.getLogger("kafka")
    handler, level, propagate = _Collect(), kafka.level, kafka.propagate
    if kafka.getEffectiveLevel() > logging.ERROR:  # hidden by the user's settings: collect them, still hide them
        kafka.setLevel(logging.ERROR)
        kafka.propagate = False
    kafka.addHandler(handler)
    try:
        yield handler.lines
    finally:
        kafka.removeHandler(handler)
        kafka.setLevel(level)
        kafka.propagate = propagate


def explain(lines: list, config) -> str | None:
    """The cause of a failed connection, naming what to check in `config` (a KafkaClientConfig); None if unknown."""
    text = "\n".join(lines)
    if "SaslAuthenticationFailedError" in text:
        return (f"the broker refused the credentials of user {config.sasl_username!r} ({config.sasl_mechanism}): "
                f"check sasl.username and the password")
    if "UnsupportedSaslMechanism" in text:
        return f"the broker does not enable sasl.mechanism {config.sasl_mechanism}"
    for line in lines:
        if "CERTIFICATE_VERIFY_FAILED" in line:
            why = line.rsplit("certificate verify failed:", 1)[-1].split("(_ssl")[0].strip()
            return (f"TLS: the broker's certificate is not trusted ({why}); check ssl.ca.location "
                    f"({config.ssl_cafile or 'the system CAs'}) and that the certificate names the host dialled")
    if "WRONG_VERSION_NUMBER" in text or "record layer failure" in text:
        return f"the broker does not speak TLS on this port, but security.protocol is {config.security_protocol}"
    if "socket disconnected" in text and config.security_protocol.startswith("SASL_"):
        # The broker answers bad credentials with an error and closes; under load kafka-python may see only the close.
        return (f"the broker closed the connection while authenticating user {config.sasl_username!r} "
                f"({config.sasl_mechanism}): check sasl.username and the password (most likely wrong), and that the "
                f"listener speaks {config.security_protocol}")
    if "socket disconnected" in text:
        return (f"the broker closed the connection during the handshake: it expects other security than "
                f"{config.security_protocol} (a secured broker needs --kafka-config with its security.protocol and "
                f"credentials)")
    return None
