"""`hilo bench wan`: policy freshness and step time over emulated slow links, with what ships now.

    sudo hilo bench wan [--json] [--steps 3] [--compute-s 8] [--links 10,100,1000] [--sites 1,4]

1. CPU, on the quiet machine, at the Qwen3-1.7B rank-64 scale (69,730,304 params), one method at a time: the
   message bytes, the trainer's encode (HiLo: the encoder, the trainer's own apply, which the digest needs before
   publishing, and msgpack + zstd framing), the Ed25519 signature, and a site's verify and decode + apply (a
   recycling site replica, as `hilo consume` runs). Gradients are replica/synthetic.py's, parameters move by
   AdamW (lr 1e-4), so the bf16 adapter changes as training changes it, which the lossless delta has to encode.
2. Network: ops/wan/ makes site namespaces behind tbf-shaped links (one link per site, or --shared: one uplink for
   all); a broker listens on 10.77.0.1:9192. The trainer side publishes each step's real signed message as the
   producer does, in a Kafka transaction of a fenced writer; receivers in the site namespaces
   (ops/bench/wan_receiver.py: read_committed fetch + reassembly, no compute) say when each message is complete.
   network_s = until the last site has it. A transfer that would take over MAX_MEASURED_S a step is not run: its
   network_s is modelled from the effective rate the largest measured message got on the same config ("modelled").
3. freshness_s = encode_s + network_s + apply_s (+ sign_s + verify_s when signed), the CPU parts measured alone
   so the 2-core machine's contention does not leak into the network figure; step_s = compute_s + freshness_s
   (strict on-policy: nothing overlaps the sync).
4. `--budget auto` per config: the slowest site's effective rate as a site measures it (message bytes over publish
   to complete, for spar4 at 1.6%), the step time a trainer at 1.6% would see, and the producer's own rule
   (`link_budget.fit`, with the trainer's CPU seconds per unit fraction fitted through the fixed rows' encode
   times, as a trainer that has published at those budgets would) give the fraction; that fraction is then
   encoded and sent like the fixed ones. Two shares: the default (0.05: in strict on-policy steps link time adds
   to the step), and 0.5.
"""
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hilo.ops.bench.baselines import apply_lossless_delta, bf16_flat, full_adapter_payload, lossless_delta_payload
from hilo.ops.bench.report import results_dir, save, save_figure
from hilo.replica.synthetic import GradientStream, initial_params, qwen3_manifest
from hilo.producer.link_budget import cpu_slope, fit
from hilo.producer.update_builder import UpdateBuilder
from hilo.replica.codecs import AutoBudget, Budget, make_encoder
from hilo.replica.replica import PolicyReplica
from hilo.schemas.chunks import split
from hilo.schemas.framing import split_trailer
from hilo.schemas.signing import Signer

FIXED = {"full-adapter": None, "lossless-delta": None, "spar4 0.5%": 0.005, "spar4 1.6%": 0.016, "spar4 5%": 0.05}
AUTO_SHARES = (AutoBudget().share, 0.5)  # the default, and the share an overlapped (async) pipeline could afford
OPS = pathlib.Path(__file__).resolve().parents[1]
BROKER = "10.77.0.1:9192"
LR = 1e-4
MAX_MEASURED_S = 60.0  # a step's transfer longer than this (full adapter at 10 Mbit/s) is modelled, not run


def _say(*a):
    print(*a, file=sys.stderr, flush=True)


@dataclass
class MethodCost:
    """One method's messages and CPU costs (medians per step) at the bench's scale."""

    messages: list = field(default_factory=list)  # the bytes each step sends (signed, for spar4)
    encode_s: float = 0.0
    apply_s: float = 0.0
    sign_s: float = 0.0    # spar4 only: Ed25519 over the framed message
    verify_s: float = 0.0  # spar4 only: the site's check before it parses anything

    @property
    def nbytes(self) -> float:
        """Mean bytes per step."""
        return statistics.mean(map(len, self.messages))


def adapter_costs(manifest, steps: int) -> dict:
    """Full bf16 adapter and lossless bf16 delta along the full-sync trajectory; step 0 warms up."""
    stream, init = GradientStream(manifest, seed=0), initial_params(manifest, 0)
    ref = PolicyReplica.genesis("wan", manifest, init, "adamw")
    ref_builder = UpdateBuilder(ref, make_encoder("dense", manifest))
    out, times = ({m: MethodCost() for m in ("full-adapter", "lossless-delta")},
                  {"full-adapter": [], "lossless-delta": []})
    site_flat = bf16_flat(ref.state.params)
    for step in range(steps + 1):
        _say(f"bench wan: cpu full-adapter / lossless-delta step {step}/{steps}")
        before = list(ref.state.params)
        ref_builder.step(stream.next(), {"lr": LR})
        after = ref.state.params
        t0 = time.perf_counter()
        full = full_adapter_payload(after)
        t1 = time.perf_counter()
        flat = torch.frombuffer(bytearray(full), dtype=torch.bfloat16)  # the site loads the adapter
        t2 = time.perf_counter()
        delta = lossless_delta_payload(before, after)
        t3 = time.perf_counter()
        site_flat = apply_lossless_delta(site_flat, delta)
        t4 = time.perf_counter()
        assert torch.equal(site_flat.view(torch.int16), flat.view(torch.int16))
        if step:
            for m, data, enc, app in (("full-adapter", full, t1 - t0, t2 - t1),
                                      ("lossless-delta", delta, t3 - t2, t4 - t3)):
                out[m].messages.append(data)
                times[m].append((enc, app))
    for m, c in out.items():
        c.encode_s, c.apply_s = (statistics.median(x[i] for x in times[m]) for i in (0, 1))
    return out


def spar4_cost(manifest, steps: int, fraction: float, signer: Signer) -> MethodCost:
    """spar4 at `fraction` of the bf16 adapter: trainer encode + frame, sign; site verify, decode + apply."""
    stream, init = GradientStream(manifest, seed=0), initial_params(manifest, 0)
    builder = UpdateBuilder(PolicyReplica.genesis("wan", manifest, init, "adamw"),
                            make_encoder("spar4", manifest, Budget(fraction)))
    site = PolicyReplica.genesis("wan", manifest, init, "adamw")
    site.recycle = True
    verifier, cost, times = signer.verifier(), MethodCost(), []
    for step in range(steps + 1):
        _say(f"bench wan: cpu spar4 {100 * fraction:.3g}% step {step}/{steps}")
        grads = stream.next()
        t0 = time.perf_counter()
        data = builder.step(grads, {"lr": LR}).to_bytes(signer)
        t1 = time.perf_counter()
        signed, trailer = split_trailer(data, "bench")
        signer.sign(bytes(signed))
        t2 = time.perf_counter()
        verifier.verify(signed, trailer, "bench")
        t3 = time.perf_counter()
        site.keyring.trust(verifier)
        assert site.apply_bytes(data, "bench")
        t4 = time.perf_counter()
        assert site.digest == builder.replica.digest
        if step:
            cost.messages.append(data)
            sign = t2 - t1
            times.append((t1 - t0 - sign, sign, t3 - t2, t4 - t3 - (t3 - t2)))
    cost.encode_s, cost.sign_s, cost.verify_s, cost.apply_s = (statistics.median(x[i] for x in times) for i in range(4))
    return cost


def _run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def measure_network(messages: list, sites: int, mbit: int, shared: bool, run: str) -> list:
    """Publish each message (a transaction of a fenced writer) on the shaped WAN; seconds until every site has it."""
    from hilo.log import open_log, updates_topic
    _run([str(OPS / "wan" / "shape.sh"), "--sites", "4", "--rate", f"{mbit}mbit",
          "--quiet"] + (["--shared"] if shared else []))
    log = open_log(f"kafka://{BROKER}")
    log.create_topics(run)
    log.become_writer(run, 0)
    procs = [subprocess.Popen(["ip", "netns", "exec", f"hilo-site-{i}", sys.executable, "-m",
                               "hilo.ops.bench.wan_receiver",
                               "--log", f"kafka://{BROKER}", "--run", run, "--versions", str(len(messages))],
                              stdout=subprocess.PIPE, text=True) for i in range(1, sites + 1)]
    try:
        for p in procs:
            json.loads(p.stdout.readline())  # "ready": the receiver is connected and polling
        results = []
        for v, data in enumerate(messages, start=1):
            t0 = time.time()
            with log.transaction() as tx:
                tx.append(updates_topic(run), split(data, run, "update", v))
            done = [json.loads(p.stdout.readline()) for p in procs]
            assert all(d["version"] == v and d["bytes"] == len(data) for d in done), done
            results.append(max(d["t"] for d in done) - t0)
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        log.close()
    return results


def _row(method: str, c: MethodCost, n: int, mbit: int, shared: bool, net: float, how: str, compute_s: float,
         **extra) -> dict:
    fresh = c.encode_s + net + c.apply_s
    signed = fresh + c.sign_s + c.verify_s
    r = {"method": method, "sites": n, "link_mbit": mbit, "shared_uplink": shared, "bytes_per_step": round(c.nbytes),
         "encode_s": round(c.encode_s, 3), "sign_s": round(c.sign_s, 4), "network_s": round(net, 3), "network": how,
         "verify_s": round(c.verify_s, 4), "apply_s": round(c.apply_s, 3), "freshness_s": round(fresh, 3),
         "freshness_signed_s": round(signed, 3), "step_s": round(compute_s + fresh, 3),
         "step_signed_s": round(compute_s + signed, 3)}
    _say(f"bench wan: {method:22s} {n} site(s) {mbit:5d} Mbit/s {'shared' if shared else 'separate'}: "
         f"{r['bytes_per_step']:,} B, network {net:.2f} s ({how}), freshness {fresh:.2f} s")
    return r | extra


def run_bench(steps: int, compute_s: float, links: list, site_counts: list, out_dir: pathlib.Path, shape: str) -> dict:
    """CPU phase, then every (method, sites, link) on the emulated WAN; one site alone, or all on a shared uplink."""
    manifest = qwen3_manifest(shape)
    adapter_bytes = manifest.adapter_bytes()
    signer = Signer(Ed25519PrivateKey.generate())  # a run's key: only its cost matters here
    costs = adapter_costs(manifest, steps)
    for m, frac in FIXED.items():
        if frac is not None:
            costs[m] = spar4_cost(manifest, steps, frac, signer)
    for m, c in costs.items():
        _say(f"bench wan: {m}: {c.nbytes:,.0f} B/step, encode {c.encode_s:.3f} s, sign {c.sign_s:.4f} s, "
             f"verify {c.verify_s:.4f} s, apply {c.apply_s:.3f} s")
    auto_costs = {}  # fraction -> MethodCost, encoded after the network phase tells the fraction
    # What a trainer that has published at these budgets knows of its CPU per unit fraction (the rule's line fit)
    slope = cpu_slope([(frac, costs[m].encode_s) for m, frac in FIXED.items() if frac is not None]) or 0.0
    env = dict(os.environ, HILO_KAFKA_HOST=BROKER.split(":")[0], HILO_KAFKA_PORT=BROKER.split(":")[1],
               HILO_KAFKA_DIR=os.path.join(os.environ.get("HILO_CACHE", os.path.expanduser("~/.cache/hilo-sync")),
                                           "kafka-wan"))
    rows = []
    try:
        _run([str(OPS / "wan" / "setup.sh"), "--sites", "4", "--rate", "0"])
        _run([str(OPS / "kafka" / "stop.sh"), "--wipe"], env=env)
        _run([str(OPS / "kafka" / "start.sh")], env=env)
        tag = int(time.time())
        for mbit in links:
            for n in site_counts:
                shared = n > 1
                # smallest first: the effective rate is known early
                fixed = sorted(FIXED, key=lambda m: costs[m].nbytes)
                got, rate = {}, None
                for m in fixed:
                    c = costs[m]
                    if rate is not None and n * c.nbytes * 8 / (mbit * 1e6) > MAX_MEASURED_S:
                        got[m] = (c.nbytes / rate, "modelled")
                    else:
                        times = measure_network(c.messages, n, mbit, shared, f"wan-{tag}-{len(rows)}-{m[:4]}")
                        got[m] = (statistics.median(times), "measured")
                        rate = c.nbytes / got[m][0]  # effective bytes/s of the slowest site, largest message so far
                    rows.append(_row(m, c, n, mbit, shared, *got[m], compute_s))
                base = next(r for r in rows[-len(fixed):] if r["method"] == "spar4 1.6%")
                link_bps = base["bytes_per_step"] / base["network_s"]
                for share in AUTO_SHARES:
                    frac, rule = fit(AutoBudget(share=share), base["step_s"], link_bps, adapter_bytes, slope)
                    key = round(frac, 5)
                    if key not in auto_costs:
                        auto_costs[key] = spar4_cost(manifest, steps, key, signer)
                    c = auto_costs[key]
                    net = statistics.median(measure_network(c.messages, n, mbit, shared, f"wan-{tag}-{len(rows)}-auto"))
                    rows.append(_row(f"auto (share {share})", c, n, mbit, shared, net, "measured", compute_s,
                                     auto={"fraction": key, "rule": rule, "link_bps": round(link_bps),
                                           "step_s": base["step_s"],
                                           "cpu_s_per_fraction": round(slope, 3)}))
    finally:
        subprocess.run([str(OPS / "kafka" / "stop.sh"), "--wipe"], env=env)
        subprocess.run([str(OPS / "wan" / "teardown.sh")])
    res = {"rows": rows, "shape": shape, "compute_s": compute_s, "steps": steps, "adapter_bytes": adapter_bytes,
           "cpu": {m: {"encode_s": c.encode_s, "sign_s": c.sign_s, "verify_s": c.verify_s, "apply_s": c.apply_s,
                       "bytes": c.nbytes} for m, c in costs.items()},
           "delay": "none (this kernel has no sch_netem): rate limits only", "targets": targets(rows)}
    res["plot"] = plot(res, out_dir)
    return res


def targets(rows: list) -> dict:
    """The issue's targets from the rows: auto against the best fixed budget, freshness, speedups over the adapter."""
    out = {}
    configs = sorted({(r["link_mbit"], r["sites"]) for r in rows})
    for mbit, n in configs:
        here = {r["method"]: r for r in rows if (r["link_mbit"], r["sites"]) == (mbit, n)}
        best = min((r for m, r in here.items() if m in FIXED), key=lambda r: r["step_s"])
        tag = f"{n} site(s), {mbit} Mbit/s"
        out[tag] = {"best_fixed": best["method"],
                    "speedup_full_over_spar4_1.6": round(here["full-adapter"]["step_s"] / here["spar4 1.6%"]["step_s"],
                                                         2),
                    **{f"{m}_over_best_fixed": round(r["step_s"] / best["step_s"], 3) for m, r in here.items()
                       if m.startswith("auto")}}
    one = [r for r in rows if r["method"] == "spar4 1.6%" and r["sites"] == 1 and r["link_mbit"] == 100]
    if one:
        out["freshness_1_site_100mbit_spar4_1.6"] = {"unsigned_s": one[0]["freshness_s"],
                                                     "signed_s": one[0]["freshness_signed_s"]}
    return out


def plot(res: dict, out_dir: pathlib.Path) -> str:
    """Step time vs link rate per method, one panel per site count (measured and modelled points)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    counts = sorted({r["sites"] for r in res["rows"]})
    methods = list(dict.fromkeys(r["method"] for r in res["rows"]))
    fig, axes = plt.subplots(1, len(counts), figsize=(6 * len(counts), 4.5), squeeze=False)
    for ax, n in zip(axes[0], counts):
        for m in methods:
            pts = sorted((r["link_mbit"], r["step_s"], r["network"]) for r in res["rows"] if r["method"] == m
                         and r["sites"] == n)
            line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", label=m)
            modelled = [p for p in pts if p[2] == "modelled"]
            ax.plot([p[0] for p in modelled], [p[1] for p in modelled], "x", color=line.get_color(), ms=10)
        ax.set(xscale="log", yscale="log", xlabel="link rate (Mbit/s)", ylabel="step time (s)",
               title=f"{res['shape']} r64, {n} site(s){' on one shared uplink' if n > 1 else ''}; x = modelled")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return save_figure(fig, out_dir, "wan")


def main(as_json: bool, steps: int, compute_s: float, links: str, sites: str, out: str | None,
         shape: str = "qwen3-1.7b") -> int:
    """Run the benchmark; print the table or JSON."""
    out_dir = results_dir("wan", out)
    res = run_bench(steps, compute_s, [int(x) for x in links.split(",")], [int(x) for x in sites.split(",")], out_dir,
                    shape)
    if save(res, out_dir, "wan", as_json):
        return 0
    print(markdown(res))
    return 0


def markdown(res: dict) -> str:
    """The table of the rows in docs/benchmarks.md."""
    lines = ["| method | sites | link Mbit/s | bytes/step | encode s | network s | apply s | freshness s (signed) | "
             "step s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        name = r["method"] + (f" → {100 * r['auto']['fraction']:.2g}% ({r['auto']['rule']})" if "auto" in r else "")
        net = f"{r['network_s']:.2f}" + (" (modelled)" if r["network"] == "modelled" else "")
        lines.append(f"| {name} | {r['sites']}{' shared' if r['shared_uplink'] else ''} | {r['link_mbit']} | "
                     f"{r['bytes_per_step']:,} | {r['encode_s']:.2f} | {net} | {r['apply_s']:.2f} | "
                     f"{r['freshness_s']:.2f} ({r['freshness_signed_s']:.2f}) | {r['step_s']:.2f} |")
    return "\n".join(lines)
