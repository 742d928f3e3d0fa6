"""A site's snapshot at a real adapter's shape: the checkpoint-record format (msgpack + zstd) against raw tensor bytes.

    python -m hilo.ops.bench.snapshot [--shape qwen3-1.7b] [--versions 100] [--repeats 3] [--out DIR] [--json]

A site's AdamW replica is built as `hilo bench replay` builds it (spar4 at 1.6% from the synthetic gradients,
replica/synthetic.py, for `versions` versions), so its optimizer moments compress as a running site's do. Then, each
`repeats` times in a fresh state dir on the disk that holds the temp dir, fsynced as a site saves: SnapshotStore.save
in the checkpoint format (format 1: msgpack + zstd level 1) and in the raw format (format 2, the default), and
SnapshotStore.load of each after its files are dropped from the page cache (a restart's cold read; the raw load
re-hashes the state). And what deciding on compression needs: the raw tensor bytes through zstd (level 1, and
level 1 on every core) then written and fsynced, never stored. And the stall the apply loop sees with background
snapshots: the copy of the state into the reused second buffers (consumer/snapshots.py StateCopy), first (allocating)
and reused, and the digest the writer thread re-checks. Medians of `repeats`; times in seconds, sizes in bytes.
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


def site_state(shape: str, versions: int) -> PolicyReplica:
    """An AdamW replica `versions` versions in, stepped as `hilo bench replay`'s trainer steps it."""
    manifest = qwen3_manifest(shape)
    replica = PolicyReplica.genesis("bench-snapshot", manifest, initial_params(manifest), "adamw")
    builder = UpdateBuilder(replica, make_encoder("spar4", manifest, Budget(0.016)))
    stream = GradientStream(manifest, seed=0)
    for v in range(versions):
        builder.step(stream.next(), {"lr": DEFAULT_LR["adamw"]})
        if (v + 1) % 20 == 0:
            _say(f"bench snapshot: {shape}: state at v{v + 1}/{versions}")
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


def run_bench(shape: str, versions: int, repeats: int) -> dict:
    """The rows: each format's save/load, zstd over raw, the copy and the digest."""
    replica = site_state(shape, versions)
    s = replica.state
    raw_bytes = 4 * s.manifest.numel * (1 + len(s.slots))
    work = pathlib.Path(tempfile.mkdtemp(prefix="hilo-bench-snapshot-"))
    try:
        formats = {}
        for fmt in ("ckpt", "raw"):
            formats[fmt] = _median([_store(replica, fmt, work) for _ in range(repeats)])
            _say(f"bench snapshot: {fmt}: {formats[fmt]}")
        zstd = {}
        for name, threads in (("zstd1", 0), ("zstd1_all_cores", -1)):
            zstd[name] = _median([_zstd_raw(replica, work, threads) for _ in range(repeats)])
            _say(f"bench snapshot: raw through {name}: {zstd[name]}")
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
    return {"shape": shape, "rank": s.manifest.rank, "optimizer": "adamw", "versions": versions, "codec": "spar4",
            "budget": "1.6%", "repeats": repeats,
            "state_bytes": raw_bytes, "cores": os.cpu_count(), "formats": formats, "raw_through_zstd": zstd,
            "copy_first_s": round(first, 3), "copy_s": round(statistics.median(reused), 3),
            "digest_s": round(statistics.median(digest), 3),
            "save_speedup": round(formats["ckpt"]["save_s"] / formats["raw"]["save_s"], 1),
            "load_speedup": round(formats["ckpt"]["load_s"] / formats["raw"]["load_s"], 1)}


def table(res: dict) -> str:
    """One row per way of writing the state."""
    out = [f"| snapshot of {res['shape']} r{res['rank']} AdamW ({res['versions']} versions in) | MB on disk | save s (fsynced) | "
           "cold load s |", "|---|---:|---:|---:|"]
    names = {"ckpt": "checkpoint record: msgpack + zstd 1 (format 1)", "raw": "raw tensor bytes + header (format 2, default)"}
    for fmt, r in res["formats"].items():
        out.append(f"| {names[fmt]} | {r['bytes'] / 1e6:,.0f} | {r['save_s']:.2f} | {r['load_s']:.2f} |")
    for name, r in res["raw_through_zstd"].items():
        out.append(f"| raw through {name.replace('_', ' ')} (not stored) | {r['bytes'] / 1e6:,.0f} | {r['save_s']:.2f} | |")
    out.append(f"| the loop's stall per background snapshot: copy into the reused buffers | | {res['copy_s']:.2f} | |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hilo.ops.bench.snapshot", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen3-1.7b", help="adapter shape (replica/synthetic.py; default: %(default)s)")
    p.add_argument("--versions", type=int, default=100, help="versions stepped into the state first (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="saves and loads per format; medians (default: %(default)s)")
    p.add_argument("--out", metavar="DIR", help="results folder (default: ~/.cache/hilo-sync/bench/snapshot-TIME)")
    p.add_argument("--json", action="store_true", help="print the JSON, not the table")
    a = p.parse_args(argv)
    out_dir = results_dir("snapshot", a.out)
    res = run_bench(a.shape, a.versions, a.repeats)
    if not save(res, out_dir, "snapshot", a.json):
        print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
