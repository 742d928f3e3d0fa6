"""The state digest, by definition version (`Manifest.digest_version`; SPEC.md, "State digest").

Version 1 is one xxh3-128 stream over every tensor's bytes: a stream is sequential, so it ran on one core (about
0.07 s per 837 MB AdamW state at 1.7B). Version 2 is the same stream with each tensor's bytes replaced by that
tensor's own xxh3-128: the tensors hash on every core at once (xxhash releases the GIL), and the bits do not depend
on how many threads did it. Version 3 cuts each tensor into pieces of whole rows (`piece_rows`) and the stream takes
each piece's standard XXH3-64 instead: the fused apply kernel hashes each piece as it writes it, while it is still
in cache (replica/kernels/xxh3.py), so a state's digest costs no second pass over memory. A state computed another
way (the reference path, a loaded snapshot) is hashed here, with the xxhash library, piece by piece. A run's manifest
says which version its digests follow, so logs written before version 3 replay to the digests they promise.
"""
import os
import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import xxhash

from hilo.schemas.records import Manifest

PARALLEL_FROM_BYTES = 16 << 20  # below this a thread pool costs more than it saves (tests' tiny states)
PIECE_ELEMENTS = 1 << 14  # version 3: a piece is as many whole rows as fit in this many elements (at least one row)
LONG_PIECE_BYTES = 241    # XXH3's long-input path, the one the kernel hashes; shorter pieces are always hashed here


def piece_rows(cols: int) -> int:
    """Rows per piece of a (rows, cols) tensor under digest version 3 (the last piece may have fewer)."""
    return max(1, PIECE_ELEMENTS // max(cols, 1))


def state_digest(manifest: Manifest, optimizer: str, version: int, params: list, slots: dict, scalars: dict,
                 known: list | None = None) -> bytes:
    """The digest of a replica state under its manifest's definition version. `known`: version 3's piece hashes the
    fused kernel computed as it wrote the tensors (one uint64 array per tensor, params then slots; pieces of
    LONG_PIECE_BYTES or more), taken instead of reading the tensors again."""
    h = xxhash.xxh3_128()
    h.update(struct.pack("<Q", version))
    h.update(manifest.manifest_id)
    h.update(optimizer.encode())
    tensors = list(params) + [t for ts in slots.values() for t in ts]
    parts = iter(_piece_parts(tensors, known) if manifest.digest_version >= 3
                 else _tensor_parts(tensors, manifest.digest_version))
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
    return _on_threads(raws, xxhash.xxh3_128_digest)


def _piece_parts(tensors: list, known: list | None) -> list:
    """Version 3's part of each tensor: its pieces' XXH3-64, each 8 bytes little-endian, in row order."""
    if known is None:
        return _on_threads([(_raw(t), _piece_bytes(t.shape)) for t in tensors], lambda w: _pieces(*w, None))
    return [_pieces(t, _piece_bytes(t.shape), k) for t, k in zip(tensors, known)]


def _piece_bytes(shape: tuple) -> int:
    """Bytes per piece of an fp32 tensor of `shape`."""
    cols = shape[-1] if len(shape) > 1 else 1
    return max(4, piece_rows(cols) * cols * 4)


def _pieces(t, step: int, known) -> bytes:
    """One tensor's part under version 3 (t: its raw bytes, or where `known` is given the tensor itself): long pieces
    from `known` where given, every other piece hashed here."""
    if known is None:
        return np.array([xxhash.xxh3_64_intdigest(t[at:at + step]) for at in range(0, t.nbytes, step)], "<u8").tobytes()
    nbytes = 4 * t.numel()
    count, tail = -(-nbytes // step), nbytes % step or step
    if step >= LONG_PIECE_BYTES and tail >= LONG_PIECE_BYTES:
        return known.astype("<u8", copy=False).tobytes()  # every piece long: the kernel hashed them all
    raw, out = _raw(t), np.array(known, "<u8")
    for i in range(count):
        piece = raw[i * step:(i + 1) * step]
        if piece.nbytes < LONG_PIECE_BYTES:
            out[i] = xxhash.xxh3_64_intdigest(piece)
    return out.tobytes()


def _on_threads(work: list, fn) -> list:
    """[fn(w) for w in work], on threads when there is enough of it: one contiguous run per thread, equal in bytes."""
    size = lambda w: (w[0] if isinstance(w, tuple) else w).nbytes  # noqa: E731
    total = sum(size(w) for w in work)
    workers = min(len(os.sched_getaffinity(0)), 8)
    if total < PARALLEL_FROM_BYTES or workers == 1:
        return [fn(w) for w in work]
    # One contiguous run of tensors per thread, about equal in bytes: a task per tensor (1,176 at 1.7B) costs more in
    # hand-offs than the hashing it spreads.
    runs, edge, done = [[]], total / workers, 0
    for w in work:
        if done >= edge * len(runs) and len(runs) < workers:
            runs.append([])
        runs[-1].append(w)
        done += size(w)
    with ThreadPoolExecutor(len(runs), thread_name_prefix="hilo-digest") as pool:
        return [d for part in pool.map(lambda run: [fn(w) for w in run], runs) for d in part]


def _raw(t: torch.Tensor) -> memoryview:
    # Zero-copy view of the fp32 bytes (little-endian hosts only, which is every supported host).
    return memoryview(t.contiguous().numpy()).cast("B")
