"""The one way every kernel here is compiled, and the pointer casts numba lacks.

Compile options, and why each one keeps the bits of the torch path (replica/optimizers/base.py, "the rules"):
- fastmath off: no reassociation, no reciprocal instead of division, no `contract` flag, so LLVM never fuses a
  multiply and an add into an FMA (tests/replica/test_kernels.py reads the generated assembly for vfmadd);
- error_model="numpy": a division by zero gives Inf/NaN like torch, not a Python exception;
- cache=True: the compile (a few seconds) happens once per machine, into __pycache__ or numba's user cache;
- nogil=True: the caller's other threads (prefetch, snapshot writer) keep running meanwhile.
Scalars reach the kernels as np.float32, so no expression is promoted to float64.
"""
from numba import njit, types
from numba.extending import intrinsic

JIT = {"fastmath": False, "error_model": "numpy", "cache": True, "nogil": True}
PARALLEL = JIT | {"parallel": True}


def kernel(fn):
    """A parallel kernel: rows/blocks over numba's threads (prange), every element computed by one fixed sequence."""
    return njit(**PARALLEL)(fn)


def helper(fn):
    """A helper the kernel calls (LLVM inlines it there, so it vectorises with the kernel's loop)."""
    return njit(**JIT)(fn)


def _pointer(elem):
    """An intrinsic: elem* from an integer address."""
    @intrinsic
    def cast(typingctx, addr):
        sig = types.CPointer(elem)(types.int64)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
        return sig, codegen
    return cast


f32_ptr = _pointer(types.float32)  # a torch tensor's data_ptr(): one kernel call takes every block's buffers
u32_ptr = _pointer(types.uint32)   # the same bytes as words, for the digest's hash (kernels/xxh3.py)
u64_ptr = _pointer(types.uint64)
