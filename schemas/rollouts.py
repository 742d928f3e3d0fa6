"""The two records of the return path (SPEC.md, "Prompts and rollouts"): the trainer's prompts, the sites' rollouts.

    RUN.prompts   PromptRecord   the trainer's work queue: token ids, sampling parameters, the oldest policy
                                 version allowed to answer
    RUN.rollouts  RolloutRecord  one sample of one prompt: the policy versions that served it, completion
                                 tokens, vLLM's behaviour log-probabilities, the reward and where it came from

Framed like every record (msgpack + zstd, optional Ed25519 trailer: a site signs its rollouts with its own key).
Token ids travel as little-endian uint32 arrays and log-probabilities as float32 arrays (bin fields), so a
record of 8k tokens is 64 KiB, not a msgpack list of 8k ints. Decoding checks every field and names it; a
non-finite reward or log-probability is a NonFinite (a reader skips it with reason "non-finite").
"""
import math
from dataclasses import dataclass, field

import numpy as np

from . import fields as F
from .errors import LimitExceeded, MalformedMessage, NonFinite
from .framing import KIND_PROMPT, KIND_ROLLOUT, frame, unframe
from .limits import DEFAULT_LIMITS, Limits

FINISH_REASONS = ("stop", "length", "abort")   # vLLM's finish_reason values a rollout may carry
MAX_SAMPLES = 1024                             # n per prompt
MAX_ID_BYTES = 128                             # prompt ids and site names
LOGPROB_SLACK = 1e-4                           # a log-probability may exceed 0 by rounding, not more
EXPORT_DTYPES = ("bfloat16", "float16", "float32")  # the dtypes a site may export its adapters in
MAX_ENGINE_BYTES = 64                          # "vllm 0.32.0"


def _tokens(buf: bytes, key: str, what: str, most: int) -> np.ndarray:
    """A uint32 token-id array from a bin field."""
    if len(buf) % 4:
        raise MalformedMessage(f"{what}: field '{key}' is {len(buf)} bytes, not a whole number of uint32 token ids")
    if len(buf) // 4 > most:
        raise LimitExceeded(f"{what}: field '{key}' holds {len(buf) // 4} tokens > limit {most}")
    return np.frombuffer(buf, dtype="<u4")


def _pack_tokens(ids) -> bytes:
    return np.asarray(ids, dtype="<u4").tobytes()


@dataclass(frozen=True)
class Sampling:
    """How to answer a prompt: n samples, temperature, top_p, max_tokens (per sample), seed."""

    n: int
    temperature: float
    top_p: float
    max_tokens: int
    seed: int

    def to_dict(self) -> dict:
        """The msgpack form."""
        return {"n": self.n, "temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens,
                "seed": self.seed}

    @staticmethod
    def from_dict(d: dict, what: str, limits: Limits = DEFAULT_LIMITS) -> "Sampling":
        """Validate each parameter."""
        what = f"{what} sampling"
        temperature, top_p = F.get_float(d, "temperature", what), F.get_float(d, "top_p", what)
        if temperature < 0:
            raise MalformedMessage(f"{what}: field 'temperature' = {temperature} must be >= 0")
        if not 0 < top_p <= 1:
            raise MalformedMessage(f"{what}: field 'top_p' = {top_p} must be in (0, 1]")
        return Sampling(F.get_int(d, "n", what, 1, MAX_SAMPLES), temperature, top_p,
                        F.get_int(d, "max_tokens", what, 1, limits.max_completion_tokens),
                        F.get_int(d, "seed", what, 0, (1 << 63) - 1))


@dataclass(frozen=True)
class PromptRecord:
    """One prompt the trainer issues: answer it `sampling.n` times with a policy version >= `min_version`.

    rollouts_from: the end of RUN.rollouts when the trainer issued it; a rollout for it at a lower offset was written
    before the prompt existed (forged: no site could have seen it) and is never accepted, live or after a restart.
    """

    run: str
    prompt_id: str
    token_ids: tuple
    sampling: Sampling
    min_version: int
    rollouts_from: int = 0

    def to_bytes(self, signer=None) -> bytes:
        """Frame as a prompt record (signed by the trainer's key in a signed run)."""
        return frame(KIND_PROMPT,
                     {"run": self.run, "prompt_id": self.prompt_id, "token_ids": _pack_tokens(self.token_ids),
                                   "sampling": self.sampling.to_dict(), "min_version": self.min_version,
                                   "rollouts_from": self.rollouts_from}, signer=signer)

    @staticmethod
    def from_body(body: dict, what: str, limits: Limits = DEFAULT_LIMITS) -> "PromptRecord":
        """Validate every field."""
        pid = F.get_str(body, "prompt_id", what, MAX_ID_BYTES)
        what = f"{what} (prompt {pid})"
        tokens = _tokens(F.get_bytes(body, "token_ids", what), "token_ids", what, limits.max_prompt_tokens)
        if not len(tokens):
            raise MalformedMessage(f"{what}: field 'token_ids' is empty")
        # rollouts_from is absent from prompts written before it existed: no bound then
        since = F.get_int(body, "rollouts_from", what) if "rollouts_from" in body else 0
        return PromptRecord(F.get_str(body, "run", what, limits.max_name_bytes), pid, tuple(int(t) for t in tokens),
                            Sampling.from_dict(F.req(body, "sampling", what), what, limits),
                            F.get_int(body, "min_version", what), since)


@dataclass(frozen=True)
class RolloutRecord:
    """One sample of one prompt, as a site generated it.

    version_start / version_end: the policy version vLLM served when the request started and when it ended (a
    reload in between makes them differ, and the trainer sees it). logprobs: the behaviour log-probability of each
    completion token under the serving policy. timings: seconds, e.g. {"queued_s", "generate_s", "reward_s"}.
    export_dtype / engine (optional, None: not said): the dtype the site gave the engine its adapters in, and the
    engine and its version ("vllm 0.32.0"); the trainer's audit recomputes at that dtype.
    """

    run: str
    prompt_id: str
    sample: int
    site: str
    version_start: int
    version_end: int
    completion_ids: tuple
    logprobs: tuple
    reward: float
    reward_fn: str
    finish_reason: str
    timings: dict = field(default_factory=dict)
    export_dtype: str | None = None
    engine: str | None = None

    def to_bytes(self, signer=None) -> bytes:
        """Frame as a rollout record (signed by the site's key when it has one)."""
        return frame(KIND_ROLLOUT, {
            "run": self.run, "prompt_id": self.prompt_id, "sample": self.sample, "site": self.site,
            "version_start": self.version_start, "version_end": self.version_end,
            "completion_ids": _pack_tokens(self.completion_ids),
            "logprobs": np.asarray(self.logprobs, dtype="<f4").tobytes(),
            "reward": float(self.reward), "reward_fn": self.reward_fn, "finish_reason": self.finish_reason,
            "timings": {k: float(v) for k, v in self.timings.items()},
            # optional: absent when not said, so a record without them is the bytes it was before they existed
            **{k: v for k, v in (("export_dtype", self.export_dtype), ("engine", self.engine)) if v is not None}},
                     signer=signer)

    @staticmethod
    def from_body(body: dict, what: str, limits: Limits = DEFAULT_LIMITS) -> "RolloutRecord":
        """Validate every field; a non-finite reward or log-probability is a NonFinite naming it."""
        pid = F.get_str(body, "prompt_id", what, MAX_ID_BYTES)
        sample = F.get_int(body, "sample", what, 0, MAX_SAMPLES - 1)
        what = f"{what} (prompt {pid} sample {sample})"
        start = F.get_int(body, "version_start", what)
        end = F.get_int(body, "version_end", what, start)
        ids = _tokens(F.get_bytes(body, "completion_ids", what), "completion_ids", what, limits.max_completion_tokens)
        lp_buf = F.get_bytes(body, "logprobs", what, 4 * len(ids))
        logprobs = np.frombuffer(lp_buf, dtype="<f4")
        bad = np.flatnonzero(~np.isfinite(logprobs))
        if len(bad):
            raise NonFinite(f"{what}: field 'logprobs' has a non-finite value at token {int(bad[0])}")
        if len(logprobs) and float(logprobs.max()) > LOGPROB_SLACK:
            raise MalformedMessage(f"{what}: field 'logprobs' has {float(logprobs.max()):.3g} > 0 at token "
                                   f"{int(logprobs.argmax())}: not a log-probability")
        reward = F.req(body, "reward", what)
        if isinstance(reward, float) and not math.isfinite(reward):
            raise NonFinite(f"{what}: field 'reward' = {reward} is not finite")
        finish = F.get_str(body, "finish_reason", what, 16)
        if finish not in FINISH_REASONS:
            raise MalformedMessage(
                f"{what}: field 'finish_reason' = {finish!r}, expected one of {list(FINISH_REASONS)}")
        timings = F.get_scalar_map(body, "timings", what, limits.max_params)
        if not all(isinstance(v, (int, float)) and v >= 0 for v in timings.values()):
            raise MalformedMessage(f"{what}: field 'timings' must map names to seconds >= 0")
        dtype = F.get_str(body, "export_dtype", what, 16) if "export_dtype" in body else None
        if dtype is not None and dtype not in EXPORT_DTYPES:
            raise MalformedMessage(f"{what}: field 'export_dtype' = {dtype!r}, expected one of {list(EXPORT_DTYPES)}")
        engine = F.get_str(body, "engine", what, MAX_ENGINE_BYTES) if "engine" in body else None
        return RolloutRecord(F.get_str(body, "run", what, limits.max_name_bytes), pid, sample,
                             F.get_str(body, "site", what, MAX_ID_BYTES), start, end, tuple(int(t) for t in ids),
                             tuple(float(x) for x in logprobs), F.get_float(body, "reward", what),
                             F.get_str(body, "reward_fn", what, limits.max_name_bytes), finish,
                             {k: float(v) for k, v in timings.items()}, dtype, engine)


def decode_rollout_record(data: bytes, what: str, limits: Limits = DEFAULT_LIMITS):
    """Unframe a prompt or rollout record (a policy record here is MalformedMessage naming its kind)."""
    kind, body = unframe(data, what, limits, limits.max_rollout_bytes)
    if kind == KIND_PROMPT:
        return PromptRecord.from_body(body, f"{what} (prompt record)", limits)
    if kind == KIND_ROLLOUT:
        return RolloutRecord.from_body(body, f"{what} (rollout record)", limits)
    raise MalformedMessage(f"{what}: a policy record (kind {kind}) where a prompt or rollout record belongs")
