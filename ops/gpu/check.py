"""The GPU trainer path, checked in one command (ops/gpu/check.sh runs it on a machine with a GPU and no network).

1. Encode where the gradients are: at an adapter's real shape (--shape, default Qwen3-1.7B r64), synthetic gradients
   (replica/synthetic.py) on the device go through the trainer's UpdateBuilder with spar4 at 1.6%: the encoder and its
   residual stay on the device, only the payload and its decode reach the trainer's CPU replica. Encode seconds per
   version, on the device and, for the same gradients, on the CPU. A CPU site replica applies every message and must
   reach the trainer's digest at every version.
2. The trainer itself: the tiny Qwen3 + LoRA (ops/tiny_trainer.py) trains on the device through HiLoProducer into an
   embedded file log, restarted halfway from its state dir (the residual it saved from the device comes back); a CPU
   site follows the log to the trainer's digest, and the model's LoRA weights on the device equal the replica's.
Prints one JSON object (also written to --out/gpu-check.json); exits 1 if any digest differs.
"""
import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time

import torch

from hilo.ops.bench.codecs import DEFAULT_LR
from hilo.producer.update_builder import UpdateBuilder
from hilo.replica import kernels
from hilo.replica.codecs import Budget, make_encoder
from hilo.replica.replica import PolicyReplica
from hilo.replica.synthetic import QWEN3, GradientStream, initial_params, qwen3_manifest


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def encode_where_the_gradients_are(shape: str, device: torch.device, versions: int) -> dict:
    """Part 1: encode on `device` and on the CPU, each trainer's run followed by a CPU site at every version."""
    manifest = qwen3_manifest(shape)
    stream = GradientStream(manifest, seed=0)
    grads = [stream.next() for _ in range(versions)]
    out = {"shape": shape, "params": manifest.numel, "versions": versions}
    for where in ([device, torch.device("cpu")] if device.type != "cpu" else [device]):
        trainer = PolicyReplica.genesis("gpu-check", manifest, initial_params(manifest), "adamw")
        site = PolicyReplica.from_checkpoint(trainer.checkpoint(), "site v0")
        builder = UpdateBuilder(trainer, make_encoder("spar4", manifest, Budget(0.016)))
        encode, matched = [], 0
        for g in grads:
            on = [x.to(where) for x in g]
            _sync(where)
            proposal = builder.propose(on, {"lr": DEFAULT_LR["adamw"]})
            _sync(where)
            encode.append(proposal.timing["encode"])
            builder.commit(proposal)
            residual_device = builder.encoder.residual[0].device.type
            site.apply_bytes(proposal.message.to_bytes(), f"v{proposal.version}")
            matched += site.digest == trainer.digest
        key = "device" if where == device else "cpu"
        out[key] = {"where": str(where), "encode_median_s": round(statistics.median(encode[1:] or encode), 4),
                    "encode_s": [round(x, 4) for x in encode], "residual_on": residual_device,
                    "site_matched_versions": matched, "digest": trainer.digest.hex()}
    return out


def builder_residual_device(producer) -> str:
    """Where the trainer's error-feedback residual lives (its gradients' device, once it has encoded)."""
    return producer.builder.encoder.residual[0].device.type


def train_on_the_device(device: torch.device, steps: int) -> dict:
    """Part 2: HiLoProducer on a model on `device`, a CPU site following its file log."""
    from hilo.consumer.config import SiteConfig
    from hilo.consumer.site import Site
    from hilo.ops.tiny_trainer import build_model, train
    from hilo.producer.config import ProducerConfig
    from hilo.producer.producer import HiLoProducer

    with tempfile.TemporaryDirectory(prefix="hilo-gpu-check-") as work:
        url = f"file://{work}/log"
        cfg = ProducerConfig(run="gpu-train", log=url, codec="spar4", budget=Budget(0.016), optimizer="adamw",
                             state_dir=f"{work}/trainer")
        t0, loss = time.perf_counter(), float("nan")
        for part in (steps // 2, steps - steps // 2):  # a restart between the halves
            model = build_model(seed=0).to(device)
            producer = HiLoProducer.open(model, cfg)
            try:
                loss = train(producer, part)
                on_device = [p.detach().to("cpu", torch.float32) for p in producer.params]
                weights_equal = all(torch.equal(a, b) for a, b in zip(on_device, producer.replica.state.params))
                residual_on = builder_residual_device(producer)
                digest = producer.replica.digest
            finally:
                producer.close()
        train_s = time.perf_counter() - t0
        site = Site.open(SiteConfig(log=url, run="gpu-train", site="cpu-site", state_dir=f"{work}/site",
                                    until_version=steps, export_adapters=False))
        site.run(progress=False)
        return {"steps": steps, "loss": round(loss, 4), "train_s": round(train_s, 2), "params_on": str(model.device),
                "residual_on": residual_on,
                "weights_equal_replica": weights_equal, "site_digest_equal": site.follower.replica.digest == digest}


def main(argv=None) -> int:
    """Run both parts; print the JSON; 0 when every digest matched."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="default: cuda when there is one")
    ap.add_argument("--shape", choices=sorted(QWEN3), default="qwen3-1.7b",
                    help="adapter shape of part 1 (default: %(default)s)")
    ap.add_argument("--versions", type=int, default=8, help="versions encoded in part 1 (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=6, help="training steps in part 2 (default: %(default)s)")
    ap.add_argument("--out", default=None, help="folder for gpu-check.json")
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    res = {"torch": torch.__version__, "device": str(device),
           "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "kernels": kernels.unavailable("adamw") or "loaded"}
    print(f"gpu check: encoding {a.versions} {a.shape} versions on {device}", file=sys.stderr, flush=True)
    res["encode"] = encode_where_the_gradients_are(a.shape, device, a.versions)
    print(f"gpu check: training the tiny model {a.steps} steps on {device}", file=sys.stderr, flush=True)
    res["train"] = train_on_the_device(device, a.steps)
    enc, tr = res["encode"], res["train"]
    res["ok"] = (all(enc[k]["site_matched_versions"] == a.versions for k in ("device", "cpu") if k in enc)
                 and tr["weights_equal_replica"] and tr["site_digest_equal"]
                 # the residual stayed where the grads are
                 and enc["device"]["residual_on"] == tr["residual_on"] == device.type)
    text = json.dumps(res, indent=2)
    if a.out:
        pathlib.Path(a.out).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(a.out) / "gpu-check.json").write_text(text)
    print(text)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
