"""The trainer's ledger of the return path: prompts in flight, rollouts received, complete groups out.

    book = RolloutBook("exp1", RolloutPolicy(batch_prompts=8, max_staleness=4))
    while book.room():                       # admission control: at most (S + 1) * B prompts in flight
        publish(book.issue(next_prompt()))
    for r, offset in received: book.offer(r, trainer.version, offset)
    for group in book.complete_groups(trainer.version, most=B): ...  # train these now, at trainer.version

Bounded staleness as the field does it (TRL AsyncGRPO and SkyRL: S = 4; prime-rl ages a group out together):
a sample whose policy is more than S versions behind the trainer's is dropped with reason "stale", and with it
the rest of its group (a GRPO group must come from one prompt's complete set), which frees the prompt's room so
a fresh one can be issued. It is checked when the sample arrives and again when its group is handed out to be
trained, against the version that trains it: a complete group waiting for a later step can age out meanwhile, and
a group's staleness is what it is trained with. Admission control (AReaL) keeps at most (S + 1) * B prompts
issued and not yet handed out, which paces generation instead of discarding work. Every refusal is counted by
reason.
"""
import collections
from dataclasses import dataclass

from hilo.schemas.errors import ConfigError
from hilo.schemas.rollouts import PromptRecord, RolloutRecord

# Why a rollout is not trained on: the reasons the trainer counts (and its metrics label).
DROP_REASONS = ("stale", "other-run", "unknown-prompt", "unknown-sample", "duplicate", "too-long", "too-old-policy",
                # the audit's (producer/rollout_audit.py), asked by the book
                "bad-stamp", "audit-failed", "quarantined",
                # the last four: refused before the book (rollout_exchange)
                "malformed", "non-finite", "unsigned", "forged")
AUDIT_REASONS = ("bad-stamp", "audit-failed", "quarantined")
RETIRING = ("stale", "too-old-policy", *AUDIT_REASONS)  # the group can no longer complete: it leaves flight


@dataclass(frozen=True)
class RolloutPolicy:
    """batch_prompts (B): prompts per training step. max_staleness (S): how many versions a sample's policy may trail
    the trainer's. Default: 4. is_cap: the token-level importance weight is truncated at this. Default: 2.0"""

    batch_prompts: int
    max_staleness: int = 4
    is_cap: float = 2.0

    def __post_init__(self):
        if self.batch_prompts < 1:
            raise ConfigError(f"RolloutPolicy.batch_prompts = {self.batch_prompts}: must be >= 1")
        if self.max_staleness < 0:
            raise ConfigError(f"RolloutPolicy.max_staleness = {self.max_staleness}: must be >= 0 (0: synchronous)")
        if not self.is_cap >= 1.0:
            raise ConfigError(f"RolloutPolicy.is_cap = {self.is_cap}: must be >= 1")

    @property
    def max_in_flight(self) -> int:
        """Admission control's bound on prompts issued and not yet complete or dropped: (S + 1) * B."""
        return (self.max_staleness + 1) * self.batch_prompts


@dataclass(frozen=True)
class Group:
    """All n samples of one prompt, in sample order; staleness[i]: the version that trains it (the trainer's when it
    was handed out) - sample i's version_start."""

    prompt: PromptRecord
    rollouts: tuple
    staleness: tuple


class RolloutBook:
    """Prompts in flight and the samples received for them; complete groups come out once."""

    def __init__(self, run: str, policy: RolloutPolicy):
        self.run, self.policy = run, policy
        self.in_flight = {}                      # prompt id -> PromptRecord
        self.received = {}                       # prompt id -> {sample: RolloutRecord}
        # prompt ids completed: a late sample of one is a duplicate (ids are small)
        self.done = set()
        self.retired = set()                     # prompt ids aged out: a late sample of one is stale too
        self.retired_by = {}                     # prompt id -> the audit's reason, for prompts the audit retired
        self.dropped = collections.Counter()     # reason -> rollouts not trained on
        self.accepted = 0

    def room(self) -> int:
        """How many more prompts admission control allows now (a complete group not yet handed out still counts)."""
        return self.policy.max_in_flight - len(self.in_flight)

    def issue(self, prompt: PromptRecord) -> PromptRecord:
        """Record `prompt` as in flight (the caller publishes it); ConfigError when there is no room or the id was
        used."""
        if prompt.run != self.run:
            raise ConfigError(
                f"RolloutBook.issue: prompt {prompt.prompt_id} is of run {prompt.run!r}, not {self.run!r}")
        if prompt.prompt_id in self.in_flight or prompt.prompt_id in self.done or prompt.prompt_id in self.retired:
            raise ConfigError(f"RolloutBook.issue: prompt id {prompt.prompt_id!r} was already issued in run {self.run}")
        if self.room() < 1:
            raise ConfigError(f"RolloutBook.issue: {len(self.in_flight)} prompts in flight, the bound (S + 1) * B is "
                              f"{self.policy.max_in_flight}: wait for groups to complete")
        self.in_flight[prompt.prompt_id] = prompt
        self.received[prompt.prompt_id] = {}
        return prompt

    def restore(self, prompt: PromptRecord) -> None:
        """A prompt a previous trainer process issued, back in flight (admission control counts it, never refuses
        it)."""
        self.in_flight[prompt.prompt_id] = prompt
        self.received[prompt.prompt_id] = {}

    def offer(self, r: RolloutRecord, trainer_version: int, offset: int | None = None, judge=None) -> str | None:
        """Take one received rollout, read at `offset` of RUN.rollouts; returns None if accepted, else the reason it is
        dropped (and counted). judge(r, prompt) -> reason or None: asked last, of a rollout the book would accept (the
        audit)."""
        reason = self._check(r, trainer_version, offset)
        if reason is None and judge is not None:
            reason = judge(r, self.in_flight[r.prompt_id])
        if reason is None:
            self.received[r.prompt_id][r.sample] = r
            self.accepted += 1
            return None
        self.dropped[reason] += 1
        if reason in RETIRING:  # the group can no longer complete: it ages out together
            self._retire(r.prompt_id, reason)
        return reason

    def drop_site(self, site: str) -> list:
        """Retire every prompt in flight holding a sample from `site` (quarantined: its samples are dropped, counted
        "quarantined"); the prompt ids, in issue order."""
        out = [pid for pid, got in self.received.items() if any(r.site == site for r in got.values())]
        for pid in out:
            self._retire(pid, "quarantined")
        return out

    def _check(self, r: RolloutRecord, trainer_version: int, offset: int | None) -> str | None:
        if r.run != self.run:
            return "other-run"
        if r.prompt_id in self.retired:
            # a late sample of a group the audit dropped: the same reason
            return self.retired_by.get(r.prompt_id, "stale")
        if r.prompt_id in self.done or r.sample in self.received.get(r.prompt_id, {}):
            return "duplicate"
        prompt = self.in_flight.get(r.prompt_id)
        if prompt is None:
            return "unknown-prompt"
        if offset is not None and offset < prompt.rollouts_from:
            # written before the prompt was issued: whenever it is read, as a running trainer refuses it
            return "unknown-prompt"
        if r.sample >= prompt.sampling.n:
            return "unknown-sample"
        if len(r.completion_ids) > prompt.sampling.max_tokens:
            return "too-long"
        if r.version_start < prompt.min_version:
            return "too-old-policy"
        if trainer_version - r.version_start > self.policy.max_staleness:
            return "stale"
        return None

    def _retire(self, prompt_id: str, reason: str = "stale") -> None:
        """A prompt leaves flight: its samples so far are dropped with it (counted under `reason`: stale unless the
        audit dropped it)."""
        self.in_flight.pop(prompt_id, None)
        aged = len(self.received.pop(prompt_id, {}))
        if aged:
            self.dropped["stale" if reason == "too-old-policy" else reason] += aged
        self.retired.add(prompt_id)
        if reason in AUDIT_REASONS:
            self.retired_by[prompt_id] = reason

    def age_out(self, trainer_version: int) -> list:
        """Retire every prompt holding a sample more than S versions behind `trainer_version` (its group could only be
        trained staler than S); [(prompt id, samples dropped, their oldest version_start)], in issue order."""
        out = []
        for pid, got in list(self.received.items()):
            oldest = min((r.version_start for r in got.values()), default=trainer_version)
            if trainer_version - oldest > self.policy.max_staleness:
                out.append((pid, len(got), oldest))
                self._retire(pid)
        return out

    def complete(self) -> list:
        """Prompt ids whose groups are complete and not yet handed out, in issue order."""
        return [p for p, got in self.received.items() if len(got) == self.in_flight[p].sampling.n]

    def complete_groups(self, trainer_version: int, most: int | None = None) -> list:
        """At most `most` (default: all) complete groups, oldest issued first, to be trained at `trainer_version`: each
        is checked against it (those aged out are dropped, see age_out) and returned once (its prompt leaves flight);
        the rest wait, checked again when handed out."""
        self.age_out(trainer_version)
        out = []
        for pid in self.complete()[:most]:
            got = self.received.pop(pid)
            prompt = self.in_flight.pop(pid)
            self.done.add(pid)
            samples = tuple(got[i] for i in range(prompt.sampling.n))
            out.append(Group(prompt, samples, tuple(trainer_version - r.version_start for r in samples)))
        return out
