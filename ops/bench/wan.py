"""`hilo bench wan`: policy freshness and step time over emulated slow links, through the real Kafka path.

    sudo hilo bench wan [--json] [--steps 2] [--compute-s 8] [--links 100,1000] [--sites 1,4]

1. CPU, on the quiet machine, at the Qwen3-1.7B rank-64 scale (69,730,304 params): per method, the
   message bytes, the trainer's encode time (HiLo: encode + the trainer's own apply, which the digest
   needs before publishing) and a site's apply time. The gradient stream is ops/bench/synthetic.py's;
   parameters move by AdamW on it (lr 1e-4), so the bf16 adapter changes the way training changes it
   (most elements, by a few bf16 ulps), which is what the lossless delta has to encode.
2. Network: ops/wan/ makes site namespaces behind tbf-shaped links; a broker listens on 10.77.0.1:9192;
   per config the trainer side publishes each step's real message bytes and receivers inside the site
   namespaces (ops/bench/wan_receiver.py: fetch + reassemble, no compute) report when each message is
   complete. network_s = until the last site has it.
3. freshness_s = encode_s + network_s + apply_s (CPU measured alone in 1, so the 2-core machine's
   contention does not leak into the network figure); step_s = compute_s + freshness_s (strict on-policy:
   nothing overlaps the sync). Break-even bandwidth from the measured costs.
Methods: full bf16 adapter every step, lossless adapter delta, HiLo Spar at 1.6% and at 0.5%.
"""
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

from hilo.ops.bench.baselines import apply_lossless_delta, bf16_flat, full_adapter_payload, lossless_delta_payload
from hilo.ops.bench.report import results_dir, save, save_figure
from hilo.ops.bench.synthetic import GradientStream, initial_params, qwen3_manifest
from hilo.producer.update_builder import UpdateBuilder
from hilo.replica.codecs import Budget, make_encoder
from hilo.replica.replica import PolicyReplica
from hilo.schemas.chunks import split

METHODS = ("full-adapter", "lossless-delta", "spar-1.6%", "spar-0.5%")
OPS = pathlib.Path(__file__).resolve().parents[1]
BROKER = "10.77.0.1:9192"
LR = 1e-4


def _say(*a):
    print(*a, file=sys.stderr, flush=True)


@dataclass
class MethodCost:
    """One method's messages and CPU costs at the 1.7B scale."""

    messages: list        # framed bytes per step
    encode_s: float       # trainer side, per step (median)
    apply_s: float        # site side, per step (median)


def measure_cpu(steps: int, shape: str = "qwen3-1.7b") -> dict:
    """Build `steps` real messages per method and time encode/apply on this machine, one thing at a time."""
    manifest = qwen3_manifest(shape)
    stream = GradientStream(manifest, seed=0)
    init = initial_params(manifest, 0)
    ref = PolicyReplica.genesis("wan", manifest, init, "adamw")                    # full-sync trajectory
    ref_builder = UpdateBuilder(ref, make_encoder("dense", manifest))
    hilo = {}
    for name, frac in (("spar-1.6%", 0.016), ("spar-0.5%", 0.005)):
        trainer = PolicyReplica.genesis("wan", manifest, init, "adamw")
        site = PolicyReplica.genesis("wan", manifest, init, "adamw")
        hilo[name] = (UpdateBuilder(trainer, make_encoder("spar", manifest, Budget(frac))), site)
    out = {m: MethodCost([], 0.0, 0.0) for m in METHODS}
    times = {m: ([], []) for m in METHODS}
    site_flat = bf16_flat(ref.state.params)
    for step in range(steps + 1):  # step 0 warms up
        _say(f"bench wan: cpu step {step}/{steps}")
        grads = stream.next()
        before = [p for p in ref.state.params]
        ref_builder.step(grads, {"lr": LR})
        after = ref.state.params
        t0 = time.perf_counter()
        full = full_adapter_payload(after)
        t1 = time.perf_counter()
        flat = torch.frombuffer(bytearray(full), dtype=torch.bfloat16)            # the site loads the adapter
        t2 = time.perf_counter()
        delta = lossless_delta_payload(before, after)
        t3 = time.perf_counter()
        site_flat = apply_lossless_delta(site_flat, delta)
        t4 = time.perf_counter()
        assert torch.equal(site_flat.view(torch.int16), flat.view(torch.int16))
        samples = {"full-adapter": (full, t1 - t0, t2 - t1), "lossless-delta": (delta, t3 - t2, t4 - t3)}
        for name, (builder, site) in hilo.items():
            t0 = time.perf_counter()
            data = builder.step(grads, {"lr": LR}).to_bytes()
            t1 = time.perf_counter()
            site.apply_bytes(data, name)
            samples[name] = (data, t1 - t0, time.perf_counter() - t1)
        if step == 0:
            continue
        for m, (data, enc, app) in samples.items():
            out[m].messages.append(data)
            times[m][0].append(enc)
            times[m][1].append(app)
    for m in METHODS:
        out[m].encode_s, out[m].apply_s = statistics.median(times[m][0]), statistics.median(times[m][1])
    return out


def _run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def measure_network(costs: dict, sites: int, mbit: int, shared: bool, run: str) -> list:
    """Publish each step's message on a shaped WAN and time until every site has it; seconds per step."""
    from hilo.log import open_log, updates_topic
    _run([str(OPS / "wan" / "shape.sh"), "--sites", "4", "--rate", f"{mbit}mbit", "--quiet"] + (["--shared"] if shared else []))
    log = open_log(f"kafka://{BROKER}")
    log.create_topics(run)
    steps = len(costs.messages)
    procs = [subprocess.Popen(["ip", "netns", "exec", f"hilo-site-{i}", sys.executable, "-m", "hilo.ops.bench.wan_receiver",
                               "--log", f"kafka://{BROKER}", "--run", run, "--versions", str(steps)],
                              stdout=subprocess.PIPE, text=True) for i in range(1, sites + 1)]
    for p in procs:
        json.loads(p.stdout.readline())  # "ready": the receiver is connected and polling
    results = []
    for v, data in enumerate(costs.messages, start=1):
        t0 = time.time()
        log.append(updates_topic(run), split(data, run, "update", v))
        done = [json.loads(p.stdout.readline()) for p in procs]
        assert all(d["version"] == v and d["bytes"] == len(data) for d in done), done
        results.append(max(d["t"] for d in done) - t0)
    for p in procs:
        p.wait(timeout=60)
    log.close()
    return results


def break_even_mbit(full: MethodCost, hilo: MethodCost, n_eff: int) -> float:
    """Bandwidth above which shipping the adapter is as fast as HiLo (freshness), from the measured costs."""
    extra_cpu = (hilo.encode_s + hilo.apply_s) - (full.encode_s + full.apply_s)
    saved_bits = n_eff * 8 * (len(full.messages[0]) - len(hilo.messages[0]))
    return saved_bits / extra_cpu / 1e6 if extra_cpu > 0 else float("inf")


def run_bench(steps: int, compute_s: float, links: list, site_counts: list, out_dir: pathlib.Path, shape: str) -> dict:
    """CPU phase, then every (method, sites, link, shared) on the emulated WAN."""
    costs = measure_cpu(steps, shape)
    for m, c in costs.items():
        _say(f"bench wan: {m}: {statistics.mean(map(len, c.messages)):,.0f} B/step, encode {c.encode_s:.3f} s, apply {c.apply_s:.3f} s")
    env = dict(os.environ, HILO_KAFKA_HOST=BROKER.split(":")[0], HILO_KAFKA_PORT=BROKER.split(":")[1],
               HILO_KAFKA_DIR=os.path.join(os.environ.get("HILO_CACHE", os.path.expanduser("~/.cache/hilo-sync")), "kafka-wan"))
    rows = []
    try:
        _run([str(OPS / "wan" / "setup.sh"), "--sites", "4", "--rate", "0"])
        _run([str(OPS / "kafka" / "stop.sh"), "--wipe"], env=env)
        _run([str(OPS / "kafka" / "start.sh")], env=env)
        tag = int(time.time())
        for mbit in links:
            for shared in (False, True):
                for n in site_counts:
                    for m in METHODS:
                        c = costs[m]
                        net = measure_network(c, n, mbit, shared, f"wan-{tag}-{len(rows)}")
                        fresh = c.encode_s + statistics.median(net) + c.apply_s
                        rows.append({"method": m, "sites": n, "link_mbit": mbit, "shared_uplink": shared,
                                     "bytes_per_step": statistics.mean(map(len, c.messages)), "encode_s": round(c.encode_s, 3),
                                     "network_s": round(statistics.median(net), 3), "apply_s": round(c.apply_s, 3),
                                     "freshness_s": round(fresh, 3), "step_s": round(compute_s + fresh, 3)})
                        _say(f"bench wan: {m:15s} {n} site(s) {mbit:5d} Mbit/s {'shared' if shared else 'separate'}: "
                             f"network {statistics.median(net):.2f} s, freshness {fresh:.2f} s")
    finally:
        subprocess.run([str(OPS / "kafka" / "stop.sh"), "--wipe"], env=env)
        subprocess.run([str(OPS / "wan" / "teardown.sh")])
    ratio = {}
    for r in rows:
        if r["method"] == "spar-1.6%":
            full = next(x for x in rows if x["method"] == "full-adapter" and all(x[k] == r[k] for k in ("sites", "link_mbit", "shared_uplink")))
            ratio[f"{r['sites']} site(s), {r['link_mbit']} Mbit/s, {'shared' if r['shared_uplink'] else 'separate'}"] = round(full["step_s"] / r["step_s"], 2)
    res = {"rows": rows, "shape": shape, "compute_s": compute_s, "step_ratio_full_over_spar_1.6": ratio,
           "break_even_mbit": {f"{m}, {n} site(s) {'shared' if sh else 'separate'}": round(break_even_mbit(costs["full-adapter"], costs[m], n if sh else 1))
                               for m in ("spar-1.6%", "spar-0.5%") for n in site_counts for sh in (False, True)},
           "cpu": {m: {"encode_s": c.encode_s, "apply_s": c.apply_s, "bytes": statistics.mean(map(len, c.messages))} for m, c in costs.items()},
           "delay": "none (this kernel has no sch_netem): rate limits only"}
    res["plot"] = plot(res, costs, out_dir)
    return res


def plot(res: dict, costs: dict, out_dir: pathlib.Path) -> str:
    """Freshness and step time vs bandwidth per method: measured points, and lines from the cost model."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    colors = dict(zip(METHODS, ("tab:red", "tab:orange", "tab:blue", "tab:green")))
    bw = np.logspace(1, 5, 100)  # Mbit/s
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    n = max(r["sites"] for r in res["rows"])
    for m, c in costs.items():
        b = statistics.mean(map(len, c.messages))
        fresh = c.encode_s + c.apply_s + n * b * 8 / (bw * 1e6)
        axes[0].plot(bw, fresh, color=colors[m], label=f"{m} (model, {n} sites shared)")
        axes[1].plot(bw, res["compute_s"] + fresh, color=colors[m])
        for r in res["rows"]:
            if r["method"] == m and r["sites"] == n and r["shared_uplink"]:
                axes[0].plot(r["link_mbit"], r["freshness_s"], "o", color=colors[m])
                axes[1].plot(r["link_mbit"], r["step_s"], "o", color=colors[m])
    for ax, what in zip(axes, ("policy freshness (s)", "step time (s)")):
        ax.set(xscale="log", yscale="log", xlabel="shared uplink bandwidth (Mbit/s)", ylabel=what)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[0].set_title(f"{res['shape']} r64 adapter, {n} sites (dots measured)")
    return save_figure(fig, out_dir, "wan")


def main(as_json: bool, steps: int, compute_s: float, links: str, sites: str, out: str | None, shape: str = "qwen3-1.7b") -> int:
    """Run the benchmark; print the table or JSON."""
    out_dir = results_dir("wan", out)
    res = run_bench(steps, compute_s, [int(x) for x in links.split(",")], [int(x) for x in sites.split(",")], out_dir, shape)
    if save(res, out_dir, "wan", as_json):
        return 0
    print("| method | sites | link Mbit/s | uplink | bytes/step | encode s | network s | apply s | freshness s | step s |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in res["rows"]:
        print(f"| {r['method']} | {r['sites']} | {r['link_mbit']} | {'shared' if r['shared_uplink'] else 'separate'} | "
              f"{r['bytes_per_step']:,.0f} | {r['encode_s']:.2f} | {r['network_s']:.2f} | {r['apply_s']:.2f} | "
              f"{r['freshness_s']:.2f} | {r['step_s']:.2f} |")
    print(f"\nstep time ratio, full adapter / Spar 1.6%: {res['step_ratio_full_over_spar_1.6']}")
    print(f"break-even bandwidth (Mbit/s): {res['break_even_mbit']}")
    return 0
