"""The fused apply's Python side: check the buffers, lay out one kernel call, map its flags to the reference's errors.

`step` is PolicyReplica.compute's kernel path: given the message's payload (or gradients already decoded), it
returns what the optimizer's reference `step` would (new params, slots, scalars) and the NaN/Inf bits per block,
bit for bit. Nothing is written before every buffer has been checked: a buffer the kernel cannot take is refused
in one line naming the block (UnfitState).
"""
import threading

import numpy as np
import torch

from hilo.schemas.errors import UnfitState
from hilo.schemas.records import MATH_VERSION, Manifest

from .. import finite
from ..digest import piece_rows
from ..codecs import decode as decode_gradient
from ..codecs import dense
from ..codecs.base import block_entries, block_what
from ..codecs.lowrank import block_payload
from ..optimizers.base import Buffers
from ..state import ReplicaState
from . import fused, residual
from .lowrank import widen4

LOWRANK = ("powersgd", "spar", "spar4")  # the codecs whose payload is lowrank.py's format
# AdamW's two passes run over groups of consecutive blocks of about this many elements: few enough kernel calls (each
# wakes the threads: 0.1-1 ms on a busy 2-core machine), small enough that a group's new moments are still in cache
GROUP_ELEMENTS = 1 << 21
SQRT_PIECE = 32768  # torch's grain size (at::internal::GRAIN_SIZE): a smaller op runs on the calling thread
_layouts: dict = {}      # manifest id -> layout(): the work split depends on the shapes only
# One kernel call at a time per process: numba's fallback thread pool (workqueue, where neither TBB nor OpenMP loads)
# aborts on concurrent launches, and two replicas stepping at once would only share the same two cores anyway.
_one_at_a_time = threading.Lock()


def layout(manifest: Manifest) -> tuple:
    """(items (N, 4): block, first row, end row, block rows; cols per block; groups: [(first block, end block, first
    item, end item)] of consecutive blocks up to GROUP_ELEMENTS; each block's offset in its group; each block's first
    item, and the item count last) for `manifest`, cached."""
    hit = _layouts.get(manifest.manifest_id)
    if hit is None:
        items, cols, groups, at = [], [], [], np.zeros(len(manifest.blocks), np.int64)
        size = GROUP_ELEMENTS + 1
        for b, spec in enumerate(manifest.blocks):
            m, n = spec.shape
            cols.append(n)
            if size + spec.numel > GROUP_ELEMENTS and (not groups or groups[-1][0] < b):
                groups.append([b, b, len(items), len(items)])
                size = 0
            at[b], size = size, size + spec.numel
            # an item is a piece of digest version 3 (up to 16K elements): its decoded gradient and outputs stay in
            # L1/L2 while the kernel hashes them, and thousands of items balance the threads
            per = piece_rows(n)
            items += [(b, r, min(m, r + per), m) for r in range(0, m, per)]
            groups[-1][1], groups[-1][3] = b + 1, len(items)
        items = np.array(items, np.int64).reshape(-1, 4)
        edges = np.searchsorted(items[:, 0], np.arange(len(manifest.blocks) + 1))
        hit = (items, np.array(cols, np.int64), [tuple(g) for g in groups], at, edges)
        _layouts[manifest.manifest_id] = hit
    return hit


def _address(t, manifest: Manifest, b: int, kind: str, what: str) -> int:
    """t's data address, after checking the kernel can take it (fp32, C-contiguous, CPU, the manifest's shape)."""
    spec = manifest.blocks[b]
    # the common case in one line (a torch tensor: 4-byte aligned by its dtype); anything else gets the full look below
    if type(
        t) is torch.Tensor and t.dtype is torch.float32 and t.shape == spec.shape and t.is_contiguous() and t.is_cpu:
        return t.data_ptr()
    if isinstance(t, np.ndarray):
        dtype, contiguous, cpu, shape, addr = t.dtype == np.float32, t.flags.c_contiguous, True, t.shape, t.ctypes.data
    else:
        dtype, contiguous, cpu, shape = t.dtype == torch.float32, t.is_contiguous(), t.device.type == "cpu", tuple(
            t.shape)
        addr = t.data_ptr()
    problem = ("not float32" if not dtype else "not on the CPU" if not cpu
               else f"shape {tuple(shape)}, manifest says {spec.shape}"
               if tuple(shape) != spec.shape else "not contiguous" if not contiguous else "misaligned" if addr % 4
               else None)
    if problem:
        raise UnfitState(f"{what}: the fused apply cannot take the {kind} of block '{spec.key}': {problem} "
                         f"(dtype {getattr(t, 'dtype', '?')}); refused before anything was written (--apply reference "
                         f"takes it)")
    return addr


def gradient_sources(codec: str, manifest: Manifest, params: dict, blocks: list, what: str, limits) -> tuple | None:
    """(src, dense gradients, lr, u, s, v) for a payload the kernel decodes itself, or None for a codec it does not
    (topk: its reference decode runs first). Low-rank: every block's fields checked as the reference checks them, in its
    order (block_payload), then all factors widened to fp32 in one vectorised op per encoding. Dense: the message's
    bytes."""
    nb = len(manifest.blocks)
    src, lr, none = np.zeros(nb, np.int64), np.zeros((nb, 6), np.int64), np.zeros(1, np.float32)
    if codec == "dense":
        return src + fused.DENSE, dense.views(manifest, params, blocks, what, limits), lr, none, none, none
    if codec not in LOWRANK:
        return None
    raw = {4: ([], []), 16: ([], [])}  # bits -> (u rows, v rows) as the message holds them
    at = {4: [0, 0], 16: [0, 0]}       # bits -> widened elements so far (u, v)
    ss, s_at, enc = [], 0, np.zeros(nb, np.int64)
    for i, entry in block_entries(manifest, blocks, what, require_all=False):
        k, bits, u, v, s = block_payload(entry, manifest.blocks[i].shape, block_what(what, manifest, i), limits)
        width = 2 if bits == 4 else 1   # fp32 values per stored element: a byte holds two nibbles
        src[i], enc[i] = fused.LOWRANK, bits
        lr[i] = (k, at[bits][0], width * u.shape[1], s_at, at[bits][1], width * v.shape[1])
        raw[bits][0].append(u.reshape(-1))
        raw[bits][1].append(v.reshape(-1))
        ss.append(s)
        at[bits][0] += width * u.size
        at[bits][1] += width * v.size
        s_at += k
    flat = lambda xs, bits: _widen(np.concatenate(xs), bits) if xs else np.zeros(0, np.float32)  # noqa: E731
    u4, v4 = flat(raw[4][0], 4), flat(raw[4][1], 4)
    lr[enc == 16, 1] += len(u4)  # fp16 blocks' factors follow the 4-bit ones
    lr[enc == 16, 4] += len(v4)
    cat = lambda *xs: np.concatenate(xs + (none,)).astype(np.float32, copy=False)  # noqa: E731  (never empty)
    return src, None, lr, cat(u4, flat(raw[16][0], 16)), cat(*ss) if ss else none, cat(v4, flat(raw[16][1], 16))


def _widen(raw: np.ndarray, bits: int) -> np.ndarray:
    """Stored factor values as fp32: nibbles to -8..7 (two per byte, in a compiled loop), fp16 widened; exact."""
    if bits == 16:
        return raw.astype(np.float32)
    out = np.empty(2 * raw.size, np.float32)
    widen4(raw, out)
    return out


def step(opt, module, manifest: Manifest, state, hparams: dict, out: Buffers, what: str, sources: tuple | None = None,
         grads: list | None = None, math_version: int = MATH_VERSION) -> tuple:
    """(new params, {slot: new tensors}, new scalars, bits per block, piece hashes): the fused step. `sources` from
    gradient_sources, or `grads`: decoded fp32 gradients (any codec, or the trainer's own decode); `math_version`: the
    message's. Piece hashes: digest version 3's, per new tensor (params, then slots), or None before version 3."""
    nb = len(manifest.blocks)
    if sources is None:
        none = np.zeros(1, np.float32)
        sources = (np.zeros(nb, np.int64) + fused.DENSE, grads, np.zeros((nb, 6), np.int64), none, none, none)
    src, dense_g, lr, u, s, v = sources
    coeffs, scalars = opt.coefficients(state.scalars, hparams)
    sc = module.coefficients(coeffs)
    # every address checked before the kernel writes anything
    g_addr = np.zeros(nb, np.int64)
    keep = []  # arrays made here (a misaligned payload copied) live until the kernel returns
    for b in range(nb):
        if src[b] == fused.DENSE:
            g = dense_g[b]
            if isinstance(g, np.ndarray) and g.ctypes.data % 4:
                g = g.copy()  # a payload at an odd offset: copied once, aligned (the bits are the same)
                keep.append(g)
            g_addr[b] = _address(g, manifest, b, "gradient", what)
    names = list(opt.slots)
    addr_in, addr_out = np.zeros((4, nb), np.int64), np.zeros((3, nb), np.int64)
    new_p, new_s = [], {n: [] for n in names}
    for b in range(nb):
        p = state.params[b]
        addr_in[0, b] = _address(p, manifest, b, "params", what)
        for j, n in enumerate(names):
            addr_in[j + 1, b] = _address(state.slots[n][b], manifest, b, f"optimizer state '{n}'", what)
    for b in range(nb):
        p = state.params[b]
        new_p.append(out.param(b, p))
        addr_out[0, b] = _address(new_p[-1], manifest, b, "new params", what)
        for j, n in enumerate(names):
            new_s[n].append(out.slot(n, b, state.slots[n][b]))
            addr_out[j + 1, b] = _address(new_s[n][-1], manifest, b, f"new optimizer state '{n}'", what)
    hashes = np.zeros((len(layout(manifest)[0]), 3), np.uint64) if manifest.digest_version >= 3 else None
    with _one_at_a_time:
        flags = _run(module, sc, manifest, new_s, out, (src, g_addr, lr, u, s, v, addr_in, addr_out), math_version,
                     hashes, 1 + len(names))
    bits = np.zeros(nb, np.int64)
    np.bitwise_or.at(bits, layout(manifest)[0][:, 0], flags)
    return new_p, new_s, scalars, bits, _per_tensor(manifest, hashes, 1 + len(names))


def _per_tensor(manifest: Manifest, hashes: np.ndarray | None, outputs: int) -> list | None:
    """The kernel's piece hashes (item, output) as one array per tensor in the digest's order: params, then each
    slot."""
    if hashes is None:
        return None
    edges = layout(manifest)[4]
    return [hashes[edges[b]:edges[b + 1], j] for j in range(outputs) for b in range(len(manifest.blocks))]


def _run(module, sc, manifest: Manifest, new_s: dict, out: Buffers, addresses: tuple, math_version: int,
         hashes: np.ndarray | None, outputs: int) -> np.ndarray:
    """The kernel call(s) over checked addresses; the NaN/Inf bits per work item. Each call hashes the outputs it writes
    into `hashes` (None: none), `outputs` of them: params, then the slots."""
    src, g_addr, lr, u, s, v, addr_in, addr_out = addresses
    items, cols, groups, at, _ = layout(manifest)
    flags = np.zeros(len(items), np.int64)
    args = (cols, src, g_addr, lr, u, s, v, addr_in, addr_out)
    every = (1 << outputs) - 1 if hashes is not None else 0  # bit j: hash output j (0 params, 1.. the slots)
    hashes = hashes if hashes is not None else np.zeros((len(items), 3), np.uint64)
    if not getattr(module, "SQRT_BETWEEN", False):
        fused.run(module.CODE, sc, items, *args, flags, every, hashes)
    elif math_version >= 2:  # AdamW with a correctly rounded sqrt: the hardware's, inside the one pass
        fused.run(module.ONE_PASS_CODE, sc, items, *args, flags, every, hashes)
    # group by group, so the new moments are still in cache for torch's sqrt and the second pass (adamw.py says why)
    else:
        root = out.scratch(torch.empty(max(int(at[e - 1]) + manifest.blocks[e - 1].numel for _, e, _, _ in groups)))
        addr_in[3, :] = root.data_ptr() + 4 * at
        second = np.zeros(len(items), np.int64)
        for b0, b1, lo, hi in groups:
            # writes the moments
            fused.run(module.CODE, sc, items[lo:hi], *args, flags[lo:hi], every & ~1, hashes[lo:hi])
            # in pieces torch runs on this thread: its own thread pool would fight numba's for the cores
            for b in range(b0, b1):
                flat, dst = new_s["exp_avg_sq"][b].view(-1), root[at[b]:at[b] + manifest.blocks[b].numel]
                for c in range(0, len(flat), SQRT_PIECE):
                    torch.sqrt(flat[c:c + SQRT_PIECE], out=dst[c:c + SQRT_PIECE])
            # the params
            fused.run(module.PARAMS_CODE, sc, items[lo:hi], *args, second[lo:hi], every & 1, hashes[lo:hi])
        flags |= second
    return flags


def self_check(codec: str, manifest: Manifest, params: dict, blocks: list, corrected: list, what: str, limits) -> tuple:
    """An encoder's self-check (Encoder.encode) in one fused pass: (decoded, residual), new CPU tensors per block, where
    decoded is what every replica decodes from `blocks` and residual = corrected - decoded, both with the reference's
    bits. For a codec whose decode is fused (kernels.DECODES, not dense: a lossless codec keeps no residual)."""
    src, _, lr, u, s, v = gradient_sources(codec, manifest, params, blocks, what, limits)
    nb = len(manifest.blocks)
    decoded, left = [torch.empty(b.shape) for b in manifest.blocks], [torch.empty(b.shape) for b in manifest.blocks]
    addr_in, addr_out = np.zeros((4, nb), np.int64), np.zeros((3, nb), np.int64)
    for b in range(nb):
        addr_in[0, b] = _address(corrected[b], manifest, b, "corrected gradient", what)
        addr_out[0, b], addr_out[1, b] = decoded[b].data_ptr(), left[b].data_ptr()
    items, cols = layout(manifest)[:2]
    with _one_at_a_time:
        fused.run(residual.CODE, residual.coefficients(None), items, cols, src, np.zeros(nb, np.int64), lr, u, s, v,
                  addr_in, addr_out, np.zeros(len(items), np.int64), 0, np.zeros((len(items), 3), np.uint64))
    return decoded, left


def compute(opt, module, state, msg, what: str, hparams: dict, out: Buffers, limits, decoded=None):
    """PolicyReplica.compute's kernel path: the state `msg` leads to, with the same refusals as the reference path, in
    one pass per block. `decoded`: gradients already decoded from `msg` (the trainer's own decode), else from its
    blocks."""
    sources = None
    if decoded is None:
        sources = gradient_sources(msg.codec, state.manifest, msg.codec_params, msg.blocks, what, limits)
        if sources is None:  # a codec whose decode is not fused: its reference decode, then the fused step
            decoded = decode_gradient(msg.codec, state.manifest, msg.codec_params, msg.blocks, what, limits)
    params, slots, scalars, bits, known = step(opt, module, state.manifest, state, hparams, out, what, sources, decoded,
                                               msg.math)
    finite.check_flags(bits, opt.slots, state.manifest, msg, what)
    return ReplicaState(state.manifest, state.optimizer, msg.version, params, slots, scalars, known)
