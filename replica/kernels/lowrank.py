"""Low-rank decode fused into the step: one row of a block rebuilt from its factors, in the order torch sums them.

The payload format and the specification are replica/codecs/lowrank.py: out = 0; out += (u_j * s_j) v_j^T for
j = 0..k-1, each product and each sum an individually rounded fp32 op (the factors arrive widened to fp32, exactly).
Here row i of a block is built in a row buffer (L1-resident) that the optimizer step reads right away, instead of
the whole block being written once per rank-1 term. `us` (the k rows u_j * s_j) is formed once per block by the
caller (kernels/apply.py) with the same torch multiply the specification uses.
"""
import numpy as np

from ._jit import helper

ZERO = np.float32(0.0)


@helper
def lowrank_row(acc, i, m, n, k, us, u0, v, v0):
    """acc[:n] = row i of sum_j us_j v_j^T, us_j = us[u0 + j*m:][:m], v_j = v[v0 + j*n:][:n]; terms summed j = 0, 1, ..."""
    for c in range(n):
        acc[c] = ZERO  # +0, as torch.zeros: the first term is added to it, not stored (0 + -0 is +0)
    for j in range(k):
        a = us[u0 + j * m + i]
        vb = v0 + j * n
        for c in range(n):
            acc[c] = acc[c] + a * v[vb + c]
