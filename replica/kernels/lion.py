"""Lion's step for one row, fused: replica/optimizers/lion.py is the specification, op for op.

c = m*b1 + g*c1;  p = p*decay - sign(c)*lr;  m = m*b2 + g*c2. sign as torch's: +1, -1, and +0 for zeros and NaN.
"""
import numpy as np

from ._jit import helper

CODE = 2
PLUS, MINUS, ZERO = np.float32(1.0), np.float32(-1.0), np.float32(0.0)


def coefficients(c) -> np.ndarray:
    """[lr, decay, b1, c1, b2, c2] as fp32, from Lion.coefficients."""
    return np.array([float(c[k]) for k in ("lr", "decay", "b1", "c1", "b2", "c2")], np.float32)


@helper
def row(g, p, m, p_out, m_out, sc):
    """One span of rows (contiguous in every buffer); returns the NaN/Inf bits (1: g, 2: p, 4: m)."""
    lr, decay, b1, c1, b2, c2 = sc[0], sc[1], sc[2], sc[3], sc[4], sc[5]
    bg = bp = bm = False
    for c in range(g.size):
        gc = g[c]
        mix = m[c] * b1 + gc * c1
        sign = PLUS if mix > ZERO else (MINUS if mix < ZERO else ZERO)
        pc = p[c] * decay - sign * lr
        mc = m[c] * b2 + gc * c2
        p_out[c] = pc
        m_out[c] = mc
        bg |= not np.isfinite(gc)
        bp |= not np.isfinite(pc)
        bm |= not np.isfinite(mc)
    return (1 if bg else 0) | (2 if bp else 0) | (4 if bm else 0)
