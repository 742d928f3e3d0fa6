"""--kafka-config: standard client properties -> kafka-python options; unknown keys refused by name; secrets kept
out."""
import pathlib

import pytest

from hilo.log import open_log
from hilo.log.kafka_config import KEYS, KafkaClientConfig, Secret
from hilo.log.kafka.backend import KafkaLog
from hilo.schemas.errors import ConfigError

SECRET = "s3cret-Value-42"


@pytest.fixture
def files(tmp_path):
    """A CA file and a private password file next to the properties."""
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    pw = tmp_path / "site.password"
    pw.write_text(SECRET + "\n")
    pw.chmod(0o600)
    return tmp_path


def write(tmp_path, text):
    p = tmp_path / "client.properties"
    p.write_text(text)
    return str(p)


def test_a_sasl_ssl_file_maps_to_kafka_python_options(files):
    path = write(files, "# a site\nsecurity.protocol=sasl_ssl\nssl.ca.location=ca.pem\nsasl.mechanism=SCRAM-SHA-512\n"
                        "sasl.username=site\nsasl.password.file=site.password\n")
    kw = KafkaClientConfig.load(path).client_kwargs()
    assert kw == {"security_protocol": "SASL_SSL", "ssl_cafile": str(files / "ca.pem"), "ssl_certfile": None,
                  "ssl_keyfile": None,
                  "ssl_password": None, "ssl_check_hostname": True, "sasl_mechanism": "SCRAM-SHA-512",
                  "sasl_plain_username": "site", "sasl_plain_password": SECRET}  # relative paths are the file's
    # kafka-python logs this dict at DEBUG
    assert isinstance(kw["sasl_plain_password"], Secret) and SECRET not in repr(kw)


@pytest.mark.parametrize("lines", [
    ["sasl.mechanisms=PLAIN", "sasl.username=site", f"sasl.password={SECRET}"],            # librdkafka's names
    ["sasl.mechanism=PLAIN", 'sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\',
     # the Java client's, continued
     f'    username="site" password="{SECRET}";'],
])
def test_the_java_and_librdkafka_spellings_give_the_same_config(files, lines):
    path = write(files, "security.protocol=SASL_SSL\nssl.cafile=ca.pem\n" + "\n".join(lines) + "\n")
    c = KafkaClientConfig.load(path)
    assert (c.sasl_mechanism, c.sasl_username, c.sasl_password, c.ssl_cafile) == ("PLAIN", "site", SECRET,
                                                                                  str(files / "ca.pem"))
    assert SECRET not in repr(c) and SECRET not in str(c) and str(c) == "SASL_SSL as site (PLAIN)"


@pytest.mark.parametrize("text, error", [
    ("security.protocol=SSL\nbootstrap.servers=x:9092\n", "unknown key 'bootstrap.servers'"),
    ("security.protocol=SSL\nssl.truststore.location=/x.jks\n",
     "'ssl.truststore.location' is not supported: kafka-python reads PEM"),
    ("security.protocol=TLS\n", "security.protocol = 'TLS': expected one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
    ("security.protocol=SASL_SSL\nsasl.mechanism=GSSAPI\nsasl.username=a\nsasl.password=b\n",
     "sasl.mechanism = 'GSSAPI'"),
    ("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.username=a\n", "needs sasl.password"),
    ("security.protocol=SSL\nsasl.username=a\n", "sasl.* keys are set but security.protocol is SSL"),
    ("security.protocol=SSL\nssl.ca.location=missing.pem\n", "ssl.ca.location = "),
    ("security.protocol=PLAINTEXT\nssl.ca.location=ca.pem\n",
     "ssl.ca.location is set but security.protocol is PLAINTEXT"),
    ("security.protocol=SSL\nssl.certificate.location=ca.pem\n",
     "needs both ssl.certificate.location and ssl.key.location"),
    ("sasl.password=a\nsasl.password.file=site.password\n", "'sasl.password.file' and 'sasl.password' both set"),
    ("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.jaas.config=nonsense password=\"x\";\n",
     "sasl.jaas.config: expected"),
    ("ssl.endpoint.identification.algorithm=maybe\n", "expected https"),
])
def test_what_cannot_be_used_is_refused_naming_the_key(files, text, error):
    with pytest.raises(ConfigError) as e:
        KafkaClientConfig.load(write(files, text.replace("password=b", f"password={SECRET}")))
    assert error in str(e.value) and str(files / "client.properties") in str(e.value) and SECRET not in str(e.value)


def test_a_password_file_others_can_read_is_refused_without_reading_it_out(files):
    (files / "site.password").chmod(0o644)
    path = write(files,
                 "security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.username=a\nsasl.password.file=site.password\n")
    with pytest.raises(ConfigError, match="readable by others .mode 644.; chmod 600") as e:
        KafkaClientConfig.load(path)
    assert SECRET not in str(e.value)


def test_every_key_is_documented_and_the_defaults_are_plaintext(files):
    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    assert [k for k in KEYS if k not in doc] == []  # docs/operations.md's table lists every key this file accepts
    assert KafkaLog("127.0.0.1:1").connector.security == {"security_protocol": "PLAINTEXT"}


def test_a_kafka_config_for_a_file_log_is_refused(files, tmp_path):
    path = write(files, "security.protocol=SSL\n")
    with pytest.raises(ConfigError, match="applies to kafka:// logs"):
        open_log(f"file://{tmp_path}/log", kafka_config=path)
    from tests.conftest import producer_config
    with pytest.raises(ConfigError, match="applies to kafka:// logs"):
        producer_config(run="r", log=f"file://{tmp_path}/log", kafka_config=path)
    with pytest.raises(ConfigError, match="cannot read it"):
        open_log("kafka://127.0.0.1:1", kafka_config=str(tmp_path / "nope.properties"))
