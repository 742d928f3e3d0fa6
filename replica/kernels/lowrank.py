"""Low-rank decode fused into the step: one row of a block rebuilt from its factors, in the order torch sums them.

The payload format and the specification are replica/codecs/lowrank.py: out = 0; out += (u_j * s_j) v_j^T for
j = 0..k-1, each product and each sum an individually rounded fp32 op (the factors widen to fp32 exactly). Here row
i of a block is built in a row buffer (L1-resident) that the optimizer step reads right away, instead of the whole
block being written once per rank-1 term. Four terms are added per sweep of the row, each rounded in turn
(((acc + t0) + t1) + t2) + t3: the specification's order, with a quarter of the row's loads and stores.
"""
import numpy as np

from ._jit import helper

ZERO, EIGHT = np.float32(0.0), np.float32(8.0)


@helper
def lowrank_row(acc, i, n, k, u, u0, u_stride, s, s0, v, v0, v_stride):
    """acc[:n] = row i of sum_j (u_j[i] * s_j) v_j, j = 0, 1, ...: u_j = u[u0 + j*u_stride:], v_j = v[v0 + j*v_stride:]."""
    for c in range(n):
        acc[c] = ZERO  # +0, as torch.zeros: the first term is added to it, not stored (0 + -0 is +0)
    j = 0
    while j + 4 <= k:
        a0 = u[u0 + j * u_stride + i] * s[s0 + j]
        a1 = u[u0 + (j + 1) * u_stride + i] * s[s0 + j + 1]
        a2 = u[u0 + (j + 2) * u_stride + i] * s[s0 + j + 2]
        a3 = u[u0 + (j + 3) * u_stride + i] * s[s0 + j + 3]
        r0, r1, r2, r3 = v0 + j * v_stride, v0 + (j + 1) * v_stride, v0 + (j + 2) * v_stride, v0 + (j + 3) * v_stride
        for c in range(n):
            acc[c] = (((acc[c] + a0 * v[r0 + c]) + a1 * v[r1 + c]) + a2 * v[r2 + c]) + a3 * v[r3 + c]
        j += 4
    while j < k:
        a = u[u0 + j * u_stride + i] * s[s0 + j]
        r = v0 + j * v_stride
        for c in range(n):
            acc[c] = acc[c] + a * v[r + c]
        j += 1


@helper
def widen4(packed, out):
    """out[2i], out[2i+1] = the low and high nibble of packed[i], minus 8: lowrank.widen's table, without a gather."""
    for i in range(packed.size):
        b = packed[i]
        out[2 * i] = np.float32(b & 15) - EIGHT
        out[2 * i + 1] = np.float32(b >> 4) - EIGHT
