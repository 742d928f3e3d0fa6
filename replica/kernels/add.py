"""Delta mode's step for one row, fused: p = p + d (replica/optimizers/add.py)."""
import numpy as np

from ._jit import helper

CODE = 3


def coefficients(c) -> np.ndarray:
    """No scalars."""
    return np.zeros(1, np.float32)


@helper
def row(g, p, p_out):
    """One span of rows (contiguous in every buffer); returns the NaN/Inf bits (1: d, 2: p)."""
    bg = bp = False
    for c in range(g.size):
        gc = g[c]
        pc = p[c] + gc
        p_out[c] = pc
        bg |= not np.isfinite(gc)
        bp |= not np.isfinite(pc)
    return (1 if bg else 0) | (2 if bp else 0)
