"""Compiled loops of the direct depthwise kernel (kernel layer; imports numba, so it is
imported only through ``depthwise.available()``).

Every problem arrives as 3-D: data ``(N, C, D, H, W)``, weights ``(O, KD, KH, KW)`` with
``O = C * M`` (output channel ``o = c*M + m`` reads input channel ``c``), C-contiguous,
float32 or float64, plus ``geo = (sd, sh, sw, dd, dh, dw, pd, ph, pw, M)`` as an int64
array (so that each function has one signature per element type). A call handles the
input channels ``[c0, c1)``; ``xc0`` / ``yc0`` are the channel index of the first channel
held by the passed arrays (the whole canonical arrays: 0; a converted copy of the block's
channels: its first channel).

Two loop nests: the per-channel phase grids below (large images) and, at the end of the
file, channels-last blocks (small images; ``depthwise.channels_last`` chooses).

Lowering: the stride-phase split of ``gemm.py``, one channel at a time. Per axis, the
forward reads padded input ``x = y*s + k*d``; with ``k*d = sh*s + r`` (``0 <= r < s``) that
is ``(y + sh)*s + r``, so phase grid ``P_r[q] = x_pad[q*s + r]`` (``Q = O + max_sh`` cells,
``max_sh = (K-1)*d // s``) turns every tap into a shift by ``sh``. Flattening the three
axes of the grid row-major, tap ``k`` becomes one flat offset ``off(k) = sum_a sh_a *
stride_a`` into phase ``r(k)``, and output ``p`` (flat in the same wide grid) is::

    fwd          yw[p]     = sum_k w[k] * P_r(k)[p + off(k)]          p < span = total - max_off
    bwd_data     dP_r[q]   = sum_{k: r(k) = r} w[k] * dyw[q - off(k)]  (dyw zero outside dy)
    bwd_weights  dw[k]     = sum_p dyw[p] * P_r(k)[p + off(k)]

Grid cells that are not real outputs ("wide" cells past ``O`` on an axis) are computed and
dropped (fwd) or hold zero in ``dyw`` (both gradients); padding cells of ``P`` hold zero.
So every tap is one contiguous, unit-stride loop over the whole channel, whatever the
stride, dilation, padding or image size, with no per-element test, and LLVM vectorizes it
without fastmath. Taps are applied three at a time (``((acc + w0*a) + w1*b) + w2*c``:
the same operations in the same order as three passes, a third of the traffic on ``acc``).

Stride-1 forwards and data gradients in float32, where the micro-kernels of ``_ukernel``
run, take their taps in its compiled stencil instead (``_stencil_rows``, blocks of up to 3
x 3 taps planned by ``depthwise._stencil_plan``): four output rows per call share their
input rows, each term is one FMA, and the rows are written straight into the result (no
wide grid, no copy back). One thread, whole public calls, us, numba taps / stencil:
mobilenet conv2_1/dw (32 x 112^2) data gradient 172-201 / 104, forward 156-162 / 107-117;
conv3_1/dw (128 x 56^2) 193-210 / 120-122 and 177-184 / 133-134; conv4_1/dw (256 x 28^2)
119-120 / 100-103 and 121-144 / 111.

The float32 data gradient of 1-D and 2-D layers with stride 2 along the rows (one output
channel per input channel, kernels up to 4 wide; ``depthwise._up2_plan``, where the
derivation is) skips the phase grids too: ``backward_data_up2`` places ``diff_dst`` in a
zero-margined buffer and the compiled ``up2`` writes each dx row from it, both column
phases of a pair from one doubled load (one thread, us, phase grids / up2: conv2_2/dw
(64 x 112^2) 190-194 / 112-120, conv3_2/dw (128 x 56^2) 145-146 / 78-79). Their weight
gradient, and the weight gradient of stride-1 rows, likewise (``backward_weights_rows``,
``depthwise._row_plan``): the compiled ``rowdot`` reads the input rows in place (each
tap's cells from one masked load, or at stride 2 gathered from two, the padding masked
off) and sums against ``diff_dst`` in the vector lanes (one thread, us, phase grids /
rows: conv2_2/dw 161-170 / 112-117, conv3_2/dw 136-137 / 59-62; stride 1: conv2_1/dw
(32 x 112^2) 118 / 106, conv3_1/dw 141 / 107, conv4_1/dw (256 x 28^2) 123 / 63). Their
forward, and stride-1 forwards and data gradients (the flipped forward) with rows of at
most ``depthwise.ROW_FWD_MAX_WIDTH`` outputs, take ``rowfwd`` (``forward_rows``,
``depthwise._rowfwd_plan``: the same reads times broadcast weights, every output row in
one call; stride 2: 155-164 / 119-120 and 122-126 / 65; conv4_1/dw forward 107-112 /
68-71, data gradient 95-97 / 73-75).

Order of every sum (fixed, independent of the chunking and of the thread count): fwd, taps
row-major (in ``rowfwd`` too; in the stencil: block after block, row-major inside a
block; a kernel of at most 3 x 3 taps is one block); bwd_data, ``m`` then the taps of the element's phase
row-major (in the stencil: ``m``, then the mirrored taps block by block; in ``up2``: the
kernel rows reaching the dx row in ascending order, then the element's taps along the row
in ascending order); bwd_weights in float32 with ``rowdot``: per image and call (rows of
``DOT_CHUNK`` positions at most), the lanes summed from zero over rows then positions,
added by a fixed halving tree to the tap's running sum, image after image; in float32
with the compiled micro-kernels (``_dot_taps``): per image and per planned call, chunks
of ``DOT_CHUNK`` positions, each summed in the vector lanes from zero and the lanes
added by a fixed halving tree, added to the tap's running sum chunk after chunk, image
after image; otherwise (float64, or no micro-kernels), per lane ``p % R`` and block of
BLOCK positions a sum from zero over ``p`` ascending (kept in registers, ``_group``),
added to the lane's running sum block after block, image after image; then the lanes
folded in halves (lane ``j`` plus lane ``j + ceil(width/2)``) down to FOLD, added left to
right in float64. Measured (one core, the tap loops alone): the register groups run 19
GFMA/s on 32x112^2 and 15 on 256x28^2, where 256 lanes in memory (four blocks per pass)
ran 14 and 9. The lane-sum calls share each vector load among several taps (a 3x3
stride-1 kernel: 3 rows of ``diff_dst`` and 3 of the grid for 9 sums, against 10 loads
for 9 in the groups): the compiled weight gradient of all 128 channels of 56^2 took 120
us (89 of them the grid copies) against 200 with the groups, on one AMD Zen 5 core.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from ._jit_common import (JIT, _rowdot, _dotkernel, _rowfwd, _stencil, _transpose, _up2, copy_elems,
                          gather_strided, stack_registers, stencil_key)

FOLD = 4         # lanes left by the halving fold of the weight gradient, added in float64
from .depthwise import LANES as R     # weight-gradient lanes (positions p % R)
R_U = np.uint64(R)
TB = 9           # taps per register group (9 x R sums: 9 of the 16 AVX2 registers)
BLOCK = 256      # positions per register block before its sums go to the lane sums


@njit(nogil=True, cache=True)
def _setup(ins, outs, ks, geo):
    """Phase geometry: (q, total, span, max_off, rank, res, nres, tap_phase, tap_off)."""
    q = np.empty(3, np.int64)
    nres = np.zeros(3, np.int64)
    smax = max(geo[0], max(geo[1], geo[2]))
    rank = -np.ones((3, smax), np.int64)        # residue -> its index among the used ones
    res = np.zeros((3, smax), np.int64)         # index -> residue
    for a in range(3):
        s, d = geo[a], geo[3 + a]
        q[a] = outs[a] + (ks[a] - 1) * d // s
        for k in range(ks[a]):
            r = (k * d) % s
            if rank[a, r] < 0:
                rank[a, r] = 0
        for r in range(s):
            if rank[a, r] >= 0:
                rank[a, r] = nres[a]
                res[a, nres[a]] = r
                nres[a] += 1
    total = q[0] * q[1] * q[2]
    max_off = ((ks[0] - 1) * geo[3] // geo[0] * q[1] + (ks[1] - 1) * geo[4] // geo[1]) * q[2] \
        + (ks[2] - 1) * geo[5] // geo[2]
    n_taps = ks[0] * ks[1] * ks[2]
    tap_phase = np.empty(n_taps, np.int64)
    tap_off = np.empty(n_taps, np.int64)
    t = 0
    for k0 in range(ks[0]):
        for k1 in range(ks[1]):
            for k2 in range(ks[2]):
                kd0, kd1, kd2 = k0 * geo[3], k1 * geo[4], k2 * geo[5]
                tap_phase[t] = (rank[0, kd0 % geo[0]] * nres[1] + rank[1, kd1 % geo[1]]) * nres[2] \
                    + rank[2, kd2 % geo[2]]
                tap_off[t] = ((kd0 // geo[0]) * q[1] + kd1 // geo[1]) * q[2] + kd2 // geo[2]
                t += 1
    return q, total, total - max_off, max_off, rank, res, nres, tap_phase, tap_off


# The copies below index flat views with unsigned offsets and slice nothing per row: a
# row is 7-112 elements, and per-row slices and short edge loops around the vector loop
# cost as much as the copy (measured, one core, the phase grids of all channels of a
# call, ms, sliced rows with edge loops / flat: 256 x 28^2 0.16 / 0.11; 128 x 56^2 0.16 /
# 0.11; stride 2: 64 x 112^2 0.33 / 0.22, 128 x 56^2 0.28 / 0.19).
U1 = np.uint64(1)
U2 = np.uint64(2)


@njit(nogil=True, cache=True)
def _pair_plan(w_in, q, geo):
    """The stride-2 row copy of ``_build_phases_pairs``, planned once per call (per channel
    it cost two allocations): column ``c`` goes to residue ``(c + p) % 2``, cell ``(c + p)
    // 2``, so the column pairs ``(2i, 2i + 1)`` fill cell ``i + j_a`` of one residue row and
    ``i + j_b`` of the other. Returns ``(npair, off_a, off_b)``, the cells of columns 0 and 1
    counted from their row pair's base, and the columns past the last whole pair that still
    fall inside the grid (an odd width) as rows ``(cell offset, column)``."""
    q2 = q[2]
    plane = q[0] * q[1] * q2
    p2 = geo[8]
    npair = max(0, min(w_in // 2, min(q2 - p2 // 2, q2 - (p2 + 1) // 2)))
    head = np.array([npair, (p2 % 2) * plane + p2 // 2, (1 - p2 % 2) * plane + (p2 + 1) // 2], np.int64)
    n_edge = 0
    for c in range(2 * npair, w_in):
        if (c + p2) // 2 < q2:
            n_edge += 1
    edges = np.empty((n_edge, 2), np.uint64)
    k = 0
    for c in range(2 * npair, w_in):
        if (c + p2) // 2 < q2:
            edges[k, 0] = ((c + p2) % 2) * plane + (c + p2) // 2
            edges[k, 1] = c
            k += 1
    return head, edges


@njit(nogil=True, cache=True)
def _build_phases_pairs(xc, buf, q, res, nres, geo, head, edges):
    """``_build_phases`` for stride 2 along W with both residues used: each input row is
    de-interleaved in one loop of column pairs (a load with gaps does not vectorize, a full
    pair does), plus its leftover columns, as ``_pair_plan`` laid out."""
    d_in, h_in, w_in = xc.shape[0], xc.shape[1], xc.shape[2]
    xf = xc.reshape(d_in * h_in * w_in)
    q1, q2 = q[1], q[2]
    plane = q[0] * q1 * q2
    n = np.uint64(head[0])
    off_a, off_b = np.uint64(head[1]), np.uint64(head[2])
    for i0 in range(nres[0]):
        for i1 in range(nres[1]):
            ph = (i0 * nres[1] + i1) * 2
            r0, r1 = res[0, i0], res[1, i1]
            for a in range(q[0]):
                i_d = a * geo[0] + r0 - geo[6]
                if i_d < 0 or i_d >= d_in:
                    continue
                for b in range(q1):
                    i_h = b * geo[1] + r1 - geo[7]
                    if i_h < 0 or i_h >= h_in:
                        continue
                    base = np.uint64(ph * plane + (a * q1 + b) * q2)
                    us = np.uint64((i_d * h_in + i_h) * w_in)
                    ua, ub = base + off_a, base + off_b
                    for i in range(n):
                        buf[ua + i] = xf[us + U2 * i]
                        buf[ub + i] = xf[us + U2 * i + U1]
                    for e in range(edges.shape[0]):
                        buf[base + edges[e, 0]] = xf[us + edges[e, 1]]


@njit(nogil=True, cache=True)
def _build_phases(xc, buf, q, rank, res, nres, geo, pairs):
    """buf[phase, flat q] = x_pad[q*s + r] of one channel ``xc`` (D, H, W). Only the cells
    inside the image are written: the caller zeroes ``buf`` once per call, and the padding
    cells are the same for every channel of the call (no zeroing per channel and row).
    ``pairs``: the caller's ``_pair_plan``, used for stride 2 along W with both residues."""
    d_in, h_in, w_in = xc.shape[0], xc.shape[1], xc.shape[2]
    if geo[2] == 2 and nres[2] == 2:
        _build_phases_pairs(xc, buf, q, res, nres, geo, pairs[0], pairs[1])
        return
    xf = xc.reshape(d_in * h_in * w_in)
    q1, q2 = q[1], q[2]
    plane = q[0] * q1 * q2
    s2, p2 = geo[2], geo[8]
    for i0 in range(nres[0]):
        for i1 in range(nres[1]):
            for i2 in range(nres[2]):
                ph = (i0 * nres[1] + i1) * nres[2] + i2
                r0, r1, r2 = res[0, i0], res[1, i1], res[2, i2]
                # valid cells along W: 0 <= j*s2 + r2 - p2 < w_in
                lo = max(0, -((r2 - p2) // s2))
                hi = min(q2, (w_in - 1 + p2 - r2) // s2 + 1)
                if hi <= lo:
                    continue
                n = hi - lo
                first = lo * s2 + r2 - p2                      # the first column read (>= 0)
                for a in range(q[0]):
                    i_d = a * geo[0] + r0 - geo[6]
                    if i_d < 0 or i_d >= d_in:
                        continue
                    for b in range(q1):
                        i_h = b * geo[1] + r1 - geo[7]
                        if i_h < 0 or i_h >= h_in:
                            continue
                        d0 = ph * plane + (a * q1 + b) * q2 + lo
                        s0 = (i_d * h_in + i_h) * w_in + first
                        if s2 == 1:
                            copy_elems(buf, d0, xf, s0, n)
                        else:
                            gather_strided(buf, xf, d0, s0, n, s2)


@njit(nogil=True, cache=True)
def _place(yc, wide, base, q):
    """wide[base + flat(o)] = yc[o] for every output o of one channel (other cells untouched)."""
    d_o, h_o, w_o = yc.shape[0], yc.shape[1], yc.shape[2]
    yf = yc.reshape(d_o * h_o * w_o)
    q1, q2 = q[1], q[2]
    for a in range(d_o):
        for b in range(h_o):
            copy_elems(wide, base + (a * q1 + b) * q2, yf, (a * h_o + b) * w_o, w_o)


@njit(nogil=True, cache=True)
def _taps_into(acc, n, srcs, base, w, taps, tap_phase, tap_off, sign, plane, first):
    """For the listed taps in order: acc[p] += w[t] * srcs[phase(t)*plane + base + sign*off(t) + p], p < n;
    with ``first``, acc starts at zero (and is not read: ``0 + x`` is ``x``, so the first
    product is stored as it is; only the sign of an exact zero can differ from adding).

    ``srcs`` is one flat buffer of phase planes (fwd) or the padded wide dy (bwd_data,
    ``plane`` 0). Consecutive taps are applied three per loop, same operations and order.
    """
    i = 0
    nt = taps.shape[0]
    if first and nt > 0:
        t0 = taps[0]
        f0 = tap_phase[t0] * plane + base + sign * tap_off[t0]
        w0 = w[t0]
        a = srcs[f0:f0 + n]
        if nt >= 3:
            t1, t2 = taps[1], taps[2]
            f1 = tap_phase[t1] * plane + base + sign * tap_off[t1]
            f2 = tap_phase[t2] * plane + base + sign * tap_off[t2]
            w1, w2 = w[t1], w[t2]
            b, c = srcs[f1:f1 + n], srcs[f2:f2 + n]
            for p in range(n):
                acc[p] = (w0 * a[p] + w1 * b[p]) + w2 * c[p]
            i = 3
        else:
            for p in range(n):
                acc[p] = w0 * a[p]
            i = 1
    while i + 3 <= nt:
        t0, t1, t2 = taps[i], taps[i + 1], taps[i + 2]
        f0 = tap_phase[t0] * plane + base + sign * tap_off[t0]
        f1 = tap_phase[t1] * plane + base + sign * tap_off[t1]
        f2 = tap_phase[t2] * plane + base + sign * tap_off[t2]
        w0, w1, w2 = w[t0], w[t1], w[t2]
        a, b, c = srcs[f0:f0 + n], srcs[f1:f1 + n], srcs[f2:f2 + n]
        for p in range(n):
            acc[p] = ((acc[p] + w0 * a[p]) + w1 * b[p]) + w2 * c[p]
        i += 3
    while i < nt:
        t = taps[i]
        f = tap_phase[t] * plane + base + sign * tap_off[t]
        wv = w[t]
        a = srcs[f:f + n]
        for p in range(n):
            acc[p] += wv * a[p]
        i += 1


from ._ukernel import STENCIL_U as ST_U     # output rows per stencil call


@njit(nogil=True, cache=True)
def _stencil_rows(addr, calls, wblk, src, yflat, rows, cols, q, first, accumulate):
    """Every output row of one channel through the compiled stencil (``depthwise._stencil_plan``):
    ``yflat`` holds ``rows[0] x rows[1]`` rows of ``cols`` values, row ``(a, b)`` reads the
    grid ``src`` from cell ``((a + first[0])*q1 + b + first[1])*q2 + first[2]``; per call
    (KH, KW, base, x_cs, first weight) the block of taps at ``base`` with its weights in
    ``wblk``, added in call order (the first call stores unless ``accumulate``). Rows
    go ST_U at a time (they share input rows in the stencil), the rest one at a time."""
    sa = src.ctypes.data
    wa = wblk.ctypes.data
    ya = yflat.ctypes.data
    item = src.itemsize
    for a in range(rows[0]):
        b0 = 0
        while b0 < rows[1]:
            u = ST_U if rows[1] - b0 >= ST_U else 1
            cell = ((a + first[0]) * q[1] + b0 + first[1]) * q[2] + first[2]
            yp = ya + item * ((a * rows[1] + b0) * cols)
            for k in range(calls.shape[0]):
                key = stencil_key(calls[k, 0], calls[k, 1], u, accumulate or k > 0)
                _stencil(addr, key, sa + item * (calls[k, 2] + cell), wa + item * calls[k, 4], yp, cols, q[2],
                         calls[k, 3], cols)
            b0 += u


@njit(nogil=True, cache=True)
def forward(x, xc0, w, y, yc0, c0, c1, geo, st_addr, st_calls, st_taps):
    ins = np.array([x.shape[2], x.shape[3], x.shape[4]])
    outs = np.array([y.shape[2], y.shape[3], y.shape[4]])
    ks = np.array([w.shape[1], w.shape[2], w.shape[3]])
    q, total, span, max_off, rank, res, nres, tap_phase, tap_off = _setup(ins, outs, ks, geo)
    mult = geo[9]
    n_taps = ks[0] * ks[1] * ks[2]
    taps = np.arange(n_taps)
    nph = nres[0] * nres[1] * nres[2]
    buf = np.zeros(nph * total, x.dtype)              # padding cells stay zero (_build_phases)
    pairs = _pair_plan(ins[2], q, geo)
    yw = np.empty(max(span, 0), y.dtype)
    w2 = w.reshape((w.shape[0], n_taps))
    wblk = np.empty(max(1, st_taps.shape[0]), w.dtype)
    zero3 = np.zeros(3, np.int64)
    for n in range(x.shape[0]):
        for c in range(c0, c1):
            _build_phases(x[n, c - xc0], buf, q, rank, res, nres, geo, pairs)
            for m in range(mult):
                o = c * mult + m
                wo = w2[o]
                if st_addr:
                    for i in range(st_taps.shape[0]):
                        wblk[i] = wo[st_taps[i]]
                    _stencil_rows(st_addr, st_calls, wblk, buf, y[n, o - yc0].reshape(-1), outs[:2], outs[2], q,
                                  zero3, False)
                    continue
                _taps_into(yw, span, buf, 0, wo, taps, tap_phase, tap_off, 1, total, True)
                yo = y[n, o - yc0].reshape(outs[0] * outs[1] * outs[2])
                for a in range(outs[0]):
                    for b in range(outs[1]):
                        copy_elems(yo, (a * outs[1] + b) * outs[2], yw, (a * q[1] + b) * q[2], outs[2])


@njit(nogil=True, cache=True)
def _write_dx(dxc, dp, total, q, nres, loc_r, loc_q, geo, row_map):
    """dxc (D, H, W) of one channel from its phase grids ``dp`` (see backward_data)."""
    ins2 = dxc.shape[2]
    s2 = geo[2]
    row_j0, row_q0, row_cnt = row_map[0], row_map[1], row_map[2]
    row_gaps = row_cnt.sum() < ins2
    pa = 0 if row_j0[0] <= row_j0[nres[2] - 1] else 1           # the phase of the first element
    pb = 1 - pa
    pair = s2 == 2 and nres[2] == 2 and row_cnt[pa] > 0 and row_cnt[pb] > 0 \
        and row_j0[pb] == row_j0[pa] + 1 and row_cnt[pb] <= row_cnt[pa] <= row_cnt[pb] + 1
    n_pairs = row_cnt[pb] if pair else 0
    for a in range(dxc.shape[0]):
        for b in range(dxc.shape[1]):
            row = dxc[a, b]
            if loc_r[0, a] < 0 or loc_r[1, b] < 0:
                for j in range(ins2):
                    row[j] = 0
                continue
            pre = (loc_r[0, a] * nres[1] + loc_r[1, b]) * nres[2]
            cell = (loc_q[0, a] * q[1] + loc_q[1, b]) * q[2]
            if s2 == 1:                          # one phase along the row: a contiguous copy
                valid = max(0, min(ins2, q[2] - geo[8]))
                copy_elems(row, 0, dp, pre * total + cell + geo[8], valid)
                for j in range(valid, ins2):
                    row[j] = 0
                continue
            if row_gaps:
                for j in range(ins2):
                    row[j] = 0
            if pair:                             # stride 2, both phases: one interleaving loop,
                fa = (pre + pa) * total + cell + row_q0[pa]      # which vectorizes (a store
                fb = (pre + pb) * total + cell + row_q0[pb]      # with gaps does not)
                src_a, src_b = dp[fa:fa + row_cnt[pa]], dp[fb:fb + row_cnt[pb]]
                dst = row[row_j0[pa]:]
                for t in range(n_pairs):
                    dst[2 * t] = src_a[t]
                    dst[2 * t + 1] = src_b[t]
                for t in range(n_pairs, row_cnt[pa]):
                    dst[2 * t] = src_a[t]
                continue
            for i2 in range(nres[2]):
                f = (pre + i2) * total + cell + row_q0[i2]
                cnt = row_cnt[i2]
                src = dp[f:f + cnt]
                dst = row[row_j0[i2]:]
                for t in range(cnt):
                    dst[t * s2] = src[t]


@njit(nogil=True, cache=True)
def backward_data(dy, dyc0, w, dx, dxc0, c0, c1, geo, st_addr, st_calls, st_taps):
    ins = np.array([dx.shape[2], dx.shape[3], dx.shape[4]])
    outs = np.array([dy.shape[2], dy.shape[3], dy.shape[4]])
    ks = np.array([w.shape[1], w.shape[2], w.shape[3]])
    q, total, span, max_off, rank, res, nres, tap_phase, tap_off = _setup(ins, outs, ks, geo)
    mult = geo[9]
    n_taps = ks[0] * ks[1] * ks[2]
    nph = nres[0] * nres[1] * nres[2]
    # taps grouped by phase, row-major inside each phase
    order = np.argsort(tap_phase, kind="mergesort")
    starts = np.zeros(nph + 1, np.int64)
    for t in range(n_taps):
        starts[tap_phase[t] + 1] += 1
    for ph in range(nph):
        starts[ph + 1] += starts[ph]
    dp = np.empty(nph * total, dx.dtype)
    w2 = w.reshape((w.shape[0], n_taps))
    dyw = np.zeros(max_off + total, dy.dtype)       # cells outside dy stay zero
    # where each dx element lives: per axis, (phase index or -1, grid cell)
    loc_r = -np.ones((3, max(ins[0], max(ins[1], ins[2]))), np.int64)
    loc_q = np.zeros((3, max(ins[0], max(ins[1], ins[2]))), np.int64)
    for a in range(3):
        for i in range(ins[a]):
            t = i + geo[6 + a]
            r, qq = t % geo[a], t // geo[a]
            if rank[a, r] >= 0 and qq < q[a]:
                loc_r[a, i] = rank[a, r]
                loc_q[a, i] = qq
    # along a row, the dx elements of w-phase i2 are j = j0 + s*t at cell q0 + t, t < cnt
    # (row_map[:, i2] = j0, q0, cnt): one strided copy per phase instead of a lookup per
    # element; cells of unused residues or past the grid are zero
    row_map = np.zeros((3, nres[2]), np.int64)
    for j in range(ins[2]):
        r2 = loc_r[2, j]
        if r2 >= 0:
            if row_map[2, r2] == 0:
                row_map[0, r2] = j
                row_map[1, r2] = loc_q[2, j]
            row_map[2, r2] += 1
    wblk = np.empty(max(1, st_taps.shape[0]), w.dtype)
    pads = np.array([geo[6], geo[7], geo[8]])
    for n in range(dx.shape[0]):
        for c in range(c0, c1):
            for m in range(mult):
                o = c * mult + m
                _place(dy[n, o - dyc0], dyw, max_off, q)
                wo = w2[o]
                if st_addr:             # stride 1: dx rows straight from dyw (depthwise._stencil_plan)
                    for i in range(st_taps.shape[0]):
                        wblk[i] = wo[st_taps[i]]
                    _stencil_rows(st_addr, st_calls, wblk, dyw, dx[n, c - dxc0].reshape(-1), ins[:2], ins[2], q,
                                  pads, m > 0)
                    continue
                for ph in range(nph):
                    _taps_into(dp[ph * total:(ph + 1) * total], total, dyw, max_off, wo,
                               order[starts[ph]:starts[ph + 1]], tap_phase, tap_off, -1, 0, m == 0)
            if not st_addr:
                _write_dx(dx[n, c - dxc0], dp, total, q, nres, loc_r, loc_q, geo, row_map)


@njit(nogil=True, cache=True)
def backward_data_up2(dy, dyc0, w, dx, dxc0, c0, c1, addr, calls, widx, zero_rows, dims):
    """The data gradient of a layer with stride 2 along its rows (``depthwise._up2_plan``,
    one output channel per input channel), every dx row straight from ``diff_dst`` through
    the compiled ``up2`` calls: per channel, ``diff_dst`` placed in a zero-margined buffer
    (``dims``: row stride ``Wd``, left margin ``ML``), the calls' weight pairs gathered
    (``widx``, -1 for a tap past the kernel), the rows no tap reaches zeroed. Call ``k``:
    (key, buffer offset, weight offset, dx offset, dx row stride)."""
    W, Wd, ML, nvec, lo, hi = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]
    OH, OW = dy.shape[3], dy.shape[4]
    dyp = np.zeros(OH * Wd, dy.dtype)
    wblk = np.zeros(max(1, widx.shape[0]), w.dtype)
    pa = dyp.ctypes.data
    wa = wblk.ctypes.data
    item = dy.itemsize
    for n in range(dx.shape[0]):
        for c in range(c0, c1):
            yf = dy[n, c - dyc0].reshape(OH * OW)
            for o in range(OH):
                copy_elems(dyp, o * Wd + ML, yf, o * OW, OW)
            w2 = w[c].reshape(-1)
            for k in range(widx.shape[0]):
                wblk[k] = w2[widx[k]] if widx[k] >= 0 else 0.0
            xf = dx[n, c - dxc0].reshape(-1)
            for r in zero_rows:
                xf[r * W:(r + 1) * W] = 0.0
            xa = xf.ctypes.data
            for k in range(calls.shape[0]):
                _up2(addr, calls[k, 0], pa + item * calls[k, 1], wa + item * calls[k, 2], xa + item * calls[k, 3],
                     nvec, Wd, calls[k, 4], lo, hi)


@njit(nogil=True, cache=True)
def forward_rows(x, xc0, w, y, yc0, c0, c1, addr, calls, zero_rows, dims):
    """The forward of a layer with stride 2 along its rows (``depthwise._rowfwd_plan``, one
    output channel per input channel) straight from the input rows through the compiled
    ``rowfwd`` calls (key, input offset, output offset, first weight, rows), the output rows
    no kernel row reaches zeroed."""
    npos, x_rs, x_us, lo, hi = dims[0], dims[1], dims[2], dims[3], dims[4]
    item = x.itemsize
    for n in range(x.shape[0]):
        for c in range(c0, c1):
            wa = w[c].ctypes.data
            xa = x[n, c - xc0].ctypes.data
            yf = y[n, c - yc0].reshape(-1)
            for r in zero_rows:
                yf[r * npos:(r + 1) * npos] = 0.0
            ya = yf.ctypes.data
            for k in range(calls.shape[0]):
                _rowfwd(addr, calls[k, 0], xa + item * calls[k, 1], wa + item * calls[k, 3], ya + item * calls[k, 2],
                      npos, calls[k, 4], x_rs, x_us, npos, lo, hi)


@njit(nogil=True, cache=True)
def backward_weights_rows(x, xc0, dy, dyc0, dw, c0, c1, addr, calls, dims):
    """The weight gradient of a layer with stride 2 along its rows (``depthwise._row_plan``,
    one output channel per input channel) straight from the arrays through the compiled
    ``rowdot`` calls: per channel the taps' running sums start at zero, then image after
    image, call after call (key, input offset, diff_dst offset, first tap, rows), each
    call's lane sums are added to them. ``dims``: (positions per row, input row stride,
    input stride between a call's rows, lo, hi)."""
    npos, x_rs, x_us, lo, hi = dims[0], dims[1], dims[2], dims[3], dims[4]
    item = x.itemsize
    for c in range(c0, c1):
        wc = dw[c].reshape(-1)
        wc[:] = 0.0
        wa = wc.ctypes.data
        for n in range(x.shape[0]):
            xa = x[n, c - xc0].ctypes.data
            da = dy[n, c - dyc0].ctypes.data
            for k in range(calls.shape[0]):
                _rowdot(addr, calls[k, 0], xa + item * calls[k, 1], da + item * calls[k, 2], wa + item * calls[k, 3],
                      npos, calls[k, 4], x_rs, x_us, npos, lo, hi)


_registers = stack_registers(TB * R)     # the register tile (``_jit_common``)


@njit(**JIT)
def _group(acc, rows, g, buf, offs, span):
    """acc[rows[i], j] += sum_{p = j mod R, p < span} g[p] * buf[offs[i] + p] for the TB
    taps of a group, i < TB, j < R (``g`` and ``buf`` readable R cells past ``span``;
    ``g`` holds zero there).

    Register tile: TB taps x R lanes of partial sums stay in vector registers while the
    loop walks BLOCK positions; each R positions are one load of ``g`` shared by the TB
    taps, TB loads of ``buf`` and TB multiply-adds. Per block the registers start at zero
    and are then added to the lane sums in ``acc`` (blocks at fixed positions, so the
    order is fixed; short chains keep the float32 error small). Unsigned indices spare
    numba's negative-index wraparound.
    """
    span_r = (span + R - 1) // R * R
    for b0 in range(0, span_r, BLOCK):
        r = carray(_registers(buf.dtype), TB * R)
        for i in range(TB * R):
            r[i] = 0
        for p0 in range(b0, min(b0 + BLOCK, span_r), R):
            up = np.uint64(p0)
            for j in range(R_U):
                gv = g[up + j]
                for i in range(TB):
                    r[i * R + j] += gv * buf[offs[i] + up + j]
        for i in range(TB):
            a = acc[rows[i]]
            for j in range(R):
                a[j] += r[i * R + j]


@njit(nogil=True, cache=True)
def _tap_groups(tap_phase, tap_off, plane):
    """The taps TB at a time, as ``_group`` reads them: per group, the sum rows and the
    flat offsets ``phase(t)*plane + off(t)``; a short last group is filled with copies of
    its last tap whose sums go to the spare row ``n_taps``. Built once per call (per
    channel it was two allocations and a table: 3-15 % of a 28^2 layer's call)."""
    n_taps = tap_phase.shape[0]
    n_groups = (n_taps + TB - 1) // TB
    offs = np.empty((n_groups, TB), np.uint64)
    rows = np.empty((n_groups, TB), np.int64)
    for gi in range(n_groups):
        for i in range(TB):
            t = min(gi * TB + i, n_taps - 1)
            offs[gi, i] = tap_phase[t] * plane + tap_off[t]
            rows[gi, i] = gi * TB + i if gi * TB + i < n_taps else n_taps
    return offs, rows


@njit(nogil=True, cache=True)
def backward_weights(x, xc0, dy, dyc0, dw_out, c0, c1, geo, dot_addr, calls, call_taps, margin, chunk):
    """Weight gradient on the phase grids. With ``dot_addr`` (float32 on a host with the
    compiled micro-kernels; 0 otherwise) each image's sums run in the lane-sum micro-kernel
    (``_dot_taps``, the calls planned by ``depthwise._dot_plan``), else in the register
    groups of ``_group``; ``dyw`` holds ``margin`` zero cells before the grid."""
    ins = np.array([x.shape[2], x.shape[3], x.shape[4]])
    outs = np.array([dy.shape[2], dy.shape[3], dy.shape[4]])
    ks = np.array([dw_out.shape[1], dw_out.shape[2], dw_out.shape[3]])
    q, total, span, max_off, rank, res, nres, tap_phase, tap_off = _setup(ins, outs, ks, geo)
    mult = geo[9]
    n_taps = ks[0] * ks[1] * ks[2]
    nph = nres[0] * nres[1] * nres[2]
    # padding cells stay zero (_build_phases); R spare cells past the grids for the last
    # register block (dyw is zero there, buf is read there)
    buf = np.zeros(nph * total + R, x.dtype)
    pairs = _pair_plan(ins[2], q, geo)
    dyw = np.zeros(margin + total + R, dy.dtype)     # cells outside dy stay zero
    g = dyw[margin:]
    span = max(span, 0)
    acc = np.empty((mult, n_taps + 1, R), dw_out.dtype)   # + a spare row (_tap_groups)
    sums = np.empty((mult, n_taps), dw_out.dtype)
    tile = np.empty(max(1, call_taps.shape[0]), dw_out.dtype)
    dw2 = dw_out.reshape((dw_out.shape[0], n_taps))
    g_offs, g_rows = _tap_groups(tap_phase, tap_off, total)
    for c in range(c0, c1):
        acc[:] = 0
        sums[:] = 0
        for n in range(x.shape[0]):
            _build_phases(x[n, c - xc0], buf, q, rank, res, nres, geo, pairs)
            for m in range(mult):
                _place(dy[n, c * mult + m - dyc0], dyw, margin, q)
                if dot_addr:
                    _dot_taps(dot_addr, calls, call_taps, g, buf, span, tile, sums[m], chunk)
                else:
                    for gi in range(g_offs.shape[0]):     # acc[t, p % R] += dyw[p] * grid(t)[p]
                        _group(acc[m], g_rows[gi], g, buf, g_offs[gi], span)
        for m in range(mult):
            wo = dw2[c * mult + m]
            if dot_addr:
                for t in range(n_taps):
                    wo[t] = sums[m, t]
                continue
            for t in range(n_taps):
                # lanes folded in halves (lane j += lane j + h, h = ceil(width / 2), in
                # the compute type: vector adds) down to FOLD, which are added left to
                # right in float64
                part = acc[m, t]
                width = R
                while width > FOLD:
                    h = (width + 1) // 2
                    lo, hi = part[:width - h], part[h:width]
                    for j in range(width - h):
                        lo[j] += hi[j]
                    width = h
                total_t = 0.0
                for k in range(width):
                    total_t += part[k]
                wo[t] = total_t


@njit(nogil=True, cache=True)
def _dot_taps(addr, calls, call_taps, g, buf, span, tile, sums, chunk):
    """sums[t] += sum_{p < span} g[p] * grid(t)[p] for every tap, one image: per planned
    call (R, J, a_step, b_base, b_rs, first), tap ``call_taps[first + r*J + j]`` sits at
    ``b_base + j*b_rs + r*a_step`` of ``buf``, and

        sum_p g[p] * buf[b_base + j*b_rs + r*a_step + p] = sum_p' g[p' - r*a_step] * buf[b_base + j*b_rs + p']

    over ``p' < span + (R-1)*a_step`` (``g`` is zero before its first cell and from
    ``span`` on): the micro-kernel's ``a`` rows are ``g`` shifted back by ``a_step`` and its
    ``b`` rows the taps' rows of the grid, so R x J sums share R + J vector loads per
    position block. Each call's sums start from zero and are added to ``sums`` in call
    order (fixed by the problem)."""
    if span <= 0:
        return
    ga = g.ctypes.data
    ba = buf.ctypes.data
    ta = tile.ctypes.data
    item = g.itemsize
    for k in range(calls.shape[0]):
        nr, nj, a_step, b_base, b_rs, first = calls[k, 0], calls[k, 1], calls[k, 2], calls[k, 3], calls[k, 4], \
            calls[k, 5]
        npos = span + (nr - 1) * a_step
        for p0 in range(0, npos, chunk):
            for i in range(nr * nj):
                tile[i] = 0
            _dotkernel(addr, nr, nj, ga + item * p0, ba + item * (b_base + p0), ta, min(chunk, npos - p0), -a_step,
                       b_rs, nj)
            for i in range(nr * nj):
                sums[call_taps[first + i]] += tile[i]


# ---------------------------------------------------------------------------------------
# Channels-last variant for small images. The per-channel loops above pay a set-up per
# channel and run short loops when an image has few positions; here a block of CB channels
# is transposed to (position, channel) and the innermost loop runs over the channels (the
# same weight tap for every position of a channel's loop is now a vector of CB weights):
#
#     fwd          yt[y, c]   += wt[k, c] * xt[y*s + k*d - p, c]     (valid taps only)
#     bwd_data     dxt[i, c]  += wt[k, c] * dyt[(i + p - k*d) / s, c] (when divisible, in range)
#     bwd_weights  acc[k, c]  += dyt[y, c] * xt[y*s + k*d - p, c]
#
# Order of every sum: fwd, taps row-major; bwd_data, m then taps row-major; bwd_weights,
# images in turn, each a sum from zero over the output positions row-major (in registers,
# see backward_weights_cl), added to the running sum in the compute type.
# The innermost loops always run all CB lanes (a constant trip count: no remainder loop,
# 1.x-2x faster, measured); the lanes past a short last block hold zeros or earlier
# channels' values, and what is computed from them is never written out.
# ---------------------------------------------------------------------------------------

from .depthwise import CB_CHANNELS as CB     # channels per transposed block
# The channels-last forward and data gradient sum each cell's taps in a register tile of
# CB lanes (``_cl_forward_taps``, ``_cl_data_taps``) instead of adding every tap into the
# transposed block in memory: the same additions in the same order (bitwise equal).
# Measured on the AMD Zen 5 (one thread, whole public calls, medians of 400, us, before /
# after): mobilenet conv5_1/dw (512 x 14^2) data gradient 148-153 / 101-132, forward
# 140-152 / 104-119; conv4_2/dw (stride 2) 131-134 / 118-128, 117-118 / 94-96; conv6/dw
# (1024 x 7^2) 76-83 / 58-63, 72-77 / 60-64. Inlined into the callers' loop nests the same
# tile ran slower (conv5_1/dw: data gradient 190-202, forward 160-189): the functions stay
# apart, and the data gradient reads its output cells from per-axis tables (no division
# per tap).
_cl_registers = stack_registers(CB)


@njit(nogil=True, cache=True)
def _to_rows(src, c_lo, cnt, dst, taddr, lanes):
    """dst[p, j] = src[c_lo + j, p] (src: (C, P) of one image, its rows any stride).

    With ``taddr`` (float32 and the compiled micro-kernels) in ``lanes x lanes`` blocks
    through the compiled transpose (``_ukernel.transpose_ir``; lanes past ``cnt`` up to
    the block's end written as zeros, which the tap loops never write out): one thread,
    whole public calls, us, element loops / blocks: mobilenet conv4_2/dw data gradient
    118-125 / 78, forward 89-95 / 55-59; conv5_1/dw 105-108 / 66-79 and 107 / 66-81;
    conv6/dw 54-57 / 45-47 and 57-62 / 45-47 (weight gradients, one transpose of three
    copies, 1.0-1.1x). Else
    positions outer, channels inner: each position writes one contiguous row of ``dst``
    and reads ``cnt`` source rows that stay in L1 for the next positions (channels outer
    wrote a cache line per element, over a block larger than L1: 2.2x slower, measured on
    256 channels x 784 positions)."""
    if taddr:
        item = src.itemsize
        s_rs = src.strides[0] // item
        sa = src.ctypes.data + item * c_lo * s_rs
        da = dst.ctypes.data
        d_rs = dst.shape[1]
        npos = src.shape[1]
        for j0 in range(0, cnt, lanes):
            for p0 in range(0, npos, lanes):
                _transpose(taddr, sa + item * (j0 * s_rs + p0), s_rs, da + item * (p0 * d_rs + j0), d_rs,
                           min(lanes, cnt - j0), min(lanes, npos - p0), lanes)
        return
    blk = src[c_lo:c_lo + cnt]                      # (sliced first: an index ``c_lo + j``
    for p in range(src.shape[1]):                   # keeps numba's negative-index check)
        d = dst[p]
        for j in range(cnt):
            d[j] = blk[j, p]


@njit(nogil=True, cache=True)
def _from_rows(src, cnt, dst, c_lo, step, taddr, lanes):
    """dst[c_lo + j*step, p] = src[p, j] (as ``_to_rows``: compiled blocks with ``taddr``,
    else positions outer)."""
    if taddr:
        item = src.itemsize
        s_rs = src.shape[1]
        npos = dst.shape[1]
        d_rs = step * npos
        sa = src.ctypes.data
        da = dst.ctypes.data + item * c_lo * npos
        for p0 in range(0, npos, lanes):
            nr = min(lanes, npos - p0)
            for j0 in range(0, cnt, lanes):
                _transpose(taddr, sa + item * (p0 * s_rs + j0), s_rs, da + item * (j0 * d_rs + p0), d_rs, nr,
                           min(lanes, cnt - j0), nr)
        return
    blk = dst[c_lo:c_lo + (cnt - 1) * step + 1:step]
    for p in range(dst.shape[1]):
        s = src[p]
        for j in range(cnt):
            blk[j, p] = s[j]


@njit(nogil=True, cache=True)
def _ow_ranges(w_in, ow_n, kw_n, geo):
    """Per kw, the outputs ow whose input column ow*s + kw*d - p lies in [0, w_in): [lo, hi)."""
    lo = np.zeros(kw_n, np.int64)
    hi = np.zeros(kw_n, np.int64)
    for kw in range(kw_n):
        first = -1
        last = -1
        for ow in range(ow_n):
            i_w = ow * geo[2] + kw * geo[5] - geo[8]
            if 0 <= i_w < w_in:
                if first < 0:
                    first = ow
                last = ow
        if first >= 0:
            lo[kw], hi[kw] = first, last + 1
    return lo, hi


@njit(nogil=True, cache=True)
def _cl_forward_taps(xt, wt, yt, ow_lo, ow_hi, geo, d_in, h_in, w_in, od_n, oh_n, ow_n, kd_n, kh_n, kw_n):
    """yt[op] = sum over the taps of output cell op, row-major, of wt[t] * xt[ip] (CB
    lanes): the sums of one cell stay in a register tile (``stack_registers``) and are
    stored once; the same additions in the same order as adding every tap into ``yt``
    in memory."""
    for od in range(od_n):
        for oh in range(oh_n):
            for ow in range(ow_n):
                acc = carray(_cl_registers(yt.dtype), CB)
                for j in range(CB):
                    acc[j] = 0
                for kd in range(kd_n):
                    i_d = od * geo[0] + kd * geo[3] - geo[6]
                    if i_d < 0 or i_d >= d_in:
                        continue
                    for kh in range(kh_n):
                        i_h = oh * geo[1] + kh * geo[4] - geo[7]
                        if i_h < 0 or i_h >= h_in:
                            continue
                        row_ip = (i_d * h_in + i_h) * w_in - geo[8] + ow * geo[2]
                        for kw in range(kw_n):
                            if ow < ow_lo[kw] or ow >= ow_hi[kw]:
                                continue
                            t = np.uint64((kd * kh_n + kh) * kw_n + kw)
                            ip = np.uint64(row_ip + kw * geo[5])
                            for j in range(np.uint64(CB)):
                                acc[j] += wt[t, j] * xt[ip, j]
                op = np.uint64((od * oh_n + oh) * ow_n + ow)
                for j in range(np.uint64(CB)):
                    yt[op, j] = acc[j]


@njit(nogil=True, cache=True)
def forward_cl(x, xc0, w, y, yc0, c0, c1, geo, taddr, lanes):
    n_img = x.shape[0]
    d_in, h_in, w_in = x.shape[2], x.shape[3], x.shape[4]
    od_n, oh_n, ow_n = y.shape[2], y.shape[3], y.shape[4]
    kd_n, kh_n, kw_n = w.shape[1], w.shape[2], w.shape[3]
    mult = geo[9]
    n_taps = kd_n * kh_n * kw_n
    xf = x.reshape((x.shape[0], x.shape[1], d_in * h_in * w_in))
    yf = y.reshape((y.shape[0], y.shape[1], od_n * oh_n * ow_n))
    wf = w.reshape((w.shape[0], n_taps))
    xt = np.zeros((d_in * h_in * w_in, CB), x.dtype)
    yt = np.empty((od_n * oh_n * ow_n, CB), y.dtype)
    wt = np.zeros((n_taps, CB), w.dtype)
    ow_lo, ow_hi = _ow_ranges(w_in, ow_n, kw_n, geo)
    for n in range(n_img):
        for b0 in range(c0, c1, CB):
            cnt = min(CB, c1 - b0)
            _to_rows(xf[n], b0 - xc0, cnt, xt, taddr, lanes)
            for m in range(mult):
                for t in range(n_taps):
                    for j in range(cnt):
                        wt[t, j] = wf[(b0 + j) * mult + m, t]
                _cl_forward_taps(xt, wt, yt, ow_lo, ow_hi, geo, d_in, h_in, w_in, od_n, oh_n, ow_n, kd_n, kh_n, kw_n)
                _from_rows(yt, cnt, yf[n], b0 * mult + m - yc0, mult, taddr, lanes)


@njit(nogil=True, cache=True)
def _source_of(size, k_n, out_n, stride, dil, pad):
    """(input index, tap) -> the output index whose window puts the tap there, -1 when
    none (one spatial axis)."""
    src = -np.ones((size, k_n), np.int64)
    for i in range(size):
        for k in range(k_n):
            t = i + pad - k * dil
            if t >= 0 and t % stride == 0 and t // stride < out_n:
                src[i, k] = t // stride
    return src


@njit(nogil=True, cache=True)
def _cl_data_taps(dyt, wt, dxt, d_of, h_of, col_of, oh_n, ow_n):
    """dxt[ip] += sum over the taps that reach input cell ip, row-major, of wt[t] *
    dyt[op] (CB lanes), one register tile per cell (as ``_cl_forward_taps``; the same
    additions in the same order as adding every tap into ``dxt`` in memory)."""
    d_in, kd_n = d_of.shape
    h_in, kh_n = h_of.shape
    w_in, kw_n = col_of.shape
    for i_d in range(d_in):
        for i_h in range(h_in):
            for i_w in range(w_in):
                ip = np.uint64((i_d * h_in + i_h) * w_in + i_w)
                acc = carray(_cl_registers(dxt.dtype), CB)
                for j in range(np.uint64(CB)):
                    acc[j] = dxt[ip, j]
                for kd in range(kd_n):
                    o_d = d_of[i_d, kd]
                    if o_d < 0:
                        continue
                    for kh in range(kh_n):
                        o_h = h_of[i_h, kh]
                        if o_h < 0:
                            continue
                        row_op = (o_d * oh_n + o_h) * ow_n
                        for kw in range(kw_n):
                            o_w = col_of[i_w, kw]
                            if o_w < 0:
                                continue
                            op = np.uint64(row_op + o_w)
                            t = np.uint64((kd * kh_n + kh) * kw_n + kw)
                            for j in range(np.uint64(CB)):
                                acc[j] += wt[t, j] * dyt[op, j]
                for j in range(np.uint64(CB)):
                    dxt[ip, j] = acc[j]


@njit(nogil=True, cache=True)
def backward_data_cl(dy, dyc0, w, dx, dxc0, c0, c1, geo, taddr, lanes):
    n_img = dx.shape[0]
    d_in, h_in, w_in = dx.shape[2], dx.shape[3], dx.shape[4]
    od_n, oh_n, ow_n = dy.shape[2], dy.shape[3], dy.shape[4]
    kd_n, kh_n, kw_n = w.shape[1], w.shape[2], w.shape[3]
    mult = geo[9]
    n_taps = kd_n * kh_n * kw_n
    dyf = dy.reshape((dy.shape[0], dy.shape[1], od_n * oh_n * ow_n))
    dxf = dx.reshape((dx.shape[0], dx.shape[1], d_in * h_in * w_in))
    wf = w.reshape((w.shape[0], n_taps))
    dyt = np.zeros((od_n * oh_n * ow_n, CB), dy.dtype)
    dxt = np.empty((d_in * h_in * w_in, CB), dx.dtype)
    wt = np.zeros((n_taps, CB), w.dtype)
    # dy index of (dx index, tap) per axis, -1 when none: no divisions in the tap loops
    d_of = _source_of(d_in, kd_n, od_n, geo[0], geo[3], geo[6])
    h_of = _source_of(h_in, kh_n, oh_n, geo[1], geo[4], geo[7])
    col_of = _source_of(w_in, kw_n, ow_n, geo[2], geo[5], geo[8])
    for n in range(n_img):
        for b0 in range(c0, c1, CB):
            cnt = min(CB, c1 - b0)
            dxt[:] = 0
            for m in range(mult):
                _to_rows(dyf[n, b0 * mult + m - dyc0::mult], 0, cnt, dyt, taddr, lanes)
                for t in range(n_taps):
                    for j in range(cnt):
                        wt[t, j] = wf[(b0 + j) * mult + m, t]
                _cl_data_taps(dyt, wt, dxt, d_of, h_of, col_of, oh_n, ow_n)
            _from_rows(dxt, cnt, dxf[n], b0 - dxc0, 1, taddr, lanes)


@njit(nogil=True, cache=True)
def _to_padded_rows(src, c_lo, cnt, dst, q, geo):
    """dst[cell, j] = x_pad[c_lo + j] at ``cell`` of the padded grid ``q`` (src: (C, D, H, W)
    of one image; only the cells inside the image are written, the caller zeroes dst once)."""
    d_in, h_in, w_in = src.shape[1], src.shape[2], src.shape[3]
    w_hi = min(w_in, q[2] - geo[8])                 # columns that have a cell
    srcf = src.reshape((src.shape[0], d_in * h_in * w_in))[c_lo:c_lo + cnt]
    for a in range(min(d_in, q[0] - geo[6])):
        for b in range(min(h_in, q[1] - geo[7])):
            cell = ((a + geo[6]) * q[1] + b + geo[7]) * q[2] + geo[8]
            pos = (a * h_in + b) * w_in
            rows = dst[cell:cell + w_hi]
            cols = srcf[:, pos:pos + w_hi]
            for i in range(w_hi):                   # positions outer (see _to_rows)
                d = rows[i]
                for j in range(cnt):
                    d[j] = cols[j, i]


@njit(**JIT)
def _cl_group(acc, rows, dyf, xpf, offs, jlo, outs, q, geo):
    """acc[rows[i], jlo + j] += sum_o dyf[o*CB + jlo + j] * xpf[(cell(o) + tap_i)*CB + jlo + j]
    for the TB taps of a group (``offs[i] = tap_i*CB``) and R channels ``j``, outputs ``o``
    row-major; ``cell(o)`` is the padded-grid cell of output ``o``'s first tap.

    Register tile: TB taps x R channels of sums stay in vector registers over the image
    (from zero, then added to ``acc``); each output is one load of R channels of dy shared
    by the TB taps, TB loads of x and TB multiply-adds, with no bounds test (padded grid).
    """
    r = carray(_registers(xpf.dtype), TB * R)
    for i in range(TB * R):
        r[i] = 0
    ujlo = np.uint64(jlo)
    op = 0
    for od in range(outs[0]):
        for oh in range(outs[1]):
            rb = (od * geo[0] * q[1] + oh * geo[1]) * q[2]
            for ow in range(outs[2]):
                xb = np.uint64((rb + ow * geo[2]) * CB) + ujlo
                gb = np.uint64(op * CB) + ujlo
                op += 1
                for j in range(R_U):
                    gv = dyf[gb + j]
                    for i in range(TB):
                        r[i * R + j] += gv * xpf[offs[i] + xb + j]
    for i in range(TB):
        a = acc[rows[i]]
        for j in range(R):
            a[jlo + j] += r[i * R + j]


@njit(nogil=True, cache=True)
def backward_weights_cl(x, xc0, dy, dyc0, dw_out, c0, c1, geo, taddr, lanes):
    """Per block of CB channels and image: x transposed into a zero-padded grid (cells
    ``q_a = (O_a - 1)*s_a + (K_a - 1)*d_a + 1`` per axis, cell ``c`` holds input ``c - p_a``),
    so tap ``k`` of output ``o`` is cell ``o*s + k*d`` with no bounds test, and then
    ``_cl_group`` per R channels and TB taps. Order per weight: images in turn, each a sum
    from zero over the outputs row-major, added to the running sum."""
    n_img = x.shape[0]
    od_n, oh_n, ow_n = dy.shape[2], dy.shape[3], dy.shape[4]
    kd_n, kh_n, kw_n = dw_out.shape[1], dw_out.shape[2], dw_out.shape[3]
    outs = np.array([od_n, oh_n, ow_n])
    ks = np.array([kd_n, kh_n, kw_n])
    q = np.empty(3, np.int64)
    for a in range(3):
        q[a] = (outs[a] - 1) * geo[a] + (ks[a] - 1) * geo[3 + a] + 1
    mult = geo[9]
    n_taps = kd_n * kh_n * kw_n
    dyf = dy.reshape((dy.shape[0], dy.shape[1], od_n * oh_n * ow_n))
    dwf = dw_out.reshape((dw_out.shape[0], n_taps))
    xp = np.zeros((q[0] * q[1] * q[2], CB), x.dtype)     # padding cells stay zero
    xpf = xp.reshape(xp.size)
    dyt = np.zeros((mult, od_n * oh_n * ow_n, CB), dy.dtype)
    acc = np.empty((mult, n_taps + 1, CB), dw_out.dtype)   # + a spare row (short last group)
    offs = np.empty(TB, np.uint64)
    rows = np.empty(TB, np.int64)
    for b0 in range(c0, c1, CB):
        cnt = min(CB, c1 - b0)
        acc[:] = 0
        for n in range(n_img):
            _to_padded_rows(x[n], b0 - xc0, cnt, xp, q, geo)
            for m in range(mult):
                _to_rows(dyf[n, b0 * mult + m - dyc0::mult], 0, cnt, dyt[m], taddr, lanes)
            for m in range(mult):
                dym = dyt[m].reshape(dyt.shape[1] * CB)
                for t0 in range(0, n_taps, TB):
                    for i in range(TB):
                        t = min(t0 + i, n_taps - 1)
                        kd, kh, kw = t // (kh_n * kw_n), t // kw_n % kh_n, t % kw_n
                        offs[i] = ((kd * geo[3] * q[1] + kh * geo[4]) * q[2] + kw * geo[5]) * CB
                        rows[i] = t0 + i if t0 + i < n_taps else n_taps
                    for jlo in range(0, CB, R):
                        _cl_group(acc[m], rows, dym, xpf, offs, jlo, outs, q, geo)
        for m in range(mult):
            for t in range(n_taps):
                for j in range(cnt):
                    dwf[(b0 + j) * mult + m, t] = acc[m, t, j]
