"""One on-policy training run for the quality benchmark: sample from the rollout replica, learn, sync.

Tasks (the paper's two): "distill" = on-policy distillation, per-token reverse KL to the teacher on the
student's own samples; "rl" = GRPO-style group-relative advantages with an exact-match reward, plus an
optional teacher hint (reverse KL weighted by `hint_weight`).

Sync methods (SYNCS): "full" (the dense fp32 gradient: the uncompressed trajectory); HiLo's gradient mode
with "spar" (fp16 factors), "spar4" (4-bit factors), "spar4-floor" (spar4 with a coverage floor), "powersgd"
or "topk" at the byte budget; and "delta": delta mode (producer/delta.py) with spar4, where the trainer runs
the optimizer on its master copy and publishes the compressed master - site difference, applied with "add";
"post": compress after the optimizer, without a master: the trainer differentiates the sites' parameters (as in
gradient mode) and steps from them with its own optimizer state, and publishes that step, compressed with error
feedback, applied with "add" (the step a nonlinear optimizer such as Muon takes is what the codec approximates,
not the gradient it takes it from).
Every message is framed and decoded exactly as on the wire, by the production classes.

Fidelity, per run: the cosine between the rollout replica's total parameter movement and that of an
uncompressed "shadow" optimizer stepping on the same trajectory (gradient mode; in delta mode the master
is that optimizer; in post mode the trainer's optimizer is), how often each block was sent, and the
error-feedback residual's norm relative to the encoder's input (the gradient; in delta mode the master's
movement).
"""
import copy
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from hilo.ops.bench.baselines import lossless_delta_payload
from hilo.ops.pretrain import ANSWER_LEN, PROMPT_LEN, encode, pairs
from hilo.producer.delta import MasterCopy, MasterState, relative_lag
from hilo.producer.lora_params import lora_parameters
from hilo.producer.update_builder import UpdateBuilder
from hilo.replica.codecs import Budget, make_encoder
from hilo.replica.optimizers import get_optimizer
from hilo.replica.replica import PolicyReplica


@dataclass(frozen=True)
class Sync:
    """One sync method of the benchmark: the producer mode and the codec (with its options)."""

    mode: str                                   # gradient | delta | post
    codec: str
    options: dict = field(default_factory=dict)  # encoder keyword arguments
    hparams: dict = field(default_factory=dict)  # optimizer name -> hyperparameters other than lr (travel in messages)


SYNCS = {
    "full": Sync("gradient", "dense"),
    "spar": Sync("gradient", "spar"),
    "spar4": Sync("gradient", "spar4"),
    "spar4-floor": Sync("gradient", "spar4", {"floor": 0.25}),
    "powersgd": Sync("gradient", "powersgd"),
    "topk": Sync("gradient", "topk"),
    "delta": Sync("delta", "spar4"),
    "post": Sync("post", "spar4"),
    # Muon's step on a compressed gradient: a sent block's decoded gradient has rank ~2 of 16 at 1.6%, and the
    # momentum is where a site's step gets the other directions from; a longer horizon averages more of them
    "spar4-m98": Sync("gradient", "spar4", hparams={"muon": {"momentum": 0.98}}),
}


@dataclass(frozen=True)
class RunConfig:
    """One cell x seed of the sweep."""

    task: str                 # distill | rl
    optimizer: str            # sgd | adamw | lion | muon
    sync: str                 # a key of SYNCS
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
    eval_problems: int | None = None  # held-out problems scored (a fixed seeded subset); None: the whole split


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
def held_out(split: str, problems: int | None = None) -> torch.Tensor:
    """The held-out pairs of `split`, or the same seeded subset of `problems` of them for every run (smoke runs)."""
    ab = pairs(split)
    if problems is None or problems >= len(ab):
        return ab
    return ab[torch.randperm(len(ab), generator=torch.Generator().manual_seed(0))[:problems].sort().values]


def evaluate(model, teacher, split: str, k: int, n: int, gen: torch.Generator, problems: int | None = None) -> dict:
    """pass@1, pass@k (n samples per prompt, temperature 1) and the per-token reverse KL to the teacher on them.

    The KL is the distillation objective measured on held-out prompts: a continuous score that moves long
    before pass@k does, so it separates methods that pass@k cannot yet tell apart.
    """
    prompts, answers = encode(held_out(split, problems))
    ids = sample(model, prompts.repeat_interleave(n, 0), gen)
    ok = (ids[:, PROMPT_LEN:] == answers.repeat_interleave(n, 0)).all(1).view(-1, n)
    # KL on one sample per prompt: a forward of each model costs as much as sampling
    first = ids.view(-1, n, ids.shape[1])[:, 0]
    answer_logits = [m(input_ids=first).logits[:, PROMPT_LEN - 1:-1] for m in (model, teacher)]
    return {"pass1": pass_at_k(ok, 1), f"pass{k}": pass_at_k(ok, k), "kl": float(reverse_kl(*answer_logits).mean())}


def _set(params, values):
    with torch.no_grad():
        for p, v in zip(params, values):
            p.copy_(v)


def _norm(ts) -> float:
    return sum(float(t.double().pow(2).sum()) for t in ts) ** 0.5


def _cosine(a: list, b: list) -> float:
    dot = sum(float((x.double() * y.double()).sum()) for x, y in zip(a, b))
    na, nb = _norm(a), _norm(b)
    return dot / (na * nb) if na > 0 and nb > 0 else float("nan")


def _probe(before, after, shadow_after, grads, decoded, encoder) -> dict:
    """One version's per-block fidelity: sent, the decoded gradient's rank, cosine(replica step, shadow step), norm
    ratio, residual / gradient."""
    site = [torch.sub(a, b) for a, b in zip(after, before)]
    shadow = [torch.sub(a, b) for a, b in zip(shadow_after, before)]
    residual = encoder.residual if encoder.lossy else [torch.zeros_like(g) for g in grads]
    return {"sent": [bool(d.abs().max() > 0) for d in decoded],
            "rank": [int(torch.linalg.matrix_rank(d)) if d.dim() == 2 else 1 for d in decoded],
            "full_rank": [min(d.shape) if d.dim() == 2 else 1 for d in decoded],
            "cosine": [_cosine([x], [y]) for x, y in zip(site, shadow)],
            "norm_ratio": [_norm([x]) / max(_norm([y]), 1e-30) for x, y in zip(site, shadow)],
            "residual_ratio": [_norm([r]) / max(_norm([g]), 1e-30) for r, g in zip(residual, grads)]}


def run(cfg: RunConfig, student_base, teacher, probe: list | None = None) -> dict:
    """Train one policy and report its held-out pass@1/pass@k, bytes per step, learning curve and fidelity.

    With `probe` (gradient mode), one dict per version is appended to it: per block, whether the message carried
    it, the cosine and norm ratio of the replica's step to the shadow's step from the same params, and the
    error-feedback residual's norm relative to that block's gradient (`hilo bench probe` reads them)."""
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(cfg.seed)
    model = get_peft_model(copy.deepcopy(student_base), LoraConfig(
        r=cfg.rank, lora_alpha=2 * cfg.rank, lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    manifest, params = lora_parameters(model)
    gen = torch.Generator().manual_seed(10_000 + cfg.seed)
    train = pairs("train")
    sync = SYNCS[cfg.sync]
    opt = get_optimizer(cfg.optimizer)
    hparams = opt.defaults() | sync.hparams.get(cfg.optimizer, {}) | {"lr": cfg.lr}
    run_id = f"quality-{cfg.task}-{cfg.optimizer}-{cfg.sync}-{cfg.seed}"
    start = [p.detach().clone() for p in params]
    delta = sync.mode in ("delta", "post")  # the trainer runs the optimizer, sites add
    trainer = PolicyReplica.genesis(run_id, manifest, start, "add" if delta else cfg.optimizer)
    rollout = PolicyReplica.from_checkpoint(trainer.checkpoint())   # what a rollout site holds
    builder = UpdateBuilder(trainer, make_encoder(sync.codec, manifest, Budget(cfg.budget), **sync.options))
    master = MasterCopy(start, cfg.optimizer) if delta else None
    # gradient mode's shadow: the same optimizer on the uncompressed gradients, stepping from the replica's params
    shadow_slots, shadow_scalars = {s: [torch.zeros_like(p) for p in start] for s in opt.slots}, opt.init_scalars()
    shadow_move = [torch.zeros_like(p) for p in start]
    curve, sizes, lossless, digests_equal, residual_ratio, lag = [], [], [], 0, [], []
    sends = [0] * len(manifest.blocks)
    for _ in range(cfg.steps):
        ab = train[torch.randint(len(train), (cfg.prompts_per_step,), generator=gen)]
        prompts, answers = encode(ab)
        prompts, answers = prompts.repeat_interleave(cfg.group, 0), answers.repeat_interleave(cfg.group, 0)
        _set(params, rollout.state.params)                             # rollouts come from the site's replica
        model.eval()
        ids = sample(model, prompts, gen)
        if sync.mode == "delta":
            _set(params, master.params)                                # the trainer differentiates its master copy
        model.train()
        loss, reward = loss_fn(cfg, model, teacher, ids, answers)
        loss.backward()
        grads = [p.grad.detach().clone() for p in params]
        for p in params:
            p.grad = None
        curve.append(float(reward.mean()))
        before = trainer.state.params
        if delta:
            if sync.mode == "post":  # the trainer's optimizer steps from the sites' params; only its state is its own
                master.commit(MasterState([p.clone() for p in before], master.state.slots, master.state.scalars))
            nxt, movement = master.propose(grads, hparams)
            proposal = builder.propose(movement)
            master.commit(nxt)
            signal, new = movement, nxt.params
            if sync.mode == "post":
                shadow_move = [torch.add(a, m) for a, m in zip(shadow_move, movement)]
        else:
            new, shadow_slots, shadow_scalars = opt.step(before, grads, shadow_slots, shadow_scalars, hparams)
            shadow_move = [torch.add(a, torch.sub(n, b)) for a, n, b in zip(shadow_move, new, before)]
            proposal = builder.propose(grads, hparams)
            signal = grads
        builder.commit(proposal)
        if probe is not None and sync.mode != "delta":
            probe.append(_probe(before, trainer.state.params, new, signal, proposal.encoding.decoded, builder.encoder))
        data = proposal.message.to_bytes()
        rollout.apply_bytes(data, f"{run_id} v{proposal.version}")
        digests_equal += rollout.digest == trainer.digest
        sizes.append(len(data))
        for b, d in enumerate(proposal.encoding.decoded):
            sends[b] += bool(d.abs().max() > 0)
        if builder.encoder.lossy and _norm(signal) > 0:
            residual_ratio.append(_norm(builder.encoder.residual) / _norm(signal))
        if delta:
            lag.append(relative_lag(master.params, trainer.state.params))
        if sync.codec == "dense":
            lossless.append(lossless_delta_bytes(before, trainer.state.params))
    _set(params, rollout.state.params)
    model.eval()
    scores = evaluate(model, teacher, cfg.eval_split, cfg.group, cfg.eval_samples,
                      torch.Generator().manual_seed(99 + cfg.seed), cfg.eval_problems)
    moved = [torch.sub(p, s) for p, s in zip(rollout.state.params, start)]
    reference = [torch.sub(p, s) for p, s in zip(master.params, start)] if sync.mode == "delta" else shadow_move
    return {
        **scores, "curve": curve, "bytes_per_step": float(np.mean(sizes)),
        "adapter_bytes": manifest.adapter_bytes(),
        "lossless_delta_bytes_per_step": float(np.mean(lossless)) if lossless else None,
        "versions": cfg.steps, "rollout_digest_equal_versions": digests_equal,
        "shadow_cosine": _cosine(moved, reference), "sends_per_block": sends,
        "residual_ratio": float(np.mean(residual_ratio)) if residual_ratio else 0.0,
        "lag_mean": float(np.mean(lag)) if lag else None, "lag_final": lag[-1] if lag else None,
    }
