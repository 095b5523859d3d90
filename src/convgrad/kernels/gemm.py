"""Fast kernels: stride-phase GEMM lowering (kernel layer: arrays and a ConvSpec only).

Derivation (one spatial axis; every axis works the same way and the axes multiply).
Forward reads the padded input at ``x = y*s + k*d`` for output ``y`` and tap ``k``. Write
``k*d = sh*s + r`` with ``0 <= r < s``: then ``x = (y + sh)*s + r``. So the padded input
split into its ``s`` *phases* ``P_r[q] = src_pad[q*s + r]`` turns every tap into a
stride-1 shift: ``src_pad[y*s + k*d] = P_r(k)[y + sh(k)]``. No zero insertion, no im2col
of the strided input, for any stride and dilation.

Each phase is stored channels-last and its spatial grid is ``Q = dst + max_sh`` long per
axis (``max_sh = (k-1)*d // s``), so ``y + sh < Q`` for every valid ``y``. Flattening the
grid (batch, q_0, q_1, ...) row-major, a shift vector becomes one flat *row offset*
``off(k) = sum_j sh_j * stride_j``: tap ``k`` of output row ``p`` is row ``p + off(k)`` of
phase ``r(k)``. Rows ``p`` whose grid coordinates have ``q_j >= dst_j`` are "wide" garbage
rows; they are computed and discarded (fwd), or multiply zeros (bwd_weights, bwd_data),
which is what makes one contiguous slice per tap correct across row and image borders.

    fwd          Y[p]     = sum_k P_r(k)[p + off(k)] @ W_k                 (Y: rows x O)
    bwd_weights  dW_k     = sum_p P_r(k)[p + off(k)]^T @ dY[p]             (K = rows)
    bwd_data     dP_r[p]  = sum_{k: r(k)=r} dY[p - off(k)] @ W_k^T         (per phase)

The data gradient is the same gather with negative offsets: each input phase collects
the output-gradient rows shifted back by its taps (dY is zero-padded in front by
``max_off`` rows). Each input element belongs to exactly one phase and one grid cell, so
``dsrc`` is written, never accumulated; elements no tap reaches stay exactly zero.

Groups are the batch axis of one ``np.matmul``. Work runs in *blocks* (several whole
images, or a slab of rows of one image) planned from the problem alone; the workspace cap
only shrinks a block when one does not fit, and per-block weight-gradient partials are
added in block order, so results do not depend on the cap in the usual range.

Two lowerings per block: ``im2col`` copies the taps' row slices side by side and runs one
GEMM with K = taps * channels; ``taps`` runs one GEMM per tap on the slices in place
(no copy; fwd/bwd_data then add per tap).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..errors import WorkspaceError
from ..spec import ConvSpec


@dataclass(frozen=True)
class PhaseGeometry:
    """Pure geometry of the stride-phase lowering of one spec."""

    spec: ConvSpec
    max_sh: tuple[int, ...]
    q: tuple[int, ...]                      # phase grid extent per axis
    phases: tuple[tuple[int, ...], ...]     # residue combination of each stored phase
    taps: tuple[tuple[int, int], ...]       # per tap (row-major over the kernel): (phase, offset)
    row_strides: tuple[int, ...]            # flat rows per unit step of each axis
    max_off: int

    @property
    def row_len(self) -> int:
        """Flat rows per step of spatial axis 0 (one grid 'row')."""
        return self.row_strides[0]


def geometry(spec: ConvSpec) -> PhaseGeometry:
    s, d, k = spec.strides, spec.dilations, spec.kernel
    max_sh = tuple((kk - 1) * dd // ss for kk, dd, ss in zip(k, d, s))
    q = tuple(o + m for o, m in zip(spec.dst, max_sh))
    residues = [sorted({(kk * dd) % ss for kk in range(ks)}) for ks, dd, ss in zip(k, d, s)]
    phases = tuple(itertools.product(*residues))
    index = {p: i for i, p in enumerate(phases)}
    strides = []
    acc = 1
    for extent in reversed(q[1:]):
        strides.append(acc)
        acc *= extent
    row_strides = (acc,) + tuple(reversed(strides))
    taps = []
    for tap in itertools.product(*(range(ks) for ks in k)):
        r = tuple((kk * dd) % ss for kk, dd, ss in zip(tap, d, s))
        off = sum(((kk * dd) // ss) * st for kk, dd, ss, st in zip(tap, d, s, row_strides))
        taps.append((index[r], off))
    max_off = sum(m * st for m, st in zip(max_sh, row_strides))
    return PhaseGeometry(spec, max_sh, q, phases, tuple(taps), row_strides, max_off)


@dataclass(frozen=True)
class Block:
    """Images ``[n0, n0 + nb)`` and grid rows ``[r0, r1)`` of spatial axis 0.

    ``r`` counts output rows (fwd, bwd_weights) or input-phase rows (bwd_data).
    ``whole`` blocks cover whole images and need no halo along axis 0.
    """

    n0: int
    nb: int
    r0: int
    r1: int
    whole: bool


def _blocks(geom: PhaseGeometry, direction: str, rows_target: int) -> list[Block]:
    spec = geom.spec
    extent = spec.dst[0] if direction != "bwd_data" else geom.q[0]
    img_rows = geom.q[0] * geom.row_len
    if img_rows <= rows_target:
        per = max(1, rows_target // img_rows)
        return [Block(n0, min(per, spec.mb - n0), 0, extent, True) for n0 in range(0, spec.mb, per)]
    h = max(1, rows_target // geom.row_len)
    return [Block(n, 1, r0, min(r0 + h, extent), False)
            for n in range(spec.mb) for r0 in range(0, extent, h)]


def _grid_rows(geom: PhaseGeometry, direction: str, b: Block) -> int:
    """Axis-0 rows of a block's flat grid (with the halo it needs)."""
    if b.whole:
        return geom.q[0]
    return (b.r1 - b.r0) + geom.max_sh[0]


def workspace_bytes(geom: PhaseGeometry, direction: str, algorithm: str, b: Block, itemsize: int) -> int:
    """Bytes of temporaries one block allocates (the quantity the workspace cap bounds)."""
    spec = geom.spec
    c, o, t = spec.ic, spec.oc, len(geom.taps)
    rows = b.nb * _grid_rows(geom, direction, b) * geom.row_len
    weights = t * spec.icg * o
    if direction == "fwd":
        inner = rows * t * c if algorithm == "im2col" else rows * o
        elems = len(geom.phases) * rows * c + inner + rows * o + weights
    elif direction == "bwd_weights":
        inner = rows * t * c if algorithm == "im2col" else 0
        elems = len(geom.phases) * rows * c + rows * o + inner + 2 * weights
    else:
        per_phase = max(sum(1 for ph, _ in geom.taps if ph == i) for i in range(len(geom.phases)))
        inner = rows * per_phase * o if algorithm == "im2col" else rows * c
        elems = (geom.max_off + rows) * o + inner + rows * c + weights
    return int(elems) * itemsize


def plan(geom: PhaseGeometry, direction: str, algorithm: str, itemsize: int,
         workspace_limit: int, rows_target: int) -> list[Block]:
    """Blocks for one call: the problem decides them; the cap only shrinks them to fit."""
    target = rows_target
    while True:
        blocks = _blocks(geom, direction, target)
        worst = max((workspace_bytes(geom, direction, algorithm, b, itemsize) for b in blocks), default=0)
        if worst <= workspace_limit:
            return blocks
        if target <= 1 or all(not b.whole and b.r1 - b.r0 == 1 for b in blocks):
            raise WorkspaceError(
                f"{direction}: the workspace limit ({workspace_limit} bytes) is too small for the "
                f"smallest tile of problem {geom.spec} ({worst} bytes); raise it with "
                f"convgrad.set_workspace_limit()")
        target //= 2


# ---------------------------------------------------------------------------------------
# Data movement between canonical NC* arrays and channels-last phase grids
# ---------------------------------------------------------------------------------------

def _phase_slices(spec: ConvSpec, r: tuple[int, ...], q_lo: tuple[int, ...], q_hi: tuple[int, ...]):
    """For phase ``r`` and grid range [q_lo, q_hi): (grid slices, src slices) or None.

    Grid cell q holds padded position ``q*s + r``, i.e. input index ``q*s + r - pb``.
    """
    grid, src = [], []
    for j in range(spec.nsp):
        s, pb, size = spec.strides[j], spec.pads_begin[j], spec.src[j]
        lo = max(q_lo[j], -((pb - r[j]) // -s) if pb > r[j] else 0)
        hi = min(q_hi[j], (size - 1 + pb - r[j]) // s + 1)
        if hi <= lo:
            return None
        i0 = lo * s + r[j] - pb
        grid.append(slice(lo - q_lo[j], hi - q_lo[j]))
        src.append(slice(i0, i0 + (hi - lo - 1) * s + 1, s))
    return tuple(grid), tuple(src)


def _src_phases(geom: PhaseGeometry, src: np.ndarray, b: Block, rows0: int, dtype) -> np.ndarray:
    """Phase grids of ``src`` for a block: (phases, nb, rows0, *q[1:], C), zero outside."""
    spec = geom.spec
    out = np.zeros((len(geom.phases), b.nb, rows0) + geom.q[1:] + (spec.ic,), dtype=dtype)
    q_lo = (b.r0,) + (0,) * (spec.nsp - 1)
    q_hi = (b.r0 + rows0,) + geom.q[1:]
    nsl = slice(b.n0, b.n0 + b.nb)
    for i, r in enumerate(geom.phases):
        sl = _phase_slices(spec, r, q_lo, q_hi)
        if sl is not None:
            out[(i, slice(None)) + sl[0]] = np.moveaxis(src[(nsl, slice(None)) + sl[1]], 1, -1)
    return out


def _dst_grid(geom: PhaseGeometry, ddst: np.ndarray, b: Block, rows0: int, first: int, dtype) -> np.ndarray:
    """``diff_dst`` rows ``[first, first + rows0)`` of axis 0 on the wide grid, channels-last."""
    spec = geom.spec
    out = np.zeros((b.nb, rows0) + geom.q[1:] + (spec.oc,), dtype=dtype)
    lo, hi = max(first, 0), min(first + rows0, spec.dst[0])
    if hi > lo:
        inner = tuple(slice(0, o) for o in spec.dst[1:])
        out[(slice(None), slice(lo - first, hi - first)) + inner] = np.moveaxis(
            ddst[(slice(b.n0, b.n0 + b.nb), slice(None), slice(lo, hi)) + inner], 1, -1)
    return out


# ---------------------------------------------------------------------------------------
# Weights in the per-tap layouts the GEMMs want
# ---------------------------------------------------------------------------------------

def _weights_tgco(spec: ConvSpec, weights: np.ndarray, dtype) -> np.ndarray:
    """(O, Cg, *K) -> (T, G, Cg, Og)."""
    t = int(np.prod(spec.kernel))
    w = weights.reshape(spec.groups, spec.ocg, spec.icg, t)
    return np.ascontiguousarray(w.transpose(3, 0, 2, 1), dtype=dtype)


# ---------------------------------------------------------------------------------------
# The three directions
# ---------------------------------------------------------------------------------------

def conv_forward(spec: ConvSpec, src: np.ndarray, weights: np.ndarray, *, dtype, algorithm: str,
                 workspace_limit: int, rows_target: int) -> np.ndarray:
    geom = geometry(spec)
    g, cg, og, t = spec.groups, spec.icg, spec.ocg, len(geom.taps)
    dst = np.zeros(spec.dst_shape, dtype=dtype)
    w = _weights_tgco(spec, weights, dtype)                               # (T, G, Cg, Og)
    w_cols = np.ascontiguousarray(w.transpose(1, 0, 2, 3)).reshape(g, t * cg, og)
    inner = tuple(slice(0, o) for o in spec.dst[1:])
    for b in plan(geom, "fwd", algorithm, np.dtype(dtype).itemsize, workspace_limit, rows_target):
        rows0 = _grid_rows(geom, "fwd", b)
        phases = _src_phases(geom, src, b, rows0, dtype)
        rows = b.nb * rows0 * geom.row_len
        span = rows - geom.max_off
        flat = phases.reshape(len(geom.phases), rows, g, cg)
        y = np.empty((rows, g, og), dtype=dtype)
        if algorithm == "im2col":
            cols = np.empty((span, g, t, cg), dtype=dtype)
            for i, (ph, off) in enumerate(geom.taps):
                cols[:, :, i, :] = flat[ph, off:off + span]
            np.matmul(cols.transpose(1, 0, 2, 3).reshape(g, span, t * cg), w_cols,
                      out=y[:span].transpose(1, 0, 2))
        else:
            acc = y[:span].transpose(1, 0, 2)
            tmp = np.empty_like(acc)
            for i, (ph, off) in enumerate(geom.taps):
                np.matmul(flat[ph, off:off + span].transpose(1, 0, 2), w[i], out=acc if i == 0 else tmp)
                if i:
                    acc += tmp
        grid = y.reshape((b.nb, rows0) + geom.q[1:] + (spec.oc,))
        valid = grid[(slice(None), slice(0, b.r1 - b.r0)) + inner]
        dst[(slice(b.n0, b.n0 + b.nb), slice(None), slice(b.r0, b.r1))] = np.moveaxis(valid, -1, 1)
    return dst


def conv_backward_weights(spec: ConvSpec, src: np.ndarray, diff_dst: np.ndarray, *, dtype, algorithm: str,
                          workspace_limit: int, rows_target: int) -> np.ndarray:
    geom = geometry(spec)
    g, cg, og, t = spec.groups, spec.icg, spec.ocg, len(geom.taps)
    total = np.zeros((g, t, cg, og), dtype=dtype)
    for b in plan(geom, "bwd_weights", algorithm, np.dtype(dtype).itemsize, workspace_limit, rows_target):
        rows0 = _grid_rows(geom, "bwd_weights", b)
        phases = _src_phases(geom, src, b, rows0, dtype)
        dgrid = _dst_grid(geom, diff_dst, b, rows0, b.r0, dtype)
        rows = b.nb * rows0 * geom.row_len
        span = rows - geom.max_off
        flat = phases.reshape(len(geom.phases), rows, g, cg)
        dy = dgrid.reshape(rows, g, og)[:span].transpose(1, 0, 2)         # (G, span, Og)
        if algorithm == "im2col":
            cols = np.empty((span, g, t, cg), dtype=dtype)
            for i, (ph, off) in enumerate(geom.taps):
                cols[:, :, i, :] = flat[ph, off:off + span]
            part = np.matmul(cols.transpose(1, 2, 3, 0).reshape(g, t * cg, span), dy).reshape(g, t, cg, og)
        else:
            part = np.empty((g, t, cg, og), dtype=dtype)
            for i, (ph, off) in enumerate(geom.taps):
                np.matmul(flat[ph, off:off + span].transpose(1, 2, 0), dy, out=part[:, i])
        total += part
    # (G, T, Cg, Og) -> (G, Og, Cg, T) -> (O, Cg, *K)
    return np.ascontiguousarray(total.transpose(0, 3, 2, 1)).reshape(spec.weights_shape)


def conv_backward_data(spec: ConvSpec, diff_dst: np.ndarray, weights: np.ndarray, *, dtype, algorithm: str,
                       workspace_limit: int, rows_target: int) -> np.ndarray:
    geom = geometry(spec)
    g, cg, og = spec.groups, spec.icg, spec.ocg
    dsrc = np.zeros(spec.src_shape, dtype=dtype)
    w = _weights_tgco(spec, weights, dtype).transpose(0, 1, 3, 2)         # (T, G, Og, Cg)
    by_phase = [[i for i, (ph, _) in enumerate(geom.taps) if ph == p] for p in range(len(geom.phases))]
    w_cols = [np.ascontiguousarray(w[taps].transpose(1, 0, 2, 3)).reshape(g, len(taps) * og, cg)
              for taps in by_phase]
    for b in plan(geom, "bwd_data", algorithm, np.dtype(dtype).itemsize, workspace_limit, rows_target):
        rows0 = _grid_rows(geom, "bwd_data", b)
        lead = 0 if b.whole else geom.max_sh[0]
        dgrid = _dst_grid(geom, diff_dst, b, rows0, b.r0 - lead, dtype)
        rows = b.nb * rows0 * geom.row_len
        dy = np.zeros((geom.max_off + rows, g, og), dtype=dtype)
        dy[geom.max_off:] = dgrid.reshape(rows, g, og)
        first = lead * geom.row_len                   # flat row of the block's first phase row
        span = rows - first
        base = geom.max_off + first
        out_rows = (b.r1 - b.r0) if not b.whole else geom.q[0]
        q_lo = (b.r0,) + (0,) * (spec.nsp - 1)
        q_hi = (b.r0 + out_rows,) + geom.q[1:]
        res = np.empty((span, g, cg), dtype=dtype)
        for p, taps in enumerate(by_phase):
            sl = _phase_slices(spec, geom.phases[p], q_lo, q_hi)
            if sl is None:
                continue
            if algorithm == "im2col":
                cols = np.empty((span, g, len(taps), og), dtype=dtype)
                for j, i in enumerate(taps):
                    off = geom.taps[i][1]
                    cols[:, :, j, :] = dy[base - off:base - off + span]
                np.matmul(cols.transpose(1, 0, 2, 3).reshape(g, span, len(taps) * og), w_cols[p],
                          out=res.transpose(1, 0, 2))
            else:
                acc = res.transpose(1, 0, 2)
                tmp = np.empty_like(acc)
                for j, i in enumerate(taps):
                    off = geom.taps[i][1]
                    np.matmul(dy[base - off:base - off + span].transpose(1, 0, 2), w[i], out=acc if j == 0 else tmp)
                    if j:
                        acc += tmp
            grid = res.reshape((b.nb, out_rows) + geom.q[1:] + (spec.ic,))
            dsrc[(slice(b.n0, b.n0 + b.nb), slice(None)) + sl[1]] = np.moveaxis(grid[(slice(None),) + sl[0]], -1, 1)
    return dsrc
