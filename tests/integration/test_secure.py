"""The pipeline over a secured broker (ops/kafka/start.sh --secure): SASL_SSL, SCRAM users, ACLs, signed updates.

The broker runs on its own ports and data dir (29192; 29292.. for three nodes), started and wiped here. Each
refusal is checked where it happens (the broker, or the TLS handshake) and for its one-line error.
"""
import os
import pathlib
import re
import subprocess
import sys
import threading

import pytest

from hilo.consumer.config import SiteConfig
from hilo.log import site_group, updates_topic
from hilo.log.base import prompts_topic, rollouts_topic
from hilo.log.kafka_config import KafkaClientConfig
from hilo.ops.acls import grant
from hilo.producer.producer import HiLoProducer
from hilo.producer.rollout_book import RolloutPolicy
from hilo.producer.rollout_exchange import RolloutExchange
from hilo.schemas.errors import LogError
from hilo.schemas.signing import generate
from tests.conftest import new_run, producer_config, publish_random, small_model
from tests.helpers import site_of, with_log

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.xdist_group("secure")]  # one worker: ports 29192-29297
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _start(tmp_path_factory, port, nodes):
    env = dict(os.environ, HILO_KAFKA_PORT=str(port),
               HILO_KAFKA_DIR=str(tmp_path_factory.mktemp(f"kafka-secure{nodes}")))
    subprocess.run([str(ROOT / "ops/kafka/start.sh"), "--secure", "--nodes", str(nodes)], env=env, check=True,
                   timeout=300)
    url = "kafka://" + ",".join(f"127.0.0.1:{port + 2 * i}" for i in range(nodes))
    return url, pathlib.Path(env["HILO_KAFKA_DIR"]) / "security", env


def _stop(env):
    subprocess.run([str(ROOT / "ops/kafka/stop.sh"), "--secure", "--wipe"], env=env, check=False, timeout=300)


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """(url, security dir) of a fresh secured single-node broker; stopped and wiped afterwards."""
    url, sec, env = _start(tmp_path_factory, 29192, 1)
    yield url, sec
    _stop(env)


def clients(sec):
    return {user: str(sec / "clients" / f"{user}.properties") for user in ("admin", "trainer", "site")}


def secured_run(url, sec, prefix, users=(("trainer", "trainer"), ("site", "site"))):
    """A run whose ACLs the admin granted: the trainer writes, the site reads."""
    run = new_run(prefix)
    with_log(url, lambda log: grant(log, run, dict(users)), kafka_config=clients(sec)["admin"])
    return run


def hilo(*args):
    """The CLI in a subprocess: (exit code, stderr)."""
    p = subprocess.run([sys.executable, "-m", "hilo.ops.cli", *args], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stderr


def test_a_signed_run_over_sasl_ssl_reaches_every_site_and_no_secret_reaches_a_log(secure, tmp_path, logs):
    url, sec = secure
    run = secured_run(url, sec, "sec")
    keys = generate(tmp_path / "keys")
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=url, kafka_config=clients(sec)["trainer"],
                                                           signing_key=str(keys[0]), checkpoint_every=3))
    publish_random(producer, 5)
    site = site_of(SiteConfig(log=url, run=run, site="eu-1", state_dir=str(tmp_path / "eu-1"), until_version=5,
                           export_adapters=False, trust=str(keys[1]), kafka_config=clients(sec)["site"]))
    assert site.run(progress=False) == 5 and site.follower.replica.digest == producer.replica.digest
    # the CLI at DEBUG, kafka-python's own config dump included: the password never appears
    password = (sec / "users" / "site.password").read_text().strip()
    code, err = hilo("--log-level", "DEBUG", "consume", "--log", url, "--run", run, "--site", "eu-2", "--state-dir",
                     str(tmp_path / "eu-2"), "--until-version", "5", "--no-export", "--no-progress", "--trust",
                     str(keys[1]),
                     "--kafka-config", clients(sec)["site"])
    assert code == 0 and "sasl_plain_password': '***'" in err  # the dump was logged, masked
    assert password not in err and (sec / "users" / "trainer.password").read_text().strip() not in err
    committed = logs(url, kafka_config=clients(sec)["site"]).committed(site_group(run, "eu-2"), updates_topic(run))
    assert committed is not None and password not in committed[1]
    config = KafkaClientConfig.load(clients(sec)["site"])
    assert password not in repr(config) and password not in str(config)
    producer.close()


def test_the_site_principal_cannot_write_an_update(secure, tmp_path, logs):
    url, sec = secure
    run = secured_run(url, sec, "sec")
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=url, kafka_config=clients(sec)["trainer"]))
    publish_random(producer, 2)
    as_site = logs(url, kafka_config=clients(sec)["site"])
    with pytest.raises(LogError) as e:  # a forged record sent with the site's credentials: the broker refuses it
        as_site.append(updates_topic(run), [(b"k", b"forged", {"hilo-run": run, "hilo-chunk": "0/1"})])
    # refused by the broker (the site may write RUN.rollouts only), in one line
    assert re.search(r"the broker refused it: this principal is not authorised on the (topic|cluster) "
                     r"\((TopicAuthorizationFailedError|ClusterAuthorizationFailedError)\)",
                     str(e.value)) and "\n" not in str(e.value)
    # the trainer makes the topics
    RolloutExchange.open(producer.log, run, RolloutPolicy(batch_prompts=1), prompt_partitions=2)
    with pytest.raises(LogError, match="not authorised on the topic"):  # a site issues no prompts ...
        logs(url, kafka_config=clients(sec)["site"]).append(prompts_topic(run), [(b"k", b"forged", {"hilo-run": run})])
    as_site = logs(url, kafka_config=clients(sec)["site"])
    # ... and writes rollouts
    assert as_site.append(rollouts_topic(run), [(b"k", b"a rollout", {"hilo-run": run})]) == [0]
    with pytest.raises(LogError, match="may not describe"):  # nor can it start a trainer of the run
        HiLoProducer.open(small_model(), producer_config(run=run, log=url, kafka_config=clients(sec)["site"]))
    site = site_of(SiteConfig(log=url, run=run, site="s", state_dir=str(tmp_path / "s"), until_version=2,
                              export_adapters=False,
                           kafka_config=clients(sec)["site"]))
    assert site.run(progress=False) == 2 and site.follower.replica.digest == producer.replica.digest
    # read after the site got v2 (so the commit markers are written): the trainer's two versions, nothing more
    records = logs(url, kafka_config=clients(sec)["site"]).read(updates_topic(run), 0, timeout_s=5.0)
    assert [r.headers["hilo-version"] for r in records] == ["1", "2"]
    producer.close()


@pytest.mark.parametrize("case, expect", [
    ("no credentials", "expects other security than PLAINTEXT"),
    ("wrong CA", "the broker's certificate is not trusted"),
    ("wrong password", "user 'site' (SCRAM-SHA-512): check sasl.username and the password"),
    ("site reads another run", "not authorised on the topic"),
])
def test_a_refused_client_gets_one_line_naming_the_cause(secure, tmp_path, case, expect):
    url, sec = secure
    run = secured_run(url, sec, "sec")
    other = secured_run(url, sec, "other", users=[("trainer", "trainer")])  # no site ACLs on this one
    HiLoProducer.open(small_model(), producer_config(run=other, log=url, kafka_config=clients(sec)["trainer"])).close()
    site_conf = pathlib.Path(clients(sec)["site"]).read_text()
    conf = tmp_path / "client.properties"
    if case == "wrong CA":
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tmp_path / "k.pem"),
                        "-out", str(tmp_path / "ca.pem"), "-days", "1", "-subj", "/CN=someone else"], check=True,
                       capture_output=True)
        conf.write_text(site_conf.replace(str(sec / "ca.pem"), str(tmp_path / "ca.pem")))
    elif case == "wrong password":
        conf.write_text("\n".join(line for line in site_conf.splitlines() if not line.startswith("sasl.password.file"))
                        + "\nsasl.password=not-the-password\n")
    elif case == "site reads another run":
        conf.write_text(site_conf)  # the site has ACLs on `run` only: reading `other`'s topics is refused
        run = other
    args = ["lag", "--log", url, "--run", run] + ([] if case == "no credentials" else ["--kafka-config", str(conf)])
    code, err = hilo(*args)
    assert code == 1 and expect in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "not-the-password" not in err


def test_three_secured_nodes_carry_a_run(tmp_path_factory, tmp_path):
    url, sec, env = _start(tmp_path_factory, 29292, 3)
    try:
        run = secured_run(url, sec, "sec3")
        producer = HiLoProducer.open(small_model(),
                                     producer_config(run=run, log=url, kafka_config=clients(sec)["trainer"]))
        part = producer.log.admin.describe_topics([updates_topic(run)])[0]["partitions"][0]
        assert sorted(part["replica_nodes"]) == [1, 2, 3]  # replicated across the three SASL_SSL brokers
        done = threading.Event()
        site = site_of(SiteConfig(log=url, run=run, site="s", state_dir=str(tmp_path / "s"), until_version=4,
                               export_adapters=False, kafka_config=clients(sec)["site"]))
        follower = threading.Thread(target=lambda: (site.run(progress=False), done.set()), daemon=True)
        follower.start()
        publish_random(producer, 4)
        follower.join(timeout=300)
        assert done.is_set() and site.follower.replica.digest == producer.replica.digest
        producer.close()
    finally:
        _stop(env)
