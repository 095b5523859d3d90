"""Compiled loops of the direct depthwise kernel (kernel layer; imports numba, so it is
imported only through ``depthwise.available()``).

Every problem arrives as 3-D: data ``(N, C, D, H, W)``, weights ``(O, KD, KH, KW)`` with
``O = C * M`` (output channel ``o = c*M + m`` reads input channel ``c``), C-contiguous,
float32 or float64, plus ``geo = (sd, sh, sw, dd, dh, dw, pd, ph, pw, M)`` as an int64 array
(so that each function has one signature per element type). A call handles the input
channels ``[c0, c1)``; ``xc0`` / ``yc0`` are the channel (input / output) index of the
first channel held by the passed arrays, which are either the whole canonical arrays
(offset 0) or a converted copy of the block's channels (offset ``c0`` or ``c0*M``).

Index identity (one axis; axes multiply): forward output ``y`` reads input
``i = y*s + k*d - p`` through tap ``k``. For a fixed tap that input is real for
``y`` in ``[lo, hi)`` with ``lo = ceil((p - k*d) / s)`` and ``hi = floor((I - 1 + p - k*d) / s) + 1``
(clipped to ``[0, O)``), so the innermost loop runs over that output-width range with no
per-element test (unit-stride fast path for ``s = 1``), and outer rows whose input row is
padding are skipped. The three directions are the same loop nest:

    fwd          y[n, o, y]      += w[o, k] * x[n, c, y*s + k*d - p]
    bwd_data     dx[n, c, y*s + k*d - p] += w[o, k] * dy[n, o, y]        (scatter)
    bwd_weights  acc[k, y_w]     += dy[n, o, y] * x[n, c, y*s + k*d - p]; dw[o, k] = sum acc[k, :]

The data gradient runs as a gather over the rows of ``dx`` (each ``dx`` row stays in
cache while every tap adds into it): for a row and a tap, the ``dx`` elements written are
``i = y*s + k*d - p`` for ``y`` in the same range ``[lo, hi)``; with ``s = 1`` that is
``dx[i] += w * dy[i - (k*d - p)]`` over ``i`` in ``[lo + k*d - p, hi + k*d - p)``, the same
shape of loop as the forward one.

Taps along the last axis are applied three at a time (``_taps_row``): on the range where
all three are valid one loop computes ``((dst + w0*a) + w1*b) + w2*c``, the same operations
in the same order as three separate passes, with a third of the loads and stores of
``dst``; the edges where fewer taps are valid run tap by tap, in tap order.

Each output element is produced by one call, in a fixed order (fwd: taps kd, kh, kw;
bwd_data: m, kd, kh, kw; bwd_weights: per output-width lane n, od, kd, oh, kh, then the
lanes summed left to right), so results do not depend on how channels are chunked or on
the thread count. No fastmath: the element-wise loops vectorize as they are, and the
weight-gradient reduction vectorizes because it is kept as per-lane partial sums.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True, inline="always")
def _range(o_len, i_len, s, kd, p):
    """Outputs [lo, hi) whose input ``y*s + kd - p`` lies in [0, i_len)."""
    lo = -((kd - p) // s)          # ceil((p - kd) / s), floor division on negatives
    if lo < 0:
        lo = 0
    hi = (i_len - 1 + p - kd) // s + 1
    if hi > o_len:
        hi = o_len
    return lo, hi


@njit(nogil=True, cache=True, inline="always")
def _ranges(o_len, i_len, s, d, p, k_n):
    lo = np.empty(k_n, np.int64)
    hi = np.empty(k_n, np.int64)
    for k in range(k_n):
        lo[k], hi[k] = _range(o_len, i_len, s, k * d, p)
    return lo, hi


@njit(nogil=True, cache=True, inline="always")
def _axpy(dst, src, step, wv, first, lo, hi):
    """dst[j] += wv * src[first + j*step] for j in [lo, hi)."""
    if hi <= lo:
        return
    cnt = hi - lo
    d = dst[lo:hi]
    if step == 1:
        s = src[first + lo:first + hi]
        for j in range(cnt):
            d[j] += wv * s[j]
    else:
        base = first + lo * step
        for j in range(cnt):
            d[j] += wv * src[base + j * step]


@njit(nogil=True, cache=True, inline="always")
def _taps_row(dst, src, step, wrow, first, lo, hi):
    """For t = 0, 1, ... in order: dst[j] += wrow[t] * src[first[t] + j*step], j in [lo[t], hi[t])."""
    n = wrow.shape[0]
    t = 0
    while t + 3 <= n:
        a = max(lo[t], max(lo[t + 1], lo[t + 2]))
        b = min(hi[t], min(hi[t + 1], hi[t + 2]))
        if b < a:
            b = a
        for u in range(t, t + 3):          # left edges, then right edges: disjoint from [a, b)
            _axpy(dst, src, step, wrow[u], first[u], lo[u], min(hi[u], a))
        for u in range(t, t + 3):
            _axpy(dst, src, step, wrow[u], first[u], max(lo[u], b), hi[u])
        if b > a:
            w0, w1, w2 = wrow[t], wrow[t + 1], wrow[t + 2]
            d = dst[a:b]
            if step == 1:
                s0 = src[first[t] + a:first[t] + b]
                s1 = src[first[t + 1] + a:first[t + 1] + b]
                s2 = src[first[t + 2] + a:first[t + 2] + b]
                for j in range(b - a):
                    d[j] = ((d[j] + w0 * s0[j]) + w1 * s1[j]) + w2 * s2[j]
            else:
                f0, f1, f2 = first[t] + a * step, first[t + 1] + a * step, first[t + 2] + a * step
                for j in range(b - a):
                    js = j * step
                    d[j] = ((d[j] + w0 * src[f0 + js]) + w1 * src[f1 + js]) + w2 * src[f2 + js]
        t += 3
    while t < n:
        _axpy(dst, src, step, wrow[t], first[t], lo[t], hi[t])
        t += 1


@njit(nogil=True, cache=True)
def forward(x, xc0, w, y, yc0, c0, c1, geo):
    n_img = x.shape[0]
    d_in, h_in, w_in = x.shape[2], x.shape[3], x.shape[4]
    od_n, oh_n, ow_n = y.shape[2], y.shape[3], y.shape[4]
    kd_n, kh_n, kw_n = w.shape[1], w.shape[2], w.shape[3]
    sd, sh, sw, dd, dh, dw, pd, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7], geo[8]
    mult = geo[9]
    lo_w, hi_w = _ranges(ow_n, w_in, sw, dw, pw, kw_n)
    first = np.empty(kw_n, np.int64)
    for kw in range(kw_n):
        first[kw] = kw * dw - pw
    for n in range(n_img):
        for c in range(c0, c1):
            for m in range(mult):
                o = c * mult + m
                for od in range(od_n):
                    for oh in range(oh_n):
                        yr = y[n, o - yc0, od, oh]
                        for ow in range(ow_n):
                            yr[ow] = 0
                        for kd in range(kd_n):
                            i_d = od * sd + kd * dd - pd
                            if i_d < 0 or i_d >= d_in:
                                continue
                            for kh in range(kh_n):
                                i_h = oh * sh + kh * dh - ph
                                if i_h < 0 or i_h >= h_in:
                                    continue
                                _taps_row(yr, x[n, c - xc0, i_d, i_h], sw, w[o, kd, kh], first, lo_w, hi_w)


@njit(nogil=True, cache=True)
def backward_data(dy, dyc0, w, dx, dxc0, c0, c1, geo):
    n_img = dx.shape[0]
    d_in, h_in, w_in = dx.shape[2], dx.shape[3], dx.shape[4]
    od_n, oh_n, ow_n = dy.shape[2], dy.shape[3], dy.shape[4]
    kd_n, kh_n, kw_n = w.shape[1], w.shape[2], w.shape[3]
    sd, sh, sw, dd, dh, dw, pd, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7], geo[8]
    mult = geo[9]
    lo_w, hi_w = _ranges(ow_n, w_in, sw, dw, pw, kw_n)
    # stride 1: dx[i] += w * dy[i - off] for i in [lo + off, hi + off), off = k*d - p
    first = np.empty(kw_n, np.int64)
    lo_i = np.empty(kw_n, np.int64)
    hi_i = np.empty(kw_n, np.int64)
    for kw in range(kw_n):
        off = kw * dw - pw
        first[kw] = -off
        lo_i[kw] = lo_w[kw] + off
        hi_i[kw] = hi_w[kw] + off
    for n in range(n_img):
        for c in range(c0, c1):
            for i_d in range(d_in):
                for i_h in range(h_in):
                    dxr = dx[n, c - dxc0, i_d, i_h]
                    for i_w in range(w_in):
                        dxr[i_w] = 0
                    for m in range(mult):
                        o = c * mult + m
                        for kd in range(kd_n):
                            t_d = i_d + pd - kd * dd          # = od * sd
                            if t_d < 0 or t_d % sd != 0 or t_d // sd >= od_n:
                                continue
                            od = t_d // sd
                            for kh in range(kh_n):
                                t_h = i_h + ph - kh * dh
                                if t_h < 0 or t_h % sh != 0 or t_h // sh >= oh_n:
                                    continue
                                dyr = dy[n, o - dyc0, od, t_h // sh]
                                if sw == 1:
                                    _taps_row(dxr, dyr, 1, w[o, kd, kh], first, lo_i, hi_i)
                                else:
                                    for kw in range(kw_n):
                                        wv = w[o, kd, kh, kw]
                                        off = kw * dw - pw
                                        for ow in range(lo_w[kw], hi_w[kw]):
                                            dxr[ow * sw + off] += wv * dyr[ow]


@njit(nogil=True, cache=True, inline="always")
def _dots_row(acc, g, src, step, first, lo, hi):
    """acc[t, j] += g[j] * src[first[t] + j*step] for j in [lo[t], hi[t]), every t."""
    for t in range(acc.shape[0]):
        if hi[t] <= lo[t]:
            continue
        ar = acc[t, lo[t]:hi[t]]
        gr = g[lo[t]:hi[t]]
        base = first[t] + lo[t] * step
        if step == 1:
            s = src[base:base + hi[t] - lo[t]]
            for j in range(hi[t] - lo[t]):
                ar[j] += gr[j] * s[j]
        else:
            for j in range(hi[t] - lo[t]):
                ar[j] += gr[j] * src[base + j * step]


@njit(nogil=True, cache=True)
def backward_weights(x, xc0, dy, dyc0, dw_out, c0, c1, geo):
    n_img = x.shape[0]
    d_in, h_in, w_in = x.shape[2], x.shape[3], x.shape[4]
    od_n, oh_n, ow_n = dy.shape[2], dy.shape[3], dy.shape[4]
    kd_n, kh_n, kw_n = dw_out.shape[1], dw_out.shape[2], dw_out.shape[3]
    sd, sh, sw, dd, dh, dw, pd, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7], geo[8]
    mult = geo[9]
    lo_w, hi_w = _ranges(ow_n, w_in, sw, dw, pw, kw_n)
    first = np.empty(kw_n, np.int64)
    for kw in range(kw_n):
        first[kw] = kw * dw - pw
    acc = np.empty((kd_n, kh_n, kw_n, ow_n), dw_out.dtype)
    for c in range(c0, c1):
        for m in range(mult):
            o = c * mult + m
            acc[:] = 0
            for n in range(n_img):
                for od in range(od_n):
                    for kd in range(kd_n):
                        i_d = od * sd + kd * dd - pd
                        if i_d < 0 or i_d >= d_in:
                            continue
                        for oh in range(oh_n):
                            dyr = dy[n, o - dyc0, od, oh]
                            for kh in range(kh_n):
                                i_h = oh * sh + kh * dh - ph
                                if i_h < 0 or i_h >= h_in:
                                    continue
                                _dots_row(acc[kd, kh], dyr, x[n, c - xc0, i_d, i_h], sw, first, lo_w, hi_w)
            for kd in range(kd_n):
                for kh in range(kh_n):
                    for kw in range(kw_n):
                        total = 0.0            # lanes summed left to right (in float64)
                        for ow in range(ow_n):
                            total += acc[kd, kh, kw, ow]
                        dw_out[o, kd, kh, kw] = total
