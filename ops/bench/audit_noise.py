"""`hilo bench audit --served`: the audit where sites serve, per served dtype: honest noise, liars, rollouts to
detection.

    hilo bench audit --served http://127.0.0.1:8011=float32,http://127.0.0.1:8012=bfloat16 --json

For each vLLM server (serving the tiny base at the dtype named after it), this process plays an honest site: it exports
the adapter of 3 versions (v0, then 2 steps of AdamW's first-step size, lr x sign of a real gradient) in that dtype, as
a site with `--export-dtype DTYPE` does, loads each into the server and samples rollouts of digit-task prompts with
their behaviour log-probabilities. The trainer's real Auditor (share 1, every default but the ones the bench compares)
judges them: the honest per-token differences (signed, |.| by quantile), false quarantines over N honest rollouts, and
for each liar of ops/faults/lies.py, rollouts until its site is quarantined: `previous` (v1 served, v2 claimed),
`perturb` (v2's largest lora_B block x (1 + 1e-3)), `logprobs` (x 0.99) and `sharpen` (temperature x 0.25). Each is
judged by the per-token rule alone (noise_z_limit off) and with the statistical verdict (audit_noise.py), so the table
shows what the statistics add.
"""
import dataclasses
import math
import os
import shutil
import tempfile
import types

import torch

from hilo.consumer.adapter_export import export_adapter
from hilo.consumer.vllm_serving import VllmServer
from hilo.ops import digit_task
from hilo.ops.faults.lies import made_up, perturb_adapter, sharpened
from hilo.ops.rl_bases import base as rl_base
from hilo.ops.tiny_trainer import with_lora
from hilo.producer.lora_params import lora_parameters
from hilo.producer.rollout_audit import AuditConfig, Auditor
from hilo.schemas.rollouts import RolloutRecord, Sampling

LIARS = ("previous", "perturb", "logprobs", "sharpen")
CLAIMED = 2  # every liar claims v2; honest rollouts claim the version they were served at (v0..v2)


def versions(model, lr: float, steps: int = 2, seed: int = 0) -> tuple:
    """(manifest, [params of v0..v_steps]): each step moves every param by lr x the sign of the gradient of a language
    model loss on digit-task prompts (AdamW's first step has that size), as a trainer's versions differ."""
    manifest, params = lora_parameters(model)
    out = [[p.detach().clone() for p in params]]
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.randint(0, 14, (16, 10), generator=g)
        loss = torch.nn.functional.cross_entropy(model(ids).logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, gr in zip(params, grads):
                p -= lr * gr.sign()
        out.append([p.detach().clone() for p in params])
    with torch.no_grad():  # the model is left at v0 (the auditor passes each version's params)
        for p, v0 in zip(params, out[0]):
            p.copy_(v0)
    return manifest, out


def export(manifest, params, version: int, root: str, dtype: str) -> str:
    """Version `version`'s adapter directory, written as a site exporting in `dtype` writes it."""
    replica = types.SimpleNamespace(version=version, manifest=manifest, state=types.SimpleNamespace(params=params),
                                    digest=b"")
    return str(export_adapter(replica, os.path.join(root, f"v{version}"), dtype=dtype, keep=1))


def gather(server: VllmServer, adapter_dir: str, prompts, served: int, claimed: int, dtype: str, engine: str,
           lie=None) -> list:
    """[(RolloutRecord, PromptRecord)] of `prompts` sampled by `server` from `adapter_dir` (version `served`), stamped
    `claimed`, told as the lie `lie` tells them (None: honestly)."""
    server.load(adapter_dir, served)
    out = []
    for p in prompts:
        samples = server.complete(p.token_ids, sharpened(p.sampling) if lie == "sharpen" else p.sampling)
        for i, (ids, lps, _) in enumerate(samples):
            lps = made_up(lps) if lie == "logprobs" else lps
            out.append((RolloutRecord(p.run, p.prompt_id, i, "site", claimed, claimed, ids, lps, 0.0, "bench", "length",
                                      {}, dtype, engine), p))
    return out


def judge(model, manifest, vs, pairs, **cfg) -> dict:
    """Every rollout of `pairs` judged in order by a fresh Auditor (share 1): when its site was first quarantined
    (rollouts judged by then, None: never), quarantines in all (a probe may release it), and its verdict."""
    a = Auditor(AuditConfig(share=1.0, **cfg), model, manifest, keep=len(vs))
    for v, params in enumerate(vs):
        a.remember(v, params)
    first, quarantines, was = None, 0, False
    for i in range(0, len(pairs), 32):
        chunk = pairs[i:i + 32]
        a.prepare(chunk)
        for j, (r, p) in enumerate(chunk):
            a.judge(r, p)
            now = a.verdict(r.site).quarantined
            if now and not was:
                quarantines += 1
                first = i + j + 1 if first is None else first
            was = now
    v = a.verdict("site")
    return {"first_quarantine": first, "quarantines": quarantines, "audited": v.audited, "failed": v.failed,
            "worst": v.worst, "noise_z": round(v.noise_z, 2), "sampling_z": round(v.z, 2), "evidence": v.evidence}


def differences(model, vs, pairs) -> dict:
    """The honest per-token differences (site's minus trainer's log-probability, under the claimed version): their
    count, mean, standard deviation, and |difference| mean, sd, quantiles and worst."""
    from hilo.replica.forward import completion_scores, lora_names
    names = lora_names(model, lora_parameters(model)[0])
    d = []
    for v, params in enumerate(vs):
        mine = [(r, p) for r, p in pairs if r.version_start == v]
        for i in range(0, len(mine), 32):
            chunk = mine[i:i + 32]
            rounded = {n: t.to(getattr(torch, chunk[0][0].export_dtype)).float() for n, t in zip(names, params)}
            scored = completion_scores(model, [(p.token_ids, r.completion_ids, p.sampling.temperature, p.sampling.top_p)
                                               for r, p in chunk], rounded)
            d += [torch.tensor(r.logprobs, dtype=torch.float64) - lp for (r, _), (lp, _, _) in zip(chunk, scored)]
    d = torch.cat(d)
    a = d.abs()
    q = torch.quantile(a, torch.tensor([0.5, 0.9, 0.99, 0.999], dtype=torch.float64)).tolist()
    return {"tokens": len(d), "mean": float(d.mean()), "sd": float(d.std()), "abs_mean": float(a.mean()),
            "abs_sd": float(a.std()), "abs_p50": q[0], "abs_p90": q[1], "abs_p99": q[2], "abs_p999": q[3],
            "worst": float(a.max())}


@dataclasses.dataclass(frozen=True)
class NoiseRun:
    """One served dtype's measurement: the server, the dtype its sites export adapters in, and the sizes."""

    url: str
    dtype: str
    honest: int = 1000     # honest rollouts (N)
    liar: int = 200        # rollouts of each liar
    samples: int = 8       # per prompt
    lr: float = 3e-3
    seed: int = 0


def measure(run: NoiseRun, log=lambda *a: None) -> dict:
    """The row of one served dtype (module docstring)."""
    torch.manual_seed(run.seed)
    model = with_lora(rl_base("tiny").model()).eval()
    manifest, vs = versions(model, run.lr, seed=run.seed)
    server = VllmServer(run.url, lora_name=f"hilo-bench-audit-{os.getpid()}-{run.dtype}")
    engine = f"vllm {server.check()}"
    work = tempfile.mkdtemp(prefix="hilo-bench-audit-")
    try:
        dirs = [export(manifest, p, v, work, run.dtype) for v, p in enumerate(vs)]
        perturbed = export(manifest, vs[CLAIMED], CLAIMED, os.path.join(work, "perturbed"), run.dtype)
        perturb_adapter(perturbed)
        sampling = Sampling(run.samples, 1.0, 1.0, digit_task.ANSWER_LEN, run.seed)
        stream = digit_task.prompts("bench", sampling, seed=run.seed)
        take = lambda rollouts: [next(stream) for _ in range(math.ceil(rollouts / run.samples))]  # noqa: E731
        honest = []
        for v, d in enumerate(dirs):
            log(f"bench audit {run.dtype}: honest rollouts of v{v}")
            honest += gather(server, d, take(run.honest / len(dirs)), v, v, run.dtype, engine)
        liars = {}
        for lie in LIARS:
            log(f"bench audit {run.dtype}: the {lie} liar")
            adapter, served = {"previous": (dirs[CLAIMED - 1], CLAIMED - 1), "perturb": (perturbed, CLAIMED)}.get(
                lie, (dirs[CLAIMED], CLAIMED))
            liars[lie] = gather(server, adapter, take(run.liar), served, CLAIMED, run.dtype, engine, lie)[:run.liar]
        server._call("POST", "/v1/unload_lora_adapter", json={"lora_name": server.lora_name})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    honest = honest[:run.honest]
    log(f"bench audit {run.dtype}: judging")
    # the statistical verdict at its default headroom (10: safe for a base sharper than the tiny one) and at 1 (the
    # tiny base's own measured noise, what a deployment that measured its own base would set)
    rules = {"per-token": {"noise_z_limit": math.inf}, "statistical": {},
             "statistical, headroom 1": {"noise_headroom": 1.0}}
    row = {"url": run.url, "dtype": run.dtype, "engine": engine, "honest_rollouts": len(honest),
           "differences": differences(model, vs, honest), "honest": {}, "liars": {}}
    for rule, cfg in rules.items():
        row["honest"][rule] = judge(model, manifest, vs, honest, **cfg)
        row["liars"][rule] = {lie: judge(model, manifest, vs, pairs, **cfg) for lie, pairs in liars.items()}
    return row
