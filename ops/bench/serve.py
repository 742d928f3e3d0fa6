"""`hilo bench serve`: from the trainer's publish to the first rollout request served by the new version.

    hilo bench serve [--shapes tiny,qwen3-0.6b] [--versions 5] [--json]

Per shape, a base model is built from a seed (no downloads: the tiny Qwen3 of the demo, or a randomly
initialised base with Qwen3-0.6B's layer shapes and the project's 14-token vocabulary, which leaves the
LoRA adapter exactly Qwen3-0.6B's at rank 64), saved in bf16, and served by a vLLM CPU server that this
command starts (ops/vllm/start.sh, its own port and run dir) and stops. A trainer publishes versions of
seeded random gradients (spar at 1.6%, AdamW) to a file log; one site, in this process, follows it. Per
version, timed one after another on this 2-core machine (nothing overlaps):
  publish_s  the trainer's step (encode, own apply, durable append);
  apply_s    the site reads the log and applies the version;
  export_s   the site writes the bf16 PEFT adapter directory;
  reload_s   POST /v1/load_lora_adapter until vLLM has the new weights (reported separately);
  first_s    the first completion request after the reload (it is checked to be the new version);
  total_s    publish -> first request served by the new version = the sum.
Results: JSON in --out (default ~/.cache/hilo-sync/bench/serve-TIME/serve.json).
"""
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import requests
import torch

from hilo.consumer.config import SiteConfig
from hilo.consumer.site import Site
from hilo.ops.bench.report import results_dir, save
from hilo.replica.synthetic import QWEN3
from hilo.ops.tiny_trainer import PAD, STOI, TOKENS, build_tokenizer
from hilo.producer.config import ProducerConfig
from hilo.producer.producer import HiLoProducer

OPS = pathlib.Path(__file__).resolve().parents[1]
SHAPES = {"tiny": 16, "qwen3-0.6b": 64}  # shape -> LoRA rank benchmarked
PORT = 8013
PROMPT = [STOI[c] for c in "12+34="]


def _say(*a):
    print(*a, file=sys.stderr, flush=True)


def build_peft(shape: str, base_dir: pathlib.Path, seed: int = 0):
    """The PEFT model of `shape` (the demo's tiny Qwen3, or Qwen3-0.6B's layer shapes on a 14-token vocab); its base,
    saved in bf16 with the tokenizer to `base_dir` before PEFT wraps it, is what vLLM serves."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    if shape == "tiny":
        hidden, inter, layers, heads, kv, head_dim = 256, 512, 4, 4, 2, 64
    else:
        hidden, inter, layers, q_out, kv_out = QWEN3[shape]
        heads, head_dim = q_out // 128, 128
        kv = kv_out // head_dim
    cfg = Qwen3Config(vocab_size=len(TOKENS), hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, max_position_embeddings=32,
                      tie_word_embeddings=True, pad_token_id=PAD, bos_token_id=PAD, eos_token_id=STOI[";"])
    base = Qwen3ForCausalLM(cfg)
    base.name_or_path = f"hilo/bench-{shape}-s{seed}"
    base.to(torch.bfloat16).save_pretrained(base_dir)
    build_tokenizer().save_pretrained(base_dir)
    rank = SHAPES[shape]
    lora = LoraConfig(r=rank, lora_alpha=2 * rank,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    return get_peft_model(base.float(), lora)


def _server(base_dir: str, rank: int, run_dir: pathlib.Path):
    env = dict(os.environ, HILO_VLLM_PORT=str(PORT), HILO_VLLM_DIR=str(run_dir))
    subprocess.run([str(OPS / "vllm" / "start.sh"), base_dir, "--max-lora-rank", str(rank), "--dtype", "bfloat16"],
                   env=env, check=True)
    return env


def _logprob(url):
    r = requests.post(f"{url}/v1/completions",
                      json={"model": "policy", "prompt": PROMPT, "max_tokens": 1, "temperature": 0,
                                                     "logprobs": 5}, timeout=120)
    r.raise_for_status()
    return r.json()["choices"][0]["logprobs"]["top_logprobs"][0]


def bench_shape(shape: str, versions: int, work: pathlib.Path) -> dict:
    """Time `versions` versions end to end for one shape (starts and stops its own vLLM server)."""
    base_dir = work / f"base-{shape}"
    model = build_peft(shape, base_dir)
    url, run_dir = f"http://127.0.0.1:{PORT}", work / f"vllm-{shape}"
    _say(f"bench serve: {shape}: starting vLLM on {base_dir}")
    env = _server(str(base_dir), SHAPES[shape], run_dir)
    try:
        log = f"file://{work}/log-{shape}"
        # spar at 1.6%
        producer = HiLoProducer.open(model, ProducerConfig(run=f"serve-{shape}", log=log, checkpoint_every=10 ** 6))
        site = Site.open(SiteConfig(log=log, run=f"serve-{shape}", site="bench", state_dir=str(work / f"site-{shape}"),
                               vllm=url, keep_adapters=2))
        gen = torch.Generator().manual_seed(1)
        rows, before = [], _logprob(url)
        for _ in range(versions + 1):  # the first version warms up the path
            for p in producer.params:
                p.grad = torch.randn(p.shape, generator=gen)
            t0 = time.perf_counter()
            v = producer.step(lr=1e-2)
            t1 = time.perf_counter()
            while site.follower.replica.version < v:
                for event in site.follower.updates(timeout_s=5.0):
                    site.on_event(event)
            t2 = time.perf_counter()
            site.publish_newest(strict=True)
            t3 = time.perf_counter()
            after = _logprob(url)
            t4 = time.perf_counter()
            assert site.serving.version == v and after != before, f"v{v} not served"
            before = after
            rows.append({"version": v, "publish_s": t1 - t0, "apply_s": t2 - t1,
                         "export_s": site.serving.timing["export_s"],
                         "reload_s": site.serving.timing["load_s"], "first_s": t4 - t3, "total_s": t4 - t0})
            _say(f"bench serve: {shape} v{v}: publish -> served {t4 - t0:.2f} s (reload "
                 f"{site.serving.timing['load_s']:.2f} s)")
        site.close()
        producer.close()
    finally:
        subprocess.run([str(OPS / "vllm" / "stop.sh")], env=env, check=False)
    rows = rows[1:]
    med = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0] if k != "version"}
    return {"shape": shape, "rank": SHAPES[shape], "lora_params": producer.manifest.numel,
            "adapter_bytes_bf16": producer.manifest.adapter_bytes(), "versions": rows, "median": med}


def main(as_json: bool, shapes: list, versions: int, out: str | None) -> int:
    """Run the benchmark per shape; print a table or JSON."""
    out_dir = results_dir("serve", out)
    with tempfile.TemporaryDirectory(prefix="hilo-serve-") as work:
        res = {"torch_threads": torch.get_num_threads(),
               "shapes": [bench_shape(s, versions, pathlib.Path(work)) for s in shapes]}
    if save(res, out_dir, "serve", as_json):
        return 0
    print("| shape | LoRA params | adapter bf16 | publish s | apply s | export s | reload s | first request s | "
          "publish -> served s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in res["shapes"]:
        m = s["median"]
        print(f"| {s['shape']} r{s['rank']} | {s['lora_params']:,} | {s['adapter_bytes_bf16']:,} | "
              f"{m['publish_s']:.3f} | {m['apply_s']:.3f} | {m['export_s']:.3f} | {m['reload_s']:.3f} | "
              f"{m['first_s']:.3f} | {m['total_s']:.3f} |")
    return 0
