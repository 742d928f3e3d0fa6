"""AdamW's step, fused: replica/optimizers/adamw.py is the specification, op for op.

m = m*b1 + g*c1;  v = v*b2 + (g*g)*c2;  p = p*decay - (m / (sqrt(v)/bc2 + eps)) * step_size, every op rounded to
fp32 on its own (no FMA: the module is compiled without fastmath, _jit.py).

Two passes per block with torch's own sqrt between them, because the specification's sqrt is torch.sqrt, and on
CPU that is MKL's vector sqrt, which is *not* correctly rounded on every instruction set: with MKL's AVX-512 code
path about 0.7% of results differ by 1-2 ulp from the correctly rounded sqrt (np.sqrt, the hardware's), with its
SSE4.2 path about 16%, with AVX2 none (measured; MKL_ENABLE_INSTRUCTIONS selects the path). It is a pure function
of the element (thread count and chunking do not change it), so calling it on the block between the two passes
gives the specification's bits wherever the specification runs. The block is still in cache for the second pass.
That is arithmetic version 1 (schemas/records.py MATH_VERSION). From version 2 the specification's sqrt is correctly
rounded, which the hardware's is: the whole step is one pass (step_row).
"""
import numpy as np

from ._jit import helper

CODE = 1          # pass 1: the moments
PARAMS_CODE = 4   # pass 2: the parameters, from the new first moment and sqrt(new second moment)
ONE_PASS_CODE = 5  # arithmetic version 2: moments, correctly rounded sqrt and parameters in one pass
SQRT_BETWEEN = True  # for version 1 (kernels/apply.py)


def coefficients(c) -> np.ndarray:
    """The step's fp32 scalars, in the order the rows read them, from AdamW.coefficients' fp32 tensors."""
    return np.array([float(c[k]) for k in ("b1", "c1", "b2", "c2", "bc2_sqrt", "eps", "step_size", "decay")],
                    np.float32)


@helper
def moments_row(g, m, v, m_out, v_out, sc):
    """Pass 1 on one span of rows; returns the NaN/Inf bits (1: g, 4: m, 8: v)."""
    b1, c1, b2, c2 = sc[0], sc[1], sc[2], sc[3]
    bg = bm = bv = False
    for c in range(g.size):
        gc = g[c]
        mc = m[c] * b1 + gc * c1
        vc = v[c] * b2 + (gc * gc) * c2
        m_out[c] = mc
        v_out[c] = vc
        bg |= not np.isfinite(gc)
        bm |= not np.isfinite(mc)
        bv |= not np.isfinite(vc)
    return (1 if bg else 0) | (4 if bm else 0) | (8 if bv else 0)


@helper
def params_row(p, m_new, root, p_out, sc):
    """Pass 2 on one span of rows (root = torch.sqrt of the new second moment); returns the NaN/Inf bit of p (2)."""
    bc2, eps, step, decay = sc[4], sc[5], sc[6], sc[7]
    bp = False
    for c in range(p.size):
        den = root[c] / bc2 + eps
        pc = p[c] * decay - (m_new[c] / den) * step
        p_out[c] = pc
        bp |= not np.isfinite(pc)
    return 2 if bp else 0


@helper
def step_row(g, p, m, v, p_out, m_out, v_out, sc):
    """Arithmetic version 2's whole step on one span of rows, the sqrt the hardware's (np.sqrt of an fp32 is IEEE's,
    correctly rounded, without fastmath); returns the NaN/Inf bits (1: g, 2: p, 4: m, 8: v)."""
    b1, c1, b2, c2, bc2, eps, step, decay = sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6], sc[7]
    bg = bp = bm = bv = False
    for c in range(g.size):
        gc = g[c]
        mc = m[c] * b1 + gc * c1
        vc = v[c] * b2 + (gc * gc) * c2
        den = np.sqrt(vc) / bc2 + eps
        pc = p[c] * decay - (mc / den) * step
        m_out[c] = mc
        v_out[c] = vc
        p_out[c] = pc
        bg |= not np.isfinite(gc)
        bp |= not np.isfinite(pc)
        bm |= not np.isfinite(mc)
        bv |= not np.isfinite(vc)
    return (1 if bg else 0) | (2 if bp else 0) | (4 if bm else 0) | (8 if bv else 0)
