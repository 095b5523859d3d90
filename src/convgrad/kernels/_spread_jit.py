"""numba loop of the GEMM lowerings (kernel layer; imports numba, so ``gemm.py`` imports it
only through ``_spread()``, where numba is available).

``spread`` writes a strided 1x1 layer's data gradient: the products of the outputs' cells
spread to the input cells they read, zeros in every other cell, each row of the result
written once, in order.
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
