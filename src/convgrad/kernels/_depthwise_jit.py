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

Each output element is produced by one call, in a fixed loop order (fwd: taps kd, kh, kw;
bwd_data: m, od, kd, oh, kh, kw; bwd_weights: per output-width lane n, od, kd, oh, kh, then
the lanes summed left to right), so results do not depend on how channels are chunked or
on the thread count. No fastmath: the element-wise loops vectorize as they are, and the
weight-gradient reduction vectorizes because it is kept as per-lane partial sums.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def _range(o_len, i_len, s, kd, p):
    """Outputs [lo, hi) whose input ``y*s + kd - p`` lies in [0, i_len)."""
    lo = -((kd - p) // s)          # ceil((p - kd) / s), floor division on negatives
    if lo < 0:
        lo = 0
    hi = (i_len - 1 + p - kd) // s + 1
    if hi > o_len:
        hi = o_len
    return lo, hi


@njit(nogil=True, cache=True)
def forward(x, xc0, w, y, yc0, c0, c1, geo):
    n_img = x.shape[0]
    d_in, h_in, w_in = x.shape[2], x.shape[3], x.shape[4]
    od_n, oh_n, ow_n = y.shape[2], y.shape[3], y.shape[4]
    kd_n, kh_n, kw_n = w.shape[1], w.shape[2], w.shape[3]
    sd, sh, sw, dd, dh, dw, pd, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7], geo[8]
    mult = geo[9]
    lo_w = np.empty(kw_n, np.int64)
    hi_w = np.empty(kw_n, np.int64)
    for kw in range(kw_n):
        lo_w[kw], hi_w[kw] = _range(ow_n, w_in, sw, kw * dw, pw)
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
                                xr = x[n, c - xc0, i_d, i_h]
                                for kw in range(kw_n):
                                    wv = w[o, kd, kh, kw]
                                    off = kw * dw - pw
                                    if sw == 1:
                                        for ow in range(lo_w[kw], hi_w[kw]):
                                            yr[ow] += wv * xr[ow + off]
                                    else:
                                        for ow in range(lo_w[kw], hi_w[kw]):
                                            yr[ow] += wv * xr[ow * sw + off]


@njit(nogil=True, cache=True)
def backward_data(dy, dyc0, w, dx, dxc0, c0, c1, geo):
    n_img = dx.shape[0]
    d_in, h_in, w_in = dx.shape[2], dx.shape[3], dx.shape[4]
    od_n, oh_n, ow_n = dy.shape[2], dy.shape[3], dy.shape[4]
    kd_n, kh_n, kw_n = w.shape[1], w.shape[2], w.shape[3]
    sd, sh, sw, dd, dh, dw, pd, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7], geo[8]
    mult = geo[9]
    lo_w = np.empty(kw_n, np.int64)
    hi_w = np.empty(kw_n, np.int64)
    for kw in range(kw_n):
        lo_w[kw], hi_w[kw] = _range(ow_n, w_in, sw, kw * dw, pw)
    for n in range(n_img):
        for c in range(c0, c1):
            dxc = dx[n, c - dxc0]
            for i_d in range(d_in):
                for i_h in range(h_in):
                    for i_w in range(w_in):
                        dxc[i_d, i_h, i_w] = 0
            for m in range(mult):
                o = c * mult + m
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
                                dxr = dxc[i_d, i_h]
                                for kw in range(kw_n):
                                    wv = w[o, kd, kh, kw]
                                    off = kw * dw - pw
                                    if sw == 1:
                                        for ow in range(lo_w[kw], hi_w[kw]):
                                            dxr[ow + off] += wv * dyr[ow]
                                    else:
                                        for ow in range(lo_w[kw], hi_w[kw]):
                                            dxr[ow * sw + off] += wv * dyr[ow]


@njit(nogil=True, cache=True)
def backward_weights(x, xc0, dy, dyc0, dw_out, c0, c1, geo):
    n_img = x.shape[0]
    d_in, h_in, w_in = x.shape[2], x.shape[3], x.shape[4]
    od_n, oh_n, ow_n = dy.shape[2], dy.shape[3], dy.shape[4]
    kd_n, kh_n, kw_n = dw_out.shape[1], dw_out.shape[2], dw_out.shape[3]
    sd, sh, sw, dd, dh, dw, pd, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7], geo[8]
    mult = geo[9]
    lo_w = np.empty(kw_n, np.int64)
    hi_w = np.empty(kw_n, np.int64)
    for kw in range(kw_n):
        lo_w[kw], hi_w[kw] = _range(ow_n, w_in, sw, kw * dw, pw)
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
                                xr = x[n, c - xc0, i_d, i_h]
                                for kw in range(kw_n):
                                    ar = acc[kd, kh, kw]
                                    off = kw * dw - pw
                                    if sw == 1:
                                        for ow in range(lo_w[kw], hi_w[kw]):
                                            ar[ow] += dyr[ow] * xr[ow + off]
                                    else:
                                        for ow in range(lo_w[kw], hi_w[kw]):
                                            ar[ow] += dyr[ow] * xr[ow * sw + off]
            for kd in range(kd_n):
                for kh in range(kh_n):
                    for kw in range(kw_n):
                        total = 0.0            # lanes summed left to right (in float64)
                        for ow in range(ow_n):
                            total += acc[kd, kh, kw, ow]
                        dw_out[o, kd, kh, kw] = total
