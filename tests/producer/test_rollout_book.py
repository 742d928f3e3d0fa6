"""The trainer's ledger of the return path: admission control, complete groups, staleness, refusals by reason,
and the truncated importance weights."""
import math

import pytest
import torch

from hilo.producer.importance import mismatch_kl, truncated_weights
from hilo.producer.rollout_book import DROP_REASONS, RolloutBook, RolloutPolicy
from hilo.schemas.errors import ConfigError
from hilo.schemas.rollouts import PromptRecord, RolloutRecord, Sampling


def prompt(i, n=2, max_tokens=4, min_version=0, run="r"):
    return PromptRecord(run, f"p{i}", (1, 2, 3), Sampling(n, 1.0, 1.0, max_tokens, i), min_version)


def rollout(pid, sample, version, tokens=2, run="r"):
    return RolloutRecord(run, pid, sample, "s", version, version, tuple(range(tokens)), (-0.5,) * tokens, 1.0, "m:f",
                         "stop")


def test_admission_control_keeps_at_most_s_plus_one_times_b_in_flight():
    book = RolloutBook("r", RolloutPolicy(batch_prompts=3, max_staleness=1))
    issued = 0
    while book.room():
        book.issue(prompt(issued))
        issued += 1
    assert issued == 6 == len(book.in_flight)
    with pytest.raises(ConfigError, match=r"6 prompts in flight, the bound \(S \+ 1\) \* B is 6"):
        book.issue(prompt(99))
    for s in range(2):
        assert book.offer(rollout("p0", s, 0), trainer_version=0) is None
    [group] = book.complete_groups(trainer_version=0)
    assert group.prompt.prompt_id == "p0" and [r.sample for r in group.rollouts] == [0, 1] and book.room() == 1
    with pytest.raises(ConfigError, match="already issued"):
        book.issue(prompt(0))


def test_a_stale_sample_ages_its_group_out_and_frees_its_room():
    book = RolloutBook("r", RolloutPolicy(batch_prompts=1, max_staleness=2))
    book.issue(prompt(0, n=3))
    assert book.offer(rollout("p0", 0, version=5), trainer_version=7) is None  # 2 behind: allowed
    assert book.offer(rollout("p0", 1, version=4), trainer_version=7) == "stale"  # 3 behind
    assert book.complete_groups(trainer_version=7) == [] and "p0" not in book.in_flight and book.room() == 3
    assert book.dropped["stale"] == 2  # the late sample and the one accepted before it: never trained on
    assert book.offer(rollout("p0", 2, version=7), trainer_version=7) == "stale"  # its group aged out: never reopened


def test_staleness_is_recorded_per_sample():
    book = RolloutBook("r", RolloutPolicy(batch_prompts=1, max_staleness=4))
    book.issue(prompt(0))
    book.offer(rollout("p0", 1, version=9), trainer_version=10)
    book.offer(rollout("p0", 0, version=6), trainer_version=10)
    [group] = book.complete_groups(trainer_version=10)
    assert group.staleness == (4, 1)


@pytest.mark.parametrize("bad,reason", [
    (rollout("p0", 0, 3, run="other"), "other-run"),
    (rollout("nope", 0, 3), "unknown-prompt"),
    (rollout("p0", 2, 3), "unknown-sample"),
    (rollout("p0", 0, 3, tokens=5), "too-long"),
    (rollout("p0", 0, 1), "too-old-policy"),
])
def test_each_refusal_is_counted_by_its_reason(bad, reason):
    book = RolloutBook("r", RolloutPolicy(batch_prompts=2))
    book.issue(prompt(0, min_version=2))
    assert reason in DROP_REASONS
    assert book.offer(bad, trainer_version=3) == reason and book.dropped == {reason: 1} and book.accepted == 0


def test_a_duplicate_is_refused_and_counted():
    book = RolloutBook("r", RolloutPolicy(batch_prompts=1))
    book.issue(prompt(0))
    assert book.offer(rollout("p0", 0, 0), 0) is None
    assert book.offer(rollout("p0", 0, 0), 0) == "duplicate" and book.dropped["duplicate"] == 1 and book.accepted == 1


def test_a_bad_policy_names_its_field():
    with pytest.raises(ConfigError, match="max_staleness = -1"):
        RolloutPolicy(batch_prompts=1, max_staleness=-1)
    with pytest.raises(ConfigError, match="batch_prompts = 0"):
        RolloutPolicy(batch_prompts=0)
    assert RolloutPolicy(batch_prompts=8).max_in_flight == 40  # S = 4 by default


def test_truncated_importance_weights():
    trainer = torch.tensor([-1.0, -0.5, -3.0, -0.1])
    behaviour = torch.tensor([-1.0, -1.0, -1.0, -2.0])
    w, rate = truncated_weights(trainer, behaviour, cap=2.0)
    assert torch.allclose(w, torch.tensor([1.0, math.exp(0.5), math.exp(-2.0), 2.0]))  # exp(1.9) capped at 2
    assert rate == 0.25
    assert mismatch_kl(behaviour, behaviour) == 0.0 and mismatch_kl(trainer, behaviour) > 0
    with pytest.raises(ConfigError, match="one value per token"):
        truncated_weights(trainer, behaviour[:3])


def test_a_complete_group_waiting_for_a_later_step_is_checked_against_the_version_that_trains_it():
    book = RolloutBook("r", RolloutPolicy(batch_prompts=2, max_staleness=1))
    for i in range(3):
        book.issue(prompt(i))
    for pid in ("p0", "p1"):
        for s in range(2):
            assert book.offer(rollout(pid, s, version=0), trainer_version=1) is None
    assert book.offer(rollout("p2", 0, version=0), trainer_version=1) is None
    [group] = book.complete_groups(trainer_version=1, most=1)          # the step at v1 takes one group
    assert group.prompt.prompt_id == "p0" and group.staleness == (1, 1)
    assert book.complete() == ["p1"] and book.room() == 2             # p1 waits, still counted by admission control
    assert book.complete_groups(trainer_version=2, most=1) == []       # at v2 p1's samples would be 2 behind: S = 1
    # p2's one sample too
    assert dict(book.dropped) == {"stale": 3} and book.retired == {"p1", "p2"} and book.room() == 4
    assert book.offer(rollout("p2", 1, version=2), trainer_version=2) == "stale"  # its group aged out: never reopened


def test_a_rollout_written_before_its_prompt_was_issued_is_refused_as_for_an_unknown_prompt():
    book = RolloutBook("r", RolloutPolicy(batch_prompts=1))
    book.issue(PromptRecord("r", "p0", (1, 2, 3), Sampling(2, 1.0, 1.0, 4, 0), 0, rollouts_from=10))
    assert book.offer(rollout("p0", 0, 0), trainer_version=0, offset=9) == "unknown-prompt"
    assert book.offer(rollout("p0", 0, 0), trainer_version=0, offset=10) is None
    assert book.offer(rollout("p0", 1, 0), trainer_version=0, offset=11) is None
    [group] = book.complete_groups(trainer_version=0)
    assert dict(book.dropped) == {"unknown-prompt": 1} and len(group.rollouts) == 2
