"""`hilo bench codecs`: message size, encode time, decode+apply time and error per codec x optimizer.

    hilo bench codecs [--json] [--shapes qwen3-1.7b,qwen3-0.6b] [--steps 3]   # --json: {"measured_on", "rows"}

Adapters: LoRA rank 64 on q,k,v,o,gate,up,down of every layer (Qwen3-1.7B: 69,730,304 params, 139.46 MB
bf16). Gradients: replica/synthetic.py (decaying, unequal spectra). Per row, medians over --steps
messages after one warm-up: encode_ms = encoder (with error feedback and its self-check decode) + framing;
apply_ms = verify + unframe + decode + optimizer step + digest on a separate replica; rel_error = ||decoded - c|| /
||c|| for c = gradient + residual, the compression error of one message; sign_ms / verify_ms = the Ed25519 signature
of the framed message (over its SHA-256) and its check, alone. Messages are signed, as with --signing-key.
"""
import statistics
import sys
import time

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from tqdm import tqdm

from hilo.replica.synthetic import GradientStream, initial_params, qwen3_manifest
from hilo.producer.update_builder import UpdateBuilder
from hilo.replica.codecs import decode, make_encoder
from hilo.replica.replica import PolicyReplica
from hilo.schemas.framing import TRAILER_BYTES, split_trailer
from hilo.schemas.signing import Signer

DEFAULT_LR = {"sgd": 0.01, "adamw": 1e-4, "lion": 1e-5, "muon": 0.02}


def bench_one(shape, codec, optimizer, steps, budget, seed=0):
    """One row: build `steps`+1 messages, apply each on a second replica, time both sides."""
    manifest = qwen3_manifest(shape)
    stream = GradientStream(manifest, seed=seed)
    params = initial_params(manifest, seed)
    trainer = PolicyReplica.genesis("bench", manifest, params, optimizer)
    site = PolicyReplica.genesis("bench", manifest, params, optimizer)
    builder = UpdateBuilder(trainer, make_encoder(codec, manifest, budget))
    signer = Signer(Ed25519PrivateKey.generate())
    verifier = signer.verifier()
    site.keyring.trust(verifier)  # the site applies only signed messages, as a --trust site does
    enc_ms, app_ms, sizes, errs, sign_ms, verify_ms = [], [], [], [], [], []
    for step in range(steps + 1):
        grads = stream.next()
        corrected = [g + e for g, e in zip(grads, builder.encoder.residual)] if builder.encoder.lossy else grads
        proposal = builder.propose(grads, {"lr": DEFAULT_LR[optimizer]})
        builder.commit(proposal)
        msg = proposal.message
        t1 = time.perf_counter()
        data = msg.to_bytes(signer)
        t2 = time.perf_counter()
        assert site.apply_bytes(data, f"bench v{msg.version}")
        t3 = time.perf_counter()
        verifier.verify(*split_trailer(data, "bench"), "bench")
        t4 = time.perf_counter()
        signer.sign(data[:-TRAILER_BYTES])
        t5 = time.perf_counter()
        if step == 0:
            continue  # warm-up
        enc_ms.append((proposal.timing["encode"] + t2 - t1) * 1e3)
        app_ms.append((t3 - t2) * 1e3)
        verify_ms.append((t4 - t3) * 1e3)
        sign_ms.append((t5 - t4) * 1e3)
        sizes.append(len(data))
        dec = decode(codec, manifest, msg.codec_params, msg.blocks, "bench")
        num = sum(float((d - c).pow(2).sum()) for d, c in zip(dec, corrected))
        den = sum(float(c.pow(2).sum()) for c in corrected)
        errs.append((num / den) ** 0.5)
    adapter = manifest.adapter_bytes()
    return {
        "codec": codec, "optimizer": optimizer, "shape": shape, "params": manifest.numel,
        "bytes": int(statistics.median(sizes)), "adapter_bytes_bf16": adapter,
        "fraction_of_adapter": statistics.median(sizes) / adapter,
        "encode_ms": round(statistics.median(enc_ms), 1), "apply_ms": round(statistics.median(app_ms), 1),
        "rel_error": round(statistics.median(errs), 5), "sign_ms": round(statistics.median(sign_ms), 2),
        "verify_ms": round(statistics.median(verify_ms), 2), "steps": steps, "torch_threads": torch.get_num_threads(),
    }


def run(shapes, codecs, optimizers, steps, budget):
    """All rows, with a progress bar on stderr."""
    combos = [(s, c, o) for s in shapes for c in codecs for o in optimizers]
    rows = []
    tty = sys.stderr.isatty()
    for n, (s, c, o) in enumerate(tqdm(combos, desc="bench codecs", file=sys.stderr, disable=not tty)):
        rows.append(bench_one(s, c, o, steps, budget))
        if not tty:  # a log file still shows progress
            r = rows[-1]
            print(f"bench codecs [{n + 1}/{len(combos)}] {s} {c} {o}: {r['bytes']:,} B, encode {r['encode_ms']:.0f} "
                  f"ms, apply {r['apply_ms']:.0f} ms", file=sys.stderr, flush=True)
    return rows


def table(res: dict) -> str:
    """Markdown table of the rows of `hilo bench codecs --json` ({"measured_on", "rows"})."""
    rows = res["rows"]
    head = ("| shape | codec | optimizer | bytes | % of bf16 adapter | encode ms | decode+apply ms | rel error |\n"
            "|---|---|---|---:|---:|---:|---:|---:|\n")
    return head + "".join(
        f"| {r['shape']} | {r['codec']} | {r['optimizer']} | {r['bytes']:,} | {100 * r['fraction_of_adapter']:.3f} | "
        f"{r['encode_ms']:.0f} | {r['apply_ms']:.0f} | {r['rel_error']:.3f} |\n" for r in rows)
