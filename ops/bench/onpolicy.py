"""One on-policy training run for the quality benchmark: sample from the rollout replica, learn, sync.

Tasks (the paper's two): "distill" = on-policy distillation, per-token reverse KL to the teacher on the
student's own samples; "rl" = GRPO-style group-relative advantages with an exact-match reward, plus an
optional teacher hint (reverse KL weighted by `hint_weight`).

Sync methods: "full" (the dense fp32 gradient: the uncompressed trajectory), HiLo with "spar",
"powersgd" or "topk" at the byte budget, and "delta": the non-HiLo baseline that runs the optimizer on
the trainer and sends the post-optimizer parameter change compressed (Spar's low-rank coder, same bytes),
with error feedback (the site gets what is left of master - site each step).
"""
import copy
import math
from dataclasses import dataclass

import numpy as np
import torch

from hilo.ops.bench.baselines import lossless_delta_payload
from hilo.ops.bench.pretrain import ANSWER_LEN, PROMPT_LEN, encode, pairs
from hilo.producer.lora_params import lora_parameters
from hilo.producer.update_builder import UpdateBuilder
from hilo.replica.codecs import Budget, decode, make_encoder
from hilo.replica.optimizers import get_optimizer
from hilo.replica.replica import PolicyReplica
from hilo.schemas.records import UpdateMessage

SYNCS = ("full", "spar", "powersgd", "topk", "delta")
CODEC_OF = {"full": "dense", "spar": "spar", "powersgd": "powersgd", "topk": "topk"}


@dataclass(frozen=True)
class RunConfig:
    """One cell x seed of the sweep."""

    task: str                 # distill | rl
    optimizer: str            # sgd | adamw | lion | muon
    sync: str                 # full | spar | powersgd | topk | delta
    lr: float
    seed: int = 0
    steps: int = 60
    prompts_per_step: int = 16
    group: int = 4            # samples per prompt (GRPO group; pass@k uses k = group)
    budget: float = 0.016     # fraction of the bf16 adapter, for every lossy method
    hint_weight: float = 0.1  # rl only: weight of the teacher's reverse KL
    rank: int = 16
    eval_split: str = "test"
    eval_samples: int = 8     # samples per held-out problem; pass@1 and pass@group are unbiased estimates from them


@torch.no_grad()
def sample(model, prompts: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Complete prompts (n, 6) with ANSWER_LEN tokens at temperature 1; returns (n, 10)."""
    out = model(input_ids=prompts, use_cache=True)
    ids, past = prompts, out.cache
    logits = out.logits[:, -1]
    for t in range(ANSWER_LEN):
        nxt = torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=gen)
        ids = torch.cat([ids, nxt], 1)
        if t < ANSWER_LEN - 1:
            out = model(input_ids=nxt, cache=past, use_cache=True)
            past, logits = out.cache, out.logits[:, -1]
    return ids


def reverse_kl(student_logits, teacher_logits):
    """Per-token KL(student || teacher) over the full vocabulary, (n, T)."""
    ls, lt = torch.log_softmax(student_logits, -1), torch.log_softmax(teacher_logits, -1)
    return (ls.exp() * (ls - lt)).sum(-1)


def loss_fn(cfg, model, teacher, ids, answers):
    """(loss, per-sample reward) for the sampled sequences."""
    logits = model(input_ids=ids).logits[:, PROMPT_LEN - 1:-1]          # (n, T, V) predicting the answer tokens
    reward = (ids[:, PROMPT_LEN:] == answers).all(1).float()            # (n,)
    with torch.no_grad():
        t_logits = teacher(input_ids=ids).logits[:, PROMPT_LEN - 1:-1]
    kl = reverse_kl(logits, t_logits).mean()
    if cfg.task == "distill":
        return kl, reward
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, PROMPT_LEN:, None]).squeeze(-1).sum(1)  # (n,)
    r = reward.view(-1, cfg.group)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
    return -(adv * logp).mean() / ANSWER_LEN + cfg.hint_weight * kl, reward


def lossless_delta_bytes(old: list, new: list) -> int:
    """What a lossless adapter-delta codec sends for this step (baselines.lossless_delta_payload)."""
    return len(lossless_delta_payload(old, new))


def pass_at_k(correct: torch.Tensor, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021) from n >= k samples per problem; correct is (problems, n) bool."""
    n = correct.shape[1]
    c = correct.sum(1).tolist()
    return float(np.mean([1.0 - math.comb(n - ci, k) / math.comb(n, k) for ci in c]))


@torch.no_grad()
def evaluate(model, teacher, split: str, k: int, n: int, gen: torch.Generator) -> dict:
    """pass@1, pass@k (n samples per prompt, temperature 1) and the per-token reverse KL to the teacher on them.

    The KL is the distillation objective measured on held-out prompts: a continuous score that moves long
    before pass@k does, so it separates methods that pass@k cannot yet tell apart.
    """
    prompts, answers = encode(pairs(split))
    ids = sample(model, prompts.repeat_interleave(n, 0), gen)
    ok = (ids[:, PROMPT_LEN:] == answers.repeat_interleave(n, 0)).all(1).view(-1, n)
    first = ids.view(-1, n, ids.shape[1])[:, 0]  # KL on one sample per prompt: a forward of each model costs as much as sampling
    answer_logits = [m(input_ids=first).logits[:, PROMPT_LEN - 1:-1] for m in (model, teacher)]
    return {"pass1": pass_at_k(ok, 1), f"pass{k}": pass_at_k(ok, k), "kl": float(reverse_kl(*answer_logits).mean())}


def _set(params, values):
    with torch.no_grad():
        for p, v in zip(params, values):
            p.copy_(v)


def run(cfg: RunConfig, student_base, teacher) -> dict:
    """Train one policy and report its held-out pass@1/pass@k, bytes per step and learning curve."""
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(cfg.seed)
    model = get_peft_model(copy.deepcopy(student_base), LoraConfig(
        r=cfg.rank, lora_alpha=2 * cfg.rank, lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    manifest, params = lora_parameters(model)
    gen = torch.Generator().manual_seed(10_000 + cfg.seed)
    train = pairs("train")
    opt = get_optimizer(cfg.optimizer)
    hparams = opt.defaults() | {"lr": cfg.lr}
    run_id = f"quality-{cfg.task}-{cfg.optimizer}-{cfg.sync}-{cfg.seed}"
    budget = Budget(cfg.budget)
    if cfg.sync == "delta":
        master = [p.detach().clone() for p in params]
        slots = {s: [torch.zeros_like(p) for p in master] for s in opt.slots}
        scalars = opt.init_scalars()
        site = [p.clone() for p in master]
        coder = make_encoder("spar", manifest, budget)
    else:
        trainer = PolicyReplica.genesis(run_id, manifest, [p.detach() for p in params], cfg.optimizer)
        rollout = PolicyReplica.from_checkpoint(trainer.checkpoint())   # what a rollout site holds
        builder = UpdateBuilder(trainer, make_encoder(CODEC_OF[cfg.sync], manifest, budget))
    curve, sizes, lossless, digests_equal = [], [], [], 0
    for step in range(cfg.steps):
        ab = train[torch.randint(len(train), (cfg.prompts_per_step,), generator=gen)]
        prompts, answers = encode(ab)
        prompts, answers = prompts.repeat_interleave(cfg.group, 0), answers.repeat_interleave(cfg.group, 0)
        _set(params, site if cfg.sync == "delta" else rollout.state.params)   # rollouts come from the site's replica
        model.eval()
        ids = sample(model, prompts, gen)
        if cfg.sync == "delta":
            _set(params, master)                                           # the trainer differentiates its master copy
        model.train()
        loss, reward = loss_fn(cfg, model, teacher, ids, answers)
        loss.backward()
        grads = [p.grad.detach().clone() for p in params]
        for p in params:
            p.grad = None
        curve.append(float(reward.mean()))
        if cfg.sync == "delta":
            master, slots, scalars = opt.step(master, grads, slots, scalars, hparams)
            delta = [m - s for m, s in zip(master, site)]               # error feedback: everything not yet sent
            blocks = coder.compress(delta)
            decoded = decode("spar", manifest, coder.params(), blocks, "delta baseline")
            site = [s + d for s, d in zip(site, decoded)]
            msg = UpdateMessage(run_id, step + 1, bytes(16), bytes(16), manifest.manifest_id, "spar", coder.params(),
                                cfg.optimizer, hparams, blocks)
            sizes.append(len(msg.to_bytes()))
        else:
            before = [p.clone() for p in trainer.state.params]
            msg = builder.step(grads, {"lr": cfg.lr})
            data = msg.to_bytes()
            rollout.apply_bytes(data, f"{run_id} v{msg.version}")
            digests_equal += rollout.digest == trainer.digest
            sizes.append(len(data))
            if cfg.sync == "full":
                lossless.append(lossless_delta_bytes(before, trainer.state.params))
    _set(params, site if cfg.sync == "delta" else rollout.state.params)
    model.eval()
    scores = evaluate(model, teacher, cfg.eval_split, cfg.group, cfg.eval_samples, torch.Generator().manual_seed(99 + cfg.seed))
    return {
        **scores, "curve": curve, "bytes_per_step": float(np.mean(sizes)),
        "adapter_bytes": manifest.adapter_bytes(), "lossless_delta_bytes_per_step": float(np.mean(lossless)) if lossless else None,
        "versions": cfg.steps, "rollout_digest_equal_versions": digests_equal if cfg.sync != "delta" else None,
    }
