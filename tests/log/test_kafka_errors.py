"""The Kafka backend's error classification: by kafka-python's types and `retriable`, and the one workaround."""
import kafka.errors as K
import pytest
from kafka import KafkaProducer

from hilo.log import open_log, updates_topic
from hilo.log.kafka.errors import failure, is_fenced, is_retriable, unwrap
from hilo.schemas.errors import FencedError
from tests.conftest import KAFKA_URL, new_run


@pytest.mark.parametrize("error, retriable, fenced", [
    (K.NotLeaderForPartitionError(), True, False), (K.KafkaTimeoutError(), True, False),
    (K.TopicAuthorizationFailedError(), False, False), (K.ProducerFencedError(), False, True),
    (K.InvalidProducerEpochError(), False, True), (ValueError("not Kafka's"), False, False)])
def test_errors_are_classified_by_type(error, retriable, fenced):
    assert (is_retriable(error), is_fenced(error)) == (retriable, fenced)


def test_an_acl_refusal_is_one_line_naming_the_resource():
    assert "not authorised on the transactional id (TransactionalIdAuthorizationFailedError)" in str(
        failure("committing", K.TransactionalIdAuthorizationFailedError()))
    assert "not authorised on the consumer group" in str(failure("commit", K.for_code(30)()))


@pytest.mark.kafka
def test_a_zombie_producers_wrapped_error_is_fenced():
    """kafka-python reports a fenced transactional producer's next transaction as a plain KafkaError naming
    ProducerFencedError in its message (the workaround in errors.unwrap); a KafkaLog writer says FencedError."""
    bootstrap = KAFKA_URL[len("kafka://"):]
    run = new_run("wrapped")
    log = open_log(KAFKA_URL)
    log.create_topics(run)
    kw = dict(bootstrap_servers=bootstrap, transactional_id=f"zombie-{run}", acks="all", enable_idempotence=True)
    first = KafkaProducer(**kw)
    first.init_transactions()
    second = KafkaProducer(**kw)
    second.init_transactions()  # fences `first`
    with pytest.raises(K.KafkaError) as raised:
        first.begin_transaction()
        first.send(updates_topic(run), b"x", partition=0).get(timeout=30)
        first.commit_transaction()
    assert is_fenced(raised.value) and isinstance(unwrap(raised.value), K.ProducerFencedError)
    for p in (first, second):
        p.close(timeout=0)

    zombie, newer = open_log(KAFKA_URL), open_log(KAFKA_URL)
    zombie.become_writer(run, 0)
    newer.become_writer(run, 0)
    with pytest.raises(FencedError, match="was fenced"):
        zombie.append(updates_topic(run), [(b"1", b"v", {})])
    with pytest.raises(FencedError):  # for good: every later append says the same
        zombie.append(updates_topic(run), [(b"1", b"v", {})])
    for c in (zombie, newer, log):
        c.close()


@pytest.mark.parametrize("use", ["admin", "reader", "writer"])
def test_a_connect_that_fails_leaves_no_io_thread_behind(use):
    """kafka-python starts a client's I/O thread before it bootstraps and leaves it running when that fails; a reader
    reconnecting through an outage made one such thread every few seconds (connection.py closes it)."""
    import socket
    import threading

    from hilo.log.kafka.backend import KafkaLog
    from hilo.schemas.errors import LogError
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = KafkaLog(f"127.0.0.1:{port}", connect_timeout_ms=300)
    before = set(threading.enumerate())
    with pytest.raises(LogError, match="cannot connect"):
        {"admin": lambda: log.runs(), "reader": lambda: log.end_offset("t.updates"),
         "writer": lambda: log.append("t.updates", [(b"k", b"v", {})])}[use]()
    assert [t.name for t in threading.enumerate() if t not in before and t.is_alive()] == []
    log.close()
