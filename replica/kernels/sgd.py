"""SGD-momentum's step for one row, fused: replica/optimizers/sgd.py is the specification, op for op.

g' = g + p*wd (only when wd != 0);  buf = buf*mu + g';  d = g' + buf*mu (Nesterov) or buf;  p = p - d*lr.
"""
import numpy as np

from ._jit import helper

CODE = 0


def coefficients(c) -> np.ndarray:
    """[lr, mu, wd, wd on, nesterov on] as fp32, from SGD.coefficients."""
    return np.array([float(c["lr"]), float(c["mu"]), float(c["wd"]), 1.0 if c["decay_on"] else 0.0,
                     1.0 if c["nesterov"] else 0.0], np.float32)


@helper
def row(g, p, b, p_out, b_out, sc):
    """One span of rows (contiguous in every buffer); returns the NaN/Inf bits (1: g, 2: p, 4: momentum)."""
    lr, mu, wd = sc[0], sc[1], sc[2]
    decay_on, nesterov = sc[3] != 0, sc[4] != 0
    bg = bp = bb = False
    for c in range(g.size):
        gc = g[c]
        gd = gc + p[c] * wd if decay_on else gc
        bc = b[c] * mu + gd
        d = gd + bc * mu if nesterov else bc
        pc = p[c] - d * lr
        b_out[c] = bc
        p_out[c] = pc
        bg |= not np.isfinite(gc)
        bp |= not np.isfinite(pc)
        bb |= not np.isfinite(bc)
    return (1 if bg else 0) | (2 if bp else 0) | (4 if bb else 0)
