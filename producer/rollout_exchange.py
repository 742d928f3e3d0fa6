"""The trainer's end of the return path: prompts out (admission control), rollouts in, complete groups to train on.

    exchange = RolloutExchange.open(producer.log, run, RolloutPolicy(batch_prompts=8, max_staleness=4))
    exchange.issue(prompt_source)                      # as many prompts as (S + 1) * B allows
    groups = exchange.poll(producer.version, most=8)   # complete groups to train at this version, stale ones dropped
    for g in groups: weights = exchange.weights(g, my_logprobs_of(g))

Prompts go to RUN.prompts spread over its partitions (one consumer group of sites shares them); rollouts come
back on RUN.rollouts, read with read_committed (Kafka), so a site's aborted batch is never seen. Every rollout is
checked (decodes, within limits, finite, signed by a trusted site key when the trainer trusts keys, this run's,
an issued prompt's and written after that prompt was issued, not a duplicate, not stale) and a refusal is counted
by reason with one warning line per reason and minute. A group is checked for staleness again when `poll` hands
it out, against the version that trains it: train what poll returns at the version given, and ask for no more
groups than the step needs (the exchange keeps the rest and checks them when they are handed out).
"""
import dataclasses
import logging
import pathlib
import time

import torch

from hilo.log.base import prompts_topic, rollouts_topic
from hilo.log.outage import Outage
from hilo.schemas import headers as H
from hilo.schemas.errors import ConfigError, HiloError, LogUnavailable, NonFinite
from hilo.schemas.framing import split_trailer
from hilo.schemas.rollouts import RolloutRecord, decode_rollout_record
from hilo.schemas.keyring import Keyring
from hilo.schemas.signing import SignatureError, Unsigned, Verifier

from . import exchange_restore
from .importance import truncated_weights
from .rollout_book import RolloutBook

logger = logging.getLogger(__name__)
WARN_EVERY_S = 60.0


def site_keys(directory) -> dict:
    """{key id: Verifier} of every *.pub in `directory` (the sites' public keys the trainer trusts)."""
    d = pathlib.Path(directory)
    keys = {v.key_id: v for v in (Verifier.load(p) for p in sorted(d.glob("*.pub")))} if d.is_dir() else {}
    if not keys:
        raise ConfigError(f"trusted site keys {d}: no *.pub public keys there (`hilo keys generate --out DIR` makes a "
                          f"site's pair; copy its .pub here)")
    return keys


def verify_site(trusted: dict, value: bytes, what: str) -> None:
    """Raise SignatureError unless `value` is signed by one of the `trusted` site keys ({key id: Verifier})."""
    signed, trailer = split_trailer(value, what)
    if trailer is None:
        raise Unsigned(f"{what}: unsigned; this trainer trusts only its sites' keys")
    verifier = trusted.get(bytes(trailer[:8]))
    if verifier is None:
        raise SignatureError(f"{what}: signed by key {bytes(trailer[:8]).hex()}, which no trusted site holds")
    verifier.verify(signed, trailer, what)


def _stamps(r) -> str:
    """A rollout's version stamps, as a refusal line shows them."""
    return f"v{r.version_start}" if r.version_end == r.version_start else f"v{r.version_start}..v{r.version_end}"


class RolloutExchange:
    """Issues `run`'s prompts on `log` and takes its rollouts back, with the bookkeeping of RolloutBook."""

    def __init__(self, log, run: str, policy, partitions: int, trusted_sites: dict | None = None, keyring=None,
                 rollouts_from: int = 0, metrics=None, ledger=None, clock=time.monotonic, auditor=None):
        """Store the parts (no I/O); `RolloutExchange.open` is how a trainer makes one. `partitions`: RUN.prompts'.
        `keyring`: the trainer's (producer.keyring): prompts are signed with its signer of the moment (None:
        unsigned)."""
        self.log, self.run, self.metrics, self.ledger, self.clock = log, run, metrics, ledger, clock
        self.keyring = keyring if keyring is not None else Keyring()
        # producer/rollout_audit.Auditor: checks a share of rollouts, quarantines sites
        self.auditor = auditor
        self.book = RolloutBook(run, policy)
        self.trusted = trusted_sites
        self.prompts, self.rollouts = prompts_topic(run), rollouts_topic(run)
        self.partitions = partitions
        self.next_offset = rollouts_from    # RUN.rollouts read position
        self.issued = 0
        self.unsent = None                  # a prompt whose publish failed (the log was away): sent first next time
        self.outage = Outage(f"run {run}: rollouts")  # a log reached before and away now: waited out, never raised
        self.in_flight_peak = 0
        self._warned = {}                   # reason -> when it was last said
        self._retired_recorded = set()      # prompt ids the ledger already lists as retired
        self.restored = {}                  # what `restore` rebuilt: {"trained", "retired", "in_flight", "rollouts"}

    @classmethod
    def open(cls, log, run: str, policy, prompt_partitions: int = 4, **parts) -> "RolloutExchange":
        """Make (or check) the return path's topics on `log`, then the exchange; `parts`: the constructor's keywords."""
        log.create_rollout_topics(run, prompt_partitions)  # checks existing ones (another partition count is refused)
        return cls(log, run, policy, log.partitions(prompts_topic(run)), **parts)

    def restore(self, trainer_version: int) -> dict:
        """After a restart at `trainer_version`: every prompt issued before (all partitions of RUN.prompts) is trained,
        retired (per the ledger, up to that version) or in flight again, and the rollouts already returned for those
        in flight are offered again (RUN.rollouts from its start; those of settled prompts are passed over
        silently). Returns what was rebuilt (producer/exchange_restore.py reads it back)."""
        return exchange_restore.restore(self, trainer_version)

    def record_step(self, version: int, groups) -> None:
        """Before publishing `version`: write down the groups its step trains on (and the prompts retired since), and
        the audit's verdicts."""
        if self.auditor is not None:
            self.auditor.save()  # the verdicts so far, beside the ledger (a store-less auditor: nothing)
        if self.ledger is None:
            return
        new = self.book.retired - self._retired_recorded
        self.ledger.record(version, [g.prompt.prompt_id for g in groups], new)
        self._retired_recorded |= new

    def issue(self, source) -> int:
        """Publish prompts from the iterator `source` while admission control has room; how many were issued. Each
        carries rollouts_from, the end of RUN.rollouts now: an answer can only come after it (see
        RolloutBook._check)."""
        n, since = 0, None
        while self.book.room() > 0:
            prompt = self.unsent or next(source, None)
            if prompt is None:
                break
            self.unsent = prompt
            try:
                if since is None:  # asked once per call: every prompt of the call is published after it
                    since = self.log.end_offset(self.rollouts)
                prompt = self.unsent = dataclasses.replace(prompt, rollouts_from=since)
                # published, then in the book (a failed publish leaves the book as it was, and the prompt to send next)
                self.log.append(self.prompts, [(prompt.prompt_id.encode(), prompt.to_bytes(self.keyring.signer),
                                                H.prompt_headers(self.run, prompt.prompt_id))],
                                self.issued % self.partitions)
            except LogUnavailable as e:  # the caller's loop goes on (the trainer's publish waits out the outage)
                self.outage.failed(e)
                break
            self.outage.over()
            self.unsent = None
            self.book.issue(prompt)
            self.issued += 1
            n += 1
        self.in_flight_peak = max(self.in_flight_peak, len(self.book.in_flight))
        if self.metrics is not None:
            self.metrics.set("prompts_in_flight", len(self.book.in_flight))
        return n

    def poll(self, trainer_version: int, timeout_s: float = 1.0, most: int | None = None) -> list:
        """Read the rollouts that arrived, offer each to the book; at most `most` (default: all) complete groups, to
        be trained at `trainer_version`: each checked against it, its staleness relative to it."""
        try:
            batch = self.log.read(self.rollouts, self.next_offset, timeout_s=timeout_s)
        except LogUnavailable as e:  # nothing new while the log is away; the caller's loop goes on
            self.outage.wait(e)
            batch = None
        if batch is not None:
            self.outage.over()
            decoded = [(rec, self._rollout(rec)) for rec in batch]
            if self.auditor is not None:  # the audited ones scored together, one forward pass per version
                self.auditor.prepare([(r, self.book.in_flight[r.prompt_id]) for _, r in decoded
                                      if r is not None and r.prompt_id in self.book.in_flight])
            for rec, r in decoded:
                if r is not None:
                    self._offer(rec, r, trainer_version)
            self.next_offset = batch.next_offset
        for pid, n, oldest in self.book.age_out(trainer_version):  # complete or not, these can no longer be trained
            self._refused("stale",
                          f"prompt {pid}: its group ({n} samples so far) aged out before it was trained: a sample of "
                          f"v{oldest} is {trainer_version - oldest} versions behind trainer "
                          f"v{trainer_version} (S = {self.book.policy.max_staleness})", counted=True, n=n)
        groups = self.book.complete_groups(trainer_version, most)
        if self.metrics is not None:
            self.metrics.set("prompts_in_flight", len(self.book.in_flight))
            for g in groups:
                self.metrics.inc("rollouts_accepted", len(g.rollouts))
                for st in g.staleness:
                    self.metrics.observe("rollout_staleness", st)
        return groups

    def _offer(self, rec, r: RolloutRecord, trainer_version: int) -> str | None:
        """Offer `r`, read at `rec`, to the book (and the audit); a refusal is said (the book counted it)."""
        reason = self.book.offer(r, trainer_version, rec.offset,
                                 self.auditor.judge if self.auditor is not None else None)
        if reason is not None:
            self._refused(reason,
                          f"{self.rollouts} offset {rec.offset}: prompt {r.prompt_id} sample {r.sample} from site "
                          f"{r.site} ({_stamps(r)}, trainer at v{trainer_version})", counted=True)
        while self.auditor is not None and self.auditor.newly_quarantined:
            site = self.auditor.newly_quarantined.pop(0)
            before = self.book.dropped["quarantined"]
            retired = self.book.drop_site(site)
            n = self.book.dropped["quarantined"] - before
            if n and self.metrics is not None:
                self.metrics.inc("rollouts_dropped", n, reason="quarantined")
            if retired:
                logger.warning("run %s: %d samples of %d prompts from quarantined site %s dropped; fresh prompts "
                               "replace them", self.run, n, len(retired), site)
        return reason

    def _rollout(self, rec) -> RolloutRecord | None:
        what = f"{self.rollouts} offset {rec.offset}"
        try:
            if self.trusted is not None:
                verify_site(self.trusted, rec.value, what)
            r = decode_rollout_record(rec.value, what)
        except Unsigned as e:
            return self._refused("unsigned", e)
        except SignatureError as e:
            return self._refused("forged", e)
        except NonFinite as e:
            return self._refused("non-finite", e)
        except HiloError as e:
            return self._refused("malformed", e)
        if not isinstance(r, RolloutRecord):
            return self._refused("malformed", f"{what}: a prompt record on the rollouts topic")
        return r

    def _refused(self, reason, detail, counted=False, n=1):
        """Count `n` rollouts not trained on (unless the book did); one warning line per reason and minute."""
        if not counted:
            self.book.dropped[reason] += n
        if self.metrics is not None:
            self.metrics.inc("rollouts_dropped", n, reason=reason)
        now = self.clock()
        if now - self._warned.get(reason, -WARN_EVERY_S) >= WARN_EVERY_S:
            self._warned[reason] = now
            logger.warning("run %s: rollout refused (%s): %s (%d so far; said once a minute per reason)", self.run,
                           reason, detail, self.book.dropped[reason])
        return None

    def weights(self, group, trainer_logprobs: list) -> list:
        """Token-level truncated importance weights of each sample of `group`, from the trainer's log-probabilities of
        its completion tokens (one sequence per sample) and the behaviour ones vLLM returned."""
        out = [truncated_weights(lp, torch.tensor(r.logprobs, dtype=lp.dtype), self.book.policy.is_cap)
               for r, lp in zip(group.rollouts, trainer_logprobs)]
        if self.metrics is not None and out:
            self.metrics.set("importance_truncated_fraction", sum(f for _, f in out) / len(out))
        return out
