"""A site's snapshot at a real adapter's shape: the checkpoint-record format (msgpack + zstd) against raw tensor bytes.

    python -m hilo.ops.bench.snapshot [--shape qwen3-1.7b] [--state spar4:30 --state dense:3] [--repeats 3]
        [--out DIR] [--json]

Each --state CODEC:N is a site's AdamW replica after N versions made from the synthetic gradients (replica/synthetic.py)
by that codec: spar4 at 1.6% as `hilo bench replay` makes them (the moments of blocks not yet sent are zero, so an
early state compresses best), or dense (every moment set: what a long-running site's state becomes, as each entry
is sent sooner or later). For each, `repeats` times in a fresh state dir on the disk that holds the temp dir, fsynced
as a site saves: SnapshotStore.save in the checkpoint format (format 1: msgpack + zstd level 1) and in the raw format
(format 2, the default), and SnapshotStore.load of each after its files are dropped from the page cache (a restart's
cold read; the raw load re-hashes the state). What deciding on compression needs: the raw tensor bytes through zstd
(level 1, and level 1 on every core) then written and fsynced, never stored. And the stall the apply loop sees with
background snapshots: the copy of the state into the reused second buffers (consumer/snapshots.py StateCopy), first
(allocating) and reused, and the digest the writer thread re-checks. Medians of `repeats`; seconds and bytes.
"""
import argparse
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

import zstandard

from hilo.consumer.snapshots import StateCopy
from hilo.ops.bench.codecs import DEFAULT_LR
from hilo.ops.bench.report import results_dir, save
from hilo.producer.update_builder import UpdateBuilder
from hilo.replay.snapshot import SnapshotStore
from hilo.replica.codecs import Budget, make_encoder
from hilo.replica.replica import PolicyReplica
from hilo.replica.synthetic import GradientStream, initial_params, qwen3_manifest
from hilo.schemas.position import Position


def _say(*a):
    print(*a, file=sys.stderr, flush=True)


def site_state(shape: str, codec: str, versions: int) -> PolicyReplica:
    """An AdamW replica `versions` versions in, stepped by a trainer with `codec` (spar4 at 1.6%, or dense)."""
    manifest = qwen3_manifest(shape)
    replica = PolicyReplica.genesis("bench-snapshot", manifest, initial_params(manifest), "adamw")
    builder = UpdateBuilder(replica, make_encoder(codec, manifest, Budget(0.016) if codec == "spar4" else Budget()))
    stream = GradientStream(manifest, seed=0)
    for v in range(versions):
        builder.step(stream.next(), {"lr": DEFAULT_LR["adamw"]})
        _say(f"bench snapshot: {shape}: {codec} state at v{v + 1}/{versions}")
    return replica


def _size(path: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _drop_cache(path: pathlib.Path) -> None:
    """Evict the files under `path` from the page cache (they are fsynced): the next read comes from the disk."""
    for f in path.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _store(replica: PolicyReplica, fmt: str, work: pathlib.Path) -> dict:
    """One save and one cold load in `fmt`, in a fresh state dir."""
    state = work / f"state-{fmt}"
    shutil.rmtree(state, ignore_errors=True)
    store = SnapshotStore(state, fmt=fmt)
    t0 = time.perf_counter()
    store.save(replica, Position(replica.version))
    t1 = time.perf_counter()
    size = _size(state)
    _drop_cache(state)
    t2 = time.perf_counter()
    loaded, _ = SnapshotStore(state).load()
    t3 = time.perf_counter()
    if loaded.digest != replica.digest:
        raise RuntimeError(f"{fmt}: loaded digest {loaded.digest.hex()} != saved {replica.digest.hex()}")
    del loaded
    shutil.rmtree(state, ignore_errors=True)
    return {"save_s": t1 - t0, "load_s": t3 - t2, "bytes": size}


def _zstd_raw(replica: PolicyReplica, work: pathlib.Path, threads: int) -> dict:
    """The raw tensor bytes through zstd level 1, written and fsynced (what compressing the raw format would cost)."""
    s = replica.state
    tensors = list(s.params) + [t for ts in s.slots.values() for t in ts]
    path = work / "state.bin.zst"
    t0 = time.perf_counter()
    cctx = zstandard.ZstdCompressor(level=1, threads=threads)
    with open(path, "wb") as f:
        with cctx.stream_writer(f, closefd=False) as w:
            for t in tensors:
                w.write(memoryview(t.numpy()).cast("B"))
        f.flush()
        os.fsync(f.fileno())
    t1 = time.perf_counter()
    size = path.stat().st_size
    path.unlink()
    return {"save_s": t1 - t0, "bytes": size}


def _median(rows: list) -> dict:
    return {k: (round(statistics.median(r[k] for r in rows), 3) if k.endswith("_s") else rows[0][k]) for k in rows[0]}


def one(shape: str, codec: str, versions: int, repeats: int) -> dict:
    """The row of one state: each format's save/load, zstd over raw, the copy and the digest."""
    replica = site_state(shape, codec, versions)
    s = replica.state
    moments = [t for ts in s.slots.values() for t in ts]
    work = pathlib.Path(tempfile.mkdtemp(prefix="hilo-bench-snapshot-"))
    try:
        formats = {}
        for fmt in ("ckpt", "raw"):
            formats[fmt] = _median([_store(replica, fmt, work) for _ in range(repeats)])
            _say(f"bench snapshot: {codec}:{versions}: {fmt}: {formats[fmt]}")
        zstd = {}
        for name, threads in (("zstd1", 0), ("zstd1_all_cores", -1)):
            zstd[name] = _median([_zstd_raw(replica, work, threads) for _ in range(repeats)])
            _say(f"bench snapshot: {codec}:{versions}: raw through {name}: {zstd[name]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    copy = StateCopy()
    t0 = time.perf_counter()
    copy.take(replica)
    first = time.perf_counter() - t0
    reused, digest = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        c = copy.take(replica)
        reused.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        assert c.state.digest() == replica.digest
        digest.append(time.perf_counter() - t0)
    return {"codec": codec, "budget": "1.6%" if codec == "spar4" else "100%", "versions": versions,
            "moments_nonzero": round(sum(int(t.count_nonzero()) for t in moments) / sum(t.numel() for t in moments), 3),
            "state_bytes": 4 * s.manifest.numel * (1 + len(s.slots)), "formats": formats, "raw_through_zstd": zstd,
            "copy_first_s": round(first, 3), "copy_s": round(statistics.median(reused), 3),
            "digest_s": round(statistics.median(digest), 3),
            "save_speedup": round(formats["ckpt"]["save_s"] / formats["raw"]["save_s"], 1),
            "load_speedup": round(formats["ckpt"]["load_s"] / formats["raw"]["load_s"], 1)}


def run_bench(shape: str, states: list, repeats: int) -> dict:
    """One row per (codec, versions) state."""
    return {"shape": shape, "rank": qwen3_manifest(shape).rank, "optimizer": "adamw", "repeats": repeats,
            "cores": os.cpu_count(), "rows": [one(shape, codec, n, repeats) for codec, n in states]}


def table(res: dict) -> str:
    """One line per state and way of writing it."""
    out = [f"| {res['shape']} r{res['rank']} AdamW state | written as | MB on disk | save s (fsynced) | cold load s |",
           "|---|---|---:|---:|---:|"]
    names = {"ckpt": "checkpoint record: msgpack + zstd 1 (format 1)",
             "raw": "raw tensor bytes + header (format 2, default)"}
    for r in res["rows"]:
        state = f"{r['codec']} x{r['versions']} ({r['moments_nonzero']:.0%} of moments set)"
        for fmt, f in r["formats"].items():
            out.append(f"| {state} | {names[fmt]} | {f['bytes'] / 1e6:,.0f} | {f['save_s']:.2f} | {f['load_s']:.2f} |")
        for name, z in r["raw_through_zstd"].items():
            out.append(f"| {state} | raw through {name.replace('_', ' ')} (not stored) | {z['bytes'] / 1e6:,.0f} | "
                       f"{z['save_s']:.2f} | |")
        out.append(f"| {state} | the loop's stall per background snapshot: copy into the reused buffers (first: "
                   f"{r['copy_first_s']:.2f}) | | {r['copy_s']:.2f} | |")
    return "\n".join(out)


def _state(text: str) -> tuple:
    codec, _, n = text.partition(":")
    if codec not in ("spar4", "dense") or not n.isdigit() or int(n) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected spar4:N or dense:N with N >= 1")
    return codec, int(n)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hilo.ops.bench.snapshot", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen3-1.7b", help="adapter shape (replica/synthetic.py; default: %(default)s)")
    p.add_argument("--state", type=_state, action="append", metavar="CODEC:N",
                   help="a state N versions in, made by CODEC (spar4 or dense); repeatable (default: spar4:30 and "
                        "dense:3)")
    p.add_argument("--repeats", type=int, default=3, help="saves and loads per format; medians (default: %(default)s)")
    p.add_argument("--out", metavar="DIR", help="results folder (default: ~/.cache/hilo-sync/bench/snapshot-TIME)")
    p.add_argument("--json", action="store_true", help="print the JSON, not the table")
    a = p.parse_args(argv)
    out_dir = results_dir("snapshot", a.out)
    res = run_bench(a.shape, a.state or [("spar4", 30), ("dense", 3)], a.repeats)
    if not save(res, out_dir, "snapshot", a.json):
        print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
