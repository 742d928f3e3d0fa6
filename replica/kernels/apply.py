"""The fused apply's Python side: check the buffers, lay out one kernel call, map its flags to the reference's errors.

`step` is PolicyReplica.compute's kernel path: given the message's payload (or gradients already decoded), it
returns what the optimizer's reference `step` would (new params, slots, scalars) and the NaN/Inf bits per block,
bit for bit. Nothing is written before every buffer has been checked: a buffer the kernel cannot take is refused
in one line naming the block (UnfitState).
"""
import numpy as np
import torch

from hilo.schemas.errors import UnfitState
from hilo.schemas.records import Manifest

from ..codecs import dense
from ..codecs.base import block_entries, block_what
from ..codecs.lowrank import block_factors
from ..optimizers.base import Buffers
from . import fused

ITEM_ELEMENTS = 1 << 15  # elements per work item: small enough that 2 threads balance, large enough to amortise a row's setup
_layouts: dict = {}      # manifest id -> (items, cols): the work split depends on the shapes only


def layout(manifest: Manifest) -> tuple:
    """(items (N, 4): block, first row, end row, block rows; cols per block; first item of each block, and N) for
    `manifest`, cached."""
    hit = _layouts.get(manifest.manifest_id)
    if hit is None:
        items, cols, first = [], [], []
        for b, spec in enumerate(manifest.blocks):
            m, n = spec.shape
            cols.append(n)
            first.append(len(items))
            per = max(1, ITEM_ELEMENTS // max(n, 1))
            items += [(b, r, min(m, r + per), m) for r in range(0, m, per)]
        hit = (np.array(items, np.int64).reshape(-1, 4), np.array(cols, np.int64), first + [len(items)])
        _layouts[manifest.manifest_id] = hit
    return hit


def _address(t, manifest: Manifest, b: int, kind: str, what: str) -> int:
    """t's data address, after checking the kernel can take it (fp32, C-contiguous, CPU, the manifest's shape)."""
    spec = manifest.blocks[b]
    if isinstance(t, np.ndarray):
        dtype, contiguous, cpu, shape, addr = t.dtype == np.float32, t.flags.c_contiguous, True, t.shape, t.ctypes.data
    else:
        dtype, contiguous, cpu, shape = t.dtype == torch.float32, t.is_contiguous(), t.device.type == "cpu", tuple(t.shape)
        addr = t.data_ptr()
    problem = ("not float32" if not dtype else "not on the CPU" if not cpu else f"shape {tuple(shape)}, manifest says {spec.shape}"
               if tuple(shape) != spec.shape else "not contiguous" if not contiguous else "misaligned" if addr % 4 else None)
    if problem:
        raise UnfitState(f"{what}: the fused apply cannot take the {kind} of block '{spec.key}': {problem} "
                         f"(dtype {getattr(t, 'dtype', '?')}); refused before anything was written (--apply reference takes it)")
    return addr


def gradient_sources(codec: str, manifest: Manifest, params: dict, blocks: list, what: str, limits) -> tuple:
    """(src, dense sources, k, u0, v0, us, v) for a payload the kernel decodes itself (lowrank: its factors;
    dense: the message's bytes), or None for a codec it does not (its reference decode runs first)."""
    nb = len(manifest.blocks)
    src, k, u0, v0 = np.zeros(nb, np.int64), np.zeros(nb, np.int64), np.zeros(nb, np.int64), np.zeros(nb, np.int64)
    if codec in ("powersgd", "spar", "spar4"):
        us, vs, at_u, at_v = [], [], 0, 0
        for i, entry in block_entries(manifest, blocks, what, require_all=False):
            kb, _, u, v, s = block_factors(entry, manifest.blocks[i].shape, block_what(what, manifest, i), limits)
            # the specification's own multiply (torch.mul(u[j], s[j]) row by row is this broadcast, element for element)
            us.append(torch.mul(u, s.unsqueeze(1)).reshape(-1).numpy())
            vs.append(v.reshape(-1).numpy())
            src[i], k[i], u0[i], v0[i] = fused.LOWRANK, kb, at_u, at_v
            at_u, at_v = at_u + us[-1].size, at_v + vs[-1].size
        cat = lambda xs: np.ascontiguousarray(np.concatenate(xs), np.float32) if xs else np.zeros(1, np.float32)  # noqa: E731
        return src, None, k, u0, v0, cat(us), cat(vs)
    if codec == "dense":
        none = np.zeros(1, np.float32)
        return src + fused.DENSE, dense.views(manifest, params, blocks, what, limits), k, u0, v0, none, none
    return None


def step(opt, module, manifest: Manifest, state, hparams: dict, out: Buffers, what: str, sources: tuple | None = None,
         grads: list | None = None) -> tuple:
    """(new params, {slot: new tensors}, new scalars, bits per block): the fused step. `sources` from gradient_sources, or
    `grads`: decoded fp32 gradients (any codec, or the trainer's own decode)."""
    nb = len(manifest.blocks)
    if sources is None:
        z = np.zeros(nb, np.int64)
        sources = (z + fused.DENSE, grads, z, z, z, np.zeros(1, np.float32), np.zeros(1, np.float32))
    src, dense_g, k, u0, v0, us, v = sources
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
    items, cols, first = layout(manifest)
    flags = np.zeros(len(items), np.int64)
    args = (cols, src, g_addr, k, u0, v0, us, v, addr_in, addr_out)
    if not getattr(module, "SQRT_BETWEEN", False):
        fused.run(module.CODE, sc, items, *args, flags)
    else:  # per block, so the block is still in cache for torch's sqrt and the second pass (kernels/adamw.py says why)
        root = out.scratch(torch.empty(max(b.numel for b in manifest.blocks)))
        addr_in[3, :] = root.data_ptr()
        second = np.zeros(len(items), np.int64)
        for b, spec in enumerate(manifest.blocks):
            lo, hi = first[b], first[b + 1]
            fused.run(module.CODE, sc, items[lo:hi], *args, flags[lo:hi])
            torch.sqrt(new_s["exp_avg_sq"][b].view(-1), out=root[:spec.numel])
            fused.run(module.PARAMS_CODE, sc, items[lo:hi], *args, second[lo:hi])
        flags |= second
    bits = np.zeros(nb, np.int64)
    np.bitwise_or.at(bits, items[:, 0], flags)
    return new_p, new_s, scalars, bits
