"""numba loops of the GEMM lowerings (kernel layer; imports numba, so ``gemm.py`` imports
it only through ``_spread()``, where numba is available).

``spread`` writes a strided 1x1 layer's data gradient: the products of the outputs' cells
spread to the input cells they read, zeros in every other cell, each row of the result
written once, in order. ``scatter_add`` is col2im's scatter for ``gemm.scatter_chunks``:
a chunk's products added into the input cells their windows cover. ``im2col`` builds
an im2col block's column matrix straight from the input: each window row one
``llvm.memcpy`` (or a strided gather), the padding written as zeros, no padded copy of the
input first.
"""

from __future__ import annotations

from numba import njit

from ._jit_common import copy_elems, gather_strided

JIT = dict(nogil=True, cache=True)


@njit(**JIT)
def spread(z, out, row_map, s):
    """``out[c, r, s*j] = z[c, row_map[r], j]`` and zero in every other cell of ``out``
    (``(C, R_in, W_in)``: the input rows over every spatial axis but the last, then the
    last axis) for rows with ``row_map[r] >= 0`` (the rows the outputs read; every cell of
    the others is zero); ``z`` is ``(C, R_out, W_out)`` with ``s*(W_out - 1) < W_in``."""
    C, R_in, W_in = out.shape
    W_out = z.shape[2]
    for c in range(C):
        for r in range(R_in):
            row = out[c, r]
            for i in range(W_in):               # (a row is in L1: zeros, then the products)
                row[i] = 0.0
            m = row_map[r]
            if m < 0:
                continue
            src = z[c, m]
            if s == 2:                           # (a constant stride: a faster loop)
                for j in range(W_out):
                    row[2 * j] = src[j]
            else:
                for j in range(W_out):
                    row[s * j] = src[j]


@njit(**JIT)
def scatter_add(z, out, s0, s1, s2, d0, d1, d2, p0, p1, p2):
    """``out[c, x] += z[c, k, y]`` with ``x = y * s + k * d - p`` per axis, for the cells
    ``x`` inside ``out``: the col2im scatter of a data gradient on three spatial axes (fewer
    axes come as leading axes of size 1). ``z`` is ``(C, K0, K1, K2, Y0, Y1, Y2)``, ``out``
    ``(C, X0, X1, X2)``, both C-contiguous. Each cell's terms are added in the order of
    (k, y), whatever the caller's threads: a caller that gives each thread its own channels
    gets the same bits."""
    C, K0, K1, K2, Y0, Y1, Y2 = z.shape
    X0, X1, X2 = out.shape[1], out.shape[2], out.shape[3]
    zf = z.reshape(-1)
    of = out.reshape(-1)
    ysize = Y0 * Y1 * Y2
    for c in range(C):
        for k0 in range(K0):
            for k1 in range(K1):
                for k2 in range(K2):
                    zt = (((c * K0 + k0) * K1 + k1) * K2 + k2) * ysize
                    off2 = k2 * d2 - p2
                    lo = 0                      # y2 with 0 <= y2 * s2 + off2 < X2
                    while lo < Y2 and lo * s2 + off2 < 0:
                        lo += 1
                    hi = Y2
                    while hi > lo and (hi - 1) * s2 + off2 >= X2:
                        hi -= 1
                    for y0 in range(Y0):
                        x0 = y0 * s0 + k0 * d0 - p0
                        if x0 < 0 or x0 >= X0:
                            continue
                        for y1 in range(Y1):
                            x1 = y1 * s1 + k1 * d1 - p1
                            if x1 < 0 or x1 >= X1:
                                continue
                            zr = zt + (y0 * Y1 + y1) * Y2
                            orow = ((c * X0 + x0) * X1 + x1) * X2 + off2
                            for y2 in range(lo, hi):
                                of[orow + y2 * s2] += zf[zr + y2]


@njit(**JIT)
def _zero(a, i, n):
    for j in range(n):
        a[i + j] = 0


@njit(**JIT)
def _inside(n, s, off, extent):
    """``[lo, hi)``: the outputs ``y < n`` whose input cell ``y * s + off`` lies in
    ``[0, extent)`` (an empty range as ``lo == hi``)."""
    lo = 0
    while lo < n and lo * s + off < 0:
        lo += 1
    hi = n
    while hi > lo and (hi - 1) * s + off >= extent:
        hi -= 1
    return lo, hi


@njit(**JIT)
def im2col(src, out, cn, k, nb, y, n0, c0, reverse, q, s, d, p):
    """``cols[c, k, n, y] = src[n0 + n, c0 + c, (q + y) * s + k' * d - p]`` per axis, zero
    where that cell lies outside ``src`` (the padding), with ``k' = K - 1 - k`` when
    ``reverse``: the K-major column matrix of ``gemm._src_cols`` for the block of outputs
    starting at output ``q``, ``cn`` channels (``c < cn``), kernel ``k``, ``nb`` images
    and outputs ``y`` per axis (three-element tuples, as ``q``, ``s``, ``d``, ``p``; fewer
    spatial axes come as leading axes of size 1). ``out`` is ``cols`` flat, C order
    ``(cn, K0, K1, K2, nb, Y0, Y1, Y2)``; ``src`` is ``(N, C, X0, X1, X2)``, C-contiguous.
    A plain copy: the result is the same for any caller's chunks.

    Each row of ``Y2`` outputs is one ``copy_elems`` (a strided gather when ``s2 > 1``);
    with unit strides and rows as wide as the input's ("same" pads, 1x1 layers) a window's
    whole plane of rows is one copy (derived below). Measured, one thread, against the
    NumPy copy of the windows' view through a padded block: 3x3 stride 1 (128 channels,
    14^2, mb4) 0.62 -> 0.32 ms, 1x1 stride 2 (256 channels, 28^2, mb19) 2.6 -> 1.4, 1x1
    stride 1 (1024 channels, 7^2, mb9) 0.23 -> 0.17, 7x7 stride 2 (3 channels, 224^2,
    mb4) 4.4 -> 3.7; one copy per plane against one per row, 3x3 "same" stride 1, mb4
    (stop 45): 256 channels at 7^2 0.54 -> 0.24 ms, 128 at 14^2 0.41 -> 0.23, 64 at 28^2
    0.45 -> 0.32, 32 at 56^2 0.85 -> 0.78.
    """
    K0, K1, K2 = k
    Y0, Y1, Y2 = y
    q0, q1, q2 = q
    s0, s1, s2 = s
    d0, d1, d2 = d
    p0, p1, p2 = p
    C, X0, X1, X2 = src.shape[1], src.shape[2], src.shape[3], src.shape[4]
    sf = src.reshape(-1)
    plane_len = Y1 * Y2
    # Unit strides and rows as wide as the input's: every window row sits at one offset
    # from its input row, so a plane's cells (y1, y2) and their input cells are two ranges
    # of one length, and one copy moves them all; the few cells whose input lies left or
    # right of the input row (the copy fills them with the neighbouring row's ends) are
    # zeroed after it.
    plane = s1 == 1 and s2 == 1 and Y2 == X2
    row = 0                                   # the next element of ``out``, in its C order
    for c in range(cn):
        for k0 in range(K0):
            off0 = q0 * s0 + (K0 - 1 - k0 if reverse else k0) * d0 - p0
            a0, b0 = _inside(Y0, s0, off0, X0)
            for k1 in range(K1):
                off1 = q1 * s1 + (K1 - 1 - k1 if reverse else k1) * d1 - p1
                a1, b1 = _inside(Y1, s1, off1, X1)
                for k2 in range(K2):
                    off2 = q2 * s2 + (K2 - 1 - k2 if reverse else k2) * d2 - p2
                    lo, hi = _inside(Y2, s2, off2, X2)
                    for n in range(nb):
                        _zero(out, row, a0 * plane_len)
                        row += a0 * plane_len
                        for y0 in range(a0, b0):
                            base = ((((n0 + n) * C + c0 + c) * X0 + y0 * s0 + off0) * X1 + off1) * X2 + off2
                            if plane:
                                if b1 > a1 and hi > lo:
                                    first = a1 * Y2 + lo
                                    last = (b1 - 1) * Y2 + hi
                                    _zero(out, row, first)
                                    copy_elems(out, row + first, sf, base + first, last - first)
                                    for y1 in range(a1, b1 - 1):
                                        _zero(out, row + y1 * Y2 + hi, Y2 - hi + lo)
                                    _zero(out, row + last, plane_len - last)
                                else:
                                    _zero(out, row, plane_len)
                                row += plane_len
                                continue
                            _zero(out, row, a1 * Y2)
                            for y1 in range(a1, b1):
                                r = row + y1 * Y2
                                x = base + y1 * s1 * X2
                                _zero(out, r, lo)
                                if s2 == 1:
                                    copy_elems(out, r + lo, sf, x + lo, hi - lo)
                                else:
                                    gather_strided(out, sf, r + lo, x + lo * s2, hi - lo, s2)
                                _zero(out, r + hi, Y2 - hi)
                            _zero(out, row + b1 * Y2, (Y1 - b1) * Y2)
                            row += plane_len
                        _zero(out, row, (Y0 - b0) * plane_len)
                        row += (Y0 - b0) * plane_len
