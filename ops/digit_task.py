"""The project's RL task with a verifiable reward: 2-digit addition on the tiny Qwen3's own vocabulary.

A prompt is "ab+cd=" (6 tokens); the answer is the 3-digit sum and ';' ("046;"). The reward is 1.0 for exactly
that answer as the first 4 completion tokens, else 0.0. Sites name it on the command line:

    hilo consume ... --generate --reward hilo.ops.digit_task:reward
"""
import random

from hilo.ops.tiny_trainer import STOI, TOKENS
from hilo.schemas.rollouts import PromptRecord, Sampling

ANSWER_LEN = 4


def answer_ids(prompt_ids) -> list:
    """The correct completion's token ids for the prompt "ab+cd=" (ValueError when it is not such a prompt)."""
    text = "".join(TOKENS[i] for i in prompt_ids)
    if len(text) != 6 or text[2] != "+" or text[5] != "=" or not (text[:2] + text[3:5]).isdigit():
        raise ValueError(f"not a digit-task prompt: {text!r}")
    return [STOI[c] for c in f"{int(text[:2]) + int(text[3:5]):03d};"]


def reward(prompt_ids, completion_ids) -> float:
    """1.0 when the completion is the correct 3-digit sum, then ';' or the end (vLLM stops at ';', the model's EOS),
    else 0.0."""
    want, got = answer_ids(prompt_ids), list(completion_ids[:ANSWER_LEN])
    return float(got[:3] == want[:3] and got[3:] in ([], want[3:]))


def partial_reward(prompt_ids, completion_ids) -> float:
    """The share of the answer's tokens (3 digits, then ';') the completion has right, position by position: partial
    credit, so even the random tiny policy's samples differ and every GRPO step moves it (the audit's tests use it)."""
    want, got = answer_ids(prompt_ids), list(completion_ids[:ANSWER_LEN])
    return sum(a == b for a, b in zip(want, got)) / len(want)


def prompts(run: str, sampling: Sampling, seed: int = 0, min_version=lambda: 0, prefix: str = "p"):
    """An endless stream of digit-task prompts of `run` (ids PREFIX-0, PREFIX-1, ...); `min_version()` is read as each
    is made (the trainer's version: S = 0 asks for the newest policy)."""
    rng = random.Random(seed)
    i = 0
    while True:
        a, b = rng.randrange(100), rng.randrange(100)
        ids = tuple(STOI[c] for c in f"{a:02d}+{b:02d}=")
        yield PromptRecord(run, f"{prefix}-{i}", ids, Sampling(sampling.n, sampling.temperature, sampling.top_p,
                                                               sampling.max_tokens, sampling.seed + i), min_version())
        i += 1
