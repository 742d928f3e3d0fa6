"""One contract, two backends: the embedded file log and Apache Kafka behave the same for hilo-sync."""
import pytest

from hilo.log import checkpoints_topic, open_log, prompts_topic, rollouts_topic, updates_topic
from hilo.schemas.errors import ConfigError, LogError
from tests.conftest import KAFKA_URL, new_run


@pytest.fixture
def log_and_run(log_url):
    log = open_log(log_url)
    run = new_run()
    created = log.create_topics(run)
    assert sorted(created) == sorted([updates_topic(run), checkpoints_topic(run)])
    yield log, run
    log.close()


def test_append_read_offsets(log_and_run):
    log, run = log_and_run
    t = updates_topic(run)
    assert log.end_offset(t) == 0
    offsets = log.append(t, [(str(i).encode(), bytes([i]) * (i + 1), {"hilo-run": run, "n": str(i)}) for i in range(5)])
    assert offsets == [0, 1, 2, 3, 4]
    assert log.end_offset(t) == 5 and log.begin_offset(t) == 0
    recs = log.read(t, 2, timeout_s=5)
    assert [r.offset for r in recs] == [2, 3, 4]
    assert [r.value for r in recs] == [b"\x02" * 3, b"\x03" * 4, b"\x04" * 5]
    assert recs[0].key == b"2" and recs[0].headers == {"hilo-run": run, "n": "2"}
    assert log.read(t, 5, timeout_s=0.2) == []
    assert [r.offset for r in log.read(t, 0, timeout_s=5)][:2] == [0, 1]  # seeking backwards works


def test_groups_commit_and_list(log_and_run):
    log, run = log_and_run
    t = updates_topic(run)
    log.append(t, [(b"1", b"x", {})])
    assert log.committed(f"hilo.{run}.a", t) is None
    log.commit(f"hilo.{run}.a", t, 1, '{"version": 1}')
    log.commit(f"hilo.{run}.b", t, 0, "{}")
    log.commit(f"hilo.{run}.a", t, 1, '{"version": 2}')
    assert log.committed(f"hilo.{run}.a", t) == (1, '{"version": 2}')
    assert log.groups(f"hilo.{run}.") == [f"hilo.{run}.a", f"hilo.{run}.b"]


def test_create_is_idempotent_and_missing_topic_is_named(log_and_run):
    log, run = log_and_run
    assert log.create_topics(run) == []
    with pytest.raises(LogError, match="topic 'no-such-run.updates' does not exist"):
        log.check_topic("no-such-run.updates")


def test_the_return_path_topics(log_and_run, log_url):
    log, run = log_and_run
    assert sorted(log.create_rollout_topics(run, 3)) == sorted([prompts_topic(run), rollouts_topic(run)])
    assert log.create_rollout_topics(run, 3) == []  # idempotent: checked, not made again
    log.check_topic(rollouts_topic(run))
    with pytest.raises(ConfigError, match="prompt_partitions = 0: must be >= 1"):
        log.create_rollout_topics(run, 0)
    if log_url.startswith("kafka://"):  # the broker holds the partition count; the file log shares by leases
        log.check_topic(prompts_topic(run), 3)
        with pytest.raises(LogError, match="has 3 partitions; hilo-sync needs exactly 5 \\(hilo topics create "
                                           "--prompt-partitions\\)"):
            log.create_rollout_topics(run, 5)


@pytest.mark.kafka
@pytest.mark.parametrize("bad", [{"num_partitions": 2}, {"configs": {"cleanup.policy": "compact"}}])
def test_kafka_refuses_misconfigured_topics(bad):
    log = open_log(KAFKA_URL)
    run = new_run()
    spec = {"num_partitions": 1, "replication_factor": 1} | bad
    log.admin.create_topics({updates_topic(run): spec})
    with pytest.raises(LogError, match="2 partitions; hilo-sync needs exactly 1|cleanup.policy=compact"):
        log.create_topics(run)
    log.close()


@pytest.mark.kafka
def test_a_reader_replaced_while_every_broker_is_down_waits_instead_of_failing():
    """A site's reader is replaced after two failed reads; if that happens while the whole cluster is down, the
    reconnect failing is a retriable empty read, and the client keeps no "unreachable" verdict. (Found by the
    whole-cluster restart test: the site thread died with "cannot connect within 10s", and its commits with it.)"""
    log = open_log(KAFKA_URL)
    run = new_run("reconnect")
    log.create_topics(run)
    t = updates_topic(run)
    log.append(t, [(b"0", b"v0", {})])
    assert [r.value for r in log.read(t, 0, timeout_s=5)] == [b"v0"]
    # every broker gone: nothing listens on port 1
    reachable, log.connector.bootstrap = log.connector.bootstrap, "127.0.0.1:1"
    log.reader.replace()  # what two failed reads do
    assert log.read(t, 0, timeout_s=0.5) == []
    assert log.connector.reached  # no "unreachable" verdict kept
    log.connector.bootstrap = reachable  # the cluster is back
    for _ in range(20):  # bounded: each empty read already waited on the broker
        got = log.read(t, 0, timeout_s=2)
        if got:
            break
    assert [r.value for r in got] == [b"v0"]
    log.close()


@pytest.mark.kafka
def test_every_client_retries_a_broker_that_went_away_within_a_second_of_its_return():
    """kafka-python's reconnect backoff doubles up to 30 s by default: after a 45-s broker restart the trainer stalled
    21 s and a site 38 s with the broker back (tests/integration/test_outage.py). Every client the connector makes
    caps it at 1 s, in kafka-python's own backoff arithmetic, after any number of failed reconnects."""
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    log = open_log(KAFKA_URL)
    for cls in (KafkaConsumer, KafkaProducer, KafkaAdminClient):
        client = log.connector.connect(cls)
        try:
            net = client._sender._client if cls is KafkaProducer else client._client  # the client's network client
            manager = net._manager
            for _ in range(12):  # twelve failed reconnects: 50 ms doubled eleven times is 102 s
                manager.update_backoff("gone")
            assert manager.connection_delay("gone") <= 1.2, cls.__name__  # 1 s, jitter up to +20%
        finally:
            client.close()
    log.close()
