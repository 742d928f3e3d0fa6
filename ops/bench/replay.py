"""`hilo bench replay`: a site that was down catches up, and what its state costs, at a real adapter's shape.

    hilo bench replay [--shape qwen3-1.7b] [--behind 100] [--apply kernel,reference] [--json]

Per optimizer (AdamW and SGD in gradient mode; "add", what a delta-mode site runs): a trainer replica makes `behind`
versions of spar4 at 1.6% from the synthetic gradients (replica/synthetic.py) and appends them, chunked and with
the headers the producer writes, to an embedded log. A site that holds version 0 then replays them through the real
follower (read, reassemble, unframe, decode, optimizer step, digest): versions per second and the time per stage,
twice from the same log: with new buffers per version, then recycling the replaced state's (what a site runs).
Its digest must equal the trainer's. One row per apply path (`apply`: the fused kernel, replica/kernels/, and the
torch reference), replaying the same log. Then its state: snapshot save and load time (fsynced, as a site saves)
and the bytes on disk, optimizer state included; a delta-mode site keeps the parameters only.

Beside them, the machine's triad bandwidth (a = b + s*c in torch, the best of a few runs) and each row's apply time
over its floor: the bytes the step must move at that bandwidth (FLOOR_BYTES: fp32 reads and writes per parameter,
the gradient counted as one read, as docs/results/replay.json's targets count them).
"""
import json
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

from hilo.log import open_log, updates_topic
from hilo.ops.bench.codecs import DEFAULT_LR
from hilo.ops.bench.machine import measured_on, triad_gbps
from hilo.ops.bench.report import results_dir, save
from hilo.replica.synthetic import GradientStream, initial_params, qwen3_manifest
from hilo.producer.update_builder import UpdateBuilder
from hilo.replay.follower import Applied, Follower
from hilo.replay.snapshot import SnapshotStore
from hilo.replica.codecs import Budget, make_encoder
from hilo.replica.replica import PolicyReplica
from hilo.schemas import headers as H
from hilo.schemas.chunks import split
from hilo.schemas.position import Position

OPTIMIZERS = ("adamw", "sgd", "add")  # add: a delta-mode site (parameters only, no optimizer state)
APPLY = ("kernel", "reference")       # PolicyReplica.apply_mode: the fused kernel, then the torch path it must equal
CHUNK_BYTES = 900_000                 # the producer's default record size
# bytes a fused step must move per parameter: AdamW reads p, g, m, v and writes p, m, v; SGD p, g, buf and p, buf; add
# p, g and p
FLOOR_BYTES = {"adamw": 28, "sgd": 20, "add": 12}


def _say(*a):
    print(*a, file=sys.stderr, flush=True)


def publish(log, run: str, shape: str, optimizer: str, versions: int) -> tuple:
    """Append `versions` messages of a trainer replica to `log`; (the trainer's final digest, bytes per message, median
    encode + apply s, median encode s)."""
    manifest = qwen3_manifest(shape)
    trainer = PolicyReplica.genesis(run, manifest, initial_params(manifest), optimizer)
    builder = UpdateBuilder(trainer, make_encoder("spar4", manifest, Budget(0.016)))
    stream, topic, log_bytes, sizes, encode, alone = GradientStream(manifest, seed=0), updates_topic(run), 0, [], [], []
    for v in range(versions):
        proposal = builder.propose(stream.next(), {"lr": DEFAULT_LR[optimizer]} if optimizer in DEFAULT_LR else {})
        builder.commit(proposal)
        data = proposal.message.to_bytes()
        log_bytes += len(data)
        log.append(topic, split(data, run, "update", proposal.message.version, CHUNK_BYTES,
                                H.update_headers(proposal.message.digest, log_bytes)))
        sizes.append(len(data))
        encode.append(proposal.timing["encode"] + proposal.timing["apply"])
        alone.append(proposal.timing["encode"])
        if (v + 1) % 20 == 0:
            _say(f"bench replay: {shape}/{optimizer}: published {v + 1}/{versions}")
    return trainer.digest, statistics.mean(sizes), statistics.median(encode), statistics.median(alone)


def one(shape: str, optimizer: str, behind: int, work: pathlib.Path, apply: tuple = APPLY,
        triad: float | None = None) -> list:
    """Publish once, replay from version 0 on each apply path, snapshot; one row per path."""
    run = f"replay-{optimizer}"
    log = open_log(f"file://{work}/log")
    log.create_topics(run)
    digest, msg_bytes, encode_s, encoder_s = publish(log, run, shape, optimizer, behind)
    manifest = qwen3_manifest(shape)
    rows = []
    for mode in apply:
        replays = {}
        for recycle in (False, True):  # what a site did before it recycled its buffers, then what it does
            site = PolicyReplica.genesis(run, manifest, initial_params(manifest), optimizer)
            site.recycle, site.apply_mode = recycle, mode
            follower = Follower(log, run, site, Position(next_offset=0))
            stages, t0 = {}, time.perf_counter()
            applied = 0
            for event in follower.catch_up():
                if isinstance(event, Applied):
                    applied += 1
                    for k, s in event.timing.items():
                        stages[k] = stages.get(k, 0.0) + s
            replays[recycle] = (time.perf_counter() - t0, stages)
            if site.digest != digest or applied != behind:
                raise RuntimeError(f"{shape}/{optimizer}/{mode}: replay (recycle={recycle}) applied {applied} of "
                                   f"{behind} versions, digest {site.digest.hex()[:12]} vs the trainer's "
                                   f"{digest.hex()[:12]}")
        replay_s, stages = replays[True]
        row = {"shape": shape, "optimizer": optimizer, "apply": mode, "versions": behind,
               "message_bytes": round(msg_bytes),
               "trainer_encode_apply_s": round(encode_s, 3), "trainer_encode_s": round(encoder_s, 3),
               "replay_s": round(replay_s, 2),
               "versions_per_s": round(behind / replay_s, 2),
               "stage_s_per_version": {k: round(v / behind, 4) for k, v in stages.items()},
               "versions_per_s_new_buffers": round(behind / replays[False][0], 2),
               "stage_s_per_version_new_buffers": {k: round(v / behind, 4) for k, v in replays[False][1].items()}}
        if triad:
            floor = FLOOR_BYTES[optimizer] * manifest.numel / (triad * 1e9)
            row |= {"triad_gbps": round(triad, 2), "floor_s": round(floor, 4),
                    "apply_over_floor": round(stages["apply"] / behind / floor, 2)}
        rows.append(row)
    store = SnapshotStore(work / "state")
    t1 = time.perf_counter()
    store.save(site, follower.position())
    t2 = time.perf_counter()
    loaded, _ = SnapshotStore(work / "state").load()
    t3 = time.perf_counter()
    assert loaded.digest == site.digest
    size = sum(f.stat().st_size for f in (work / "state").rglob("*") if f.is_file())
    # the state and its snapshot do not depend on the apply path: measured once, said on every row
    return [r | {"snapshot_save_s": round(t2 - t1, 2), "snapshot_load_s": round(t3 - t2, 2), "snapshot_bytes": size,
                 "adapter_bytes_bf16": manifest.adapter_bytes()} for r in rows]


def run_bench(shape: str, behind: int, optimizers: list, apply: tuple = APPLY) -> dict:
    """Rows per optimizer and apply path, beside the machine's triad bandwidth (measured before and after: the best)."""
    triad = triad_gbps()
    _say(f"bench replay: triad bandwidth {triad:.1f} GB/s")
    rows = []
    for opt in optimizers:
        work = pathlib.Path(tempfile.mkdtemp(prefix="hilo-replay-"))
        try:
            rows += one(shape, opt, behind, work, apply, triad)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for r in rows[-len(apply):]:
            _say(f"bench replay: {shape}/{opt}/{r['apply']}: {r['versions_per_s']} versions/s, apply "
                 f"{r['stage_s_per_version']['apply']:.3f} s ({r.get('apply_over_floor', '?')}x its floor), snapshot "
                 f"{r['snapshot_bytes'] / 1e6:.0f} MB (save {r['snapshot_save_s']} s, load {r['snapshot_load_s']} s)")
    triad_after = triad_gbps()
    return {"shape": shape, "behind": behind, "codec": "spar4", "budget": "1.6%", "triad_gbps": round(triad, 2),
            "triad_gbps_after": round(triad_after, 2), "floor_bytes_per_param": FLOOR_BYTES,
            "measured_on": measured_on(triad),
            "rows": rows}


def table(res: dict) -> str:
    """The table of docs/benchmarks.md."""
    out = ["| shape | optimizer (site) | apply path | versions/s replayed | new buffers per version: versions/s | per "
           "version: fetch / decode / apply s | apply over its floor | snapshot MB | save s | load s |",
           "|---|---|---|---:|---:|---|---:|---:|---:|---:|"]
    for r in res["rows"]:
        st = r["stage_s_per_version"]
        name = "add (delta mode)" if r["optimizer"] == "add" else r["optimizer"]
        over = f"{r['apply_over_floor']:.1f}x" if "apply_over_floor" in r else "-"
        out.append(f"| {r['shape']} | {name} | {r.get('apply', 'reference')} | {r['versions_per_s']:.2f} | "
                   f"{r['versions_per_s_new_buffers']:.2f} | "
                   f"{st.get('fetch', 0):.3f} / {st.get('decode', 0):.3f} / {st.get('apply', 0):.3f} | {over} | "
                   f"{r['snapshot_bytes'] / 1e6:,.0f} | {r['snapshot_save_s']:.2f} | {r['snapshot_load_s']:.2f} |")
    for run in res.get("runs", [res]):
        if "triad_gbps" in run:
            floors = ", ".join(f"{k} {v} B" for k, v in run["floor_bytes_per_param"].items())
            out.append(f"\n{run['shape']} ({run['behind']} versions behind): triad bandwidth of the machine that ran "
                       f"it {run['triad_gbps']:.1f} GB/s before the rows, {run['triad_gbps_after']:.1f} GB/s after "
                       f"(floor: {floors} per parameter at the first).")
    return "\n".join(out)


def merged(res: dict, out_dir: pathlib.Path) -> dict:
    """This run's results with the other shapes' rows and runs already in OUT_DIR/replay.json (a run of a shape replaces
    that shape's): one file holds every shape measured."""
    old = out_dir / "replay.json"
    prior = json.loads(old.read_text()) if old.exists() else {"rows": []}
    runs = [r for r in prior.get("runs", [prior] if "triad_gbps" in prior else []) if r["shape"] != res["shape"]]
    this = {k: v for k, v in res.items() if k != "rows"}
    return this | {"rows": [r for r in prior["rows"] if r["shape"] != res["shape"]] + res["rows"],
                   "runs": runs + [this]}


def main(as_json: bool, shape: str, behind: int, optimizers: list, out: str | None, apply: tuple = APPLY) -> int:
    """Run it; print the table or JSON."""
    out_dir = results_dir("replay", out)
    res = merged(run_bench(shape, behind, optimizers, tuple(apply)), out_dir)
    if not save(res, out_dir, "replay", as_json):
        print(table(res))
    return 0
