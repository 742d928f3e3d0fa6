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
    """acc[:n] = row i of sum_j (u_j[i] * s_j) v_j, j = 0, 1, ...: u_j = u[u0 + j*u_stride:], v_j = v[v0 +
    j*v_stride:]."""
    for c in range(n):
        acc[c] = ZERO  # +0, as torch.zeros: the first term is added to it, not stored (0 + -0 is +0)
    j = 0
    while j + 4 <= k:
        a0, a1 = u[u0 + j * u_stride + i] * s[s0 + j], u[u0 + (j + 1) * u_stride + i] * s[s0 + j + 1]
        a2, a3 = u[u0 + (j + 2) * u_stride + i] * s[s0 + j + 2], u[u0 + (j + 3) * u_stride + i] * s[s0 + j + 3]
        # each factor row as its own view: LLVM vectorises the sweep then (with flat indices it did not, 2x slower)
        r = v0 + j * v_stride
        w0, w1 = v[r:r + n], v[r + v_stride:r + v_stride + n]
        w2, w3 = v[r + 2 * v_stride:r + 2 * v_stride + n], v[r + 3 * v_stride:r + 3 * v_stride + n]
        for c in range(n):
            acc[c] = (((acc[c] + a0 * w0[c]) + a1 * w1[c]) + a2 * w2[c]) + a3 * w3[c]
        j += 4
    while j < k:
        a = u[u0 + j * u_stride + i] * s[s0 + j]
        r = v0 + j * v_stride
        w = v[r:r + n]
        for c in range(n):
            acc[c] = acc[c] + a * w[c]
        j += 1


@helper
def widen4(packed, out):
    """out[2i], out[2i+1] = the low and high nibble of packed[i], minus 8: lowrank.widen's table, without a gather."""
    for i in range(packed.size):
        b = packed[i]
        out[2 * i] = np.float32(b & 15) - EIGHT
        out[2 * i + 1] = np.float32(b >> 4) - EIGHT
