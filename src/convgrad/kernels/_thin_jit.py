"""Compiled loops of the direct thin-channel kernel (kernel layer; imports numba, so it is
imported only through ``thin.available()``).

Every problem arrives as 3-D and stride 1: data ``x`` ``(N, C, D, H, W)``, weights ``w``
``(G, Og, Cg * T)`` (``T`` taps, row-major, input channel major), result ``y`` ``(N, G*Og,
OD, OH, OW)``, C-contiguous, float32 or float64, and ``geo = (dd, dh, dw, pd, ph, pw, tile, kd, kh, kw,
channels per chunk)`` as an int64 array (one signature per element type).

Lowering ("wide rows", stride 1). Per axis the padded input has ``Q = I + pb + pe = O +
(K - 1)*d`` cells and output ``o`` reads padded cell ``o + k*d``. Flatten the padded grid
row-major (``f = (a*Q1 + b)*Q2 + c``) and give output ``(o0, o1, o2)`` the flat index ``p``
of cell ``(o0, o1, o2)`` of the same grid: tap ``k`` is then one flat offset ``off(k) =
(k0*d0*Q1 + k1*d1)*Q2 + k2*d2``, and::

    yw[p] = sum_{c < Cg} sum_k w[o, c, k] * xpad_flat[c, p + off(k)]       p < span

where ``span`` is one past the flat index of the last output. Cells ``p`` with ``o2 >= O2``
(or ``o1 >= O1``) are "wide" cells, computed and dropped (a halo of ``(K - 1)*d`` per row).
The images' padded grids are laid end to end (a leading axis ``n`` of ``N`` cells): a tap
of a real output never leaves its image, so small images share tiles.

Positions are cut into tiles of ``tile`` consecutive ``p`` (a multiple of ``R``); a tile
copies the ``tile + max_off`` padded cells it reads, of every input channel of its group,
into a buffer (zeros in the padding: no per-element test in the loops), and computes
every output channel of the group from it in register tiles of ``OB`` output channels x
``R`` consecutive positions: the ``OB * R`` accumulators stay in vector registers while
the loop runs over all the ``(c, k)`` terms, each term one load of ``R`` consecutive
inputs (shared by the ``OB`` channels) and ``OB`` broadcast weights, multiplied and added
with no reduction inside a vector (so LLVM vectorizes it without fastmath). Measured on
the development machine (Zen 3, 2.45 GHz, AVX2: 78 GFLOP/s a core with separate multiply
and add), the register tile runs at 64 GFLOP/s in the L1 cache.

Order of every sum (fixed, independent of the tiling, the chunking and the thread count):
``acc = 0``, then ``acc = acc + w*x`` for the terms ``u = (c, k)`` in order (``c``
ascending, taps row-major inside).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from ._jit_common import JIT, _prefetch, _prefetch_write, copy_elems, gather_strided, stack_registers

from .thin import OB, R     # register tile: output channels x positions (the loops below are written out for OB = 3)

R_U = np.uint64(R)


@njit(nogil=True, cache=True)
def _cell(f, q0, q1, q2):
    """(image, depth, row, column) of flat cell ``f`` of the images' padded grids laid end
    to end (``f = ((n*q0 + a)*q1 + b)*q2 + col``)."""
    row = f // q2
    na = row // q1
    return na // q0, na % q0, row % q1, f % q2


@njit(nogil=True, cache=True, inline="always")
def _row(arr, n, c, a, b):
    """Flat index of ``arr[n, c, a, b, 0]`` (``arr`` (N, C, D, H, W), C-contiguous)."""
    return (((n * arr.shape[1] + c) * arr.shape[2] + a) * arr.shape[3] + b) * arr.shape[4]


@njit(nogil=True, cache=True)
def _fill(x, c_lo, cg, buf, width, lo, hi, q0, q1, q2, p0, p1, p2):
    """buf[c*width + f - lo] = xpad_flat[n, c_lo + c, ...][f] for lo <= f < hi, c < cg, where
    ``f`` runs over the padded grids of all images in turn (``(n*q0 + a)*q1 + b)*q2 + col``)
    and the padding (``p0, p1, p2`` cells in front) holds zero. ``x`` is C-contiguous.

    Each row's cells are one ``copy_elems`` (``llvm.memcpy``), as are ``_scatter``'s and
    ``_gather``'s: element loops had paid their vectorized loop's checks and remainder per
    row. Measured on the Zen 3 host, one thread: every tile's fill of the grouped 8 x 16
    channels 3x3 165^2 data gradient 1.80-1.94 -> 1.05-1.29 ms, its scatter 0.59-0.64 ->
    0.50-0.57; whole calls (alternating processes, the least of 30 calls): that data
    gradient 15.6-16.0 -> 14.7-15.2 ms, its forward 15.3-15.9 -> 14.5-14.7, weight
    gradient 16.5-16.7 -> 15.6; wavenet conv1d_7 forward 5.6-5.7 -> 5.0-5.3; 32 channels
    24^3 3x3x3 forward 10.9-11.3 -> 10.2-10.4."""
    d_in, h_in, w_in = x.shape[2], x.shape[3], x.shape[4]
    f = lo
    while f < hi:
        n, a, b, col = _cell(f, q0, q1, q2)
        end = min(hi, f - col + q2)
        cnt = end - f
        i_d, i_h = a - p0, b - p1
        inside = 0 <= i_d < d_in and 0 <= i_h < h_in
        # padded columns [col, col + cnt) read source columns [col - p2, ...)
        first = max(0, min(cnt, p2 - col)) if inside else cnt      # leading padding
        last = max(first, min(cnt, w_in + p2 - col)) if inside else cnt
        for c in range(cg):
            out = c * width + f - lo
            for j in range(first):
                buf[out + j] = 0
            if last > first:
                copy_elems(buf, out + first, x, _row(x, n, c_lo + c, i_d, i_h) + col + first - p2, last - first)
            for j in range(last, cnt):
                buf[out + j] = 0
        f = end


@njit(nogil=True, cache=True)
def _fill_phases(x, pgeo, c_lo, cg, buf, width, lo, hi, q0, q1, q2):
    """``_fill`` of the phase problem (``thin.phase_spec``) read from the strided problem's
    own input ``x`` (N, C, S0, S1, S2): phase channel ``c_lo + c = ch*P + r`` holds
    ``x[n, ch, s*j + r - pb]`` at phase cell ``j`` of grids ``q``, zero outside ``x`` and
    on cells no real tap reads (``_last_read``); ``pgeo`` = ``(s0, s1, s2, pb0, pb1, pb2,
    k0, k1, k2)``. A copy of the whole phase array made first cost mobilenet conv1's
    weight gradient (mb32, 19 MB input) a pass that wrote 19.6 MB and one that read it
    back: 21.5-26 -> 13.6-13.7 ms with the live terms (median, alternating processes)."""
    s0, s1, s2, pb0, pb1, pb2 = pgeo[0], pgeo[1], pgeo[2], pgeo[3], pgeo[4], pgeo[5]
    n_ch, d_in, h_in, w_in = x.shape[1], x.shape[2], x.shape[3], x.shape[4]
    xf = x.reshape(-1)
    p12 = s1 * s2
    for c in range(cg):
        ch, r = (c_lo + c) // (s0 * p12), (c_lo + c) % (s0 * p12)
        r0, r1, r2 = r // p12, (r // s2) % s1, r % s2
        last0 = _last_read(r0, s0, pgeo[6], q0)
        last1 = _last_read(r1, s1, pgeo[7], q1)
        lo2, hi2 = _phase_range(r2, s2, pb2, q2, w_in)
        hi2 = max(lo2, min(hi2, _last_read(r2, s2, pgeo[8], q2) + 1))
        f = lo
        while f < hi:
            n, a, b, col = _cell(f, q0, q1, q2)
            end = min(hi, f - col + q2)
            cnt = end - f
            i_d, i_h = s0 * a + r0 - pb0, s1 * b + r1 - pb1
            inside = 0 <= i_d < d_in and 0 <= i_h < h_in and a <= last0 and b <= last1
            first = min(cnt, max(0, lo2 - col)) if inside else cnt
            last = max(first, min(cnt, hi2 - col)) if inside else cnt
            out = c * width + f - lo
            for j in range(first):
                buf[out + j] = 0
            if last > first:
                row = (((n * n_ch + ch) * d_in + i_d) * h_in + i_h) * w_in
                gather_strided(buf, xf, out + first, row + s2 * (col + first) + r2 - pb2, last - first, s2)
            for j in range(last, cnt):
                buf[out + j] = 0
            f = end


_registers = stack_registers(OB * R)     # the register tile (``_jit_common``)

# Software prefetch in the forward loop. A tile's register tiles run from its buffer in
# the caches, but its fill reads the input from memory and its scatter writes the outputs
# there, each a stall: with the register tiles skipped, the grouped 8 x 16 channels 3x3
# 165^2 data gradient still took 3.5 of its 14.5 ms (one thread). So while a tile
# computes, each register-tile step asks for a few lines of the input cells the next tile
# will read (``_prefetch``) and of the outputs this tile will write (``_prefetch_write``),
# spread evenly over the tile's steps. Each channel's cells of a tile are one range of
# its plane (``_plane_at``), so ``pf`` holds per stream: [first address, lines per
# channel, channel stride in bytes, lines per step, cursor: line, cursor: channel,
# channels, write intent]; the output stream follows at PF_LEN. Measured on the Zen 3 host
# (alternating processes, the least of 30 calls, ms, new / old): one thread, that data
# gradient 13.0-13.1 / 14.8-15.3, its forward 12.8-12.9 / 15.3-15.6, wavenet conv1d_7's
# forward 5.1-5.2 / 5.5-5.8; two threads 6.7-7.0 / 7.8-8.2, 7.0-7.2 / 8.0-8.4, and a 3-D
# forward (32 channels 24^3) 6.9-7.2 / 7.4-8.1. The weight gradient's tiles prefetch the
# next tile's input and diff_dst cells the same way, one step per term triple of
# ``_wtile``: one thread, the grouped layer's 15.6-15.9 / 16.1, the 3-D one's 12.8-13.1 /
# 13.3-13.7; two threads 8.4-8.8 / 9.0-9.1 (wavenet conv1d_9's alike). A phase problem
# (stride 2 and more) prefetches the rows of its own input that the next tile's phase
# cells read: resnet_50 conv1 (mb4, 7x7 stride 2), one thread, forward 12.2-12.3 /
# 12.5-13.0, weight gradient 14.5-14.7 / 16.1; two threads 6.5-6.7 / 6.8-7.9 and 8.1-8.5
# / 8.5-8.6. Prefetches never fault and change no result, so the ranges may be
# approximate (a tile across two images stops at the first).
PF_LEN = 8


@njit(nogil=True, cache=True, inline="always")
def _prefetch_some(pf):
    """The next lines of both streams of ``pf`` (at most ``lines per step`` of each)."""
    for k in range(0, 2 * PF_LEN, PF_LEN):
        line, ch = pf[k + 4], pf[k + 5]
        for _ in range(pf[k + 3]):
            if ch >= pf[k + 6]:
                break
            if pf[k + 7]:
                _prefetch_write(pf[k] + pf[k + 2] * ch + 64 * line)
            else:
                _prefetch(pf[k] + pf[k + 2] * ch + 64 * line)
            line += 1
            if line == pf[k + 1]:
                line = 0
                ch += 1
        pf[k + 4], pf[k + 5] = line, ch


@njit(nogil=True, cache=True)
def _stream(pf, k, arr, ch0, nch, f0, f1, q0, q1, q2, pads, strides, steps, write):
    """Set stream ``k`` of ``pf`` to the lines of ``arr`` (N, C, D, H, W) that hold the
    cells ``[f0, f1)`` of the flat padded grids (``_plane_at``: pads ``pads`` in front on
    each axis, cells ``strides`` apart) of channels ``ch0 .. ch0 + nch``, spread over
    ``steps`` steps (none when empty)."""
    pf[k + 4], pf[k + 5], pf[k + 6] = 0, 0, 0
    if f1 <= f0 or steps <= 0:
        return
    d_in, h_in, w_in = arr.shape[2], arr.shape[3], arr.shape[4]
    plane = d_in * h_in * w_in
    e0, m0 = _plane_at(f0, q0, q1, q2, pads, strides, False, d_in, h_in, w_in)
    e1, m1 = _plane_at(f1 - 1, q0, q1, q2, pads, strides, True, d_in, h_in, w_in)
    e1 = e1 + 1 if m1 == m0 else plane
    if e1 <= e0:
        return
    pf[k] = arr.ctypes.data + arr.itemsize * ((m0 * arr.shape[1] + ch0) * plane + e0)
    pf[k + 1] = (arr.itemsize * (e1 - e0) + 63) // 64 + 1
    pf[k + 2] = arr.itemsize * plane
    pf[k + 3] = (nch * pf[k + 1] + steps - 1) // steps
    pf[k + 6] = nch
    pf[k + 7] = write


@njit(**JIT)
def _block(acc, row, col, n, buf, w, o, offs, u0, u1, first, pf):
    """acc[row + o + i, col + p] = (0 if first else acc[...]) + sum_{u0 <= u < u1}
    w[o + i, u] * buf[offs[u] + p] for i < OB, p < n rounded up to R (terms in order).

    Register tile: ``OB`` output channels x ``R`` positions of accumulators stay in
    registers over the terms; each term loads ``R`` consecutive inputs (shared by the
    ``OB`` channels) and ``OB`` broadcast weights. Indices are unsigned (``offs`` is
    uint64, the term index ``u`` too), which spares numba's negative-index wraparound in
    the loop: with a signed ``u`` each term paid a sign test and a select for each of its
    four indexed loads (23 instructions per 12 multiply-adds without them, about 30 with
    them); in-process on the Zen 3 host, interleaved, unsigned / signed: grouped 8 x 16
    channels 3x3 165^2 data gradient 0.90-0.95, forward 0.89, wavenet conv1d_4 and
    conv1d_7 data gradients 0.85 and 0.90 (same bits).
    """
    wa, wb, wc = w[o], w[o + 1], w[o + 2]
    for p0 in range(0, n, R):
        _prefetch_some(pf)
        r = carray(_registers(buf.dtype), OB * R)
        if first:
            for i in range(OB * R):
                r[i] = 0
        else:
            for i in range(OB):
                src = acc[row + o + i, col + p0:col + p0 + R]
                for j in range(R):
                    r[i * R + j] = src[j]
        up0 = np.uint64(p0)
        for u in range(np.uint64(u0), np.uint64(u1)):      # unsigned: no negative-index wraparound
            base = offs[u] + up0
            w0, w1, w2 = wa[u], wb[u], wc[u]
            for j in range(R_U):
                xv = buf[base + j]
                r[j] += w0 * xv
                r[R + j] += w1 * xv
                r[2 * R + j] += w2 * xv
        for i in range(OB):
            dst = acc[row + o + i, col + p0:col + p0 + R]
            for j in range(R):
                dst[j] = r[i * R + j]


@njit(**JIT)
def _block2(acc, row, col, n, buf, w, o, o2, offs, u0, u1, first, pf):
    """``_block`` for the output channels ``o`` and ``o2`` (pairs after the full tiles):
    the same sums. A last single channel runs as ``o2 = o``, both rows the same: twice its
    work, but vectorized (LLVM left the loop of one channel scalar, at a quarter of the
    speed); ``forward`` leaves it only where a group has one output channel."""
    wa, wb = w[o], w[o2]
    for p0 in range(0, n, R):
        _prefetch_some(pf)
        r = carray(_registers(buf.dtype), OB * R)
        if first:
            for i in range(2 * R):
                r[i] = 0
        else:
            src, src2 = acc[row + o, col + p0:col + p0 + R], acc[row + o2, col + p0:col + p0 + R]
            for j in range(R):
                r[j] = src[j]
                r[R + j] = src2[j]
        up0 = np.uint64(p0)
        for u in range(np.uint64(u0), np.uint64(u1)):      # unsigned: no negative-index wraparound
            base = offs[u] + up0
            w0, w1 = wa[u], wb[u]
            for j in range(R_U):
                xv = buf[base + j]
                r[j] += w0 * xv
                r[R + j] += w1 * xv
        dst = acc[row + o, col + p0:col + p0 + R]
        for j in range(R):
            dst[j] = r[j]
        dst = acc[row + o2, col + p0:col + p0 + R]
        for j in range(R):
            dst[j] = r[R + j]


@njit(nogil=True, cache=True)
def _scatter(y, o_lo, ocg, acc, lo, cnt, q0, q1, q2, outs0, outs1, outs2):
    """y[n, o_lo + o][cell] = acc[o, f - lo] for the real outputs among the flat cells
    [lo, lo + cnt) of the images' padded grids, o < ocg."""
    f = lo
    while f < lo + cnt:
        n, a, b, col = _cell(f, q0, q1, q2)
        end = min(lo + cnt, f - col + q2)
        if a < outs0 and b < outs1 and col < outs2:
            stop = min(end - f, outs2 - col)
            for o in range(ocg):
                copy_elems(y, _row(y, n, o_lo + o, a, b) + col, acc, o * acc.shape[1] + f - lo, stop)
        f = end


@njit(nogil=True, cache=True)
def _grid(n_img, outs0, outs1, outs2, geo):
    """``(q0, q1, q2, max_off, span)`` of the images' flat padded grids: cells per axis,
    the flat offset of the last tap, one past the last output (see the derivation above)."""
    q0 = outs0 + (geo[7] - 1) * geo[0]
    q1 = outs1 + (geo[8] - 1) * geo[1]
    q2 = outs2 + (geo[9] - 1) * geo[2]
    max_off = ((geo[7] - 1) * geo[0] * q1 + (geo[8] - 1) * geo[1]) * q2 + (geo[9] - 1) * geo[2]
    span = (((n_img - 1) * q0 + outs0 - 1) * q1 + outs1 - 1) * q2 + outs2
    return q0, q1, q2, max_off, span


@njit(nogil=True, cache=True)
def _offsets(cg, geo, q1, q2, width, n_pad, live):
    """offs[i] = c*width + off(k) for the terms ``live[i] = c*T + k`` (channel, tap) in
    order, then copies of the last one up to ``n_pad`` (padding terms whose sums the
    callers drop)."""
    T = geo[7] * geo[8] * geo[9]
    offs = np.empty(n_pad, np.uint64)
    for i in range(live.shape[0]):
        c, k = live[i] // T, live[i] % T
        k0, k1, k2 = k // (geo[8] * geo[9]), (k // geo[9]) % geo[8], k % geo[9]
        offs[i] = c * width + (k0 * geo[0] * q1 + k1 * geo[1]) * q2 + k2 * geo[2]
    for v in range(live.shape[0], n_pad):
        offs[v] = offs[live.shape[0] - 1]
    return offs


@njit(nogil=True, cache=True)
def _input_cells(x, geo, pgeo, n_groups):
    """(strides, pads, channels per group) of the input cells a flat cell reads, for
    ``_stream``: a phase problem's phase cells are stride apart in its own input ``x``
    (pads ``pb``, its real channels), other problems' cells are ``x``'s padded cells."""
    if pgeo.shape[0] > 0:
        return pgeo[0:3].copy(), pgeo[3:6].copy(), x.shape[1] // n_groups
    return np.ones(3, np.int64), geo[3:6].copy(), x.shape[1] // n_groups


@njit(nogil=True, cache=True)
def _plane_at(f, q0, q1, q2, pads, strides, end, d_in, h_in, w_in):
    """(element offset in its channel's plane, image) of the input cell that flat padded
    cell ``f`` reads (cell ``s*j - p`` per axis; with ``end``, the last of the ``s`` cells
    of its stride phases, ``s*j + s - 1 - p``), or the nearest one after it where that
    lies in the padding (the plane's ends around it)."""
    n, a, b, col = _cell(f, q0, q1, q2)
    e = 1 if end else 0
    i_d = strides[0] * a + (strides[0] - 1) * e - pads[0]
    i_h = strides[1] * b + (strides[1] - 1) * e - pads[1]
    i_w = min(max(strides[2] * col + (strides[2] - 1) * e - pads[2], 0), w_in)
    if i_d < 0 or (i_d == 0 and i_h < 0):
        return 0, n
    if i_d >= d_in:
        return d_in * h_in * w_in, n
    if i_h < 0 or i_h >= h_in:          # a padding row: the start of the next real row
        i_w = 0
    i_h = min(max(i_h, 0), h_in)
    return (i_d * h_in + i_h) * w_in + i_w, n


@njit(nogil=True, cache=True)
def forward(x, w, y, geo, i0, i1, live, pgeo):
    """Items ``[i0, i1)`` of the flat list ``g*tiles + tile``; tiles cut the flat padded
    grids of all images, one after the other (a tile may span images: taps of real
    outputs never leave their image, and the cells they do leave are dropped).

    ``live`` lists the terms ``c*T + k`` that are summed (sorted; ``w``'s last axis holds
    their weights in that order). With ``pgeo`` (``_fill_phases``; empty otherwise) the
    problem is a phase problem, ``x`` the strided problem's own input and ``live`` its
    ``thin._live_terms``: the tiles read their phase cells from ``x``, no phase array."""
    n_img = x.shape[0]
    outs0, outs1, outs2 = y.shape[2], y.shape[3], y.shape[4]
    p0, p1, p2 = geo[3], geo[4], geo[5]
    tile = geo[6]                    # a multiple of R
    cch = geo[10]                    # input channels per chunk
    n_groups = w.shape[0]
    ocg = w.shape[1]
    phases = pgeo.shape[0] > 0
    cg = x.shape[1] * (pgeo[0] * pgeo[1] * pgeo[2] if phases else 1) // n_groups
    n_taps = geo[7] * geo[8] * geo[9]
    q0, q1, q2, max_off, span = _grid(n_img, outs0, outs1, outs2, geo)
    n_tiles = (span + tile - 1) // tile
    width = tile + max_off
    offs = _offsets(cg, geo, q1, q2, width, live.shape[0], live)
    # first_u[c]: the index in ``live`` of channel c's first term (a chunk of channels
    # [c0, c1) sums the terms [first_u[c0], first_u[c1]))
    first_u = np.searchsorted(live // n_taps, np.arange(cg + 1))
    # register tiles run to a multiple of R positions: the cells past a tile's last input
    # are read (they hold zeros or older inputs) and the outputs they make are dropped
    buf = np.zeros(cg * width, x.dtype)
    acc = np.empty((ocg, tile), y.dtype)
    # (reading the input in place when there is no padding measured slower, 6.3 against
    # 5.5 ms on wavenet: the copy packs the tile's rows into the cache)
    img = q0 * q1 * q2
    # channels [0, full) in register tiles of OB, the rest in pairs: a remainder of one
    # channel after the last full tile runs as two pairs (4 = 2 + 2) rather than a pair
    # with itself, which computes it twice (16 channels: 16 channel passes instead of 17)
    full = ocg - ocg % OB
    if ocg % OB == 1 and full > 0:
        full -= OB
    # 1-D (one row per image): a tile of real outputs only is written straight into y
    y2 = y.reshape((y.shape[0] * y.shape[1], outs0 * outs1 * outs2))
    rows = q0 == 1 and q1 == 1
    pf = np.zeros(2 * PF_LEN, np.int64)
    zeros3, ones3 = np.zeros(3, np.int64), np.ones(3, np.int64)
    xstrides, xpads, xcg = _input_cells(x, geo, pgeo, n_groups)
    blocks = (full // OB + (ocg - full + 1) // 2) * ((cg + cch - 1) // cch)
    for item in range(i0, i1):
        ti = item % n_tiles
        g = item // n_tiles
        lo = ti * tile
        cnt = min(tile, span - lo)
        n = lo // img
        if phases:
            _fill_phases(x, pgeo, g * cg, cg, buf, width, lo, lo + cnt + max_off, q0, q1, q2)
        else:
            _fill(x, g * cg, cg, buf, width, lo, lo + cnt + max_off, q0, q1, q2, p0, p1, p2)
        steps = blocks * ((cnt + R - 1) // R)
        # the cells the next tile reads that this one did not; the outputs this tile writes
        _stream(pf, 0, x, g * xcg, xcg, lo + tile + max_off,
                min(span, lo + 2 * tile) + max_off if ti + 1 < n_tiles and item + 1 < i1 else 0,
                q0, q1, q2, xpads, xstrides, steps, 0)
        _stream(pf, PF_LEN, y, g * ocg, ocg, lo, lo + cnt, q0, q1, q2, zeros3, ones3, steps, 1)
        direct = rows and lo + tile <= n * img + outs2
        out = y2 if direct else acc
        row = n * y.shape[1] + g * ocg if direct else 0
        col = lo - n * img if direct else 0
        wg = w[g]
        # input channels in chunks of ``cch`` (a chunk's rows of the buffer stay in L2
        # while every output channel reads them); the sums run on in ``out``
        for c0 in range(0, cg, cch):
            u0, u1 = first_u[c0], first_u[min(cg, c0 + cch)]
            for o in range(0, full, OB):
                _block(out, row, col, cnt, buf, wg, o, offs, u0, u1, c0 == 0, pf)
            for o in range(full, ocg, 2):
                _block2(out, row, col, cnt, buf, wg, o, min(o + 1, ocg - 1), offs, u0, u1, c0 == 0, pf)
        if not direct:
            _scatter(y, g * ocg, ocg, acc, lo, cnt, q0, q1, q2, outs0, outs1, outs2)


# ---------------------------------------------------------------------------------------
# Weight gradient (stride 1). With the same flat padded grids,
#     dw[o, c, k] = sum_{p < span} dyw[o, p] * xpad_flat[c, p + off(k)]
# where ``dyw`` is diff_dst on the flat grid with zeros in the wide cells: a product whose
# reduction (positions) is long and whose output (output channels x terms u = (c, k)) is
# small. Register tile: ``WO`` output channels x ``WU`` terms x ``L`` lanes of partial sums,
# lane ``l`` summing the positions ``p = l mod L``; per L positions it loads WO rows of dyw
# and WU rows of the input buffer (7 loads for 12 multiply-adds) and multiplies them
# element by element (no reduction inside a vector, so LLVM vectorizes it without
# reassociation).
# Order of every sum (fixed by the problem's chunk cuts alone): within a chunk (a range of
# one group's positions, cut at multiples of L) each lane is one running sum over its
# positions in increasing order (the register tile is loaded from the lane sums and stored
# back at each tile's end, so the tile length does not matter); then the L lanes of the
# chunk are added in lane order in float64, and the chunks in chunk order (thin.py).
# ---------------------------------------------------------------------------------------

WO = 4
WU = 3
L = 8
L_U = np.uint64(L)

_wregs = stack_registers(WO * WU * L)


@njit(**JIT)
def _wtile(lanes, o, dyb, buf, offs, n, pf):
    """lanes[o + i, u, l] += dyb[o + i, p] * buf[offs[u] + p] for p = l, l + L, ... < n
    (one addition after the other), for i < WO and every term u, WU terms at a time
    (``n`` a multiple of L). The register tile is loaded from the lane sums and stored back,
    so each lane is one running sum over its positions whatever the tile length."""
    y0, y1, y2, y3 = dyb[o], dyb[o + 1], dyb[o + 2], dyb[o + 3]
    l0, l1, l2, l3 = lanes[o], lanes[o + 1], lanes[o + 2], lanes[o + 3]
    for uu in range(0, offs.shape[0], WU):
        _prefetch_some(pf)
        r = carray(_wregs(buf.dtype), WO * WU * L)
        for j in range(WU):
            a0, a1, a2, a3 = l0[uu + j], l1[uu + j], l2[uu + j], l3[uu + j]
            for l in range(L):
                r[j * L + l] = a0[l]
                r[(3 + j) * L + l] = a1[l]
                r[(6 + j) * L + l] = a2[l]
                r[(9 + j) * L + l] = a3[l]
        b0, b1, b2 = offs[uu], offs[uu + 1], offs[uu + 2]
        for p0 in range(0, n, L):
            up = np.uint64(p0)
            for l in range(L_U):
                x0 = buf[b0 + up + l]
                x1 = buf[b1 + up + l]
                x2 = buf[b2 + up + l]
                v = y0[up + l]
                r[l] += v * x0
                r[L + l] += v * x1
                r[2 * L + l] += v * x2
                v = y1[up + l]
                r[3 * L + l] += v * x0
                r[4 * L + l] += v * x1
                r[5 * L + l] += v * x2
                v = y2[up + l]
                r[6 * L + l] += v * x0
                r[7 * L + l] += v * x1
                r[8 * L + l] += v * x2
                v = y3[up + l]
                r[9 * L + l] += v * x0
                r[10 * L + l] += v * x1
                r[11 * L + l] += v * x2
        for j in range(WU):
            a0, a1, a2, a3 = l0[uu + j], l1[uu + j], l2[uu + j], l3[uu + j]
            for l in range(L):
                a0[l] = r[j * L + l]
                a1[l] = r[(3 + j) * L + l]
                a2[l] = r[(6 + j) * L + l]
                a3[l] = r[(9 + j) * L + l]


@njit(nogil=True, cache=True)
def _gather(dyb, dy, o_lo, ocg, lo, cnt, q0, q1, q2, outs0, outs1, outs2):
    """dyb[o, f - lo] = dy[n, o_lo + o][cell f] for real outputs among the flat cells
    [lo, lo + cnt), zero for the wide cells (o < ocg; ``_scatter`` read the other way)."""
    f = lo
    while f < lo + cnt:
        n, a, b, col = _cell(f, q0, q1, q2)
        end = min(lo + cnt, f - col + q2)
        stop = min(end - f, outs2 - col) if (a < outs0 and b < outs1 and col < outs2) else 0
        for o in range(ocg):
            out = o * dyb.shape[1] + f - lo
            if stop > 0:
                copy_elems(dyb, out, dy, _row(dy, n, o_lo + o, a, b) + col, stop)
            for j in range(max(stop, 0), end - f):
                dyb[o, f - lo + j] = 0
        f = end


@njit(nogil=True, cache=True)
def backward_weights(x, dy, part, geo, cuts, i0, i1, ocg_pad, n_u_pad, live, pgeo):
    """Items ``[i0, i1)`` of the flat list ``g*chunks + chunk``: item (g, ch) sums the
    flat positions ``[cuts[ch], cuts[ch + 1])`` of group ``g`` (multiples of L) into L
    lane sums per (output channel, term ``live[i]``), walked in tiles of ``tile`` positions, then adds
    the lanes in order (l = 0, 1, ..., L - 1, in float64) into ``part[ch, g]``. The sums
    depend on the cuts, never on the tile length or on which thread runs the item. With
    ``pgeo`` (``_fill_phases``; empty otherwise) the problem is a phase problem and
    ``x`` the strided problem's input, its tiles filled by ``_fill_phases``."""
    n_img = x.shape[0]
    outs0, outs1, outs2 = dy.shape[2], dy.shape[3], dy.shape[4]
    p0, p1, p2 = geo[3], geo[4], geo[5]
    tile = geo[6]                    # a multiple of L
    n_groups = part.shape[1]
    ocg = part.shape[2]
    n_chunks = cuts.shape[0] - 1
    phases = pgeo.shape[0] > 0
    cg = x.shape[1] * (pgeo[0] * pgeo[1] * pgeo[2] if phases else 1) // n_groups
    q0, q1, q2, max_off, span = _grid(n_img, outs0, outs1, outs2, geo)
    width = tile + max_off
    offs = _offsets(cg, geo, q1, q2, width, n_u_pad, live)
    # a tile rounds up to L positions: the cells read past its last input are set to zero,
    # and so are the cells of dyb there
    buf = np.zeros(cg * width, x.dtype)
    dyb = np.zeros((ocg_pad, tile), dy.dtype)      # rows past ocg stay zero
    lanes = np.empty((ocg_pad, n_u_pad, L), dy.dtype)
    pf = np.zeros(2 * PF_LEN, np.int64)
    zeros3, ones3 = np.zeros(3, np.int64), np.ones(3, np.int64)
    xstrides, xpads, xcg = _input_cells(x, geo, pgeo, n_groups)
    steps = (ocg_pad // WO) * (n_u_pad // WU)     # _prefetch_some calls per tile
    for item in range(i0, i1):
        g = item // n_chunks
        ch = item % n_chunks
        lanes[:] = 0
        end = min(cuts[ch + 1], span)
        for lo in range(cuts[ch], end, tile):
            cnt = min(tile, end - lo)
            cnt_l = (cnt + L - 1) // L * L
            # the next tile's input cells that this one does not read, and its diff_dst cells;
            # after an item's last tile, the first tile of the next item of this call
            if lo + tile < end:
                nxt = min(end, lo + 2 * tile)
                _stream(pf, 0, x, g * xcg, xcg, lo + tile + max_off, nxt + max_off, q0, q1, q2, xpads, xstrides,
                        steps, 0)
                _stream(pf, PF_LEN, dy, g * ocg, ocg, lo + tile, nxt, q0, q1, q2, zeros3, ones3, steps, 0)
            else:                                  # none where this call ends (empty ranges)
                g2, lo2, nxt = g, 0, 0
                if item + 1 < i1:
                    g2, ch2 = (item + 1) // n_chunks, (item + 1) % n_chunks
                    lo2 = cuts[ch2]
                    nxt = min(cuts[ch2 + 1], span, lo2 + tile)
                _stream(pf, 0, x, g2 * xcg, xcg, lo2, nxt + max_off if nxt > lo2 else 0, q0, q1, q2, xpads, xstrides,
                        steps, 0)
                _stream(pf, PF_LEN, dy, g2 * ocg, ocg, lo2, nxt, q0, q1, q2, zeros3, ones3, steps, 0)
            if phases:
                _fill_phases(x, pgeo, g * cg, cg, buf, width, lo, lo + cnt + max_off, q0, q1, q2)
            else:
                _fill(x, g * cg, cg, buf, width, lo, lo + cnt + max_off, q0, q1, q2, p0, p1, p2)
            _gather(dyb, dy, g * ocg, ocg, lo, cnt, q0, q1, q2, outs0, outs1, outs2)
            for o in range(ocg):
                row = dyb[o]
                for j in range(cnt, cnt_l):
                    row[j] = 0
            for c in range(cg):      # the cells read past the tile's inputs hold zeros, not older inputs
                for j in range(cnt + max_off, cnt_l + max_off):
                    buf[c * width + j] = 0
            for o in range(0, ocg_pad, WO):
                _wtile(lanes, o, dyb, buf, offs, cnt_l, pf)
        _fold(part[ch, g], lanes)


@njit(nogil=True, cache=True)
def _fold(out, lanes):
    """out[o, u] = lanes[o, u, 0] + ... + lanes[o, u, L-1] in float64, in lane order."""
    for o in range(out.shape[0]):
        for u in range(out.shape[1]):
            s = 0.0
            for l in range(L):
                s += lanes[o, u, l]
            out[o, u] = s


# Stride phases (``thin.phase_spec``): a strided problem's input as phase channels and back.
# ``geo`` = (s0, s1, s2, pb0, pb1, pb2, k0, k1, k2) per 3-D axis; phase cell ``j`` of phase
# ``r`` is padded cell ``s*j + r``, input cell ``s*j + r - pb``. A real tap ``k = s*q + r <
# K`` of output ``o < dst`` reads phase cell ``o + q``, so phase ``r`` is read exactly on
# ``j <= dst - 1 + (K - 1 - r) // s`` (none when ``r >= K``).

@njit(nogil=True, cache=True)
def _phase_range(r, s, pb, length, size):
    """Phase cells ``j`` of phase ``r`` whose input cell ``s*j + r - pb`` lies in ``[0, size)``."""
    lo = max(0, -((r - pb) // s))
    hi = min(length, max(lo, -((r - pb - size) // s)))
    return lo, hi


@njit(nogil=True, cache=True)
def _last_read(r, s, k, length):
    """The last phase cell of phase ``r`` that a real tap reads (-1: none)."""
    if r >= k:
        return -1
    kq = (k + s - 1) // s
    return length - kq + (k - 1 - r) // s


@njit(nogil=True, cache=True)
def _phase_dims(plain, phases, geo):
    """Channels and input sizes of ``plain`` (N, C, S0, S1, S2), strides and phase-grid
    sizes of ``phases`` (N, C, s0, s1, s2, L0, L1, L2), and the leading pads."""
    return (plain.shape[1], plain.shape[2], plain.shape[3], plain.shape[4],
            phases.shape[2], phases.shape[3], phases.shape[4], phases.shape[5], phases.shape[6], phases.shape[7],
            geo[3], geo[4], geo[5])


@njit(nogil=True, cache=True)
def phase_merge(dph, geo, out, k0, k1):
    """``out[n, c, i] = dph[n, c, r, j]`` with ``s*j + r = i + pb`` (zero past the phase
    grids) for the (image, channel) pairs ``k0 <= n*C + c < k1``: the inverse of
    phase split (``_fill_phases``) on the cells of ``out``."""
    n_ch, i0n, i1n, i2n, s0, s1, s2, l0, l1, l2, pb0, pb1, pb2 = _phase_dims(out, dph, geo)
    for k in range(k0, k1):
        n, c = k // n_ch, k % n_ch
        for i0 in range(i0n):
            j0, r0 = (i0 + pb0) // s0, (i0 + pb0) % s0
            for i1 in range(i1n):
                j1, r1 = (i1 + pb1) // s1, (i1 + pb1) % s1
                dst = out[n, c, i0, i1]
                if not (0 <= j0 < l0 and 0 <= j1 < l1):      # cropped by a negative pad, or past the grids
                    dst[:] = 0.0
                    continue
                dst[max(0, s2 * l2 - pb2):] = 0.0      # cells past the phase grids (read by no tap)
                for r2 in range(s2):
                    lo, hi = _phase_range(r2, s2, pb2, l2, i2n)
                    src = dph[n, c, r0, r1, r2, j0, j1]
                    base = r2 - pb2
                    for j2 in range(lo, hi):
                        dst[s2 * j2 + base] = src[j2]
