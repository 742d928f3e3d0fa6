"""The state digest, by definition version (`Manifest.digest_version`; SPEC.md, "State digest").

Version 1 is one xxh3-128 stream over every tensor's bytes: a stream is sequential, so it ran on one core (about
0.07 s per 837 MB AdamW state at 1.7B). Version 2 is the same stream with each tensor's bytes replaced by that
tensor's own xxh3-128: the tensors hash on every core at once (xxhash releases the GIL), and the bits do not depend
on how many threads did it. A run's manifest says which one its digests follow, so logs written before version 2
replay to the digests they promise.
"""
import os
import struct
from concurrent.futures import ThreadPoolExecutor

import torch
import xxhash

from hilo.schemas.records import Manifest

PARALLEL_FROM_BYTES = 16 << 20  # below this a thread pool costs more than it saves (tests' tiny states)


def state_digest(manifest: Manifest, optimizer: str, version: int, params: list, slots: dict, scalars: dict) -> bytes:
    """The digest of a replica state under its manifest's definition version."""
    h = xxhash.xxh3_128()
    h.update(struct.pack("<Q", version))
    h.update(manifest.manifest_id)
    h.update(optimizer.encode())
    tensors = list(params) + [t for ts in slots.values() for t in ts]
    parts = iter(_tensor_parts(tensors, manifest.digest_version))
    for _ in params:
        h.update(next(parts))
    for name, ts in slots.items():
        h.update(name.encode())
        for _ in ts:
            h.update(next(parts))
    for name in sorted(scalars):
        h.update(name.encode() + struct.pack("<d", scalars[name]))
    return h.digest()


def _tensor_parts(tensors: list, digest_version: int) -> list:
    """What the stream takes for each tensor: its bytes (version 1) or its own xxh3-128 (version 2)."""
    raws = [_raw(t) for t in tensors]
    if digest_version == 1:
        return raws
    total = sum(r.nbytes for r in raws)
    workers = min(len(os.sched_getaffinity(0)), 8)
    if total < PARALLEL_FROM_BYTES or workers == 1:
        return [xxhash.xxh3_128_digest(r) for r in raws]
    # One contiguous run of tensors per thread, about equal in bytes: a task per tensor (1,176 at 1.7B) costs more in
    # hand-offs than the hashing it spreads.
    runs, edge, done = [[]], total / workers, 0
    for r in raws:
        if done >= edge * len(runs) and len(runs) < workers:
            runs.append([])
        runs[-1].append(r)
        done += r.nbytes
    with ThreadPoolExecutor(len(runs), thread_name_prefix="hilo-digest") as pool:
        return [d for part in pool.map(lambda run: [xxhash.xxh3_128_digest(r) for r in run], runs) for d in part]

def _raw(t: torch.Tensor) -> memoryview:
    # Zero-copy view of the fp32 bytes (little-endian hosts only, which is every supported host).
    return memoryview(t.contiguous().numpy()).cast("B")
