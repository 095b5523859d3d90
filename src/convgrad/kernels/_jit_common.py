"""Pieces shared by the compiled kernels (kernel layer; imports numba, so it is imported
only by ``_depthwise_jit`` and ``_thin_jit``).

Register tiles: a small array of accumulators that the hot loops index only with
constants after unrolling. On the stack (``alloca``) LLVM promotes it to vector registers;
a heap array (``np.empty``) may alias the other arrays, so every update went through
memory (measured in both kernels: the thin forward tile 62 -> 88 GFLOP/s per core with
FMA, the depthwise weight-gradient taps 14 -> 19 G multiply-adds/s).
"""

from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

# ``contract`` only (no reassociation): each ``r + w*x`` may become one FMA, the same
# additions in the same order, so the sums stay fixed whatever the chunking or threads.
JIT = dict(nogil=True, cache=True, fastmath={"contract"})


def stack_registers(size: int):
    """An intrinsic ``f(dtype) -> pointer`` to ``size`` uninitialised elements of ``dtype``
    on the calling function's stack (wrap it with ``numba.carray(ptr, size)``)."""
    @intrinsic
    def registers(typingctx, dtype_t):
        dt = dtype_t.dtype

        def impl(context, builder, sig, args):
            return cgutils.alloca_once(builder, context.get_value_type(dt), size=size)
        return types.CPointer(dt)(dtype_t), impl
    return registers
