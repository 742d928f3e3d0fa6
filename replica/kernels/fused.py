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

from . import adamw, add, lion, residual, sgd
from ._jit import f32_ptr, kernel
from .lowrank import lowrank_row

ZERO_GRAD, DENSE, LOWRANK = 0, 1, 2   # where a block's gradient comes from
FLOAT = 4                              # bytes per element


@kernel
def run(opt, sc, items, cols, src, g_addr, lr, u, s, v, addr_in, addr_out, flags):
    """Apply step `opt` (a kernel module's CODE) to every item; flags[item] gets the NaN/Inf bits its span returns."""
    for it in prange(items.shape[0]):
        b, r0, r1 = items[it, 0], items[it, 1], items[it, 2]
        n = cols[b]
        span, off = (r1 - r0) * n, r0 * n * FLOAT
        p = carray(f32_ptr(addr_in[0, b] + off), span)
        p_out = carray(f32_ptr(addr_out[0, b] + off), span)
        if opt == adamw.PARAMS_CODE:  # AdamW's second pass reads no gradient
            flags[it] = adamw.params_row(p, carray(f32_ptr(addr_out[1, b] + off), span), carray(f32_ptr(addr_in[3, b] + off), span),
                                         p_out, sc)
            continue
        if src[b] == DENSE:
            g = carray(f32_ptr(g_addr[b] + off), span)
        else:
            g = np.empty(span, np.float32)
            k = lr[b, 0] if src[b] == LOWRANK else 0
            for i in range(r0, r1):
                lowrank_row(g[(i - r0) * n:(i - r0 + 1) * n], i, n, k, u, lr[b, 1], lr[b, 2], s, lr[b, 3], v, lr[b, 4], lr[b, 5])
        if opt == adamw.CODE:
            bad = adamw.moments_row(g, carray(f32_ptr(addr_in[1, b] + off), span), carray(f32_ptr(addr_in[2, b] + off), span),
                                    carray(f32_ptr(addr_out[1, b] + off), span), carray(f32_ptr(addr_out[2, b] + off), span), sc)
        elif opt == adamw.ONE_PASS_CODE:
            bad = adamw.step_row(g, p, carray(f32_ptr(addr_in[1, b] + off), span), carray(f32_ptr(addr_in[2, b] + off), span), p_out,
                                 carray(f32_ptr(addr_out[1, b] + off), span), carray(f32_ptr(addr_out[2, b] + off), span), sc)
        elif opt == sgd.CODE:
            bad = sgd.row(g, p, carray(f32_ptr(addr_in[1, b] + off), span), p_out, carray(f32_ptr(addr_out[1, b] + off), span), sc)
        elif opt == residual.CODE:  # the encoder's self-check: p is the corrected gradient, p_out the decoded one
            bad = residual.row(g, p, p_out, carray(f32_ptr(addr_out[1, b] + off), span))
        elif opt == lion.CODE:
            bad = lion.row(g, p, carray(f32_ptr(addr_in[1, b] + off), span), p_out, carray(f32_ptr(addr_out[1, b] + off), span), sc)
        else:
            bad = add.row(g, p, p_out)
        flags[it] = bad
