"""numba loops of the ``blocked`` kernel (kernel layer; imports numba).

They copy between NCX and channels-last layouts, reorder the weights into blocks and walk
the output rows, calling the compiled micro-kernel (``_ukernel.py``) through its address.
The address is an argument, never a constant of the compiled loop, so numba's on-disk
cache stays valid in every process.

Channels-last arrays: ``(N, rows, Wp, Cp)`` flat, where ``rows`` runs over every spatial
axis but the last (row-major), ``Wp`` is the last axis with its zero padding, and ``Cp``
the channels, each group's ``cg`` channels padded with zeros to ``cgp`` (lanes of the
micro-kernel's vectors). Weight blocks (made with NumPy, ``blocked.py``): for group ``g``
and the block of ``wbw`` output channels from ``ob0``, a ``(T, cg, wbw)`` array at
``(g*T*cg*ogp + ob0*T*cg)``.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import intrinsic

from ._jit_common import _dotkernel, _indirect_call, _prefetch, _transpose

JIT = dict(nogil=True, cache=True)
NARGS = 15      # R, OB + the micro-kernel's 13 arguments


@intrinsic
def _ukernel(typingctx, addr, R, OB, a, b, y, aoff, boff, ntaps, K, a_rs, a_ks, b_ks, y_rs, acc, tail):
    return _indirect_call(NARGS)


@njit(**JIT)
def to_channels_last(x, out, q0, q1, groups, cg, cgp, first, origin, taddr, lanes, cs):
    """``x`` (N, G*cg, rows, W) -> ``out`` (N, rows, Wp, G*cgp): cell ``j`` of a row holds
    column ``first + j*cs`` (zero outside ``0 .. W``: ``first = -pad`` puts the padding
    around a whole row; ``cs`` 1, or 2 with ``first >= 0`` and ``taddr`` the compiled
    ``transpose_pairs``); rows ``q0 .. q1`` of all images laid end to end, flat row ``q``
    to row ``q - origin`` of ``out`` (a buffer for a few rows: ``origin = q0``)."""
    src = np.arange(q0, q1)
    _copy_rows(x, out, src, src - origin, groups, cg, cgp, first, taddr, lanes, cs)


PREFETCH_ROWS = 2
# ``line_items`` asks for its rows LINE_AHEAD vector steps ahead: the input rows of every
# reduced channel in a block's first row tile (the later tiles find them in the cache),
# and the output rows of each tile. The micro-kernel's accesses are masked on AVX-512, and
# masked accesses to lines not in the cache do not start the hardware prefetchers here
# (``_ukernel.PREFETCH_ROWS``). wavenet conv1d_1 (32 channels, 84350 positions, k2) data
# gradient, in-process medians of five processes each, ms: no prefetch 1.8-3.4, 2 steps
# 1.7-2.7, 4 steps 1.2-1.6 (one 2.4), 8 steps 1.5-2.1. Benchmark runs, four alternating
# pairs, new / old medians: conv1d_1-5 data gradients 0.70-0.93, forwards 0.68-0.79.
LINE_AHEAD = 4
# ... and, before an item whose successor starts a new image, the first LINE_AHEAD steps of
# that image's rows (which nothing ahead of them asks for): wavenet conv1d_10 (512 images
# of 163 outputs, 32 channels) data gradient, in-process, calls with and without it
# interleaved, ratio of medians over five processes 0.72-1.00 (0.91 typical), forward
# 0.84; conv1d_6 - conv1d_9 (longer rows) 0.97-1.02.
LINE_NEXT = True
# ``weight_blocks`` asks for the weights WEIGHT_AHEAD bytes past the rows it transposes
# (masked loads of 9-tap rows: no hardware prefetch, as above). One thread, res5a_branch2b
# (512 x 512 x 3 x 3, 9.4 MB), ms per call, three processes each: data gradient (flipped,
# rows contiguous) 0.7-1.8 -> 0.6-0.8, forward (rows cg*T apart) 1.6-1.8 -> 1.1-1.4.
WEIGHT_AHEAD = 1024
# ``pointwise_items`` in strip order reads each strip (one register tile's positions down
# every reduced channel) from memory once, asking for it POINTWISE_AHEAD strips ahead (128
# rows of 256 bytes each are too many streams for the hardware prefetchers), and every row
# tile then reads it from L1. mobilenet conv3's data gradient (64 <- 128 channels, 56^2),
# in-process medians, new / old order: no prefetch 0.85, 1 strip 0.82, 2 strips 0.81, 4
# strips 0.81.
POINTWISE_AHEAD = 2


@njit(**JIT)
def _copy_rows(x, out, src_rows, dst_rows, groups, cg, cgp, first, taddr, lanes, cs):
    """``to_channels_last`` for flat input rows ``src_rows[i]`` to rows ``dst_rows[i]`` of
    ``out``. Blocks of ``lanes`` channels x ``lanes`` positions go through the compiled
    transpose (the channels past ``cg`` of a group written as zeros), a group of channels
    down all the rows before the next group: each of its ``lanes`` planes is then read in
    ascending order, which the hardware prefetchers follow (row after row for every group,
    res3a_branch2a's streamed weight gradient spent 4.7 of 10.4 ms copying, one thread)."""
    rows, W = x.shape[2], x.shape[3]
    Wp, Cp = out.shape[2], out.shape[3]
    of = out.reshape(-1)
    xa = x.ctypes.data
    oa = out.ctypes.data
    plane = rows * W
    j0 = min(Wp, max(0, -first))              # cells j0 .. j1 hold real columns
    j1 = max(j0, min(Wp, (W - first + cs - 1) // cs))
    for k in range(len(src_rows)):
        ob = dst_rows[k] * Wp * Cp
        for i in range(j0 * Cp):
            of[ob + i] = 0.0
        for i in range(j1 * Cp, Wp * Cp):
            of[ob + i] = 0.0
    for g in range(groups):
        for c0 in range(0, cgp, lanes):
            nr = max(0, min(lanes, cg - c0))
            for k in range(len(src_rows)):
                n, r = src_rows[k] // rows, src_rows[k] % rows
                src = xa + 4 * ((n * groups * cg + g * cg + c0) * plane + r * W + first)
                dst = oa + 4 * (dst_rows[k] * Wp * Cp + g * cgp + c0)
                if PREFETCH_ROWS and k + PREFETCH_ROWS < len(src_rows):
                    kn = k + PREFETCH_ROWS
                    nxt = xa + 4 * ((src_rows[kn] // rows * groups * cg + g * cg + c0) * plane
                                    + src_rows[kn] % rows * W + first)
                    for i in range(nr):
                        for b in range(0, 4 * (j1 - 1) * cs + 4, 64):
                            _prefetch(nxt + 4 * i * plane + b)
                for j in range(j0, j1, lanes):
                    _transpose(taddr, src + 4 * j * cs, plane, dst + 4 * j * Cp, Cp, nr, min(lanes, j1 - j),
                               min(lanes, cgp - c0))


@njit(**JIT)
def from_channels_last(ycl, y, q0, q1, groups, og, ogp, taddr, lanes):
    """``ycl`` (N, rows, W, G*ogp) -> ``y`` (N, G*og, rows, W), rows ``q0 .. q1`` of all
    images laid end to end, through the compiled transpose."""
    rows, W = y.shape[2], y.shape[3]
    Cp = groups * ogp
    ca = ycl.ctypes.data
    ya = y.ctypes.data
    plane = rows * W
    for q in range(q0, q1):
        n, r = q // rows, q % rows
        for g in range(groups):
            for o0 in range(0, og, lanes):
                nc = min(lanes, og - o0)
                src = ca + 4 * (q * W * Cp + g * ogp + o0)
                dst = ya + 4 * ((n * groups * og + g * og + o0) * plane + r * W)
                for w0 in range(0, W, lanes):
                    nr = min(lanes, W - w0)
                    _transpose(taddr, src + 4 * w0 * Cp, Cp, dst + 4 * w0, plane, nr, nc, nr)


@njit(**JIT)
def _block_geometry(b, T, og, cg, ogp, obw):
    """(group, first output channel, width, real output channels, offset) of weight block
    ``b``: a ``(T, cg, width)`` array at ``offset`` of the blocks."""
    nob = (ogp + obw - 1) // obw
    g, ob0 = b // nob, (b % nob) * obw
    wbw = min(obw, ogp - ob0)
    return g, ob0, wbw, min(wbw, og - ob0), g * T * cg * ogp + ob0 * T * cg


@njit(**JIT)
def weight_blocks(w3, blk, b0, b1, groups, og, cg, ogp, obw, flip, taddr, lanes):
    """Weight blocks ``b0 .. b1`` (group, block of ``obw`` output channels) of the forward
    (module doc): ``blk[t, c, j] = w3[g*og + ob0 + j, c, t]``, or with ``flip`` (``w3`` the
    data gradient's original (G*cg, og, T) weights) ``w3[g*cg + c, ob0 + j, T-1-t]``, zero
    for ``j`` past ``og`` (those lanes' results are dropped; zeros keep stale scratch, a
    denormal or NaN, out of the arithmetic). For each input channel the ``(j, t)`` matrix
    goes through the compiled transpose (flipped: its rows written from the last tap
    backwards)."""
    T = w3.shape[2]
    wa = w3.ctypes.data
    ba = blk.ctypes.data
    for b in range(b0, b1):
        g, ob0, wbw, n, base = _block_geometry(b, T, og, cg, ogp, obw)
        for c in range(cg):
            for j0 in range(0, wbw, lanes):
                nr = max(0, min(lanes, n - j0))
                for t0 in range(0, T, lanes):
                    nc = min(lanes, T - t0)
                    if flip:
                        src = wa + 4 * (((g * cg + c) * og + ob0 + j0) * T + t0)
                        dst = ba + 4 * (base + ((T - 1 - t0) * cg + c) * wbw + j0)
                        if WEIGHT_AHEAD:             # this block's rows, WEIGHT_AHEAD bytes on
                            for q in range(0, 4 * nr * T, 64):
                                _prefetch(src + WEIGHT_AHEAD + q)
                        _transpose(taddr, src, T, dst, -cg * wbw, nr, nc, min(lanes, wbw - j0))
                    else:
                        src = wa + 4 * (((g * og + ob0 + j0) * cg + c) * T + t0)
                        dst = ba + 4 * (base + (t0 * cg + c) * wbw + j0)
                        if WEIGHT_AHEAD and t0 == 0:  # each row's taps of a later input channel
                            for i in range(nr):
                                _prefetch(src + 4 * i * cg * T + WEIGHT_AHEAD)
                        _transpose(taddr, src, cg * T, dst, cg * wbw, nr, nc, min(lanes, wbw - j0))


@njit(**JIT)
def weights_from_blocks(blk, dw, b0, b1, groups, og, cg, ogp, obw, taddr, lanes):
    """Inverse of ``weight_blocks`` without flip, blocks ``b0 .. b1``: ``dw[g*og + ob0 + j,
    c, t] = blk[t, c, j]`` for ``j`` below ``og``."""
    T = dw.shape[2]
    ba = blk.ctypes.data
    da = dw.ctypes.data
    for b in range(b0, b1):
        g, ob0, wbw, n, base = _block_geometry(b, T, og, cg, ogp, obw)
        for c in range(cg):
            for t0 in range(0, T, lanes):
                nr = min(lanes, T - t0)
                for j0 in range(0, n, lanes):
                    src = ba + 4 * (base + (t0 * cg + c) * wbw + j0)
                    dst = da + 4 * (((g * og + ob0 + j0) * cg + c) * T + t0)
                    _transpose(taddr, src, cg * wbw, dst, cg * T, nr, min(lanes, n - j0), nr)


@njit(**JIT)
def _tap_rows(r, rows_dst, dst_o, src_o, k_o, s_o, d_o, pb_o, ko, rows_src):
    """Input row (flat over images) that output row ``r`` reads with outer tap ``ko``, or
    -1 where it lies in the padding."""
    n = r // rows_dst
    rem = r % rows_dst
    kr = ko
    lin = 0
    mult = 1
    for a in range(len(dst_o) - 1, -1, -1):
        oa = rem % dst_o[a]
        rem //= dst_o[a]
        ka = kr % k_o[a]
        kr //= k_o[a]
        ia = oa * s_o[a] - pb_o[a] + ka * d_o[a]
        if ia < 0 or ia >= src_o[a]:
            return -1
        lin += ia * mult
        mult *= src_o[a]
    return n * rows_src + lin


@njit(**JIT)
def forward_rows(xcl, wblk, ycl, geo, dst_o, src_o, k_o, s_o, d_o, pb_o, r0, r1, addr, rlim, lanes, obw, cb, ob_lo,
                 ob_hi):
    """Output rows ``r0 .. r1`` (flat over images) of the forward convolution on
    channels-last ``xcl`` (N, rows_src, Wp, G*cg) into ``ycl`` (N, rows_dst, Wout, G*ogp).

    Each tile: ``R`` consecutive outputs of a row x ``wbw`` output channels of a group
    (``OB = wbw / lanes`` vectors; the row cut into balanced tiles of at most ``rlim[OB -
    1]`` outputs, so a narrow block at the end of the channels, 8 of 32, runs tiles of up
    to 12 rows whose accumulators hide the FMA latency, not the 4 of the 24-wide blocks),
    summed over the chunk's input channels ``cb0 .. cb0 + cb`` of every tap that reads a
    real input row (outer axes; the last axis reads the zero padding of ``xcl``), chunk
    after chunk. Loops: group, output-channel block (those from ``ob_lo`` below ``ob_hi``:
    all of them, or one for ``blocked.block_order``), channel chunk, row, tile, so that one
    block of weights (``T * cb * wbw``) is read from cache while the rows stream.
    """
    groups, cg, ogp, Wp, Wout, kw_n, sw, dw, rows_dst, rows_src = (
        geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7], geo[8], geo[9])
    T = wblk.shape[0] // (groups * cg * ogp)
    C = groups * cg
    kouter = T // kw_n
    aoff = np.empty(T, np.int64)
    boff = np.empty(T, np.int64)
    xa = xcl.ctypes.data
    ya = ycl.ctypes.data
    wa = wblk.ctypes.data
    for g in range(groups):
        for ob0 in range(ob_lo, min(ob_hi, ogp), obw):
            wbw = min(obw, ogp - ob0)
            OB = wbw // lanes
            ntile = (Wout + rlim[OB - 1] - 1) // rlim[OB - 1]
            bbase = g * T * cg * ogp + ob0 * T * cg
            for cb0 in range(0, cg, cb):
                cn = min(cb, cg - cb0)
                for r in range(r0, r1):
                    ntaps = 0
                    for ko in range(kouter):
                        src_row = _tap_rows(r, rows_dst, dst_o, src_o, k_o, s_o, d_o, pb_o, ko, rows_src)
                        if src_row < 0:
                            continue
                        for kw in range(kw_n):
                            aoff[ntaps] = src_row * Wp * C + kw * dw * C + g * cg + cb0
                            boff[ntaps] = bbase + ((ko * kw_n + kw) * cg + cb0) * wbw
                            ntaps += 1
                    w0 = 0
                    for tile in range(ntile):
                        R = Wout // ntile + (1 if tile < Wout % ntile else 0)
                        _ukernel(addr, R, OB, xa + 4 * (w0 * sw * C), wa, ya + 4 * ((r * Wout + w0) * groups * ogp
                                                                                    + g * ogp + ob0),
                                 aoff.ctypes.data, boff.ctypes.data, ntaps, cn, sw * C, 1, wbw, groups * ogp,
                                 1 if cb0 > 0 else 0, lanes)
                        w0 += R


@njit(inline="always", **JIT)
def _tile(i, nct, nv, nob, obw, ogp, rt, U):
    """(group, first output channel, block width, tile group, first row, rows) of weight
    tile ``i``: row chunks of ``rt`` fastest, then the ``nv`` tile groups (taps), then the
    ``nob`` output-channel blocks, then the groups."""
    rest = i // nct
    v = rest % nv
    rest //= nv
    ob0 = (rest % nob) * obw
    c0 = (i % nct) * rt
    return rest // nob, ob0, min(obw, ogp - ob0), v, c0, min(rt, U - c0)


@njit(**JIT)
def _tile_pass(xa, da, ba, geo, dst_o, src_o, k_o, s_o, d_o, pb_o, i0, i1, q0, q1, x_origin, x_slot, y_origin, x_w,
               y_w, K, acc, aoff, boff, addr, rt, lanes, obw):
    """Tiles ``i0 .. i1`` of the weight gradient over output rows ``q0 .. q1`` (flat over
    images) and ``K`` positions of each, adding to the blocks at ``ba`` (``acc``) or
    starting them. The channels-last input rows (``x_w`` cells each) are at ``xa``: flat
    input row ``x_origin + i`` at buffer row ``x_slot[i]`` (every row from ``x_origin``
    where ``x_slot`` is empty), the ``diff_dst`` rows (``y_w`` positions) at ``da`` from
    ``y_origin``.

    Tile ``i``: group, output-channel block, tap, and ``R <= rt`` input channels from
    ``c0``: ``dW[t, c, o] += x[row_in, w*sw + kw*dw, c] * dy[row, w, o]`` over the rows
    whose input row for this tap is real and their ``Wout`` positions. With ``merged``
    (one group, no dilation along the last axis) the taps of the last axis join the
    channels: in a channels-last row the cell of ``(kw, c)`` is ``kw*C + c`` and its block
    row ``(ko*kw_n + kw)*C + c``, both one step apart from pair to pair, so a tile is ``R``
    consecutive pairs of one outer tap ``ko`` (few input channels still fill it)."""
    groups, cg, ogp, kw_n, sw, dw, rows_dst, rows_src, merged = (
        geo[0], geo[1], geo[2], geo[5], geo[6], geo[7], geo[8], geo[9], geo[11])
    T = k_o.prod() * kw_n if len(k_o) else kw_n
    C = groups * cg
    nob = (ogp + obw - 1) // obw
    nv = T // kw_n if merged else T           # tile groups: outer taps, or taps
    U = kw_n * cg if merged else cg           # rows of a tile group
    nct = (U + rt - 1) // rt
    listed = -1                               # the tile group whose row list aoff / boff hold
    n = 0
    for i in range(i0, i1):
        g, ob0, wbw, v, c0, R = _tile(i, nct, nv, nob, obw, ogp, rt, U)
        if v != listed:
            ko = v if merged else v // kw_n
            shift = 0 if merged else (v % kw_n) * dw * C
            n = 0
            for r in range(q0, q1):
                src_row = _tap_rows(r, rows_dst, dst_o, src_o, k_o, s_o, d_o, pb_o, ko, rows_src)
                if src_row < 0:
                    continue
                slot = src_row - x_origin if len(x_slot) == 0 else x_slot[src_row - x_origin]
                aoff[n] = slot * x_w * C + shift
                boff[n] = (r - y_origin) * y_w * groups * ogp
                n += 1
            listed = v
        y = ba + 4 * (g * T * cg * ogp + ob0 * T * cg + (v * U + c0) * wbw)
        _ukernel(addr, R, wbw // lanes, xa + 4 * (g * cg + c0), da + 4 * (g * ogp + ob0), y, aoff.ctypes.data,
                 boff.ctypes.data, n, K, 1, sw * C, groups * ogp, wbw, acc, lanes)


@njit(**JIT)
def weight_tiles(xcl, dycl, blk, geo, dst_o, src_o, k_o, s_o, d_o, pb_o, i0, i1, addr, rt, lanes, obw,
                 chunk_rows):
    """Tiles ``i0 .. i1`` (``_tile_pass``) of the weight gradient into the blocks ``blk``
    (module doc), on whole channels-last copies. The sums run over the output rows in
    chunks of ``chunk_rows`` (fixed by the problem): every thread walks the same chunks for
    its own tiles (the chunk's rows stay in cache for all of them), so no element is summed
    by two threads."""
    Wp, Wout, nrows = geo[3], geo[4], geo[10]
    whole = np.empty(0, np.int64)             # every input row in place
    aoff = np.empty(chunk_rows, np.int64)
    boff = np.empty(chunk_rows, np.int64)
    for q0 in range(0, nrows, chunk_rows):
        q1 = min(nrows, q0 + chunk_rows)
        _tile_pass(xcl.ctypes.data, dycl.ctypes.data, blk.ctypes.data, geo, dst_o, src_o, k_o, s_o, d_o, pb_o, i0, i1,
                   q0, q1, 0, whole, 0, Wp, Wout, Wout, 1 if q0 > 0 else 0, aoff, boff, addr, rt, lanes, obw)


@njit(inline="always", **JIT)
def _part_items(p, items, nparts):
    """The items ``[first, end)`` of part ``p`` of ``nparts`` (fixed by the problem)."""
    return items * p // nparts, items * (p + 1) // nparts


@njit(**JIT)
def _chunk(item, end, geo, nseg, seg):
    """(rows ``q0 .. q1``, positions ``w0 .. w1``, next item) of the chunk of
    ``weight_parts`` from item ``item`` (items: output rows x segments of ``seg``
    positions, row-major): one segment of a row where rows are cut, else at most
    ``chunk_rows`` (``geo[13]``) whole rows, within the part (``end``) and one image."""
    rows_dst, Wout, chunk_rows = geo[8], geo[4], geo[13]
    q0 = item // nseg
    if nseg > 1:
        w0 = (item % nseg) * seg
        return q0, q0 + 1, w0, min(Wout, w0 + seg), item + 1
    q1 = min(end, q0 + chunk_rows, (q0 // rows_dst + 1) * rows_dst)
    return q0, q1, 0, Wout, q1


@njit(**JIT)
def _input_rows(q, q1, geo, dst_o, src_o, k_o, s_o, d_o, pb_o):
    """The flat input rows that output rows ``q .. q1`` read, as (first row, ``slot``):
    ``slot[row - first]`` is the row's place in a compact buffer, or -1 for a row no tap
    reads (a strided 1x1 layer reads every other row); empty where every tap falls in the
    padding."""
    rows_dst, rows_src = geo[8], geo[9]
    kouter = k_o.prod() if len(k_o) else 1
    lo = 1 << 62
    hi = -1
    for r in range(q, q1):
        for ko in range(kouter):
            s = _tap_rows(r, rows_dst, dst_o, src_o, k_o, s_o, d_o, pb_o, ko, rows_src)
            if s >= 0:
                lo = min(lo, s)
                hi = max(hi, s)
    if hi < 0:
        return 0, np.empty(0, np.int64)
    slot = np.full(hi + 1 - lo, -1, np.int64)
    for r in range(q, q1):
        for ko in range(kouter):
            s = _tap_rows(r, rows_dst, dst_o, src_o, k_o, s_o, d_o, pb_o, ko, rows_src)
            if s >= 0:
                slot[s - lo] = 0
    n = 0
    for i in range(len(slot)):
        if slot[i] == 0:
            slot[i] = n
            n += 1
    return lo, slot


@njit(**JIT)
def part_input_rows(geo, dst_o, src_o, k_o, s_o, d_o, pb_o, nparts, nseg, seg):
    """The most input rows any chunk of ``weight_parts`` reads (its buffer's size)."""
    items = geo[10] * nseg
    most = 0
    for p in range(nparts):
        item, end = _part_items(p, items, nparts)
        while item < end:
            q0, q1, w0, w1, item = _chunk(item, end, geo, nseg, seg)
            lo, slot = _input_rows(q0, q1, geo, dst_o, src_o, k_o, s_o, d_o, pb_o)
            if len(slot):
                most = max(most, slot.max() + 1)
    return most


@njit(**JIT)
def weight_parts(x4, dy4, parts, xbuf, ybuf, geo, dst_o, src_o, k_o, s_o, d_o, pb_o, p0, p1, nparts, nseg, seg, pad,
                 addr, rt, lanes, obw, tiles, taddr, xs, xtaddr):
    """Parts ``p0 .. p1`` of the weight gradient streamed from the NCX arrays: part ``p``
    (``nparts``, fixed by the problem) sums the items ``items*p/nparts ..`` (output rows x
    segments of ``seg`` positions) into its own blocks ``parts[p]``. Chunk after chunk
    (``_chunk``), the chunk's ``diff_dst`` cells and the input cells they read (only the
    rows some tap reads, ``_input_rows``) are copied channels-last into the small buffers
    ``ybuf`` / ``xbuf`` (cache-resident: no whole-array copy goes through memory), then
    every tile sums over them. ``xs``: the input's own stride along the last axis where
    the problem has the read cells only (``compressed_spec``, stride 1 there, ``xtaddr``
    the compiled ``transpose_pairs``), else 1 (``xtaddr = taddr``)."""
    groups, cg, ogp, og, nrows, sw = geo[0], geo[1], geo[2], geo[12], geo[10], geo[6]
    chunk_rows = geo[13]
    aoff = np.empty(chunk_rows, np.int64)
    boff = np.empty(chunk_rows, np.int64)
    items = nrows * nseg
    x_w, y_w = xbuf.shape[2], ybuf.shape[2]
    for p in range(p0, p1):
        item, end = _part_items(p, items, nparts)
        acc = 0
        pa = parts[p].ctypes.data
        while item < end:
            q0, q1, w0, w1, item = _chunk(item, end, geo, nseg, seg)
            lo, slot = _input_rows(q0, q1, geo, dst_o, src_o, k_o, s_o, d_o, pb_o)
            read = np.flatnonzero(slot >= 0)         # row lo + i to buffer row slot[i]
            _copy_rows(x4, xbuf, lo + read, slot[read], groups, cg, cg, (w0 * sw - pad) * xs, xtaddr, lanes, xs)
            to_channels_last(dy4, ybuf, q0, q1, groups, og, ogp, w0, q0, taddr, lanes, 1)
            _tile_pass(xbuf.ctypes.data, ybuf.ctypes.data, pa, geo, dst_o, src_o, k_o, s_o, d_o, pb_o, 0, tiles,
                       q0, q1, lo, slot, q0, x_w, y_w, w1 - w0, acc, aoff, boff, addr, rt, lanes, obw)
            acc = 1


@njit(**JIT)
def weight_parts_ncx(x4, dy4, parts, ybuf, geo, dst_o, src_o, k_o, s_o, d_o, pb_o, p0, p1, nparts, nseg, seg, pad,
                     addr, rt, lanes, obw, tiles, taddr):
    """``weight_parts`` with the input read in place: the micro-kernel's broadcast operand
    is any strided array, so a tile's ``R`` input channels are ``R`` planes of the NCX
    input (``a_rs`` a plane, ``a_ks`` the stride along the row, each tap's row offsets in
    ``aoff``) and only the chunk's ``diff_dst`` cells are copied channels-last (the
    vectors of output channels). Along the last axis a tap's sums run over the positions
    whose cell is real (``pad`` cells of padding in front): ``lo <= w < hi``, the same
    range in every row, so one call per tile still covers its rows (the channels-last
    copies had summed zeros there instead). The taps are not merged with the channels, so
    a tile row is one (tap, channel) pair as in ``_tile_pass`` without ``merged``: the
    same block layout, and each element's terms in the same order (rows, then positions)."""
    groups, cg, ogp, kw_n, sw, dw = geo[0], geo[1], geo[2], geo[5], geo[6], geo[7]
    rows_dst, rows_src, nrows, og, chunk_rows = geo[8], geo[9], geo[10], geo[12], geo[13]
    W = x4.shape[3]
    C = groups * cg
    plane = rows_src * W
    T = k_o.prod() * kw_n if len(k_o) else kw_n
    nob = (ogp + obw - 1) // obw
    nct = (cg + rt - 1) // rt
    aoff = np.empty(chunk_rows, np.int64)
    boff = np.empty(chunk_rows, np.int64)
    items = nrows * nseg
    y_w = ybuf.shape[2]
    xa = x4.ctypes.data
    ya = ybuf.ctypes.data
    for p in range(p0, p1):
        item, end = _part_items(p, items, nparts)
        acc = 0
        pa = parts[p].ctypes.data
        while item < end:
            q0, q1, w0, w1, item = _chunk(item, end, geo, nseg, seg)
            to_channels_last(dy4, ybuf, q0, q1, groups, og, ogp, w0, q0, taddr, lanes, 1)
            listed = -1
            n = 0
            for i in range(tiles):
                g, ob0, wbw, v, c0, R = _tile(i, nct, T, nob, obw, ogp, rt, cg)
                if v != listed:
                    ko = v // kw_n
                    first = (v % kw_n) * dw - pad     # cell of position 0 for this tap
                    lo = max(w0, (-first + sw - 1) // sw if first < 0 else 0)
                    hi = min(w1, (W - 1 - first) // sw + 1 if W - 1 - first >= 0 else 0)
                    n = 0
                    for r in range(q0, q1):
                        if hi <= lo:
                            break                     # no real cell: the tile is zeroed or kept
                        src_row = _tap_rows(r, rows_dst, dst_o, src_o, k_o, s_o, d_o, pb_o, ko, rows_src)
                        if src_row < 0:
                            continue
                        aoff[n] = (src_row // rows_src) * C * plane + (src_row % rows_src) * W + lo * sw + first
                        boff[n] = ((r - q0) * y_w + lo - w0) * groups * ogp
                        n += 1
                    listed = v
                y = pa + 4 * (g * T * cg * ogp + ob0 * T * cg + (v * cg + c0) * wbw)
                _ukernel(addr, R, wbw // lanes, xa + 4 * (g * cg + c0) * plane, ya + 4 * (g * ogp + ob0), y,
                         aoff.ctypes.data, boff.ctypes.data, n, max(0, hi - lo), plane, sw, groups * ogp, wbw, acc,
                         lanes)
            acc = 1


@njit(**JIT)
def pointwise_items(a, b, y, geo, i0, i1, addr, r_max, lanes, ob_max):
    """Items ``i0 .. i1`` of a 1x1 convolution on the NCX arrays themselves (no copies):
    ``y[n, g, m, p] = sum_k a[g, m, k] * b[n, g, k, p]`` with positions ``p`` in the vector
    lanes, ``m`` broadcast (``a[m*a_rs + k*a_ks]``). Item: (image, block of ``pblk``
    positions); per item every tile of ``R`` rows ``m`` x ``OB`` vectors of positions (the
    last vector masked) sums all ``K`` terms in registers. Row order (``strips`` 0): each
    row tile runs along the block, its weights in L1 and the block's ``K`` rows in L2;
    strip order (1): each strip of ``OB_MAX`` vectors, prefetched ``POINTWISE_AHEAD`` strips
    ahead, goes through every row tile. Each output is the same sum either way."""
    groups, M, K, a_rs, a_ks, a_gs, b_img, b_gs, y_img, y_gs, HW, pblk, strips = (
        geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7], geo[8], geo[9], geo[10], geo[11], geo[12])
    offs = np.zeros(1, np.int64)
    nblk = (HW + pblk - 1) // pblk
    step = ob_max * lanes
    aa = a.ctypes.data
    ba = b.ctypes.data
    ya = y.ctypes.data
    for i in range(i0, i1):
        n = i // nblk
        pb0 = (i % nblk) * pblk
        pb1 = min(HW, pb0 + pblk)
        for g in range(groups):
            brow = ba + 4 * (n * b_img + g * b_gs)
            yimg = ya + 4 * (n * y_img + g * y_gs)
            if strips:
                for p0 in range(pb0, pb1, step):
                    ahead = p0 + POINTWISE_AHEAD * step          # this image's rows, never past their end
                    if ahead < HW:
                        for k in range(K):
                            for off in range(0, 4 * min(step, HW - ahead), 64):
                                _prefetch(brow + 4 * (k * HW + ahead) + off)
                    for m0 in range(0, M, r_max):
                        _pointwise_tile(addr, aa + 4 * (g * a_gs + m0 * a_rs), brow + 4 * p0, yimg + 4 * (m0 * HW + p0),
                                        min(r_max, M - m0), min(step, pb1 - p0), K, a_rs, a_ks, HW, lanes, offs)
            else:
                for m0 in range(0, M, r_max):
                    for p0 in range(pb0, pb1, step):
                        _pointwise_tile(addr, aa + 4 * (g * a_gs + m0 * a_rs), brow + 4 * p0, yimg + 4 * (m0 * HW + p0),
                                        min(r_max, M - m0), min(step, pb1 - p0), K, a_rs, a_ks, HW, lanes, offs)


@njit(inline="always", **JIT)
def _pointwise_tile(addr, ap, bp, yp, R, cnt, K, a_rs, a_ks, HW, lanes, offs):
    """One ``R`` x ``cnt`` tile of ``pointwise_items`` (``cnt`` positions, the last vector
    masked): every ``K`` term in registers, stored once."""
    OB = (cnt + lanes - 1) // lanes
    _ukernel(addr, R, OB, ap, bp, yp, offs.ctypes.data, offs.ctypes.data, 1, K, a_rs, a_ks, HW, HW, 0,
             cnt - (OB - 1) * lanes)


@njit(**JIT)
def pointwise_weight_tiles(dy, x, dw, geo, i0, i1, addr, r_max, j_max):
    """Tiles ``i0 .. i1`` of a 1x1 weight gradient on the NCX arrays:
    ``dw[g*og + o, c] += sum_p dy[n, g*og + o, p] * x[n, g*cg + c, p]`` over every image and
    position, in blocks of ``pblk`` positions (fixed by the problem): per block every tile
    of ``R`` output x ``J`` input channels sums along the lanes and adds its lane sums into
    ``dw`` (zero before the first block). A tile is (group, R outputs, J inputs)."""
    groups, og, cg, HW, N, pblk = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    nro = (og + r_max - 1) // r_max
    ncj = (cg + j_max - 1) // j_max
    da = dy.ctypes.data
    xa = x.ctypes.data
    wa = dw.ctypes.data
    for n in range(N):
        for p0 in range(0, HW, pblk):
            npos = min(pblk, HW - p0)
            for i in range(i0, i1):
                cj = i % ncj
                rest = i // ncj
                o0 = (rest % nro) * r_max
                g = rest // nro
                c0 = cj * j_max
                _dotkernel(addr, min(r_max, og - o0), min(j_max, cg - c0),
                           da + 4 * ((n * groups * og + g * og + o0) * HW + p0),
                           xa + 4 * ((n * groups * cg + g * cg + c0) * HW + p0),
                           wa + 4 * ((g * og + o0) * cg + c0), npos, HW, HW, cg)


@njit(inline="always", **JIT)
def _row_tiles(addr, ap, a_rs, a_ks, bp, b_ks, yp, y_rs, r0, r1, nb, aoff, boff, ntaps, K, acc, rt, lanes, ob_max):
    """Rows ``r0 .. r1`` x ``nb`` columns of ``y`` (row ``r`` at ``yp + r*y_rs``) in tiles of
    ``rt`` rows x ``ob_max`` vectors: each sums ``ntaps`` x ``K`` terms of the broadcast
    operand's rows (``ap + r*a_rs``) times the vectors at ``bp`` (column ``j`` at ``bp + j``)."""
    width = lanes * ob_max
    for r in range(r0, r1, rt):
        R = min(rt, r1 - r)
        for j in range(0, nb, width):
            w = min(width, nb - j)
            OB = (w + lanes - 1) // lanes
            _ukernel(addr, R, OB, ap + 4 * r * a_rs, bp + 4 * j, yp + 4 * (r * y_rs + j), aoff, boff, ntaps, K, a_rs,
                     a_ks, b_ks, y_rs, acc, w - (OB - 1) * lanes)


@njit(**JIT)
def inplace_weight_rows(a, b, y, buf, geo, row_a, row_b, g, r0, r1, addr, taddr, rt, lanes, ob_max):
    """Rows ``r0 .. r1`` of group ``g`` of a 1x1 weight gradient as one product over every
    image and position: ``y[g, r, j] = sum_n sum_q a[n, g*ra + r, in(q)] * b[n, g*nb + j, q]``
    (``blocked.inplace_weights``). ``a`` is read in place, the broadcast operand: ``R``
    channel planes ``a_plane`` apart, positions ``a_ks`` apart along a row of ``wout``
    outputs whose first cell is at ``row_a[q]`` (output row ``q``). ``b`` (positions
    contiguous) goes ``block`` positions (or ``block / wout`` whole rows) at a time,
    transposed into ``buf`` (positions x ``nb``), the vector operand. Each tile of ``R``
    rows x ``ob_max`` vectors sums the block's positions in registers onto its rows of
    ``y`` (zero before the first block of image 0): every element is one chain of FMAs
    over (image, position) in order, whatever the blocks, tiles or threads."""
    N, G, ra, nb, a_plane, P, wout, a_ks, block, flat = (geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6],
                                                         geo[7], geo[8], geo[9])
    aa = a.ctypes.data
    ba = b.ctypes.data
    ya = y.ctypes.data
    bb = buf.ctypes.data
    for n in range(N):
        src = ba + 4 * ((n * G + g) * nb * P)
        arow = aa + 4 * ((n * G + g) * ra * a_plane)
        for p0 in range(0, P, block):
            p1 = min(P, p0 + block)
            for j0 in range(0, nb, lanes):
                nr = min(lanes, nb - j0)
                for q0 in range(p0, p1, lanes):
                    _transpose(taddr, src + 4 * (j0 * P + q0), P, bb + 4 * ((q0 - p0) * nb + j0), nb, nr,
                               min(lanes, p1 - q0), nr)
            if flat:                          # contiguous positions: one run of p1 - p0
                ntaps, K, ap = 1, p1 - p0, arow + 4 * p0
                aoff, boff = row_a.ctypes.data, row_b.ctypes.data       # both [0]
            else:                             # whole output rows p0 / wout .. p1 / wout
                ntaps, K, ap = (p1 - p0) // wout, wout, arow
                aoff, boff = row_a.ctypes.data + 8 * (p0 // wout), row_b.ctypes.data
            _row_tiles(addr, ap, a_plane, a_ks, bb, nb, ya + 4 * g * ra * nb, nb, r0, r1, nb, aoff, boff, ntaps, K,
                       1 if n > 0 or p0 > 0 else 0, rt, lanes, ob_max)


@njit(**JIT)
def framed_weight_rows(dy, x, dw, geo, g, r0, r1, addr, rt, lanes, ob_max):
    """Rows ``r0 .. r1`` (output channels of group ``g``) of a framed 1-D weight gradient
    (``blocked.framed_weights``): ``dw[g*og + o, c, t] = sum_n sum_p dy[n, g*og + o, p] *
    x[n, g*cg + c, p*s + t]``. The input row read as the overlapping (P, KW) matrix
    ``X[p, t] = x[p*s + t]`` (row step ``s``) is the vector operand, ``diff_dst``'s rows the
    broadcast one, both in place; each tile sums the P positions of an image in registers
    onto its rows of ``dw`` (zero before image 0), one chain of FMAs per element."""
    N, G, cg, og, P, L, s, KW = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    offs = np.zeros(1, np.int64)
    da = dy.ctypes.data
    xa = x.ctypes.data
    wa = dw.ctypes.data
    for n in range(N):
        for c in range(cg):
            _row_tiles(addr, da + 4 * (n * G + g) * og * P, P, 1, xa + 4 * ((n * G + g) * cg + c) * L, s,
                       wa + 4 * (g * og * cg + c) * KW, cg * KW, r0, r1, KW, offs.ctypes.data, offs.ctypes.data, 1, P,
                       1 if n > 0 else 0, rt, lanes, ob_max)


@njit(**JIT)
def framed_data_columns(dy, w, dx, geo, items, i0, i1, addr, rt, lanes, kc):
    """Items ``i0 .. i1`` of a framed 1-D data gradient (``blocked.framed_data``), each
    (image, group, channel, first cell, last cell + 1) of a frame's cells: ``dx[n, c, f*s +
    r] = sum_j sum_o dy[n, o, f - j] * w[o, c, j*s + r]`` over the taps ``j`` with ``0 <= f -
    j < P``. Tiles of ``R`` frames (rows ``s`` apart in ``dx``) x the item's cells sum the
    taps (``aoff[j] = -j`` frames of ``diff_dst``, ``boff[j] = j*s`` cells of the weights)
    and ``kc`` output channels at a time (``diff_dst`` broadcast ``P`` apart, the weights'
    rows ``cg*KW`` apart), in order; the ``m - 1`` frames at each end, where fewer taps are
    real, one by one."""
    N, G, cg, og, P, L, s, KW = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    m = KW // s
    Q = P + m - 1
    aoff = np.empty(m, np.int64)
    boff = np.empty(m, np.int64)
    for j in range(m):
        aoff[j] = -j
        boff[j] = j * s
    da = dy.ctypes.data
    wa = w.ctypes.data
    xa = dx.ctypes.data
    for i in range(i0, i1):
        n, g, c, r0, r1 = items[i, 0], items[i, 1], items[i, 2], items[i, 3], items[i, 4]
        wd = r1 - r0
        OB = (wd + lanes - 1) // lanes
        tail = wd - (OB - 1) * lanes
        arow = da + 4 * ((n * G + g) * og) * P
        brow = wa + 4 * ((g * og * cg + c) * KW + r0)
        yrow = xa + 4 * (((n * G + g) * cg + c) * L + r0)
        for k0 in range(0, og, kc):
            K = min(kc, og - k0)
            acc = 1 if k0 > 0 else 0
            ak = arow + 4 * k0 * P
            bk = brow + 4 * k0 * cg * KW
            f = m - 1                                   # frames where every tap is real
            while f < P:
                R = min(rt, P - f)
                _ukernel(addr, R, OB, ak + 4 * f, bk, yrow + 4 * f * s, aoff.ctypes.data, boff.ctypes.data, m, K, 1, P,
                         cg * KW, s, acc, tail)
                f += R
            for f in range(Q):                          # the ends: taps j_lo .. j_hi
                if m - 1 <= f < P:
                    continue
                j_lo = max(0, f - P + 1)
                j_hi = min(m - 1, f)
                _ukernel(addr, 1, OB, ak + 4 * f, bk, yrow + 4 * f * s, aoff.ctypes.data + 8 * j_lo,
                         boff.ctypes.data + 8 * j_lo, j_hi - j_lo + 1, K, 1, P, cg * KW, s, acc, tail)


@njit(**JIT)
def transpose_planes(src, dst, g, i0, i1, taddr, lanes):
    """``dst[g, j, i] = src[g, i, j]`` for rows ``i0 .. i1`` of plane ``g``."""
    rows, cols = src.shape[1], src.shape[2]
    sa = src.ctypes.data + 4 * g * rows * cols
    da = dst.ctypes.data + 4 * g * rows * cols
    for r in range(i0, i1, lanes):
        nr = min(lanes, i1 - r)
        for j0 in range(0, cols, lanes):
            _transpose(taddr, sa + 4 * (r * cols + j0), cols, da + 4 * (j0 * rows + r), rows, nr, min(lanes, cols - j0),
                       nr)


@njit(**JIT)
def line_weight_items(dy, x, dwt, geo, i0, i1, addr, r_max, j_max):
    """Items ``i0 .. i1`` of a 1-D stride-1 weight gradient on the NCX rows, added into
    ``dwt`` (T, G*og, cg): ``dwt[t, g*og + o, c] += sum_p dy[n, g*og + o, p] *
    x[n, g*cg + c, p + t*d - pb]`` over the positions ``p`` of the item's block whose cell
    lies in the row (the padding adds nothing, so each tap sums a contiguous range and
    nothing is copied). Item: (image, block of ``pblk`` outputs); per item every tile of
    ``R`` outputs x ``J`` inputs, tap after tap, sums along the lanes (``dotkernel``)
    while the block's rows stay in the cache."""
    groups, og, cg, L_in, L_out, pblk, T, d, pb = (geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6],
                                                   geo[7], geo[8])
    nblk = (L_out + pblk - 1) // pblk
    plane = groups * og * cg
    da = dy.ctypes.data
    xa = x.ctypes.data
    wa = dwt.ctypes.data
    for i in range(i0, i1):
        n = i // nblk
        p0 = (i % nblk) * pblk
        p1 = min(L_out, p0 + pblk)
        for g in range(groups):
            for o0 in range(0, og, r_max):
                R = min(r_max, og - o0)
                for c0 in range(0, cg, j_max):
                    J = min(j_max, cg - c0)
                    for t in range(T):
                        off = t * d - pb                   # input cell of output p: p + off
                        lo = max(p0, -off)
                        hi = min(p1, L_in - off)
                        if hi > lo:
                            _dotkernel(addr, R, J, da + 4 * ((n * groups * og + g * og + o0) * L_out + lo),
                                       xa + 4 * ((n * groups * cg + g * cg + c0) * L_in + lo + off),
                                       wa + 4 * (t * plane + (g * og + o0) * cg + c0), hi - lo, L_out, L_in, cg)


@njit(**JIT)
def _line_span(addr, wa, bbase, b_ks, yrow, q0, q1, M, K, T, a_rs, a_ks, aoff, boff, L_out, r_max, lanes, ob_max,
               ahead_end):
    """Outputs ``q0 .. q1`` of one (image, group) row of ``line_items``: ``bbase`` is the
    input cell of output ``q0`` for tap offset 0 (channel ``k`` at ``+ k*b_ks``), ``yrow``
    the address of output channel 0's row at position 0. Rows are asked for ahead up to
    output ``ahead_end`` (0 for a window in ``buf``: nothing ahead)."""
    step = ob_max * lanes
    for m0 in range(0, M, r_max):
        R = min(r_max, M - m0)
        for q in range(q0, q1, step):
            cnt = min(step, q1 - q)
            OB = (cnt + lanes - 1) // lanes
            ahead = q + LINE_AHEAD * step                # (module constant above)
            if LINE_AHEAD and ahead < ahead_end:         # (short rows: nothing ahead)
                if m0 == 0:
                    for k in range(K):
                        for b in range(0, 4 * step, 64):
                            _prefetch(bbase + 4 * (k * b_ks + ahead - q0) + b)
                for r in range(R):
                    for b in range(0, 4 * step, 64):
                        _prefetch(yrow + 4 * ((m0 + r) * L_out + ahead) + b)
            _ukernel(addr, R, OB, wa + 4 * m0 * a_rs, bbase + 4 * (q - q0), yrow + 4 * (m0 * L_out + q),
                     aoff.ctypes.data, boff.ctypes.data, T, K, a_rs, a_ks, b_ks, L_out, 0, cnt - (OB - 1) * lanes)


@njit(**JIT)
def _line_window(x, buf, n, c0, K, L_in, first, width):
    """Input cells ``first .. first + width`` of channels ``c0 .. c0 + K`` of image ``n``
    into ``buf`` (``K`` rows of ``width``), zero outside the row."""
    for k in range(K):
        row = x[n, c0 + k]
        for q in range(width):
            src = first + q
            buf[k * width + q] = row[src] if 0 <= src < L_in else 0.0


@njit(**JIT)
def _line_next(x, ya, n, groups, M, K, L_in, L_out, count, halo, pb):
    """Ask for the first ``count`` outputs' rows of image ``n`` (every input channel's cells
    they read, every output channel's row) before its first block starts (``LINE_NEXT``)."""
    q1 = min(L_in, count + halo - pb)
    for c in range(groups * K):
        row = x.ctypes.data + 4 * (n * groups * K + c) * L_in
        for b in range(0, 4 * q1, 64):
            _prefetch(row + b)
    for m in range(groups * M):
        row = ya + 4 * (n * groups * M + m) * L_out
        for b in range(0, 4 * count, 64):
            _prefetch(row + b)


@njit(**JIT)
def line_items(w, x, y, buf, geo, i0, i1, addr, r_max, lanes, ob_max):
    """Items ``i0 .. i1`` of a 1-D stride-1 convolution on the NCX arrays, positions in the
    lanes: ``y[n, g*M + m, p] = sum_t sum_k A[m, k, t] * x[n, g*K + k, p + t*d - pb]`` with
    ``A[m, k, t] = w[g*M + m, k, t]`` or, ``flip`` (the data gradient's forward),
    ``w[g*K + k, m, T-1-t]``, read in place. Item: (image, block of ``pblk`` outputs). The
    outputs whose taps all read real cells (``pb <= p <= L_in - 1 - halo + pb``) read ``x``
    in place; the few at the ends of the row (``pb`` at the start, ``halo - pb`` at the
    end: one each for the data gradient of two taps) read a copy of their window in
    ``buf`` (zeros for the padding). Copying a whole block's window instead had cost as
    much as the products on short rows (wavenet conv1d_10, 163 outputs)."""
    groups, M, K, T, d, pb, L_in, L_out, flip, pblk = (
        geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7], geo[8], geo[9])
    aoff = np.empty(T, np.int64)
    boff = np.empty(T, np.int64)
    if flip:
        a_rs, a_ks = T, M * T
        for t in range(T):
            aoff[t] = T - 1 - t
    else:
        a_rs, a_ks = K * T, T
        for t in range(T):
            aoff[t] = t
    for t in range(T):
        boff[t] = t * d
    halo = (T - 1) * d
    nblk = (L_out + pblk - 1) // pblk
    wa = w.ctypes.data
    ya = y.ctypes.data
    ba = buf.ctypes.data
    step = ob_max * lanes
    for i in range(i0, i1):
        n = i // nblk
        p0 = (i % nblk) * pblk
        p1 = min(L_out, p0 + pblk)
        if LINE_NEXT and i + 1 < i1 and (i + 1) % nblk == 0:
            _line_next(x, ya, n + 1, groups, M, K, L_in, L_out, min(L_out, LINE_AHEAD * step), halo, pb)
        ia = min(p1, max(p0, pb))                            # the in-place outputs: ia .. ib
        ib = max(ia, min(p1, L_in - halo + pb))
        for g in range(groups):
            wg = wa + 4 * g * M * K * T
            yrow = ya + 4 * (n * groups * M + g * M) * L_out
            if ib > ia:
                _line_span(addr, wg, x.ctypes.data + 4 * ((n * groups * K + g * K) * L_in + ia - pb), L_in, yrow,
                           ia, ib, M, K, T, a_rs, a_ks, aoff, boff, L_out, r_max, lanes, ob_max, L_out)
            for e0, e1 in ((p0, ia), (ib, p1)):
                if e1 > e0:
                    width = e1 - e0 + halo
                    _line_window(x, buf, n, g * K, K, L_in, e0 - pb, width)
                    _line_span(addr, wg, ba, width, yrow, e0, e1, M, K, T, a_rs, a_ks, aoff, boff, L_out,
                               r_max, lanes, ob_max, 0)
