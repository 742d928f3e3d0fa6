"""A LoRA policy's forward pass at a given version: token log-probabilities of completions, from the replica's params.

Shared by the trainer's audit of every rollout (producer/rollout_audit.py) and a site's self-check after each vLLM
load (consumer/self_check.py): both score token ids under the params of one version, held as fp32 tensors in
manifest order (a replica's state), without writing them into the model (torch.func.functional_call).

    model = policy_model(base_dir, manifest)              # a site: the base vLLM serves, with the manifest's LoRA
    names = lora_names(model, manifest)                   # the model's parameter names, in manifest order
    lps = completion_logprobs(model, [(prompt, completion)], dict(zip(names, params)))
"""
import torch

from hilo.schemas.errors import ConfigError

# The largest per-token |log-probability difference| between a vLLM CPU server (fp32 base and adapter) and this forward
# pass that the audit and the self-check accept by default: honest differences measured up to 1.02e-5 on the pretrained
# student base (`hilo bench audit`); a GPU or bf16 deployment measures and sets its own.
LOGPROB_TOLERANCE = 1e-4
PROBE_TOKENS = 12  # the self-check's probe: this many token ids, drawn from a fixed seed


def lora_names(model: torch.nn.Module, manifest, adapter: str = "default") -> list:
    """The names of `model`'s parameters that hold each block of `manifest`, in manifest order (ConfigError if one is
    missing or of another shape)."""
    params = dict(model.named_parameters())
    out = []
    for b in manifest.blocks:
        name = f"base_model.model.{b.key}.{adapter}.weight"
        p = params.get(name)
        if p is None or tuple(p.shape) != tuple(b.shape):
            raise ConfigError(f"the model has no LoRA parameter {name} of shape {tuple(b.shape)} (found "
                              f"{None if p is None else tuple(p.shape)}): it is not the run's base model and adapter "
                              f"layout")
        out.append(name)
    return out


def policy_model(base_dir: str, manifest) -> torch.nn.Module:
    """The base model in `base_dir` (fp32, eval) wrapped in a LoRA of the manifest's rank, alpha and target modules; its
    LoRA values are the caller's to pass (completion_logprobs' `params`)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    cfg = LoraConfig(r=manifest.rank, lora_alpha=manifest.alpha, target_modules=list(manifest.target_modules),
                     lora_dropout=0.0)
    return get_peft_model(base, cfg).eval()


def probe_ids(vocab_size: int, n: int = PROBE_TOKENS) -> list:
    """A fixed sequence of `n` token ids below `vocab_size` (the same on every machine): the self-check's probe."""
    g = torch.Generator().manual_seed(20261205)
    return torch.randint(0, vocab_size, (n,), generator=g).tolist()


def completion_logprobs(model, samples, params: dict | None = None, grad: bool = True) -> list:
    """For each (prompt ids, completion ids): the model's log-probability of each completion token given the prompt and
    the tokens before it. params: {parameter name: tensor} used instead of the model's own (none: the model's).
    grad: keep the graph (a training step) or not (an audit). One forward for all: right padding never reaches a real
    token (causal attention)."""
    if not samples:
        return []
    if any(not len(p) for p, _ in samples):
        raise ConfigError("completion_logprobs: a sample has an empty prompt (the first completion token needs a "
                          "context)")
    seqs = [list(p) + list(c) for p, c in samples]
    pad = getattr(model.config, "pad_token_id", None) or 0
    ids = torch.tensor([s + [pad] * (max(map(len, seqs)) - len(s)) for s in seqs])
    with torch.set_grad_enabled(grad):
        out = torch.func.functional_call(model, params, (ids,)) if params else model(ids)
        logp = torch.log_softmax(out.logits.float(), -1)
        return [logp[i, len(p) - 1:len(p) + len(c) - 1].gather(1, torch.tensor(list(c),
                                                                               dtype=torch.long).view(-1, 1)).squeeze(1)
                for i, (p, c) in enumerate(samples)]


def sampling_moments(logits: torch.Tensor, temperature: float, top_p: float) -> tuple:
    """(mean, variance) per position of the surprisal -log p(x) (p: softmax of `logits`, what vLLM reports) when x is
    drawn as vLLM samples it: softmax(logits / temperature) kept to the top_p nucleus (temperature 0: the argmax).
    `logits`: [tokens, vocab]. An honest site's sampled tokens have surprisals whose deviations from these means sum to
    a martingale: their standardized sum is close to N(0, 1) (the audit's sampling test)."""
    logp = torch.log_softmax(logits.double(), -1)
    if temperature == 0:
        q = torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).double()
    else:
        q = torch.softmax(logits.double() / temperature, -1)
        if top_p < 1:
            sq, order = q.sort(-1, descending=True)
            drop = (sq.cumsum(-1) - sq) >= top_p  # outside the nucleus: the mass before it already reached top_p
            q = torch.zeros_like(q).scatter(-1, order, sq.masked_fill(drop, 0.0))
            q = q / q.sum(-1, keepdim=True)
    s = -logp
    mean = (q * s).sum(-1)
    return mean, ((q * s * s).sum(-1) - mean * mean).clamp(min=0.0)


def completion_scores(model, samples, params: dict | None) -> list:
    """For each (prompt ids, completion ids, temperature, top_p): (log-probability of each completion token, surprisal
    mean, surprisal variance), no grad, one forward pass for all (right padding never reaches a real token): what the
    audit compares with a site's behaviour log-probabilities, and its sampling test's terms (sampling_moments)."""
    if not samples:
        return []
    seqs = [list(p) + list(c) for p, c, _, _ in samples]
    pad = getattr(model.config, "pad_token_id", None) or 0
    ids = torch.tensor([s + [pad] * (max(map(len, seqs)) - len(s)) for s in seqs])
    with torch.no_grad():
        out = torch.func.functional_call(model, params, (ids,)) if params else model(ids)
    res = []
    for i, (p, c, temperature, top_p) in enumerate(samples):
        logits = out.logits[i, len(p) - 1:len(p) + len(c) - 1].float()
        lp = torch.log_softmax(logits.double(),
                               -1).gather(1, torch.tensor(list(c), dtype=torch.long).view(-1, 1)).squeeze(1)
        res.append((lp, *sampling_moments(logits, temperature, top_p)))
    return res
