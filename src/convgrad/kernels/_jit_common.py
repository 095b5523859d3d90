"""Pieces shared by the compiled kernels (kernel layer; imports numba, so it is imported
only by ``_depthwise_jit`` and ``_thin_jit``).

Register tiles: a small array of accumulators that the hot loops index only with
constants after unrolling. On the stack (``alloca``) LLVM promotes it to vector registers;
a heap array (``np.empty``) may alias the other arrays, so every update went through
memory (measured in both kernels: the thin forward tile 62 -> 88 GFLOP/s per core with
FMA, the depthwise weight-gradient taps 14 -> 19 G multiply-adds/s).

Calls into the micro-kernels compiled with llvmlite (``_ukernel.py``): ``_indirect_call``
builds intrinsics that call a function by its address (an argument, never a constant of
the compiled loop, so numba's on-disk cache stays valid in every process); ``_dotkernel``
is the lane-sum family (``dotkernel(R, J, ...)``), shared by ``blocked``'s 1x1 weight
gradient and the depthwise weight gradient.

Row copies: ``copy_elems`` (contiguous, one ``llvm.memcpy``) and ``gather_strided`` (a
constant or variable stride, unsigned offsets) fill both kernels' padded and phase grids.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
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


@intrinsic
def copy_elems(typingctx, dst_t, dst_off_t, src_t, src_off_t, n_t):
    """``copy_elems(dst, i, src, j, n)``: ``dst.flat[i:i + n] = src.flat[j:j + n]`` for two
    C-contiguous arrays of one element type, as one ``llvm.memcpy`` (the ranges must lie
    inside the arrays and not overlap; nothing is checked).

    A row of a depthwise layer is 7-112 elements: the vectorized copy loop pays its
    overlap checks and remainder per row, and a 28-element row ran entirely in the scalar
    remainder (measured, one core, 256 channels x 28 rows of 28 into a wider grid: 0.057
    ms as a loop, 0.028 as memcpy; 56-element rows 0.065 / 0.050; 112 the same)."""
    if dst_t.dtype != src_t.dtype:
        return None

    def codegen(context, builder, sig, args):
        dst, doff, src, soff, n = args
        da = context.make_array(sig.args[0])(context, builder, dst)
        sa = context.make_array(sig.args[2])(context, builder, src)
        item = context.get_abi_sizeof(context.get_value_type(sig.args[0].dtype))
        nbytes = builder.mul(n, context.get_constant(types.intp, item))
        cgutils.raw_memcpy(builder, builder.gep(da.data, [doff]), builder.gep(sa.data, [soff]), nbytes, 1)
        return context.get_dummy_value()
    return types.void(dst_t, types.intp, src_t, types.intp, types.intp), codegen


@njit(nogil=True, cache=True, inline="always")
def gather_strided(dst, src, d0, s0, n, s):
    """``dst[d0 + j] = src[s0 + s*j]`` for ``j < n``, offsets unsigned (no negative-index
    wrap test per element) and the stride a constant in the stride-2 branch: LLVM makes a
    faster loop of each. Measured, one thread, the 19 MB input of mobilenet conv1 (mb32):
    a bare stride-2 row copy 5.8 ms with signed offsets, 4.1 with a variable stride, 2.1
    with neither (a whole phase split in views, as ``phase_merge`` is, took 8.5)."""
    d0, s0 = np.uint64(d0), np.uint64(s0)
    if s == 2:
        for j in range(np.uint64(n)):
            dst[d0 + j] = src[s0 + np.uint64(2) * j]
    else:
        su = np.uint64(s)
        for j in range(np.uint64(n)):
            dst[d0 + j] = src[s0 + su * j]


def _indirect_call(nargs: int):
    """``(signature, codegen)`` of an intrinsic ``f(addr, x1 .. x_nargs)`` that calls the
    function at ``addr`` with ``nargs`` 64-bit integers."""
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fnty = ir.FunctionType(ir.VoidType(), [i64] * nargs)
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        builder.call(fn, list(args[1:]))
        return context.get_dummy_value()
    return types.void(*([types.int64] * (nargs + 1))), codegen


@intrinsic
def _dotkernel(typingctx, addr, R, J, a, b, y, npos, a_rs, b_rs, y_rs):
    """``dotkernel(R, J, a, b, y, npos, a_rs, b_rs, y_rs)`` at ``addr`` (``_ukernel``
    module doc: ``y[r*y_rs + j] += sum_p a[r*a_rs + p] * b[j*b_rs + p]``, p < npos,
    addresses as integers, strides in elements)."""
    return _indirect_call(9)


@intrinsic
def _stencil(typingctx, addr, key, x, w, y, npos, x_rs, x_cs, y_rs):
    """``stencil(key, x, w, y, npos, x_rs, x_cs, y_rs)`` at ``addr`` (``_ukernel`` module
    doc; ``key`` from ``stencil_key``)."""
    return _indirect_call(8)


@njit(nogil=True, cache=True, inline="always")
def stencil_key(KH, KW, U, accumulate):
    """``_ukernel.stencil_key`` in compiled code (the same formula: checked by a test)."""
    return ((KH * 8 + KW) * 8 + U) * 2 + (1 if accumulate else 0)


@intrinsic
def _transpose(typingctx, addr, src, src_rs, dst, dst_rs, nr, nc, sl):
    """The compiled ``V x V`` block transpose at ``addr`` (``_ukernel.transpose_ir``)."""
    return _indirect_call(7)


def _prefetch_codegen(write: int):
    """``(signature, codegen)`` of ``llvm.prefetch`` of the line at an address (kept in
    every cache level; ``write`` 1: with write intent, ``prefetchw`` where the CPU has it)."""
    def codegen(context, builder, signature, args):
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(fn, [builder.inttoptr(args[0], i8p), i32(write), i32(3), i32(1)])
        return context.get_dummy_value()
    return types.void(types.int64), codegen


@intrinsic
def _prefetch(typingctx, addr):
    """Ask for the cache line at address ``addr`` ahead of its use (a read; a hint that
    never faults)."""
    return _prefetch_codegen(0)


@intrinsic
def _prefetch_write(typingctx, addr):
    """``_prefetch`` of a line about to be written."""
    return _prefetch_codegen(1)


@intrinsic
def _up2(typingctx, addr, key, x, w, y, nvec, x_rs, y_rs, lo, hi):
    """``up2(key, x, w, y, nvec, x_rs, y_rs, lo, hi)`` at ``addr`` (``_ukernel._up2_variant_ir``;
    ``key`` from ``_ukernel.up2_key``)."""
    return _indirect_call(9)


@intrinsic
def _rowdot(typingctx, addr, key, x, dy, acc, npos, nrows, x_rs, x_us, dy_rs, lo, hi):
    """``rowdot(key, x, dy, acc, npos, nrows, x_rs, x_us, dy_rs, lo, hi)`` at ``addr``
    (``_ukernel._rowdot_variant_ir``; ``key`` from ``_ukernel.row_key``)."""
    return _indirect_call(11)


@intrinsic
def _rowfwd(typingctx, addr, key, x, w, y, npos, nrows, x_rs, x_us, y_rs, lo, hi):
    """``rowfwd(key, x, w, y, npos, nrows, x_rs, x_us, y_rs, lo, hi)`` at ``addr``
    (``_ukernel._rowfwd_variant_ir``; ``key`` from ``_ukernel.row_key``)."""
    return _indirect_call(11)
