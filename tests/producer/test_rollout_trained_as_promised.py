"""The return path trains what it promised (issue 41): a group's staleness is checked against the version that trains
it, and a rollout written before its prompt was issued is never accepted, by a running trainer or a restarted one."""
import logging

from hilo.log import open_log
from hilo.log.base import rollouts_topic
from hilo.ops.digit_task import prompts
from hilo.producer.rollout_book import RolloutPolicy
from hilo.producer.rollout_exchange import RolloutExchange
from hilo.producer.rollout_ledger import RolloutLedger
from hilo.schemas.rollouts import RolloutRecord, Sampling
from tests.conftest import new_run

POLLS = 200  # reads until the exchange reaches the log's end (Kafka may hand out part of it per read)


def _rollout(run, pid, sample, version=0, reward=None, site="s"):
    reward = float(sample % 2 == 0) if reward is None else reward  # genuine rewards: 1 or 0 (the digit task's grid)
    return RolloutRecord(run, pid, sample, site, version, version, (1, 2), (-0.5, -0.5), reward,
                         "hilo.ops.digit_task:reward", "stop")


def _put(log, run, answers, **kw):
    log.append(rollouts_topic(run), [(pid.encode(), _rollout(run, pid, s, **kw).to_bytes(), {}) for pid, s in answers])


def _take(log, ex, version, most=None):
    """Poll until the exchange has read all of RUN.rollouts; the groups it handed out to train at `version`."""
    end, groups = log.end_offset(rollouts_topic(ex.run)), []
    for _ in range(POLLS):
        groups += ex.poll(version, timeout_s=0.5, **({} if most is None else {"most": most - len(groups)}))
        if ex.next_offset >= end:
            return groups
    raise AssertionError(f"the exchange read RUN.rollouts to {ex.next_offset}, not to its end {end}")


def test_a_group_completed_a_version_later_is_checked_against_the_version_that_trains_it(tmp_path, caplog):
    # sample 0 arrived at v1 (1 behind: allowed), sample 1 at v2: trained at v2, sample 0 would be 2 behind (S = 1).
    # It used to come out with staleness (1, 0), the one it had on arrival.
    url, run = f"file://{tmp_path}/log", new_run("late")
    log = open_log(url)
    log.create_topics(run)
    ex = RolloutExchange.open(log, run, RolloutPolicy(batch_prompts=1, max_staleness=1))
    assert ex.issue(prompts(run, Sampling(2, 1.0, 1.0, 3, 0))) == 2
    _put(log, run, [("p-0", 0)], version=0)
    assert _take(log, ex, 1) == []
    _put(log, run, [("p-0", 1)], version=2)
    _put(log, run, [("p-1", 0), ("p-1", 1)], version=2)
    with caplog.at_level(logging.WARNING, logger="hilo.producer.rollout_exchange"):
        groups = _take(log, ex, 2)
    assert [(g.prompt.prompt_id, g.staleness) for g in groups] == [("p-1", (0, 0))]
    assert dict(ex.book.dropped) == {"stale": 2} and "p-0" in ex.book.retired
    # said
    assert any(r.levelno == logging.WARNING for r in caplog.records if r.name == "hilo.producer.rollout_exchange")


def _forged_run(tmp_path, log_url):
    """Forged rollouts for prompt ids not yet issued: p-4's are read (refused as unknown) before p-4 is issued, p-5's
    are still unread when p-5 is issued; then every prompt is answered. Returns (log, run, policy, ledger, the live
    exchange), the live one at v1 with p-0 and p-1 trained and published, p-2 .. p-5 in flight."""
    run = new_run("forge")
    log = open_log(log_url)
    log.create_topics(run)
    policy, ledger = RolloutPolicy(batch_prompts=2,
                                   max_staleness=1), RolloutLedger(str(tmp_path / "t" / "rollouts.jsonl"))
    live = RolloutExchange.open(log, run, policy, ledger=ledger, prompt_partitions=2)
    source = prompts(run, Sampling(2, 1.0, 1.0, 3, 0))
    assert live.issue(source) == 4                                          # p-0 .. p-3
    forged = dict(reward=0.5, site="forger")                                # off the 0/1 grid: it shows in a mean
    _put(log, run, [("p-4", 0), ("p-4", 1)], **forged)
    assert _take(log, live, 0) == [] and dict(live.book.dropped) == {"unknown-prompt": 2}
    _put(log, run, [("p-0", 0), ("p-0", 1), ("p-1", 0), ("p-1", 1)])
    step1 = _take(log, live, 0, most=2)
    assert [g.prompt.prompt_id for g in step1] == ["p-0", "p-1"]
    live.record_step(1, step1)                                               # ... and v1 is published
    _put(log, run, [("p-5", 0), ("p-5", 1)], version=1, **forged)          # not read before p-5 is issued
    assert live.issue(source) == 2                                           # p-4, p-5
    _put(log, run, [(p, s) for p in ("p-2", "p-3", "p-4", "p-5") for s in (0, 1)], version=1)
    return log, run, policy, ledger, live


def _genuine(groups) -> bool:
    return all(x.site == "s" and x.reward in (0.0, 1.0) for g in groups for x in g.rollouts)


def test_forged_rollouts_written_before_their_prompts_are_never_trained_by_the_running_trainer(tmp_path, log_url):
    log, _, _, _, live = _forged_run(tmp_path, log_url)
    trained = _take(log, live, 1, most=2)
    live.record_step(2, trained)
    trained += _take(log, live, 2, most=2)
    assert [g.prompt.prompt_id for g in trained] == ["p-2", "p-3", "p-4", "p-5"] and _genuine(trained)
    assert dict(live.book.dropped) == {"unknown-prompt": 4}


def test_forged_rollouts_written_before_their_prompts_are_never_trained_after_a_restart(tmp_path, log_url):
    # a restarted trainer replays RUN.rollouts: it used to accept both forged pairs, then drop the genuine answers as
    # duplicates (a step's mean reward came out off the 0/1 grid)
    log, run, policy, ledger, _ = _forged_run(tmp_path, log_url)
    again = RolloutExchange.open(log, run, policy, ledger=ledger, prompt_partitions=2)  # the trainer restarted at v1
    assert again.restore(trainer_version=1) == {"trained": 2, "retired": 0, "in_flight": 4, "rollouts": 8}
    trained = again.poll(1, timeout_s=0, most=2) + again.poll(2, timeout_s=0, most=2)
    assert [g.prompt.prompt_id for g in trained] == ["p-2", "p-3", "p-4", "p-5"] and _genuine(trained)
    assert dict(again.book.dropped) == {"unknown-prompt": 4}
