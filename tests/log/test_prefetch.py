"""Reading ahead (log/prefetch.py): the next batch is fetched while the caller works on the last, and what the
caller gets is exactly what a plain read gives, however it moves."""
import pytest

from hilo.log import open_log, updates_topic
from hilo.log.prefetch import Prefetcher
from hilo.schemas.errors import HiloError
from tests.conftest import new_run, producer_config, publish_random, small_model
from tests.helpers import open_site


def _topic_with(url, n):
    log = open_log(url)
    run = new_run("prefetch")
    log.create_topics(run)
    topic = updates_topic(run)
    log.append(topic, [(b"k", f"value {i}".encode() * 40, {"i": str(i)}) for i in range(n)])
    return log, topic


def _plain(batch):
    return [(r.offset, r.value, r.headers) for r in batch]


def test_the_next_batch_is_fetched_while_the_caller_works_and_a_seek_is_served_too(tmp_path):
    url = f"file://{tmp_path}/log"
    log, topic = _topic_with(url, 10)
    p = Prefetcher(open_log(url), topic, max_bytes=1)  # one record per batch: every read is one step ahead
    try:
        first = p.read(topic, 0, timeout_s=5)
        assert _plain(first) == _plain(log.read(topic, 0, max_bytes=1)) and first.next_offset == 1
        assert p.misses == 1 and p.hits == 0
        assert p.ahead(1, timeout_s=10)            # fetched before anyone asked for it
        got = [first]
        while got[-1].next_offset < 10:
            assert p.ahead(got[-1].next_offset, timeout_s=10)  # the thread keeps one step (or two) ahead of the caller
            got.append(p.read(topic, got[-1].next_offset, timeout_s=5))
        assert p.hits == 9 and p.misses == 1       # every read after the first was served from the read-ahead
        assert [r for b in got for r in _plain(b)] == _plain(log.read(topic, 0))
        again = p.read(topic, 3, timeout_s=5)       # the caller moved back (a half-read message is read again)
        assert _plain(again) == _plain(log.read(topic, 3, max_bytes=1)) and p.misses == 2
        assert not p.read(topic, 10, timeout_s=0.2)  # at the end: an empty batch within the timeout, not a hang
    finally:
        p.close()
    assert not p._thread.is_alive()


def test_an_error_of_the_reading_client_reaches_the_caller(tmp_path):
    url = f"file://{tmp_path}/log"
    _topic_with(url, 1)
    p = Prefetcher(open_log(url), "no-such-run.updates")
    try:
        with pytest.raises(HiloError, match="no-such-run.updates"):
            p.read("no-such-run.updates", 0, timeout_s=5)
    finally:
        p.close()


def test_sites_with_and_without_prefetch_apply_the_same_versions(log_url, tmp_path):
    run = new_run("prefetch-site")
    producer_model = small_model()
    from hilo.producer.producer import HiLoProducer
    producer = HiLoProducer.open(producer_model, producer_config(run=run, log=log_url))
    publish_random(producer, 3)
    ahead = open_site(log_url, run, tmp_path, "ahead", until_version=8, export_adapters=False)
    plain = open_site(log_url, run, tmp_path, "plain", until_version=8, export_adapters=False, prefetch=False)
    assert isinstance(ahead.follower.reader, Prefetcher) and plain.follower.reader is plain.follower.log
    publish_random(producer, 5)
    assert ahead.run(progress=False) == plain.run(progress=False) == 8
    assert ahead.follower.replica.digest == plain.follower.replica.digest == producer.replica.digest
    assert ahead.follower.reader.hits + ahead.follower.reader.misses > 0
    assert not ahead.follower.reader._thread.is_alive()  # run() closed it
    producer.close()


def test_a_site_that_is_only_polled_stops_its_read_ahead_on_close(tmp_path):
    url, run = f"file://{tmp_path}/log", new_run("prefetch-close")
    from hilo.producer.producer import HiLoProducer
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=url))
    publish_random(producer, 3)
    site = open_site(url, run, tmp_path, "polled", export_adapters=False)
    # polled as `hilo bench serve` and a metrics test do, never run()
    for event in site.follower.updates(timeout_s=1.0):
        site.on_event(event)
    assert site.follower.replica.digest == producer.replica.digest
    reader = site.follower.reader
    assert reader._thread.is_alive()
    site.close()
    site.close()  # a second close does nothing
    assert not reader._thread.is_alive()
    producer.close()
