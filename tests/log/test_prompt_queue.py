"""The return path's queue on both backends: prompts spread over sites, each settled exactly once with its rollouts;
a site that lost its prompts settles nothing."""
import pytest

from hilo.log import open_log
from hilo.log.base import prompts_topic, rollouts_topic
from hilo.schemas import headers as H
from hilo.schemas.errors import LeaseLost
from tests.conftest import KAFKA_URL, new_run
from tests.helpers import wait_until


def _setup(url, run, n, partitions=3):
    log = open_log(url)
    log.create_topics(run)
    log.create_rollout_topics(run, partitions)
    for i in range(n):
        record = (f"p{i}".encode(), f"prompt {i}".encode(), {H.RUN: run, H.PROMPT: f"p{i}"})
        log.append(prompts_topic(run), [record], i % log.partitions(prompts_topic(run)))
    return log


def _answers(log, run):
    """prompt id -> how many rollout records answer it (read_committed: settled batches only)."""
    out, off = {}, 0
    end = log.end_offset(rollouts_topic(run))
    while off < end:
        batch = log.read(rollouts_topic(run), off, timeout_s=5)
        for r in batch:
            out[r.key.decode()] = out.get(r.key.decode(), 0) + 1
        off = batch.next_offset
    return out


def _rollouts(lease, site):
    return [(r.key, f"{site} answers {r.value.decode()}".encode(), {H.PROMPT: r.key.decode(), H.SITE: site})
            for r in lease.records]


def test_two_sites_answer_every_prompt_exactly_once(log_url):
    run, n = new_run("queue"), 12
    log = _setup(log_url, run, n)
    sites = {name: log.prompt_queue(run, name, 60.0) for name in ("a", "b")}
    by = {}
    try:
        def drain():
            for name, q in sites.items():
                lease = q.take(3, timeout_s=0.5)
                if lease.records:
                    q.settle(lease, _rollouts(lease, name))
                    for r in lease.records:
                        by.setdefault(r.key.decode(), []).append(name)
            return len(by) == n
        wait_until(drain, 120, "every prompt settled", every_s=0)
    finally:
        for q in sites.values():
            q.close()
    assert all(len(v) == 1 for v in by.values()), by
    assert _answers(log, run) == {f"p{i}": 1 for i in range(n)}
    log.close()


def test_an_expired_lease_goes_to_another_site_and_its_late_settle_appends_nothing(tmp_path):
    url, run = f"file://{tmp_path}/log", new_run("lease")
    log = _setup(url, run, 2)
    now = [1000.0]
    slow = log.prompt_queue(run, "slow", 30.0)
    slow.clock = lambda: now[0]
    lease = slow.take(2, timeout_s=0)
    assert [r.key for r in lease.records] == [b"p0", b"p1"]
    fast = log.prompt_queue(run, "fast", 30.0)
    fast.clock = lambda: now[0]
    assert not fast.take(2, timeout_s=0).records  # held
    now[0] += 31                                   # the slow site stalled past its lease
    taken = fast.take(2, timeout_s=0)
    assert [r.key for r in taken.records] == [b"p0", b"p1"]
    with pytest.raises(LeaseLost, match=r"site slow: the lease on prompts at offsets \[0, 1\] ran out"):
        slow.settle(lease, _rollouts(lease, "slow"))
    fast.settle(taken, _rollouts(taken, "fast"))
    assert _answers(log, run) == {"p0": 1, "p1": 1}
    assert not slow.take(2, timeout_s=0).records and not fast.take(2, timeout_s=0).records


def test_rollouts_appended_by_a_site_that_died_before_its_table_update_count_as_the_answer(tmp_path):
    """The append is the commit: the next site rolls the lease forward instead of answering the prompts again."""
    url, run = f"file://{tmp_path}/log", new_run("rollfwd")
    log = _setup(url, run, 3)
    q = log.prompt_queue(run, "a", 30.0)
    lease = q.take(2, timeout_s=0)
    # what settle does before it updates the table, done by hand: the rollouts tagged with the lease, appended
    log.append(rollouts_topic(run), [(k, v, h | {H.LEASE: lease.handle}) for k, v, h in _rollouts(lease, "a")])
    other = log.prompt_queue(run, "b", 30.0)
    rest = other.take(5, timeout_s=0)
    assert [r.key for r in rest.records] == [b"p2"]  # p0 and p1 are answered, not free again
    with pytest.raises(LeaseLost):
        q.settle(lease, _rollouts(lease, "a"))       # a second settle of the same lease appends nothing
    assert _answers(log, run) == {"p0": 1, "p1": 1}


def test_a_site_restarted_under_its_name_frees_its_dead_incarnations_leases(tmp_path):
    url, run = f"file://{tmp_path}/log", new_run("restart")
    log = _setup(url, run, 2)
    dead = log.prompt_queue(run, "a", 600.0)
    lease = dead.take(2, timeout_s=0)
    assert len(lease) == 2
    other = log.prompt_queue(run, "b", 600.0)
    assert not other.take(2, timeout_s=0).records           # held by a's lease for ten minutes ...
    again = log.prompt_queue(run, "a", 600.0)                # ... until a starts again
    assert [r.key for r in again.take(2, timeout_s=0).records] == [b"p0", b"p1"]
    # the old incarnation, if it was only stalled, settles nothing
    with pytest.raises(LeaseLost):
        dead.settle(lease, _rollouts(lease, "a"))


def test_a_deferred_prompt_waits_the_rest_is_answered_and_every_prompt_is_answered_once(log_url):
    """A site that cannot serve one prompt yet answers the others now; on Kafka the deferred prompt's partition waits
    (offsets commit in order, so what follows it there waits too) until `resume`; on the embedded log it is free at
    once."""
    run, n = new_run("defer"), 6
    log = _setup(log_url, run, n, partitions=1)
    q = log.prompt_queue(run, "a", 60.0)
    kafka = log_url.startswith("kafka")
    try:
        got = []
        wait_until(lambda: got.append(q.take(4, timeout_s=0.5)) or len(got[-1]) >= 3, 120, "a batch of 3 prompts")
        lease = got[-1]
        recs = sorted(lease.records, key=lambda r: r.offset)
        later = recs[1]
        now = q.defer(lease, [later])
        assert [r.offset for r in now.records] == ([recs[0].offset] if kafka
                                                   else [r.offset for r in recs if r is not later])
        q.settle(now, _rollouts(now, "a"))
        again = q.take(4, timeout_s=1.0)
        if kafka:
            assert not again.records  # the partition waits at the deferred prompt
            q.resume()
            wait_until(lambda: got.append(q.take(4, timeout_s=0.5)) or bool(got[-1].records), 60,
                       "the deferred prompt again")
            again = got[-1]
        assert min(r.offset for r in again.records) == later.offset
        q.settle(again, _rollouts(again, "a"))

        def drain():
            lease = q.take(4, timeout_s=0.5)
            if lease.records:
                q.settle(lease, _rollouts(lease, "a"))
            return len(_answers(log, run)) == n
        wait_until(drain, 120, "every prompt settled", every_s=0)
    finally:
        q.close()
    assert _answers(log, run) == {f"p{i}": 1 for i in range(n)}
    log.close()


@pytest.mark.kafka
def test_an_idle_member_counts_no_transaction_marker_as_a_waiting_prompt():
    """The trainer appends prompts in transactions, whose commit markers take offsets: once every prompt is settled
    the stuck-member watch finds no backlog (it used to count one prompt per partition, the last marker, and rejoin
    the group every 30 s while idle); a prompt appended after that is found."""
    run = new_run("backlog")
    trainer = open_log(KAFKA_URL)
    trainer.create_topics(run)
    trainer.create_rollout_topics(run, 2)
    trainer.become_writer(run, 0)  # transactional appends, as the trainer's
    for i in range(4):
        trainer.append(prompts_topic(run), [(f"p{i}".encode(), b"prompt", {H.RUN: run, H.PROMPT: f"p{i}"})], i % 2)
    site = open_log(KAFKA_URL)
    queue = site.prompt_queue(run, "a", 60.0)
    try:
        settled = []

        def drain():
            lease = queue.take(4, timeout_s=0.5)
            if lease.records:
                queue.settle(lease, _rollouts(lease, "a"))
                settled.extend(r.key for r in lease.records)
            return len(settled) == 4
        wait_until(drain, 120, "every prompt settled", every_s=0)
        assert [site.end_offset(prompts_topic(run), p) for p in (0, 1)] == [4, 4]  # 2 prompts, 2 markers each
        assert queue.member._backlog() == {}
        trainer.append(prompts_topic(run), [(b"p4", b"prompt", {H.RUN: run, H.PROMPT: "p4"})], 1)
        assert queue.member._backlog() == {1: 3}  # offsets past the committed 3: a marker, the prompt, its marker
    finally:
        queue.close()
        site.close()
        trainer.close()
