"""Scale-out on Dask (a layer above the canonical ops): ``convgrad.dask``.

``conv_forward``, ``conv_backward_weights`` and ``conv_backward_data`` with the canonical
signatures and semantics (API.md sections 1 and 8) on ``dask.array`` inputs of any chunking;
``weights`` may be a NumPy or a dask array. Arguments are validated with the canonical
rules (``make_spec`` and the ``ops`` dtype checks) *before* any task is built, so bad input
raises :class:`convgrad.ConvError` at call time. The results are lazy dask arrays; every
task calls the single-machine canonical function on one chunk, with that chunk's own
explicit pads, so the per-chunk math is exactly the single-machine kernel.

How the work is split:

* ``conv_forward``: the result follows ``src``'s batch chunks; along each spatial axis an
  output row belongs to the ``src`` chunk that holds the first row of its window. Each
  result chunk reads its rows of ``src`` plus a halo (see :func:`forward_parts`).
* ``conv_backward_data``: the result follows ``diff_dst``'s batch chunks; along each
  spatial axis the chunk boundaries of ``diff_src`` are the first rows of the windows at
  ``diff_dst``'s chunk boundaries, so they are aligned to the stride (see
  :func:`data_parts`).
* ``conv_backward_weights``: one partial gradient per ``diff_dst`` chunk (batch and spatial
  axes), each reading the ``src`` rows its windows cover; the partials are summed in float32
  (half types), float64 or int64 in a fixed tree over the chunk indices (:data:`SPLIT_EVERY`
  partials per node, left to right), and rounded once to the input's element type. The
  order of every addition depends only on the chunking, so the result is bitwise identical
  run to run, whatever the number of workers or the scheduler.

Channel axes are never split: a chunk that cuts through channels is gathered whole by the
task that needs it. Halo rows travel as slices (one small ``getitem`` task on the block
that holds them), never as whole neighbour blocks.

Every chunk task runs its BLAS calls on one thread (the parallelism is Dask's). This is
what makes the per-chunk partials bitwise reproducible: OpenBLAS splits long GEMM
reductions differently with 2 threads than with 1 (measured: a float64 3-D weights
gradient differed in the last bit between the threads scheduler and distributed workers,
which run with ``OPENBLAS_NUM_THREADS=1``). The limit is process-wide while any chunk task
runs in the process (the threads scheduler), and restored when the last one ends
(``convgrad.threads.pinned_blas``, shared with the kernels, inside ``threads.serial()``).
Bitwise identity holds on workers with the same CPU kind (the BLAS kernels are chosen per
CPU).
"""

from __future__ import annotations

import functools
import itertools
import operator
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

try:
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"convgrad.dask needs the optional extra: pip install 'convgrad[dask]' ({e})") from e

from . import ops, threads
from .errors import ConvValueError
from .spec import ConvSpec, effective_kernel

__all__ = ["SPLIT_EVERY", "Part", "conv_backward_data", "conv_backward_weights", "conv_forward",
           "data_parts", "forward_parts"]

# Partials summed per node of the weights-gradient tree (left to right, in chunk order).
SPLIT_EVERY = 8


# --------------------------------------------------------------------------------------
# Per-axis chunk geometry (pure functions of one spatial axis and the chunk boundaries)
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Part:
    """One chunk along one spatial axis.

    ``out``: the rows of the chunk's result; ``reads``: the rows of the operand it reads
    (``src`` for forward / weights gradient, ``diff_dst`` for the data gradient; empty when
    the chunk reads nothing and its result is zero); ``pads``: the (begin, end) pads of the
    canonical sub-problem that the chunk is.
    """

    out: tuple[int, int]
    reads: tuple[int, int]
    pads: tuple[int, int]

    @property
    def empty(self) -> bool:
        return self.reads[0] >= self.reads[1]


def _bounds(chunks: Sequence[int]) -> list[int]:
    return [0] + list(itertools.accumulate(chunks))


def _inner(chunks: Sequence[int]) -> list[int]:
    """The boundaries between chunks (the ends of the axis are not mapped: rows past the
    last boundary belong to the last chunk, whatever maps there)."""
    return _bounds(chunks)[1:-1]


def _ranges(bounds: Sequence[int], total: int) -> list[tuple[int, int]]:
    """Consecutive ranges between sorted unique ``bounds`` clipped to [0, total]."""
    b = sorted({0, total} | {min(max(v, 0), total) for v in bounds})
    return [(lo, hi) for lo, hi in zip(b, b[1:])] or [(0, 0)]


def forward_parts(i: int, k: int, s: int, d: int, pb: int, pe: int,
                  dst_ranges: Sequence[tuple[int, int]]) -> list[Part]:
    """The ``src`` rows and pads of each forward-output chunk ``[a, b)`` of one axis.

    Output row ``j`` reads padded rows ``[j*s, j*s + ek)``, i.e. input rows
    ``[j*s - pb, j*s - pb + ek)`` with ``ek = d*(k-1) + 1``. So ``[a, b)`` reads
    ``[start, end) = [a*s - pb, (b-1)*s - pb + ek)``. Clipped to the input ``[0, i)`` that is
    ``[lo, hi)``, and the rows cut off are the chunk's own pads ``(lo - start, end - hi)``:
    non-zero only where the chunk reaches the global padding, never larger than it. The
    chunk's forward size is ``floor((end - start - ek) / s) + 1 = b - a``: it is exactly the
    canonical problem on rows ``[lo, hi)`` with those pads.
    """
    ek = effective_kernel(k, d)
    parts = []
    for a, b in dst_ranges:
        start, end = a * s - pb, (b - 1) * s - pb + ek
        lo, hi = max(start, 0), min(end, i)
        if b <= a or hi <= lo:  # nothing to compute, or only padding is read: zeros
            parts.append(Part((a, b), (0, 0), (0, 0)))
        else:
            parts.append(Part((a, b), (lo, hi), (lo - start, end - hi)))
    return parts


def forward_dst_ranges(i: int, k: int, s: int, d: int, pb: int, pe: int,
                       src_chunks: Sequence[int]) -> list[tuple[int, int]]:
    """Forward-output chunks along one axis, derived from ``src``'s chunks.

    Output row ``j`` belongs to the ``src`` chunk holding its window's first row
    ``j*s - pb``, so a ``src`` boundary ``c`` becomes the output boundary
    ``ceil((c + pb) / s)`` (rows in the begin padding go to the first chunk). Each chunk then
    reads its own rows plus a halo of less than ``ek`` rows after them.
    """
    o = (i + pb + pe - effective_kernel(k, d)) // s + 1
    return _ranges([-((-(c + pb)) // s) for c in _inner(src_chunks)], o)


def data_parts(i: int, k: int, s: int, d: int, pb: int, pe: int,
               dst_chunks: Sequence[int]) -> list[Part]:
    """``diff_src`` chunks along one axis, with the ``diff_dst`` rows and pads each one needs.

    ``diff_src`` row ``r`` receives from output rows ``j`` whose window covers it:
    ``j*s - pb <= r < j*s - pb + ek``, i.e. ``floor((r + pb - ek)/s) < j <= floor((r + pb)/s)``.
    The ``diff_src`` boundaries are the first rows ``a*s - pb`` of the windows at
    ``diff_dst``'s chunk boundaries ``a`` (clipped to ``[0, i]``), plus that of the first
    window reaching row 0, ``a0 = max(0, floor((pb - ek)/s) + 1)``: aligned to the stride, every
    chunk ``[c, c')`` starts at a window start, or at row 0 with window ``a0`` starting at or
    before it (when ``a0*s - pb > 0`` the rows before it, fewer than ``s`` and reached by no
    window, form a zero chunk). The chunk receives from ``diff_dst`` rows ``[j_lo, j_hi)`` with
    ``j_lo = max(0, floor((c + pb - ek)/s) + 1)`` and ``j_hi = min(o, floor((c' - 1 + pb)/s) + 1)``
    (a halo of ``floor((ek - 1)/s)`` rows before its own). As a forward problem on rows
    ``[c, c')``, window ``j_lo`` starts ``c + pb - j_lo*s >= 0`` rows before ``c``: that is
    the chunk's begin pad; the end pad lets the last window ``j_hi - 1`` end where it ends,
    ``max(0, (j_hi - 1)*s - pb + ek - c')``. Rows past it are fewer than ``s`` (no further
    window starts in the chunk), so the chunk's forward size is ``j_hi - j_lo``.
    """
    ek = effective_kernel(k, d)
    o = (i + pb + pe - ek) // s + 1
    parts = []
    a0 = max(0, (pb - ek) // s + 1)
    for c, c1 in _ranges([a * s - pb for a in _inner(dst_chunks) + [a0]], i):
        j_lo = max(0, (c + pb - ek) // s + 1)
        j_hi = min(o, (c1 - 1 + pb) // s + 1)
        if c1 <= c or j_hi <= j_lo:  # no window reaches these rows: zeros
            parts.append(Part((c, c1), (0, 0), (0, 0)))
        else:
            parts.append(Part((c, c1), (j_lo, j_hi),
                              (c + pb - j_lo * s, max(0, (j_hi - 1) * s - pb + ek - c1))))
    return parts


# --------------------------------------------------------------------------------------
# Validation (the canonical rules, on shapes and dtypes only: nothing is computed)
# --------------------------------------------------------------------------------------

def _as_dask(op: str, name: str, value: object):
    """A dask array with known chunk sizes (NumPy-like input becomes one block)."""
    if isinstance(value, da.Array):
        if any(isinstance(c, float) and np.isnan(c) for axis in value.chunks for c in axis):
            raise ConvValueError(f"{op}: {name} must have known chunk sizes (call .compute_chunk_sizes()), "
                                 f"but got chunks {value.chunks}")
        return value
    arr = ops.as_array(op, name, value)
    return da.from_array(arr, chunks=arr.shape if arr.ndim else (), name=False)


# --------------------------------------------------------------------------------------
# Graph building: gather a region of a dask array, run one canonical call per chunk
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Region:
    """How a task assembles one operand region from the pieces it receives."""

    shape: tuple[int, ...]
    dtype: np.dtype
    places: tuple[tuple[slice, ...], ...]  # where each piece goes in the region

    def assemble(self, pieces: Sequence[np.ndarray]) -> np.ndarray:
        if len(pieces) == 1 and pieces[0].shape == self.shape:
            return pieces[0]  # the canonical functions never write their inputs: no copy
        out = np.empty(self.shape, self.dtype)
        for place, piece in zip(self.places, pieces):
            out[place] = piece
        return out


@dataclass(frozen=True)
class _Chunk:
    """One task: the canonical call of one chunk, on its two assembled operands."""

    call: Callable[..., np.ndarray]
    shape: tuple[int, ...]          # the chunk's result
    dtype: np.dtype
    operands: tuple[_Region, _Region] | None  # None: the chunk reads nothing, result zero
    cast: np.dtype | None = None    # operands' element type for the call (partials' accumulator)


def _run_chunk(chunk: _Chunk, a_pieces: list, b_pieces: list) -> np.ndarray:
    if chunk.operands is None:
        return np.zeros(chunk.shape, chunk.dtype)
    a, b = (r.assemble(p) for r, p in zip(chunk.operands, (a_pieces, b_pieces)))
    if chunk.cast is not None:
        a, b = a.astype(chunk.cast, copy=False), b.astype(chunk.cast, copy=False)
    # BLAS on one thread and the kernel's blocks one at a time: Dask is the parallelism
    with threads.pinned_blas(), threads.serial():
        return chunk.call(a, b)


def _sum_in_order(parts: list) -> np.ndarray:
    """Left-to-right sum: the order of the additions is the order of ``parts``."""
    acc = np.array(parts[0], copy=True)
    for p in parts[1:]:
        np.add(acc, p, out=acc)
    return acc


def _finish(acc: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.ascontiguousarray(acc.astype(dtype, copy=False))


def _pieces(chunks: Sequence[int], lo: int, hi: int) -> list[tuple[int, slice, slice]]:
    """(block index, rows in the block, rows in the region) of the blocks that [lo, hi) spans."""
    out, start = [], 0
    for b, size in enumerate(chunks):
        l, h = max(lo, start), min(hi, start + size)
        if l < h:
            out.append((b, slice(l - start, h - start), slice(l - lo, h - lo)))
        start += size
    return out


class _Graph:
    """The tasks of one result: one layer, keyed by ``name`` (chunks) and ``name-*`` helpers."""

    def __init__(self, name: str):
        self.name = name
        self.dsk: dict = {}

    def gather(self, x, box: Sequence[tuple[int, int]], tag: tuple) -> tuple[list, _Region]:
        """Keys of the pieces of ``x[box]`` (whole blocks, or getitem tasks on a block) and
        how to assemble them; ``tag`` names the consumer so helper keys are unique."""
        per_axis = [_pieces(ch, lo, hi) for ch, (lo, hi) in zip(x.chunks, box)]
        keys, places = [], []
        for n, combo in enumerate(itertools.product(*per_axis)):
            block = (x.name,) + tuple(b for b, _, _ in combo)
            take = tuple(sl for _, sl, _ in combo)
            whole = all(sl.start == 0 and sl.stop == ch[b] for (b, sl, _), ch in zip(combo, x.chunks))
            if whole:
                keys.append(block)
            else:  # only the needed rows travel to the consumer
                key = (f"{self.name}-piece",) + tag + (n,)
                self.dsk[key] = (operator.getitem, block, take)
                keys.append(key)
            places.append(tuple(pl for _, _, pl in combo))
        shape = tuple(hi - lo for lo, hi in box)
        return keys, _Region(shape, np.dtype(x.dtype), tuple(places))

    def array(self, chunks, dtype, deps) -> "da.Array":
        graph = HighLevelGraph.from_collections(self.name, self.dsk, dependencies=deps)
        return da.Array(graph, self.name, chunks=chunks, dtype=dtype)


def _whole(x) -> list[tuple[int, int]]:
    return [(0, n) for n in x.shape]


def _blocks(batch: Sequence[tuple[int, int]], axes: Sequence[Sequence[Part]]):
    """Every result chunk in C order: (block index over batch and spatial axes, batch rows,
    its Part on each spatial axis, whether it reads nothing and is zero)."""
    for (nb, rows), combo in itertools.product(enumerate(batch), itertools.product(*map(enumerate, axes))):
        parts = [p for _, p in combo]
        yield (nb,) + tuple(m for m, _ in combo), rows, parts, rows[1] == rows[0] or any(p.empty for p in parts)


def _sizes(parts: Sequence[Part]) -> tuple[int, ...]:
    return tuple(p.out[1] - p.out[0] for p in parts)


def _chunk_call(fn: Callable, spec: ConvSpec, parts: Sequence[Part], algorithm: str, limit: int, **fixed):
    """The canonical function ``fn`` with the chunk's own pads and everything else global."""
    return functools.partial(fn, strides=spec.strides, dilations=spec.dilations, groups=spec.groups,
                             pads_begin=tuple(p.pads[0] for p in parts), pads_end=tuple(p.pads[1] for p in parts),
                             algorithm=algorithm, workspace_limit=limit, **fixed)


def _one_block(w):
    """Weights as one block: every chunk task needs all of them."""
    return w if all(len(c) == 1 for c in w.chunks) else w.rechunk(w.shape)


# --------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------

def conv_forward(src, weights, *, strides=1, pads_begin=0, pads_end=0, dilations=1, groups=1,
                 algorithm: str | None = None, workspace_limit: int | None = None):
    """Lazy forward convolution: ``(N, C, *i)`` x ``(O, C // groups, *k)`` -> ``(N, O, *o)``.

    The result follows ``src``'s batch chunks, and along each spatial axis the output rows
    whose windows start in each ``src`` chunk (:func:`forward_dst_ranges`).
    """
    op = "dask.conv_forward"
    src = _as_dask(op, "src", src)
    weights = _as_dask(op, "weights", weights)
    spec, dt = ops.validate_forward(op, src, weights, strides=strides, pads_begin=pads_begin,
                                    pads_end=pads_end, dilations=dilations, groups=groups)
    # the algorithm and cap are fixed at graph-building time (the caller's, not a worker's)
    algorithm, limit = ops.resolve(op, spec, "fwd", dt, algorithm, workspace_limit)
    weights = _one_block(weights)

    axes = [forward_parts(*geo, forward_dst_ranges(*geo, ch))
            for geo, ch in zip(_axis_geometry(spec), src.chunks[2:])]
    g = _Graph("convgrad-forward-" + tokenize(src, weights, spec, algorithm, limit))
    w_keys, w_region = g.gather(weights, _whole(weights), ("w",))
    batch = _ranges(_bounds(src.chunks[0]), spec.mb)
    for idx, (n0, n1), parts, zero in _blocks(batch, axes):
        idx = idx[:1] + (0,) + idx[1:]
        shape = (n1 - n0, spec.oc) + _sizes(parts)
        if zero:
            chunk, a_keys, b_keys = _Chunk(None, shape, dt, None), [], []
        else:
            a_keys, a_region = g.gather(src, [(n0, n1), (0, spec.ic)] + [p.reads for p in parts], idx)
            call = _chunk_call(ops.conv_forward, spec, parts, algorithm, limit)
            chunk, b_keys = _Chunk(call, shape, dt, (a_region, w_region)), w_keys
        g.dsk[(g.name,) + idx] = (_run_chunk, chunk, a_keys, b_keys)
    chunks = (tuple(b - a for a, b in batch), (spec.oc,)) + tuple(_sizes(parts) for parts in axes)
    return g.array(chunks, dt, [src, weights])


def conv_backward_data(diff_dst, weights, src_spatial, *, strides=1, pads_begin=0, pads_end=0,
                       dilations=1, groups=1, algorithm: str | None = None,
                       workspace_limit: int | None = None):
    """Lazy data gradient ``(N, C, *src_spatial)`` of ``conv_forward``.

    The result follows ``diff_dst``'s batch chunks, and along each spatial axis the rows
    from the window starts at ``diff_dst``'s chunk boundaries (:func:`data_parts`).
    """
    op = "dask.conv_backward_data"
    diff_dst = _as_dask(op, "diff_dst", diff_dst)
    weights = _as_dask(op, "weights", weights)
    spec, dt = ops.validate_backward_data(op, diff_dst, weights, src_spatial, strides=strides,
                                          pads_begin=pads_begin, pads_end=pads_end, dilations=dilations,
                                          groups=groups)
    algorithm, limit = ops.resolve(op, spec, "bwd_data", dt, algorithm, workspace_limit)
    weights = _one_block(weights)

    axes = [data_parts(*geo, ch) for geo, ch in zip(_axis_geometry(spec), diff_dst.chunks[2:])]
    g = _Graph("convgrad-backward-data-" + tokenize(diff_dst, weights, spec, algorithm, limit))
    w_keys, w_region = g.gather(weights, _whole(weights), ("w",))
    batch = _ranges(_bounds(diff_dst.chunks[0]), spec.mb)
    for idx, (n0, n1), parts, zero in _blocks(batch, axes):
        idx = idx[:1] + (0,) + idx[1:]
        shape = (n1 - n0, spec.ic) + _sizes(parts)
        if zero:
            chunk, a_keys, b_keys = _Chunk(None, shape, dt, None), [], []
        else:
            a_keys, a_region = g.gather(diff_dst, [(n0, n1), (0, spec.oc)] + [p.reads for p in parts], idx)
            call = _chunk_call(ops.conv_backward_data, spec, parts, algorithm, limit, src_spatial=shape[2:])
            chunk, b_keys = _Chunk(call, shape, dt, (a_region, w_region)), w_keys
        g.dsk[(g.name,) + idx] = (_run_chunk, chunk, a_keys, b_keys)
    chunks = (tuple(b - a for a, b in batch), (spec.ic,)) + tuple(_sizes(parts) for parts in axes)
    return g.array(chunks, dt, [diff_dst, weights])


def conv_backward_weights(src, diff_dst, kernel, *, strides=1, pads_begin=0, pads_end=0, dilations=1,
                          groups=1, algorithm: str | None = None, workspace_limit: int | None = None):
    """Lazy weights gradient ``(O, C // groups, *kernel)`` of ``conv_forward`` (one block).

    One partial per chunk of ``diff_dst`` along its batch and spatial axes (its channel
    chunks are gathered whole), reading the ``src`` rows its windows cover with the pads of
    :func:`forward_parts`; partials are summed in a fixed tree (:data:`SPLIT_EVERY`).
    """
    op = "dask.conv_backward_weights"
    src = _as_dask(op, "src", src)
    diff_dst = _as_dask(op, "diff_dst", diff_dst)
    spec, dt = ops.validate_backward_weights(op, src, diff_dst, kernel, strides=strides, pads_begin=pads_begin,
                                             pads_end=pads_end, dilations=dilations, groups=groups)
    algorithm, limit = ops.resolve(op, spec, "bwd_weights", dt, algorithm, workspace_limit)
    acc = ops.compute_dtype(dt)  # partials: float32 (half types, float32), float64, int64

    axes = [forward_parts(*geo, _ranges(_bounds(ch), spec.dst[ax]))
            for ax, (geo, ch) in enumerate(zip(_axis_geometry(spec), diff_dst.chunks[2:]))]
    g = _Graph("convgrad-backward-weights-" + tokenize(src, diff_dst, spec, algorithm, limit))
    batch = _ranges(_bounds(diff_dst.chunks[0]), spec.mb)
    level = []
    for idx, (n0, n1), parts, zero in _blocks(batch, axes):
        if zero:
            chunk, a_keys, b_keys = _Chunk(None, spec.weights_shape, acc, None), [], []
        else:
            a_keys, a_region = g.gather(src, [(n0, n1), (0, spec.ic)] + [p.reads for p in parts], ("s",) + idx)
            b_keys, b_region = g.gather(diff_dst, [(n0, n1), (0, spec.oc)] + [p.out for p in parts], ("d",) + idx)
            call = _chunk_call(ops.conv_backward_weights, spec, parts, algorithm, limit, kernel=spec.kernel)
            chunk = _Chunk(call, spec.weights_shape, acc, (a_region, b_region), cast=acc)
        key = (f"{g.name}-partial",) + idx
        g.dsk[key] = (_run_chunk, chunk, a_keys, b_keys)
        level.append(key)
    # The fixed tree: level after level, SPLIT_EVERY consecutive nodes summed left to right.
    depth = 0
    while len(level) > 1:
        depth += 1
        nxt = []
        for n in range(0, len(level), SPLIT_EVERY):
            key = (f"{g.name}-sum", depth, n // SPLIT_EVERY)
            g.dsk[key] = (_sum_in_order, level[n:n + SPLIT_EVERY])
            nxt.append(key)
        level = nxt
    g.dsk[(g.name,) + (0,) * len(spec.weights_shape)] = (_finish, level[0], dt)
    return g.array(tuple((n,) for n in spec.weights_shape), dt, [src, diff_dst])


def _axis_geometry(spec: ConvSpec) -> list[tuple[int, int, int, int, int, int]]:
    """(i, k, s, d, pb, pe) of each spatial axis, the argument order of the part functions."""
    return list(zip(spec.src, spec.kernel, spec.strides, spec.dilations, spec.pads_begin, spec.pads_end))
