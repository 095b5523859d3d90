"""numba loops of the GEMM lowerings (kernel layer; imports numba, so ``gemm.py`` imports
it only through ``_spread()``, where numba is available).

``spread`` writes a strided 1x1 layer's data gradient: the products of the outputs' cells
spread to the input cells they read, zeros in every other cell, each row of the result
written once, in order. ``scatter_add`` is col2im's scatter for ``gemm.scatter_chunks``:
a chunk's products added into the input cells their windows cover.
"""

from __future__ import annotations

from numba import njit

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
