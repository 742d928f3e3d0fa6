"""Positions survive a mirror: a site finds its place by version on any cluster that holds the run. A mirror
(MirrorMaker 2) copies records but not Kafka's transaction markers, so the same versions sit at smaller offsets
there; here the source's extra offsets are another writer's records, and the mirror copies only this run's."""
import threading

import pytest

from hilo.log import checkpoints_topic, open_log, updates_topic
from hilo.log.tail import locate, records
from hilo.producer.producer import HiLoProducer
from hilo.schemas import headers as H
from hilo.schemas.errors import LogError
from tests.conftest import new_run, producer_config, publish_random, small_model
from tests.helpers import open_site


def _source(tmp_path, run, versions):
    """A file log: the genesis checkpoint of `run`, 5 records of another writer, then `versions` versions."""
    url = f"file://{tmp_path}/a"
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=url, codec="dense", checkpoint_every=4))
    open_log(url).append(updates_topic(run), [(b"k", b"x" * 10, {H.RUN: "someone-else"})] * 5)
    publish_random(producer, versions)
    return url, producer


def _mirror(src_url, dst_url, run, copied: dict):
    """Copy `run`'s records that `copied` ({topic: source offset}) has not copied yet, as MirrorMaker does."""
    src, dst = open_log(src_url), open_log(dst_url)
    dst.create_topics(run)
    for topic in (updates_topic(run), checkpoints_topic(run)):
        recs = [r for r in records(src, topic, start=copied.get(topic, 0)) if r.headers.get(H.RUN) == run]
        if recs:
            dst.append(topic, [(r.key, r.value, r.headers) for r in recs])
        copied[topic] = src.end_offset(topic)


def _firsts(log, run) -> dict:
    """{version: offset of its first chunk} on this log."""
    return {r.parsed.version: r.offset for r in records(log, updates_topic(run))
            if r.headers.get(H.RUN) == run and r.headers[H.CHUNK].startswith("0/")}


def test_locate_finds_each_version_by_its_header_whatever_the_hint(tmp_path):
    run = new_run("locate")
    url, producer = _source(tmp_path, run, 6)
    _mirror(url, f"file://{tmp_path}/b", run, {})
    a, b = open_log(url), open_log(f"file://{tmp_path}/b")
    topic = updates_topic(run)
    fa, fb = _firsts(a, run), _firsts(b, run)
    assert all(fa[v] - fb[v] == 5 for v in fa)  # the same versions, 5 offsets apart
    for v in range(1, 7):
        assert locate(a, topic, run, v, fa[v]) == fa[v]        # the right hint is kept
        assert locate(b, topic, run, v, fa[v]) == fb[v]        # the source's offset is found again on the mirror
        assert locate(b, topic, run, v, 0) == 0                # before it: kept (what is re-read is checked, skipped)
    assert locate(b, topic, run, 7, fa[6] + 1) == b.end_offset(topic)  # at the head: read from the end
    with pytest.raises(LogError, match=rf"holds run '{run}' up to v6, behind this replica's v8: a mirror that lags"):
        locate(b, topic, run, 9, 0, patience_s=0)
    producer.close()


def test_a_site_moves_from_the_source_to_a_mirror_and_back_and_continues_exactly(tmp_path):
    run = new_run("failover")
    url, producer = _source(tmp_path, run, 5)
    mirror, copied = f"file://{tmp_path}/b", {}
    _mirror(url, mirror, run, copied)
    site = open_site(url, run, tmp_path, idle_exit_s=0.5)
    assert site.run(progress=False) == 5
    publish_random(producer, 3, seed=1)
    _mirror(url, mirror, run, copied)
    site = open_site(mirror, run, tmp_path, idle_exit_s=0.5)        # same state dir, the mirror's log
    assert site.run(progress=False) == 8 and site.follower.replica.digest == producer.replica.digest
    assert site.follower.skips == {}                                 # nothing read twice, nothing foreign
    publish_random(producer, 2, seed=2)
    site = open_site(url, run, tmp_path, idle_exit_s=0.5)            # and back to the source
    assert site.run(progress=False) == 10 and site.follower.replica.digest == producer.replica.digest
    # a new site on the mirror bootstraps from a mirrored checkpoint, whose replay offset is the source's
    _mirror(url, mirror, run, copied)
    late = open_site(mirror, run, tmp_path, name="late", idle_exit_s=0.5)
    assert late.run(progress=False) == 10 and late.follower.replica.digest == producer.replica.digest
    producer.close()


def _followed(tmp_path, name, versions):
    """A source holding `versions` versions of a new run, and site "s" that applied them all: (run, url, producer)."""
    run = new_run(name)
    url, producer = _source(tmp_path, run, versions)
    assert open_site(url, run, tmp_path, idle_exit_s=0.5).run(progress=False) == versions
    return run, url, producer


def _files(d) -> dict:
    return {p.name: p.read_bytes() for p in d.rglob("*") if p.is_file()}


def test_a_cluster_that_holds_another_run_under_the_same_name_is_one_line_and_the_sites_state_is_kept(tmp_path):
    run, url, producer = _followed(tmp_path, "samename", 4)
    state = _files(tmp_path / "s")
    # another cluster where someone started a different history under the same run name (another base, another seed)
    other = HiLoProducer.open(small_model(seed=7), producer_config(run=run, log=f"file://{tmp_path}/c", codec="dense"))
    publish_random(other, 6, seed=9)
    said = (r"its snapshot v4 is of history [0-9a-f]{12}, the log's checkpoints are of history [0-9a-f]{12} \(another "
            r"history")
    with pytest.raises(LogError, match=said) as e:
        open_site(f"file://{tmp_path}/c", run, tmp_path, idle_exit_s=0.5)
    assert "\n" not in str(e.value)
    assert _files(tmp_path / "s") == state                                  # nothing of the site's state changed
    site = open_site(url, run, tmp_path, idle_exit_s=0.5)                   # and it still follows its own run
    publish_random(producer, 1, seed=3)
    assert site.run(progress=False) == 5 and site.follower.replica.digest == producer.replica.digest
    producer.close()
    other.close()


def test_a_cluster_without_the_run_is_one_line_naming_the_runs_it_holds(tmp_path):
    run, _, producer = _followed(tmp_path, "absent", 2)
    elsewhere = f"file://{tmp_path}/d"
    HiLoProducer.open(small_model(), producer_config(run="someone-elses-run", log=elsewhere, codec="dense")).close()
    with pytest.raises(LogError, match=rf"site s: {elsewhere} holds no run '{run}' after 0.5 s \(it holds "
                                       rf"someone-elses-run\)") as e:
        open_site(elsewhere, run, tmp_path, wait_checkpoint_s=0.5)
    assert "\n" not in str(e.value)
    producer.close()


def test_a_cluster_that_shows_the_replicas_version_within_the_patience_is_waited_for(tmp_path):
    """A trainer's v and its checkpoint commit in one transaction, but a reader can see the checkpoint's partition
    committed before RUN.updates' (Kafka writes each partition's marker separately): a replica bootstrapped from that
    checkpoint finds RUN.updates one version short for a moment. Here the cluster shows v5 only after 0.5 s."""
    run = new_run("patience")
    url, producer = _source(tmp_path, run, 6)
    a, b, topic = open_log(url), open_log(f"file://{tmp_path}/b"), updates_topic(run)
    b.create_topics(run)
    recs = [r for r in records(a, topic) if r.headers.get(H.RUN) == run]
    early = [r for r in recs if r.parsed.version <= 4]
    b.append(topic, [(r.key, r.value, r.headers) for r in early])
    late = threading.Timer(0.5, lambda: b.append(topic, [(r.key, r.value, r.headers) for r in recs[len(early):]]))
    late.start()  # fault injection: the rest of the log becomes visible later
    at = len([r for r in recs if r.parsed.version <= 5])  # where v6 will start on b: past its visible end now
    try:
        assert locate(b, topic, run, 6, at) == at == _firsts(b, run)[6]  # kept once v5 showed up
    finally:
        late.join()
    with pytest.raises(LogError, match="up to v6, behind this replica's v8"):
        locate(b, topic, run, 9, 0, patience_s=0.3)               # still behind after the patience: one line
    producer.close()
