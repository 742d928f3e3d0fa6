"""The trainer's end of the return path on the embedded log: prompts issued under admission control, bad rollouts
refused and counted by reason (one warning line per reason), never part of a group."""
import logging

import pytest

from hilo.log import open_log
from hilo.log.base import prompts_topic, rollouts_topic
from hilo.ops.digit_task import prompts
from hilo.producer.rollout_book import RolloutPolicy
from hilo.producer.rollout_exchange import RolloutExchange, site_keys
from hilo.producer.rollout_ledger import RolloutLedger
from hilo.replay.history import check_return_path
from hilo.schemas.errors import ConfigError
from hilo.schemas.rollouts import RolloutRecord, Sampling
from hilo.schemas.signing import Signer, generate
from tests.conftest import new_run


def _rollout(run, pid, sample, tokens=(1, 2, 12), reward=1.0, logprob=-0.5, version=0):
    return RolloutRecord(run, pid, sample, "s", version, version, tokens, tuple(logprob for _ in tokens), reward,
                         "hilo.ops.digit_task:reward", "stop")


@pytest.mark.parametrize("signed", [False, True])
def test_bad_rollouts_are_refused_by_reason_and_never_trained_on(tmp_path, caplog, signed):
    url, run = f"file://{tmp_path}/log", new_run("rx")
    log = open_log(url)
    log.create_topics(run)
    trusted = signer = forger = None
    if signed:
        signer = Signer.load(generate(str(tmp_path / "site"))[0])
        forger = Signer.load(generate(str(tmp_path / "forger"))[0])
        trusted = site_keys(tmp_path / "site")
    ex = RolloutExchange.open(log, run, RolloutPolicy(batch_prompts=2, max_staleness=1), trusted_sites=trusted)
    assert ex.issue(prompts(run, Sampling(2, 1.0, 1.0, 3, 0))) == 4  # (S + 1) * B
    assert log.end_offset(prompts_topic(run)) == 4 and ex.book.room() == 0

    def put(r, key=signer, times=1):
        for _ in range(times):
            log.append(rollouts_topic(run), [(r.prompt_id.encode(), r.to_bytes(key), {})])
    put(_rollout(run, "p-0", 0))
    put(_rollout(run, "p-0", 1))
    put(_rollout(run, "p-0", 0))                                   # duplicate (its group is complete and out)
    put(_rollout("other", "p-1", 0), times=2)                      # another run's, twice: one warning line
    put(_rollout(run, "nope", 0))                                  # a prompt nobody issued
    put(_rollout(run, "p-1", 5))                                   # sample 5 of n = 2
    put(_rollout(run, "p-1", 0, tokens=(1, 2, 3, 4)))              # above max_tokens = 3
    put(_rollout(run, "p-1", 1, reward=float("nan")))              # NaN reward
    put(_rollout(run, "p-2", 0, logprob=float("inf")))             # infinite log-probability
    log.append(rollouts_topic(run), [(b"x", b"not a frame at all", {})])
    expect = {"duplicate": 1, "other-run": 2, "unknown-prompt": 1, "unknown-sample": 1, "too-long": 1, "non-finite": 2,
              "malformed": 1}
    if signed:
        put(_rollout(run, "p-3", 0), key=None)                     # unsigned
        put(_rollout(run, "p-3", 1), key=forger)                   # signed by a key no trusted site holds
        # the junk carries no signature either
        expect = {k: v for k, v in expect.items() if k != "malformed"} | {"unsigned": 2, "forged": 1}
    with caplog.at_level(logging.WARNING, logger="hilo.producer.rollout_exchange"):
        groups = []
        for _ in range(3):  # everything is on the log already; a few reads take it all
            groups += ex.poll(trainer_version=0, timeout_s=0)
    assert [g.prompt.prompt_id for g in groups] == ["p-0"] and len(groups[0].rollouts) == 2
    assert dict(ex.book.dropped) == expect
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == len(expect) and all(any(f"({reason})" in m for m in lines) for reason in expect), lines
    assert ex.book.room() == 1  # p-0 left flight: one more prompt may be issued


def test_admission_control_and_staleness(tmp_path):
    url, run = f"file://{tmp_path}/log", new_run("stale")
    log = open_log(url)
    log.create_topics(run)
    ex = RolloutExchange.open(log, run, RolloutPolicy(batch_prompts=1, max_staleness=1))
    source = prompts(run, Sampling(1, 1.0, 1.0, 3, 0))
    assert ex.issue(source) == 2 and ex.issue(source) == 0      # (1 + 1) * 1 in flight, no more
    log.append(rollouts_topic(run), [(b"p-0", _rollout(run, "p-0", 0, version=3).to_bytes(), {}),
                                     (b"p-1", _rollout(run, "p-1", 0, version=1).to_bytes(), {})])
    groups = ex.poll(trainer_version=4, timeout_s=0)             # p-1's sample is 3 versions old: S = 1 drops it
    assert [(g.prompt.prompt_id, g.staleness) for g in groups] == [("p-0", (1,))]
    assert dict(ex.book.dropped) == {"stale": 1} and ex.issue(source) == 2


def test_a_trust_directory_without_keys_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"trusted site keys .*: no \*.pub public keys there"):
        site_keys(tmp_path)


def test_the_return_path_history_names_a_lost_prompt_and_a_duplicated_sample(tmp_path):
    url, run = f"file://{tmp_path}/log", new_run("hist")
    log = open_log(url)
    log.create_topics(run)
    ex = RolloutExchange.open(log, run, RolloutPolicy(batch_prompts=3, max_staleness=0))
    assert ex.issue(prompts(run, Sampling(2, 1.0, 1.0, 3, 0))) == 3
    answers = [("p-0", 0), ("p-0", 1), ("p-1", 0), ("p-1", 1)]
    log.append(rollouts_topic(run), [(p.encode(), _rollout(run, p, s).to_bytes(), {}) for p, s in answers])
    assert check_return_path(log, run).anomalies == ["prompt p-2: no rollout (lost)"]
    log.append(rollouts_topic(run),
               [(b"p-1", _rollout(run, "p-1", 1).to_bytes(), {}), (b"p-9", _rollout(run, "p-9", 0).to_bytes(), {})])
    assert check_return_path(log, run).anomalies == ["prompt p-1: samples [0, 1, 1] of n = 2 (duplicated: [1])",
                                                      "rollouts for prompt p-9, which was never issued",
                                                     "prompt p-2: no rollout (lost)"]


def test_a_restarted_trainer_neither_loses_a_prompt_in_flight_nor_trains_on_a_group_twice(tmp_path):
    """The ledger line of version v is written before v is published: a restart at v - 1 (v never published) takes
    v's groups again; a restart at v does not, and rebuilds what was in flight from the log."""
    url, run = f"file://{tmp_path}/log", new_run("ledger")
    log = open_log(url)
    log.create_topics(run)
    policy, ledger = RolloutPolicy(batch_prompts=2,
                                   max_staleness=1), RolloutLedger(str(tmp_path / "t" / "rollouts.jsonl"))
    first = RolloutExchange.open(log, run, policy, ledger=ledger, prompt_partitions=2)
    assert first.issue(prompts(run, Sampling(2, 1.0, 1.0, 3, 0))) == 4
    answers = [("p-0", 0), ("p-0", 1), ("p-1", 0), ("p-1", 1), ("p-2", 0)]
    log.append(rollouts_topic(run), [(p.encode(), _rollout(run, p, s).to_bytes(), {}) for p, s in answers])
    groups = first.poll(trainer_version=0, timeout_s=0)
    assert sorted(g.prompt.prompt_id for g in groups) == ["p-0", "p-1"]
    first.record_step(1, groups)      # ... and the trainer dies before v1 is on the log
    again = RolloutExchange.open(log, run, policy, ledger=ledger, prompt_partitions=2)
    assert again.restore(trainer_version=0) == {"trained": 0, "retired": 0, "in_flight": 4, "rollouts": 5}
    assert sorted(g.prompt.prompt_id for g in again.poll(0, timeout_s=0)) == ["p-0", "p-1"] and again.issued == 4
    later = RolloutExchange.open(log, run, policy, ledger=ledger, prompt_partitions=2)  # v1 was published after all
    assert later.restore(trainer_version=1) == {"trained": 2, "retired": 0, "in_flight": 2, "rollouts": 1}
    log.append(rollouts_topic(run),
               [(b"p-0", _rollout(run, "p-0", 0).to_bytes(), {}), (b"p-2", _rollout(run, "p-2", 1).to_bytes(), {})])
    assert [g.prompt.prompt_id for g in later.poll(1, timeout_s=0)] == ["p-2"]
    assert dict(later.book.dropped) == {"duplicate": 1}   # p-0 was trained on at v1: never again
    # a line for v1 written again later (a second crash-and-retry of v1) replaces the first
    ledger.record(1, ["p-1"])
    assert ledger.settled(1) == ({"p-1"}, set()) and ledger.settled(0) == (set(), set())
    with open(ledger.path, "a") as f:
        f.write('{"v": 2, "trai')  # torn by a crash mid-write
    assert ledger.settled(5) == ({"p-1"}, set())


class _Away:
    """A log that is away while `down` (LogUnavailable, as a Kafka log reached before says it), the real one
    otherwise."""

    def __init__(self, log):
        self.log, self.down = log, False

    def __getattr__(self, name):
        attr = getattr(self.log, name)
        if name not in ("read", "append", "end_offset") or not callable(attr):
            return attr

        def call(*a, **kw):
            if self.down:
                from hilo.schemas.errors import LogUnavailable
                raise LogUnavailable("simulated: the broker is restarting")
            return attr(*a, **kw)
        return call


def test_an_outage_is_waited_out_and_the_prompt_it_stopped_is_sent_once_after(tmp_path):
    """While the log is away, issue() and poll() return (nothing issued, nothing read) instead of raising into the
    trainer's loop; the prompt whose publish failed is sent first when the log is back, once, and enters the book
    only then."""
    url, run = f"file://{tmp_path}/log", new_run("away")
    log = _Away(open_log(url))
    log.create_topics(run)
    ex = RolloutExchange.open(log, run, RolloutPolicy(batch_prompts=1, max_staleness=0))
    source = prompts(run, Sampling(1, 1.0, 1.0, 3, 0))
    log.down = True
    assert ex.issue(source) == 0 and ex.poll(0, timeout_s=0) == [] and ex.outage.down
    assert ex.unsent is not None and not ex.book.in_flight
    log.down = False
    assert ex.issue(source) == 1 and not ex.outage.down and ex.unsent is None
    log.log.append(rollouts_topic(run), [(b"p-0", _rollout(run, "p-0", 0).to_bytes(), {})])
    groups = ex.poll(0, timeout_s=0)
    assert [g.prompt.prompt_id for g in groups] == ["p-0"]
    assert check_return_path(log.log, run).ok  # p-0 issued once, answered once
