"""The one fused pass: for every row of every block, its gradient (decoded in place), the optimizer step and the
NaN/Inf check, with nothing adapter-sized in between.

Work items are row ranges of blocks (`items`: block, first row, end row, block rows), spread over numba's threads
by prange. Each element is computed by the same op sequence whichever thread runs its item, so the bits do not
depend on the thread count or the schedule. An item's rows are contiguous in every buffer, so the step runs over
them as one span (a block with 64 columns would otherwise pay a loop setup per 64 elements); a low-rank gradient
is decoded row by row into an item-sized buffer first (L1/L2-resident). Buffers arrive as addresses (one call
covers any number of blocks, whatever tensors hold them); kernels/apply.py checks each one's dtype, shape and
contiguity before it passes an address. addr_in rows: params, slot 1, slot 2, AdamW's sqrt buffer; addr_out rows:
params, slot 1, slot 2. A low-rank block's factors: lr[b] = (k, u offset, u row stride, s offset, v offset, v row
stride) into the flat fp32 u, s, v.
"""
import numpy as np
from numba import carray, prange

from ..digest import LONG_PIECE_BYTES
from . import adamw, add, lion, residual, sgd
from ._jit import f32_ptr, helper, kernel, u32_ptr, u64_ptr
from .lowrank import lowrank_row
from .xxh3 import BLOCK_WORDS, INIT, absorb, blocks, finish, piece_hash

ZERO_GRAD, DENSE, LOWRANK = 0, 1, 2   # where a block's gradient comes from
FLOAT = 4                              # bytes per element


@kernel
def run(opt, sc, items, cols, src, g_addr, lr, u, s, v, addr_in, addr_out, flags, hash_out, hashes):
    """Apply step `opt` (a kernel module's CODE) to every item; flags[item] gets the NaN/Inf bits its span returns, and
    hashes[item, j] the XXH3-64 of output j's span for each bit j set in hash_out (spans over 240 bytes: the digest's
    pieces, replica/digest.py). Where every output span starts on 8 bytes, each 1 KB of output is hashed right after the
    step wrote it (in L1, while the memory keeps streaming the next inputs); else the span is hashed after the step."""
    for it in prange(items.shape[0]):
        b, r0, r1 = items[it, 0], items[it, 1], items[it, 2]
        n = cols[b]
        span, off = (r1 - r0) * n, r0 * n * FLOAT
        ins = (carray(f32_ptr(addr_in[0, b] + off), span), carray(f32_ptr(addr_in[1, b] + off), span),
               carray(f32_ptr(addr_in[2, b] + off), span), carray(f32_ptr(addr_in[3, b] + off), span))
        outs = (carray(f32_ptr(addr_out[0, b] + off), span), carray(f32_ptr(addr_out[1, b] + off), span),
                carray(f32_ptr(addr_out[2, b] + off), span))
        g = _gradient(opt, b, r0, r1, n, span, off, src, g_addr, lr, u, s, v)
        hashed = hash_out if span * FLOAT >= LONG_PIECE_BYTES else 0
        if hashed and (off + addr_out[0, b]) % 8 == 0 and (off + addr_out[1, b]) % 8 == 0 \
                and (off + addr_out[2, b]) % 8 == 0:
            acc = np.empty((3, 8), np.uint64)
            for j in range(3):
                acc[j, :] = INIT
            bad, whole = 0, blocks(span)
            for k in range(0, (span + BLOCK_WORDS - 1) // BLOCK_WORDS):
                bad |= _step(opt, sc, g, ins, outs, k * BLOCK_WORDS, min(span, (k + 1) * BLOCK_WORDS))
                if k < whole:
                    for j in range(3):
                        if hashed & (1 << j):
                            absorb(acc[j], carray(u64_ptr(addr_out[j, b] + off), span // 2), k)
            for j in range(3):
                if hashed & (1 << j):
                    hashes[it, j] = finish(acc[j], carray(u32_ptr(addr_out[j, b] + off), span),
                                           carray(u64_ptr(addr_out[j, b] + off), span // 2), span)
        else:
            bad = _step(opt, sc, g, ins, outs, 0, span)
            for j in range(3):
                if hashed & (1 << j):
                    hashes[it, j] = piece_hash(addr_out[j, b] + off, span)
        flags[it] = bad


@helper
def _gradient(opt, b, r0, r1, n, span, off, src, g_addr, lr, u, s, v):
    """One item's gradient: the message's dense bytes, or its rows decoded from the low-rank factors."""
    if opt == adamw.PARAMS_CODE:  # AdamW's second pass reads no gradient
        return np.empty(0, np.float32)
    if src[b] == DENSE:
        return carray(f32_ptr(g_addr[b] + off), span)
    g = np.empty(span, np.float32)
    k = lr[b, 0] if src[b] == LOWRANK else 0
    for i in range(r0, r1):
        lowrank_row(g[(i - r0) * n:(i - r0 + 1) * n], i, n, k, u, lr[b, 1], lr[b, 2], s, lr[b, 3], v, lr[b, 4],
                    lr[b, 5])
    return g


@helper
def _step(opt, sc, g, ins, outs, a, e):
    """The step on elements [a, e) of one item (ins: params, slot 1, slot 2, AdamW's sqrt; outs: params, slot 1, slot
    2); its NaN/Inf bits."""
    p, p_out = ins[0][a:e], outs[0][a:e]
    if opt == adamw.PARAMS_CODE:
        return adamw.params_row(p, outs[1][a:e], ins[3][a:e], p_out, sc)
    if opt == adamw.CODE:
        return adamw.moments_row(g[a:e], ins[1][a:e], ins[2][a:e], outs[1][a:e], outs[2][a:e], sc)
    if opt == adamw.ONE_PASS_CODE:
        return adamw.step_row(g[a:e], p, ins[1][a:e], ins[2][a:e], p_out, outs[1][a:e], outs[2][a:e], sc)
    if opt == sgd.CODE:
        return sgd.row(g[a:e], p, ins[1][a:e], p_out, outs[1][a:e], sc)
    if opt == residual.CODE:  # the encoder's self-check: p is the corrected gradient, p_out the decoded one
        return residual.row(g[a:e], p, p_out, outs[1][a:e])
    if opt == lion.CODE:
        return lion.row(g[a:e], p, ins[1][a:e], p_out, outs[1][a:e], sc)
    return add.row(g[a:e], p, p_out)
