"""A site that generates: take prompts from the run's queue, answer them with the policy vLLM serves, settle.

    hilo consume ... --vllm URL --generate --reward hilo.ops.digit_task:reward

One batch at a time, between versions, in the site's own loop: the adapter is never reloaded in the middle of a
request group, and each rollout records the version served when its request started and when it ended (equal
here by construction; the record keeps both so a pipelined site could say otherwise). A prompt that asks for a
newer policy than this site serves waits (on Kafka its partition pauses) until the site has applied it, while the
rest of the batch and the other partitions are answered: a site never holds servable prompts hostage. The batch's
rollouts and the prompts they answer are settled atomically (log/prompt_queue.py), so a kill at any instant loses
no prompt and duplicates no rollout.
"""
import importlib
import logging
import time
from dataclasses import dataclass

from hilo.log import retry
from hilo.schemas import crash_points
from hilo.schemas import headers as H
from hilo.schemas.errors import ConfigError, HiloError, LeaseLost, LogError, NoSuchTopic
from hilo.schemas.framing import split_trailer
from hilo.schemas.options import opt
from hilo.schemas.rollouts import PromptRecord, RolloutRecord, decode_rollout_record

from .vllm_serving import VllmDown, VllmError

logger = logging.getLogger(__name__)


def load_reward(spec: str):
    """The function `module:function` names: reward(prompt_ids, completion_ids) -> float."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ConfigError(f"--reward {spec!r}: expected MODULE:FUNCTION, e.g. hilo.ops.digit_task:reward")
    try:
        fn = getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise ConfigError(f"--reward {spec!r}: cannot import {module!r} ({e})") from None
    except AttributeError:
        raise ConfigError(f"--reward {spec!r}: module {module!r} has no {name!r}") from None
    if not callable(fn):
        raise ConfigError(f"--reward {spec!r}: {module}.{name} is not callable")
    return fn


@dataclass(frozen=True)
class GenerateConfig:
    """How a site generates: the reward it scores rollouts with, how many prompts it takes at a time and for how
    long, and the key it signs rollouts with; checked at construction. Each field's help is in its metadata
    (`hilo consume --help`, docs/cli.md)."""

    reward: str = opt(help="MODULE:FUNCTION of the reward, reward(prompt_ids, completion_ids) -> float (the digit "
                      "task's: hilo.ops.digit_task:reward)")
    batch_prompts: int = opt(4, "prompts taken at a time")
    lease_s: float = opt(120.0, "embedded log only: how long taken prompts stay this site's")
    signing_key: str | None = opt(None, "the site's Ed25519 private key; its rollouts are signed")

    def __post_init__(self):
        if self.batch_prompts < 1:
            raise ConfigError(f"GenerateConfig.batch_prompts = {self.batch_prompts}: must be >= 1")
        if not self.lease_s > 0:
            raise ConfigError(f"GenerateConfig.lease_s = {self.lease_s}: must be > 0")


class Generator:
    """Answers the run's prompts (from `log`'s prompt queue) for `site` through what it serves: `serving` (a
    consumer/serving.Serving) gives the vLLM server, the version it serves (`version`) and whether its loads
    succeed (`healthy`); the generator reads nothing else of the site. A site whose vLLM stops answering (a
    request fails, or a load does) says so once, gives its prompts back and leaves the queue (on Kafka its
    partitions go to the other sites); it checks the server again with a backoff (2 s doubling to 60 s) and takes
    prompts again once it answers. `sample` is a seam: a fault-injection harness (ops/faults/lies.py) overrides it in
    a subclass to make a site report rollouts other than what it served.
    """

    def __init__(self, cfg: GenerateConfig, log, serving, run: str, site: str, keyring=None, signer=None, metrics=None,
                 clock=time.monotonic):
        """`keyring`: the site's (schemas/keyring.py): prompts are verified with any trainer key it trusted so far;
        `signer`: the site's own key, for its rollouts."""
        self.cfg, self.log, self.server, self.run, self.site = cfg, log, serving.server, run, site
        self.queue = None       # opened once the trainer has made the return path's topics
        self.clock, self.retry = clock, retry.Backoff(2.0, 60.0)
        self.retry_at = 0.0     # when to try opening the queue (again)
        self.paused = False     # left the queue because vLLM stopped answering
        self._said_waiting = False
        self.serving, self.keyring, self.signer, self.metrics = serving, keyring, signer, metrics  # serving: read only
        self.reward = load_reward(cfg.reward)
        self.reward_name = cfg.reward
        self.settled = self.rollouts = 0
        self.refused = {}       # reason -> prompts refused (not decodable, not the trainer's, another run's)
        self.waiting_for = None  # the version a prompt asked for that this site does not serve yet
        self.deferred_at = None  # the version served when prompts were deferred (a newer one resumes them)

    def step(self, timeout_s: float = 0.2) -> int:
        """Take one batch, answer it and settle it; the number of rollouts settled (0 when there was nothing to do)."""
        version = self.serving.version
        if version is None:
            return 0  # nothing served yet
        if not self.serving.healthy:
            self._pause("vLLM does not take the newest version")
            return 0
        if not self._ensure_queue():
            return 0
        if self.deferred_at is not None and version > self.deferred_at:
            self.queue.resume()  # a newer policy serves now: the deferred prompts come again
            self.deferred_at = None
        lease = self.queue.take(self.cfg.batch_prompts, timeout_s)
        if not lease.records:
            return 0
        crash_points.reach("generate.taken")
        parsed = [(r, self._prompt(r)) for r in lease.records]
        later = [(r, p) for r, p in parsed if p is not None and p.min_version > version]
        if later:  # asked for a policy this site has not applied yet: those wait, the rest is answered now
            newest = max(p.min_version for _, p in later)
            if self.waiting_for != newest:
                logger.info("site %s: prompts ask for v%d, serving v%d: answering the others, catching up for those",
                            self.site, newest, version)
            self.waiting_for, self.deferred_at = newest, version
            lease = self.queue.defer(lease, [r for r, _ in later])
            kept = {id(r) for r in lease.records}
            parsed = [(r, p) for r, p in parsed if id(r) in kept]
            if not lease.records:
                return 0
        else:
            self.waiting_for = None
        prompts = [p for _, p in parsed if p is not None]
        out = []
        try:
            for i, p in enumerate(prompts):
                try:
                    out += self._answer(p, version)
                except VllmError as e:
                    if isinstance(e, VllmDown):
                        raise
                    # this prompt only (too long for the model, say): settled unanswered
                    self._count("engine-refused", 1, f"prompt {p.prompt_id}: {e}")
                if i == 0:
                    crash_points.reach("generate.generating")
        except VllmDown as e:
            self.queue.release(lease)
            self._pause(f"vLLM cannot generate ({e}); {len(lease)} prompts given back")
            return 0
        try:
            self.queue.settle(lease, out)
        except LeaseLost as e:
            self._count("lease_lost", len(lease), e)
            return 0
        except LogError as e:  # the log said no or did not answer: the prompts are read again (nothing was settled, or
            # it was, and they are not)
            logger.warning("site %s: settling failed (%s); the prompts are read again", self.site, e)
            self.queue.release(lease)
            return 0
        crash_points.reach("generate.settled")
        self.settled += len(lease)
        self.rollouts += len(out)
        if self.metrics is not None:
            self.metrics.inc("rollouts_generated", len(out))
        return len(out)

    def _pause(self, why: str) -> None:
        """Leave the queue (Kafka: the group, so the other sites get this site's partitions), saying so once. Said
        also when the queue was never opened (vLLM went away before this site took its first prompt)."""
        if self.paused:
            return
        logger.warning("site %s: %s; this site takes no prompts until its vLLM answers again", self.site, why)
        if self.queue is not None:
            self.queue.close()
        self.queue, self.paused, self.retry_at = None, True, self.clock() + self.retry.next()

    def _ensure_queue(self) -> bool:
        """Whether the queue is open, opening it when it is time: once the trainer made the return path's topics, and
        after a pause once the server answers again (checked with a backoff)."""
        if self.queue is not None:
            return True
        if self.clock() < self.retry_at:
            return False
        if self.paused:
            try:
                self.server.check()
            except VllmDown:
                self.retry_at = self.clock() + self.retry.next()
                return False
        try:
            self.queue = self.log.prompt_queue(self.run, self.site, self.cfg.lease_s)
        except NoSuchTopic as e:
            if not self._said_waiting:
                logger.info("site %s: waiting for the trainer to make the return path's topics (%s)", self.site, e)
                self._said_waiting = True
            self.retry_at = self.clock() + 1.0
            return False
        if self.paused:
            logger.info("site %s: vLLM answers again; taking prompts", self.site)
            self.paused = False
            self.retry.reset()
        return True

    def _prompt(self, rec) -> PromptRecord | None:
        """The prompt record, or None (counted, warned) when it cannot be the trainer's prompt of this run."""
        what = f"{self.queue.prompts} offset {rec.offset}"
        try:
            if self.keyring is not None:
                self.keyring.verify_any(*split_trailer(rec.value, what), what)
            p = decode_rollout_record(rec.value, what)
        except HiloError as e:
            self._count("malformed", 1, e)
            return None
        if not isinstance(p, PromptRecord) or p.run != self.run:
            self._count("other-run" if isinstance(p, PromptRecord) else "malformed", 1,
                        f"{what}: not a prompt of run {self.run}")
            return None
        return p

    def _answer(self, p: PromptRecord, version: int) -> list:
        """The n rollouts of one prompt, as (key, value, headers) records."""
        t0 = time.perf_counter()
        samples, end = self.sample(p, version)
        t1 = time.perf_counter()
        # what served it, for the trainer's audit
        engine = f"vllm {self.server.version}" if self.server.version else None
        out = []
        for i, (ids, logprobs, finish) in enumerate(samples):
            reward = float(self.reward(p.token_ids, ids))
            r = RolloutRecord(self.run, p.prompt_id, i, self.site, version, end, ids, logprobs, reward,
                              self.reward_name, finish if finish in ("stop", "length") else "abort",
                              {"generate_s": t1 - t0, "reward_s": time.perf_counter() - t1}, self.serving.dtype, engine)
            out.append((p.prompt_id.encode(), r.to_bytes(self.signer),
                        H.rollout_headers(self.run, p.prompt_id, self.site, version)))
        return out

    def sample(self, p: PromptRecord, version: int) -> tuple:
        """(samples, version served at the end) of prompt `p`, started at `version`: each sample is (token ids,
        behaviour log-probabilities, finish reason) as vLLM gave them. A seam (see the class)."""
        return self.server.complete(p.token_ids, p.sampling), self.serving.version

    def _count(self, reason, n, detail=None):
        first = reason not in self.refused
        self.refused[reason] = self.refused.get(reason, 0) + n
        if self.metrics is not None:
            self.metrics.inc("prompts_refused", n, reason=reason)
        if first:
            logger.warning("site %s: refused a prompt (%s): %s (said once per reason; counted)", self.site, reason,
                           detail)
