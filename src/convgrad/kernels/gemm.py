"""Fast kernels: two GEMM lowerings on channel-major tiles (kernel layer: arrays and a ConvSpec only).

Layout. Everything inside runs *channel-major*: a tile is ``(channels, rows)`` with the
images of a block and their spatial positions flattened into ``rows`` (row-major). The
canonical arrays are ``(N, C, *spatial)``, so moving between the two swaps the two
leading axes and keeps every spatial row contiguous: no element-wise transpose. Groups
are the leading (batch) axis of every product, ``(G, Cg, rows)``.

``taps``: stride-phase lowering, no column matrix (one spatial axis; axes multiply).
Forward reads the padded input at ``x = y*s + k*d`` for output ``y`` and tap ``k``. Write
``k*d = sh*s + r`` with ``0 <= r < s``: then ``x = (y + sh)*s + r``. So the padded input
split into its ``s`` *phases* ``P_r[q] = src_pad[q*s + r]`` turns every tap into a
stride-1 shift: ``src_pad[y*s + k*d] = P_r(k)[y + sh(k)]``. No zero insertion, for any
stride and dilation. Each phase grid is ``Q = dst + max_sh`` long per axis
(``max_sh = (k-1)*d // s``), so ``y + sh < Q`` for every valid ``y``. Flattening
(image, q_0, q_1, ...) row-major, a shift vector becomes one flat *row offset*
``off(k) = sum_j sh_j * stride_j``: tap ``k`` of output row ``p`` is row ``p + off(k)`` of
phase ``r(k)``. Rows ``p`` with some ``q_j >= dst_j`` are "wide" garbage rows; they are
computed and discarded (fwd) or multiply zeros (bwd_weights, bwd_data), which is what
makes one contiguous slice per tap correct across row and image borders:

    fwd          Y[:, p]    = sum_k W_k @ P_r(k)[:, p + off(k)]             (Y: O x rows)
    bwd_weights  dW_k       = sum_p dY[:, p] @ P_r(k)[:, p + off(k)]^T      (K = rows)
    bwd_data     dP_r[:, p] = sum_{k: r(k)=r} W_k^T @ dY[:, p - off(k)]     (per phase)

The data gradient is the same gather with negative offsets (dY is zero-padded in front by
``max_off`` rows). Each input element belongs to exactly one phase cell, so ``dsrc`` is
written, never accumulated. Products accumulate in place (BLAS ``beta = 1``, see
``blas.py``); a contraction of length 1 (depthwise convolution) is an element-wise
multiply-add instead of a GEMM.

No copies where the layout allows. With stride 1 and no front padding the one phase is
the input itself (cell ``q`` is input index ``q``), so a one-image block reads ``src``
rows in place, channels ``prod(spatial)`` apart (BLAS's leading dimension); when no axis
after the first has a halo (1-D, or kernels of extent 1 there) the wide rows *are* the
canonical rows, so ``diff_dst`` is read and the forward result and data gradient are
written in place too. 1x1 kernels with stride 1 and no padding ("pointwise") never pack:
``Y_n = W @ X_n`` per image, or, for 1x1 images, one product with the batch as rows;
except the data gradient of short images (7x7), which packs ``diff_dst`` once and splits
the input channels instead (``packed_pointwise_chunks``): one product over every image.
Their work is balanced over the problem, never the threads: images under 2048 positions
run one per item, an odd batch's last image as two halves of its result channels
(``pointwise_items``); an odd batch's weight gradient sums two halves of all positions,
the middle image cut between them (``pointwise_weight_halves``), and one image's splits
its input channels (``pointwise_weight_columns``). The other 1x1 unpadded weight
gradients of an odd batch (strided, or 7x7 images) pack the same two halves
(``packed_weight_halves``). Strided 1x1 data gradients run one product per image on the
output grid, spread into the image's rows of dsrc by a numba loop that writes each row
once (``strided_1x1_data``); those of short images (7x7 outputs) pack every image and
spread the channel chunks' products the same way (``packed_pointwise_chunks``). Strided
1x1 forwards gather each image's read cells and write its products in place
(``strided_1x1_forward``). 1-D kernels of whole strides (an STFT's convolution, an ISTFT's
data gradient) run on frame views of the canonical arrays (``framed_spec``).

``im2col``: the exact column matrix (no wide rows: best for small images, whose halo
would waste flops, and for few channels, whose per-tap products are too thin). For output
position ``y`` and tap ``k`` the column holds ``src[y*s + k*d - pb]`` (zero in the
padding), so with ``cols[(k, c), y]`` (built by one compiled pass over the input where
numba is there, ``_spread_jit.im2col``; else NumPy's copy of a padded block's windows):

    fwd          Y  = W_cols @ cols                                       (K = taps * Cg)
    bwd_weights  dW = dY @ cols^T                                         (K = rows)
    bwd_data     Z  = W_cols^T @ dY;  dsrc[window(k)] += Z[k]  (col2im)   (M = taps * Cg)

The scatter adds one tap at a time along contiguous memory (``_scatter_layout``): along
the channels of a channel-last block when there are many (Z stored rows-major, taps
outside the channels), else along output rows, into one grid per stride phase (tap ``k``
lands in phase ``k*d mod s`` at a shift of ``k*d // s`` cells, as in ``taps``), copied into
the strided positions once at the end. One image with a huge kernel (the ISTFT) splits Z's
columns between the threads instead of its rows (``column_chunks``).

With stride 1 the data gradient is itself a forward correlation of ``dY`` with the
flipped kernel (``flipped_spec``), so ``im2col`` runs it as a forward im2col: no scatter
(``flipped_data_gradient``: unless that column matrix is larger than Z).

Work runs in *blocks* (several whole images, or a slab of rows of one image) planned
from the problem alone, balanced (equal image counts, slabs within one row of each
other, an even count for large problems); the workspace cap only shrinks a block when
one does not fit, and partial sums are added in block order, so results do not depend on
the cap in the usual range. A weights gradient with few rows and many channels (deep
layers) is split over channels instead of rows (``weight_chunks``; the input channels
where their packed rows are the larger operand, ``weight_chunk_axis``): each chunk writes
its part of the result, with no result-sized partial sums.

A block's packing temporaries (phase grids, column matrices, packed ``diff_dst``, result
rows before they are copied out) live in per-thread scratch buffers reused from block to
block and call to call (``_scratch``; results and returned partials never do): a fresh
multi-MiB buffer costs a page fault per 4 KiB on its first write.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import queue
import threading
from concurrent.futures import Future
import dataclasses
from dataclasses import dataclass

import numpy as np

from ..errors import WorkspaceError
from .. import threads
from ..spec import ConvSpec
from . import results
from .blas import available as blas_available
from .blas import matmul_into

# Element-wise (depthwise) products run over channel chunks of about this many elements,
# so that the operands of the multiply-add stay in cache.
ELEMENTWISE_CHUNK = 1 << 16
# An im2col block holds about ROWS_TARGET * IM2COL_WIDTH column elements.
IM2COL_WIDTH = 512
# A weights-gradient block whose column matrix is narrower than IM2COL_THIN_WIDTH (few
# input channels: first layers) holds IM2COL_THIN_ROWS times more rows: its products are
# short (M = C_out, N = width) and the per-block work around them (views, packing calls,
# a partial sum) was a tenth of the time. Measured (float32, ms, 1 / 2 threads, x1 / x2
# rows): mobilenet conv1 (3 -> 32, 3x3 s2, mb32) 29.6 / 26.5 and 25.6 / 17.5; 3 -> 64 3x3
# 224^2 mb8 36.9 / 34.6 and 29.7 / 23.6; 3-D 3 -> 32 3x3x3 64^3 30.4 / 29.4 and 19.8 / 16.9;
# resnet_50 conv1 (width 147) was no faster (19.5 / 21.0, 10.1 / 10.6) and keeps x1.
IM2COL_THIN_WIDTH = 128
IM2COL_THIN_ROWS = 2
# Large problems get at least MIN_BLOCKS blocks (work for every thread) of at least
# MIN_BLOCK_ROWS rows (long enough for efficient products).
MIN_BLOCKS = 4
# Weight gradients add one partial result per block, and each block's product reduces over
# its own rows only, so they take one block per thread: whole images, ceil(mb / 2) in the
# first block (an odd batch too), or one image cut in two slabs. Measured (2 threads,
# medians of 8 x 5 calls in one process, 4 blocks / 2): resnet_50 res2a_branch2b (mb4,
# im2col) 13.1 / 11.2 ms, res3a_branch2b 11.8 / 9.3 (taps 12.8 / 10.6), res3a_branch1
# (taps) 9.5 / 8.1, 3d_unet conv_4 (mb1) 9.4 / 7.2; data gradients and forwards did not
# change (res3a_branch1). Odd batches kept finer blocks, (2, 2, 2, 2, 1) for mb9 and
# (4, 4, 4, 4, 3) for mb19, until two blocks of 5 + 4 and 10 + 9 measured faster (paired
# medians of 16 rounds in one process, two blocks with ``_in_order``'s pulled blocks
# against the finer blocks handed out by the caller): resnet_50 res2a_branch1 0.93,
# res4a_branch2c 0.89, res4b_branch2a 0.85, res4a_branch2a 0.92, res3a_branch2a 0.85;
# mobilenet conv3 0.83, conv4 0.88, conv7 0.86, conv8 0.90. The finer blocks balance no
# better (mb9: 5 images on one thread, 4 on the other either way; mb19: 11 and 8 against
# 10 and 9) and cost a partial sum, a hand-off and a shorter reduction each.
MIN_BLOCKS_WEIGHTS = 2
MIN_BLOCK_ROWS = 512
# A weights gradient split over output channels keeps at least this many per chunk.
CHUNK_MIN_CHANNELS = 32
# ... and is split where its rows' elements (rows x (C_in + C_out)) are fewer than
# CHUNK_MAX_ROW_RATIO times the weights: at 1.0 resnet_50 res5a_branch2c (512 -> 2048
# channels, 9 x 7x7, ratio 1.08) kept two image blocks, 2.94-3.36 ms (min of 20 calls,
# two processes) against 2.65-2.71 in chunks.
CHUNK_MAX_ROW_RATIO = 1.25
# Chunks first: a problem whose rows all fit one block (the row target) and whose weight
# gradient ``weight_chunks`` splits runs as that one block in channel chunks, before the
# rule that cuts a parallel problem into MIN_BLOCKS_WEIGHTS blocks of at least
# MIN_BLOCK_ROWS rows: that rule had cut resnet_50 res4a_branch2b (256 -> 256, 3x3, 14^2,
# mb4: 784 rows) into two blocks of two images, whose two partial gradients, each as large
# as the result, were then added. In one process, paired medians of 14 rounds (2 threads,
# float32), chunks / blocks: mb4 0.97, mb3 0.77 (the blocks were 2 + 1 images), mb6 0.99.
PARALLEL_FLOPS = 20_000_000


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


@functools.lru_cache(maxsize=256)
def geometry(spec: ConvSpec) -> PhaseGeometry:
    """The phase geometry of a spec (pure; cached, since small calls repeat shapes)."""
    s, d, k = spec.strides, spec.dilations, spec.kernel
    max_sh = tuple((kk - 1) * dd // ss for kk, dd, ss in zip(k, d, s))
    q = tuple(o + m for o, m in zip(spec.dst, max_sh))
    residues = [sorted({(kk * dd) % ss for kk in range(ks)}) for ks, dd, ss in zip(k, d, s)]
    phases = tuple(itertools.product(*residues))
    strides = []
    acc = 1
    for extent in reversed(q[1:]):
        strides.append(acc)
        acc *= extent
    row_strides = (acc,) + tuple(reversed(strides))
    # Per tap (row-major over the kernel), vectorised: k*d = sh*s + r per axis; the phase
    # is the row-major index of r among the stored residues, the offset is sh . strides.
    kd = np.indices(k, dtype=np.int64).reshape(len(k), -1) * np.array(d, dtype=np.int64)[:, None]
    sv = np.array(s, dtype=np.int64)[:, None]
    pos = np.stack([np.searchsorted(np.array(res), row) for res, row in zip(residues, kd % sv)])
    phase = np.ravel_multi_index(tuple(pos), tuple(len(r) for r in residues)) if len(k) else np.zeros(1, np.int64)
    off = (np.array(row_strides, dtype=np.int64)[:, None] * (kd // sv)).sum(axis=0)
    taps = tuple(zip(phase.tolist(), off.tolist()))
    max_off = sum(m * st for m, st in zip(max_sh, row_strides))
    return PhaseGeometry(spec, max_sh, q, phases, taps, row_strides, max_off)


# ---------------------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    """Images ``[n0, n0 + nb)`` and rows ``[r0, r1)`` of spatial axis 0.

    ``r`` counts output rows (fwd, bwd_weights, every im2col block) or input-phase rows
    (bwd_data of ``taps``). ``whole`` blocks cover whole images and need no halo.
    """

    n0: int
    nb: int
    r0: int
    r1: int
    whole: bool


def _extent(geom: PhaseGeometry, direction: str, algorithm: str) -> tuple[int, int]:
    """(rows of axis 0 that blocks split, flat rows per such row)."""
    spec = geom.spec
    if algorithm == "im2col":
        return spec.dst[0], math.prod(spec.dst[1:])
    return (geom.q[0] if direction == "bwd_data" else spec.dst[0]), geom.row_len


def _img_rows(geom: PhaseGeometry, algorithm: str) -> int:
    if algorithm == "im2col":
        return math.prod(geom.spec.dst)
    return geom.q[0] * geom.row_len


def _natural(geom: PhaseGeometry, direction: str, algorithm: str, rows_target: int) -> tuple[int, int]:
    """(images per whole block, slabs per image) decided by the problem alone.

    Blocks hold about ``rows_target`` rows (fewer for wide column matrices), and a large
    problem (``PARALLEL_FLOPS`` or more, made of BLAS products) is cut into at least
    ``MIN_BLOCKS`` blocks (``MIN_BLOCKS_WEIGHTS`` of whole images for a weight gradient,
    past the row target when ``taps`` reads the images in place) of at least
    ``MIN_BLOCK_ROWS`` rows, or in two when it has fewer
    rows than that (deep layers: few rows, long reductions), so that the thread pool has
    work for every thread. Sizes are balanced (equal image counts, slabs that differ by at
    most one row), and a large problem cut into an odd number of slabs gets one slab less
    (or more, for three), so that two threads finish together. Element-wise (depthwise)
    work keeps its large blocks: its many short NumPy calls would only contend for the
    interpreter.
    """
    spec = geom.spec
    if algorithm == "im2col":
        width = len(geom.taps) * spec.ic
        rows_target = max(1, rows_target * IM2COL_WIDTH // max(IM2COL_WIDTH, width))
        if direction == "bwd_weights" and width < IM2COL_THIN_WIDTH:
            rows_target *= IM2COL_THIN_ROWS
    extent, row_len = _extent(geom, direction, algorithm)
    img = _img_rows(geom, algorithm)
    elementwise = {"fwd": spec.icg == 1, "bwd_data": spec.ocg == 1,
                   "bwd_weights": spec.icg == spec.ocg == 1}[direction] and algorithm == "taps"
    parallel = spec.flops >= PARALLEL_FLOPS and not elementwise
    if parallel:
        total = spec.mb * img
        if direction == "bwd_weights":
            # whole images, ceil(mb / 2) per block (an odd batch too); one image in slabs
            least = -(-spec.mb // MIN_BLOCKS_WEIGHTS) * img if spec.mb > 1 else -(-total // MIN_BLOCKS_WEIGHTS)
            if spec.mb > 1 and algorithm == "taps" and pointwise_spec(spec):
                rows_target = max(rows_target, least)  # views, nothing packed: no row cap
        else:
            least = -(-total // MIN_BLOCKS)
        if total <= rows_target and weight_chunks(spec, direction, algorithm) > 1:
            rows_target = total     # one row block within the cap, the channels split: chunks first
        else:
            rows_target = min(rows_target, max(MIN_BLOCK_ROWS, least))
            if total <= rows_target:              # still one block: split it in two
                half = -(-spec.mb // 2) * img if 2 * img <= total else -(-total // 2)
                rows_target = max(MIN_BLOCK_ROWS // 8, half)
    if img <= rows_target:
        per = max(1, rows_target // max(1, img))
        return (-(-spec.mb // -(-spec.mb // per)) if spec.mb else per), 1    # even blocks
    slabs = -(-extent // max(1, min(extent, rows_target // max(1, row_len))))
    if parallel and slabs > 1 and (spec.mb * slabs) % 2:
        slabs = slabs + 1 if slabs == 3 else slabs - 1
    return 1, slabs


def _bounds(extent: int, slabs: int) -> list[int]:
    """Row boundaries of ``slabs`` balanced slabs of ``extent`` rows (sizes differ by <= 1)."""
    return [extent * i // slabs for i in range(slabs + 1)]


def _make_blocks(geom: PhaseGeometry, direction: str, algorithm: str, per: int, slabs: int) -> list[Block]:
    spec = geom.spec
    extent, _ = _extent(geom, direction, algorithm)
    if slabs <= 1:
        return [Block(n0, min(per, spec.mb - n0), 0, extent, True) for n0 in range(0, spec.mb, per)]
    cuts = _bounds(extent, min(slabs, extent))
    return [Block(n, 1, r0, r1, False) for n in range(spec.mb) for r0, r1 in zip(cuts, cuts[1:])]


def _result(shape: tuple[int, ...], dtype, zeroed: bool) -> tuple[np.ndarray, bool]:
    """A result array and whether it holds zeros (``results.take``; the tests poison the
    ones that do not)."""
    return results.take(shape, dtype, zeroed)


def _block_src_rows(geom: PhaseGeometry, b: Block) -> slice:
    """The input rows (spatial axis 0) of a ``taps`` data-gradient block: phase row ``q``
    holds input rows ``q*s + r - pb`` for ``0 <= r < s``, so the blocks' consecutive phase
    rows ``[r0, r1)`` cut the input rows at ``r*s - pb``; the first and last blocks of an
    image reach its ends (rows no window reads included)."""
    spec = geom.spec
    s, pb, size = spec.strides[0], spec.pads_begin[0], spec.src[0]
    lo = 0 if b.r0 == 0 else min(size, max(0, b.r0 * s - pb))
    hi = size if b.r1 >= geom.q[0] else min(size, max(0, b.r1 * s - pb))
    return slice(lo, hi)


def _grid_rows(geom: PhaseGeometry, b: Block) -> int:
    """Axis-0 rows of a ``taps`` block's flat grid (with the halo it needs)."""
    if b.whole:
        return geom.q[0]
    return (b.r1 - b.r0) + geom.max_sh[0]


def workspace_bytes(geom: PhaseGeometry, direction: str, algorithm: str, b: Block, itemsize: int) -> int:
    """Bytes of temporaries one block allocates (the quantity the workspace cap bounds).

    Counted generously: every buffer a block allocates, a temporary for one product (used
    when a product cannot accumulate in place) and the per-call weight layouts.
    """
    spec = geom.spec
    c, o, t = spec.ic, spec.oc, len(geom.taps)
    weights = t * spec.icg * o
    if algorithm == "im2col":
        rows = b.nb * (b.r1 - b.r0) * _extent(geom, direction, algorithm)[1]
        cols = t * c * rows                       # the column matrix (col2im: Z)
        padded = b.nb * c * math.prod(_padded_rows(spec, b))
        if direction == "bwd_weights":            # a block's partial, and the running total
            elems = padded + cols + o * rows + 2 * weights
        else:                                     # + the block's result rows, weight layouts
            elems = padded + cols + 2 * o * rows + 2 * weights
        if direction == "bwd_data" and any(st > 1 for st in spec.strides):   # phase grids
            dst_b = (b.r1 - b.r0,) + spec.dst[1:]
            q = [n + (k - 1) * d // st for n, k, d, st in zip(dst_b, spec.kernel, spec.dilations, spec.strides)]
            elems += len(geom.phases) * b.nb * c * math.prod(q)
    else:
        rows = b.nb * _grid_rows(geom, b) * geom.row_len
        if direction == "fwd":
            elems = len(geom.phases) * rows * c + 2 * rows * o + 2 * weights
        elif direction == "bwd_weights":
            elems = len(geom.phases) * rows * c + rows * o + 2 * weights
        else:
            elems = (geom.max_off + rows) * o + 2 * rows * c + 2 * weights
    return int(elems) * itemsize


def plan(geom: PhaseGeometry, direction: str, algorithm: str, itemsize: int,
         workspace_limit: int, rows_target: int) -> list[Block]:
    """Blocks for one call: the problem decides them; the cap only shrinks them to fit.

    Shrinking halves the images per block first (keeping them balanced), then doubles the
    slabs per image.
    """
    per, slabs = _natural(geom, direction, algorithm, rows_target)
    extent, _ = _extent(geom, direction, algorithm)
    while True:
        blocks = _make_blocks(geom, direction, algorithm, per, slabs)
        worst = max((workspace_bytes(geom, direction, algorithm, b, itemsize) for b in blocks), default=0)
        if worst <= workspace_limit:
            return blocks
        if per > 1:
            per //= 2
            per = -(-geom.spec.mb // -(-geom.spec.mb // per))
        elif slabs < extent:
            slabs = min(extent, 2 * slabs)
        else:
            raise WorkspaceError(
                f"{direction}: the workspace limit ({workspace_limit} bytes) is too small for the "
                f"smallest tile of problem {geom.spec} ({worst} bytes); raise it with "
                f"convgrad.set_workspace_limit()")


# ---------------------------------------------------------------------------------------
# Scratch buffers
# ---------------------------------------------------------------------------------------

# Each thread keeps its packing buffers between blocks and calls, up to this size each, in
# three slots: "a" the packed src operand (phase grids, column matrix; bwd_data: its
# result rows), "b" the packed diff_dst or the forward result rows, "c" im2col's padded
# block (so at most 3 * SCRATCH_KEEP bytes per thread stay allocated between calls). A
# fresh buffer of a few MiB is mapped by the allocator and faulted in page by page on its
# first write (the kernel zeroes every page), and whether it is depends on what the
# process freed before (glibc's mmap and trim thresholds move). Measured (1 thread,
# float32, ms, weights gradients, first problem of a fresh process, fresh / reused):
# wavenet 32 -> 32 channels mb32 (11 blocks of 1 MiB grids) 19.2 / 7.6, mb512 19.7 / 9.3;
# resnet_50 res2a_branch2b 18-19 / 14.2. Once the process has freed larger buffers
# both run alike.
SCRATCH_KEEP = 16 << 20       # bytes


class _Scratch(threading.local):
    def __init__(self) -> None:
        self.bufs: dict[str, np.ndarray] = {}
        self.generation = 0


_SCRATCH = _Scratch()
_GENERATION = [0]      # bumped by release_scratch; a thread drops older buffers on next use


def release_scratch() -> None:
    """Drop the block buffers every thread keeps: the calling thread's now, the pool
    threads' at their next block (so the next call allocates, and pays for, fresh ones:
    the benchmark's peak-memory measurement uses this)."""
    _GENERATION[0] += 1
    _SCRATCH.bufs.clear()
    _SCRATCH.generation = _GENERATION[0]


def _scratch(slot: str, shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialised C-contiguous array for a temporary of one block that never outlives
    it (never a result or a block's returned partial): this thread's buffer for ``slot``,
    grown when too small; larger than ``SCRATCH_KEEP``, a plain ``np.empty``."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > SCRATCH_KEEP:
        return np.empty(shape, dtype=dtype)
    if _SCRATCH.generation != _GENERATION[0]:
        _SCRATCH.bufs.clear()
        _SCRATCH.generation = _GENERATION[0]
    bufs = _SCRATCH.bufs
    buf = bufs.get(slot)
    if buf is None or buf.nbytes < nbytes:
        bufs.pop(slot, None)
        buf = None                                 # free the old one before allocating
        raw = np.empty(nbytes + 64, dtype=np.uint8)
        start = -raw.ctypes.data % 64                  # 64-byte aligned, like a cache line
        buf = bufs[slot] = raw[start:start + nbytes]
    return buf[:nbytes].view(dtype).reshape(shape)


# ---------------------------------------------------------------------------------------
# Data movement between canonical NC* arrays and channel-major tiles
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


def _zero_outside(arr: np.ndarray, first_axis: int, box: tuple[slice, ...]) -> None:
    """Zero every element of ``arr`` outside ``box`` (slices of the axes from ``first_axis``)."""
    for j, sl in enumerate(box):
        ax = first_axis + j
        pre = (slice(None),) * ax
        if sl.start > 0:
            arr[pre + (slice(0, sl.start),)] = 0
        if sl.stop < arr.shape[ax]:
            arr[pre + (slice(sl.stop, None),)] = 0


def _src_grid(geom: PhaseGeometry, src: np.ndarray, b: Block, rows0: int, dtype) -> np.ndarray:
    """Channel-major phase grids of ``src`` for a block: (phases, C, nb, rows0, *q[1:])."""
    spec = geom.spec
    out = _scratch("a", (len(geom.phases), spec.ic, b.nb, rows0) + geom.q[1:], dtype)
    q_lo = (b.r0,) + (0,) * (spec.nsp - 1)
    q_hi = (b.r0 + rows0,) + geom.q[1:]
    nsl = slice(b.n0, b.n0 + b.nb)
    for i, r in enumerate(geom.phases):
        sl = _phase_slices(spec, r, q_lo, q_hi)
        if sl is None:
            out[i] = 0
            continue
        _zero_outside(out[i], 2, sl[0])
        out[(i, slice(None), slice(None)) + sl[0]] = src[(nsl, slice(None)) + sl[1]].swapaxes(0, 1)
    return out


def _src_flat(geom: PhaseGeometry, src: np.ndarray, b: Block, rows0: int, dtype) -> np.ndarray:
    """A block's phase grids flat: (phases, G, Cg, nb * rows0 * row_len); ``src`` itself
    when it is the one phase grid (``_rows_in_place``), else packed by ``_src_grid``."""
    if _unit_phase(geom.spec):
        view = _rows_in_place(geom, src, b, b.r0, rows0, geom.q, geom.spec.groups, dtype)
        if view is not None:
            return view[None]
    return _src_grid(geom, src, b, rows0, dtype).reshape(len(geom.phases), geom.spec.groups, geom.spec.icg, -1)


def _dst_grid(geom: PhaseGeometry, ddst: np.ndarray, b: Block, rows0: int, first: int, dtype,
              front: int = 0) -> np.ndarray:
    """``diff_dst`` rows ``[first, first + rows0)`` of axis 0 on the wide grid, channel-major
    and flat: (O, front + nb * rows0 * row_len), zero in front and outside diff_dst."""
    spec = geom.spec
    oc = ddst.shape[1]                        # spec.oc, or a chunk of the output channels
    out = _scratch("b", (oc, front + b.nb * rows0 * geom.row_len), dtype)
    out[:, :front] = 0
    grid = out[:, front:].reshape((oc, b.nb, rows0) + geom.q[1:])
    lo, hi = max(first, 0), min(first + rows0, spec.dst[0])
    if hi <= lo:
        grid[...] = 0
        return out
    box = (slice(lo - first, hi - first),) + tuple(slice(0, o) for o in spec.dst[1:])
    _zero_outside(grid, 2, box)
    grid[(slice(None), slice(None)) + box] = ddst[
        (slice(b.n0, b.n0 + b.nb), slice(None), slice(lo, hi)) + box[1:]].swapaxes(0, 1)
    return out


def _padded_rows(spec: ConvSpec, b: Block) -> tuple[int, ...]:
    """Extent of the padded input an im2col block reads: output rows [r0, r1) of axis 0 and
    all of the others; padded coordinate ``x`` of axis 0 starts at ``r0 * s``."""
    ek = [d * (k - 1) + 1 for k, d in zip(spec.kernel, spec.dilations)]
    ext = [(b.r1 - b.r0 - 1) * spec.strides[0] + ek[0]]
    ext += [(o - 1) * s + e for o, s, e in zip(spec.dst[1:], spec.strides[1:], ek[1:])]
    return tuple(ext)


def _padded_box(spec: ConvSpec, b: Block):
    """(box in the padded block, src slices) of the real input inside it, or None."""
    ext = _padded_rows(spec, b)
    box, srcsl = [], []
    for j in range(spec.nsp):
        start = b.r0 * spec.strides[0] if j == 0 else 0          # padded coordinate of element 0
        lo = max(0, spec.pads_begin[j] - start)
        hi = min(ext[j], spec.pads_begin[j] + spec.src[j] - start)
        if hi <= lo:
            return None
        box.append(slice(lo, hi))
        srcsl.append(slice(lo + start - spec.pads_begin[j], hi + start - spec.pads_begin[j]))
    return tuple(box), tuple(srcsl)


def _windows(spec: ConvSpec, padded: np.ndarray) -> np.ndarray:
    """All windows of a padded block as one view: (nb, C, *dst_block, *kernel)."""
    # Element (n, c, y, k) is padded[n, c, y*s + k*d]: one strided view (built directly:
    # sliding_window_view and its slicing cost ~40 us a block, as_strided ~15).
    ext, st = padded.shape[2:], padded.strides[2:]
    dst_b = tuple((e - d * (k - 1) - 1) // s + 1 for e, k, d, s in zip(ext, spec.kernel, spec.dilations, spec.strides))
    shape = padded.shape[:2] + dst_b + tuple(spec.kernel)
    strides = (padded.strides[:2] + tuple(s * b for s, b in zip(spec.strides, st))
               + tuple(d * b for d, b in zip(spec.dilations, st)))
    if not padded.flags.c_contiguous:
        return np.lib.stride_tricks.as_strided(padded, shape, strides, writeable=False)
    view = np.ndarray(shape, padded.dtype, buffer=padded, strides=strides)
    view.flags.writeable = False
    return view


def _rows_major(spec: ConvSpec, b: Block) -> bool:
    """Column matrices are stored rows-major, (rows, G, K), when the kernel's innermost
    axis is longer than the block's innermost output axis (huge kernels, tiny outputs: the
    copies then run along kernel rows), else K-major, (G, K, rows)."""
    inner = (b.r1 - b.r0) if spec.nsp == 1 else spec.dst[-1]
    return spec.kernel[-1] > inner


def _loop_axes(spec: ConvSpec) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(strides, dilations, pads_begin) on the compiled loops' three spatial axes (pure):
    fewer axes come first as axes of size 1 (stride and dilation 1, no padding)."""
    one = (1,) * (3 - spec.nsp)
    return one + spec.strides, one + spec.dilations, (0,) * len(one) + spec.pads_begin


def _jit_cols(spec: ConvSpec, src: np.ndarray, b: Block, dtype) -> bool:
    """Whether ``_spread_jit.im2col`` builds this block's column matrix: numba there, a
    K-major matrix (``_rows_major`` keeps NumPy's copy along kernel rows), at most three
    spatial axes, and ``src`` a C-contiguous float32 array, the compute type (else NumPy's
    copy converts or gathers it). float32 only, the type the copy was measured to pay in:
    a float64 call neither imports numba nor compiles a second specialization for it (two
    300 MiB Dask workers of the tests' float64 weight gradient, whose blocks had never
    loaded numba, went past their pause threshold compiling it and the call never
    finished)."""
    return (spec.nsp <= 3 and not _rows_major(spec, b) and src.dtype == np.dtype(dtype)
            and np.dtype(dtype) == np.float32 and src.flags.c_contiguous
            and _spread() is not None)


def _src_cols(spec: ConvSpec, src: np.ndarray, b: Block, dtype, reverse: bool = False, c0: int = 0) -> np.ndarray:
    """Exact column matrix of a block as a (G, Cg * T, rows) view of channels
    ``[c0, c0 + spec.ic)`` of ``src``: one copy of the block's windows, no loop over taps
    (compiled, ``_jit_cols``; else NumPy's copy of the sliding-window view of a padded
    block). ``reverse``: every window read back to front (tap ``j`` holds the element of
    tap ``K - 1 - j``)."""
    if _jit_cols(spec, src, b, dtype):
        rows = b.nb * (b.r1 - b.r0) * math.prod(spec.dst[1:])
        cols = _scratch("a", (spec.ic, math.prod(spec.kernel) * rows), dtype)
        one = (1,) * (3 - spec.nsp)
        _spread().im2col(src.reshape(src.shape[:2] + one + src.shape[2:]), cols.reshape(-1), spec.ic,
                         one + spec.kernel, b.nb, one + (b.r1 - b.r0,) + spec.dst[1:], b.n0, c0, reverse,
                         (0,) * len(one) + (b.r0,) + (0,) * (spec.nsp - 1), *_loop_axes(spec))
        return cols.reshape(spec.groups, -1, rows)
    src = src[:, c0:c0 + spec.ic]
    padded = _scratch("c", (b.nb, spec.ic) + _padded_rows(spec, b), dtype)
    inside = _padded_box(spec, b)
    if inside is None:
        padded[...] = 0
    else:
        _zero_outside(padded, 2, inside[0])
        padded[(slice(None), slice(None)) + inside[0]] = src[(slice(b.n0, b.n0 + b.nb), slice(None)) + inside[1]]
    win = _windows(spec, padded)                                  # (nb, C, *dst_b, *k)
    if reverse:
        win = win[(Ellipsis,) + (slice(None, None, -1),) * spec.nsp]
    win = win.reshape((b.nb, spec.groups, spec.icg) + win.shape[2:])
    nsp, g = spec.nsp, spec.groups
    rows = b.nb * math.prod(win.shape[3:3 + nsp])
    k_axes = tuple(range(3 + nsp, 3 + 2 * nsp))
    y_axes = tuple(range(3, 3 + nsp))
    if _rows_major(spec, b):
        order = (0,) + y_axes + (1, 2) + k_axes                   # (nb, *dst_b, G, Cg, *k)
        cols = _scratch("a", tuple(win.shape[i] for i in order), dtype)
        cols[...] = win.transpose(order)
        return cols.reshape(rows, g, -1).transpose(1, 2, 0)
    order = (1, 2) + k_axes + (0,) + y_axes                       # (G, Cg, *k, nb, *dst_b)
    cols = _scratch("a", tuple(win.shape[i] for i in order), dtype)
    cols[...] = win.transpose(order)
    return cols.reshape(g, -1, rows)


def _col2im(spec: ConvSpec, z: np.ndarray, padded: np.ndarray) -> None:
    """``padded[window(y, k)] += z[k, y]`` for every output ``y`` and tap ``k``.

    z: (G, Cg, *kernel, nb, *dst_block); padded: (nb, C, *_padded_rows) (zeroed).
    Per axis the loop runs over taps ``k`` (each tap's windows are distinct elements) or
    over classes ``y mod m`` with ``m = ceil(ek / s)`` (windows ``m`` outputs apart never
    overlap) when that is at least 4x shorter; every iteration is one add over a
    non-overlapping view.
    """
    nsp, g, cg = spec.nsp, spec.groups, spec.icg
    nb = padded.shape[0]
    item = padded.itemsize
    st = padded.strides
    dst_b = z.shape[3 + nsp:]
    plans = []
    for j in range(nsp):
        s, d, k = spec.strides[j], spec.dilations[j], spec.kernel[j]
        m = -(-(d * (k - 1) + 1) // s)
        classes = min(m, dst_b[j])
        # Tap loops add along contiguous output rows; class loops add along the kernel axis,
        # so they are taken only where they save most of the iterations (huge kernels).
        plans.append(("class", classes, m) if 4 * classes <= k else ("tap", k))
    for idx in itertools.product(*(range(p[1]) for p in plans)):
        offset = 0
        shape, strides = [nb, g, cg], [st[0], cg * st[1], st[1]]
        zsel: list = [slice(None), slice(None)]
        ksel, ysel, kshape, kstrides, yshape, ystrides = [], [], [], [], [], []
        empty = False
        for j, (plan_j, i) in enumerate(zip(plans, idx)):
            s, d = spec.strides[j], spec.dilations[j]
            sj = st[2 + j]
            if plan_j[0] == "tap":                       # tap i: positions y*s + i*d for all y
                offset += i * d * sj
                ksel.append(i)
                ysel.append(slice(None))
                yshape.append(dst_b[j])
                ystrides.append(s * sj)
            else:                                        # class i: y = i + m*u, all taps
                m = plan_j[2]
                u = -(-(dst_b[j] - i) // m)
                if u <= 0:
                    empty = True
                    break
                offset += i * s * sj
                ksel.append(slice(None))
                ysel.append(slice(i, None, m))
                yshape.append(u)
                ystrides.append(m * s * sj)
                kshape.append(spec.kernel[j])
                kstrides.append(d * sj)
        if empty:
            continue
        kept = [j for j in range(nsp) if plans[j][0] == "class"]
        part = z[tuple(zsel) + tuple(ksel) + (slice(None),) + tuple(ysel)]     # (G, Cg, *k_kept, nb, *y)
        nk = len(kept)
        part = part.transpose((2 + nk, 0, 1) + tuple(range(3 + nk, 3 + nk + nsp)) + tuple(range(2, 2 + nk)))
        base = padded.reshape(-1)[offset // item:]
        view = np.lib.stride_tricks.as_strided(base, tuple(shape + yshape + kshape),
                                               tuple(strides + ystrides + kstrides), writeable=True)
        view += part


def _scatter_layout(spec: ConvSpec, b: Block) -> str:
    """How a block of the col2im data gradient lays out Z and scatters it (pure).

    * ``rows``: huge kernels on tiny outputs (``_rows_major``), Z rows-major, ``_col2im``.
    * ``classes``: some axis loops over window classes (kernels far longer than the
      stride, ``_col2im``), Z K-major.
    * ``channels``: at least 4x more input channels per group than the block's innermost
      output axis (deep layers, small images), and not far more output channels than
      output positions, Z rows-major with the taps outermost, scattered channel-last by
      ``_col2im_channels_last``: each add runs along the channels.
    * ``channels_ct``: as ``channels`` but with far more output channels than positions
      (heavy weights): Z rows-major in the weights' own (channel, tap) order, so the
      weights need no transposing copy, scattered channel-last reading Z with a stride of
      T along the channels.
    * ``phases``: otherwise, Z K-major, scattered by ``_col2im_phases`` along the output
      rows (stride-phase grids, so the adds are unit-stride even with strides).

    Measured (one thread, adds only): 3d_unet conv_7 (256 channels, 5x6x6 outputs, 27
    taps) 4.8 ms channel-major, 0.7 ms channel-last; resnet_50 conv1 (3 channels, 4 x
    112x112 outputs, 7x7 stride 2) 8.1 ms strided, 4.5 ms on phase grids; 64 channels on
    2 x 56x56 outputs 2.1 ms channel-major, 3.3 ms channel-last; 3d_unet conv_8 (256
    channels, a 2x5x5 slab, 512 output channels) 1.91 ms on phase grids, 0.79 channel-last
    with Z in (channel, tap) order, 0.25 in (tap, channel) order (AMD VM), where the
    products cost the same in either order (4.9-5.1 ms) but the (tap, channel) weights a
    transposing copy of 14 MB.
    """
    if _rows_major(spec, b):
        return "rows"
    dst_b = (b.r1 - b.r0,) + spec.dst[1:]
    for j in range(spec.nsp):
        s, d, k = spec.strides[j], spec.dilations[j], spec.kernel[j]
        if 4 * min(-(-(d * (k - 1) + 1) // s), dst_b[j]) <= k:
            return "classes"
    # ``channels`` needs the weights in (T, Cg) order: a copy that costs about what the
    # scatter saves once the weights outgrow twice Z (3d_unet conv_8, 100 output positions,
    # 512 output channels: 8.5 ms channel-last, 7.6 on phase grids), so heavier weights take
    # ``channels_ct``, which reads them as they are.
    if spec.icg >= 4 * dst_b[-1]:
        return "channels" if 2 * spec.mb * math.prod(spec.dst) >= spec.ocg else "channels_ct"
    return "phases"


def _tap_windows(spec: ConvSpec, dst_b: tuple[int, ...]):
    """Per tap (row-major over the kernel): the slices of a padded block it writes,
    positions ``y*s + k*d`` for the block's outputs ``y``."""
    for kk in itertools.product(*(range(k) for k in spec.kernel)):
        yield tuple(slice(i * d, i * d + (n - 1) * s + 1, s)
                    for i, d, s, n in zip(kk, spec.dilations, spec.strides, dst_b))


def _col2im_channels_last(spec: ConvSpec, z: np.ndarray, padded: np.ndarray) -> None:
    """``padded[n, window(y, k), c] += z[n, y, k, c]``, channel-last.

    z: (nb, *dst_block, G, T, Cg), taps row-major; padded: (nb, *_padded_rows, G, Cg)
    (zeroed). One add per tap over a (nb, *dst_block, G, Cg) view whose innermost axis
    is the channels, contiguous on both sides, whatever the strides.
    """
    dst_b = z.shape[1:1 + spec.nsp]
    for i, win in enumerate(_tap_windows(spec, dst_b)):
        padded[(slice(None),) + win] += z[..., i, :]


def _col2im_phases(spec: ConvSpec, z: np.ndarray, padded: np.ndarray) -> None:
    """``padded[window(y, k)] += z[k, y]`` through stride-phase grids (same adds, same order
    per element as ``_col2im``'s tap loop, so the same rounding).

    z: (G, Cg, *kernel, nb, *dst_block); padded: (nb, C, *_padded_rows) (zeroed). Tap
    ``k`` writes padded position ``y*s + k*d = (y + sh)*s + r`` with ``k*d = sh*s + r``:
    cell ``y + sh`` of phase ``r``. So every tap is a unit-stride shifted add into the
    grid of its phase (``Q = dst_block + (k - 1)*d // s`` cells per axis, zeroed), and each
    phase is then copied into the padded block once, ``padded[r::s] = grid_r``: the
    strided writes happen once per element instead of once per tap. With stride 1 the
    one phase grid is the padded block itself.
    """
    nsp, g, cg = spec.nsp, spec.groups, spec.icg
    nb = padded.shape[0]
    ext = padded.shape[2:]
    dst_b = z.shape[3 + nsp:]
    view = padded.reshape((nb, g, cg) + ext)
    if all(s == 1 for s in spec.strides):
        grids = None
    else:
        q = tuple(n + (k - 1) * d // s for n, k, d, s in zip(dst_b, spec.kernel, spec.dilations, spec.strides))
        grids = {}
    order = (2, 0, 1) + tuple(range(3, 3 + nsp))
    for kk in itertools.product(*(range(k) for k in spec.kernel)):
        part = z[(slice(None), slice(None)) + kk].transpose(order)              # (nb, G, Cg, *dst_b)
        if grids is None:
            win = tuple(slice(a * d, a * d + n) for a, d, n in zip(kk, spec.dilations, dst_b))
            view[(slice(None),) * 3 + win] += part
            continue
        r = tuple(a * d % s for a, d, s in zip(kk, spec.dilations, spec.strides))
        if r not in grids:
            grids[r] = np.zeros((nb, g, cg) + q, dtype=padded.dtype)
        sh = tuple(a * d // s for a, d, s in zip(kk, spec.dilations, spec.strides))
        grids[r][(slice(None),) * 3 + tuple(slice(h, h + n) for h, n in zip(sh, dst_b))] += part
    for r, grid in (grids or {}).items():
        cells = tuple(min(qq, -(-(e - rr) // s)) for qq, e, rr, s in zip(q, ext, r, spec.strides))
        out = tuple(slice(rr, rr + (c - 1) * s + 1, s) for rr, c, s in zip(r, cells, spec.strides))
        view[(slice(None),) * 3 + out] = grid[(slice(None),) * 3 + tuple(slice(0, c) for c in cells)]


def _rows_in_place(geom: PhaseGeometry, a: np.ndarray, b: Block, first: int, rows0: int, grid: tuple[int, ...],
                   groups: int, dtype) -> np.ndarray | None:
    """Rows ``[first, first + rows0)`` of axis 0 of image ``b.n0`` of a canonical array as a
    flat (G, C/G, rows0 * row_len) *view*, when that is exactly a block's wide grid: one
    image, every spatial axis after the first as long as the grid's, the rows inside the
    array, compute type, C-contiguous. Else None (the grid is then packed).

    For ``src`` (stride 1, no padding: one phase whose cell ``q`` is input index ``q``) this
    is the phase grid itself; for ``diff_dst`` when no axis after the first has a halo; for
    the results the rows they are written to. Channels are ``prod(spatial)`` apart, which
    BLAS reads as the leading dimension of a matrix."""
    if (b.nb != 1 or a.dtype != dtype or not a.flags.c_contiguous or first < 0
            or first + rows0 > a.shape[2] or tuple(a.shape[3:]) != grid[1:]):
        return None
    return a[b.n0, :, first:first + rows0].reshape(groups, a.shape[1] // groups, -1)


def _unit_phase(spec: ConvSpec) -> bool:
    """Stride 1 and no padding at the front: the one phase grid is the input itself."""
    return all(s == 1 for s in spec.strides) and not any(spec.pads_begin)


def _dst_rows(spec: ConvSpec, ddst: np.ndarray, b: Block, dtype, o0: int = 0, o1: int | None = None) -> np.ndarray:
    """``diff_dst`` of a block, channel-major and exact: (O, nb, r1 - r0, *dst[1:]), output
    channels ``[o0, o1)`` (all by default). One image in the compute type is a view (its
    channels' rows, BLAS's leading dimension apart), else a copy."""
    o1 = spec.oc if o1 is None else o1
    part = ddst[slice(b.n0, b.n0 + b.nb), o0:o1, b.r0:b.r1]
    if b.nb == 1 and part.dtype == dtype and part[0, 0].flags.c_contiguous and part.strides[-1] == part.itemsize:
        return part.swapaxes(0, 1)
    out = _scratch("b", (o1 - o0, b.nb) + part.shape[2:], dtype)
    out[...] = part.swapaxes(0, 1)
    return out


# ---------------------------------------------------------------------------------------
# Products
# ---------------------------------------------------------------------------------------

def _product(a: np.ndarray, b: np.ndarray, out: np.ndarray, accumulate: bool, tmp: np.ndarray | None) -> None:
    """``out (+)= a @ b`` for (G, M, K) @ (G, K, N). K = 1 (depthwise) is an element-wise
    multiply-add, run over channel chunks small enough to stay in cache (``tmp``, the
    shape of ``out``, holds a chunk's product when accumulating)."""
    if a.shape[-1] != 1:
        matmul_into(a, b, out, accumulate)
        return
    g, m, n = out.shape
    step = max(1, ELEMENTWISE_CHUNK // max(1, m * n))
    for g0 in range(0, g, step):
        gs = slice(g0, g0 + step)
        if accumulate:
            t = tmp[gs]
            np.multiply(a[gs], b[gs], out=t)
            out[gs] += t
        else:
            np.multiply(a[gs], b[gs], out=out[gs])


def _sum_products(pairs, out: np.ndarray, tmp: np.ndarray | None = None) -> None:
    """``out = sum a @ b`` over the pairs; BLAS products accumulate in place (``beta = 1``),
    only element-wise ones need a temporary (``tmp``, the shape of ``out``, or allocated
    here when needed)."""
    for i, (a, b) in enumerate(pairs):
        if i == 1 and tmp is None and a.shape[-1] == 1:
            tmp = np.empty_like(out)
        _product(a, b, out, i > 0, tmp)


def _weights(spec: ConvSpec, weights: np.ndarray, order: tuple[int, ...], dtype) -> np.ndarray:
    """Weights (O, Cg, *K) viewed as (G, Og, Cg, T), permuted by ``order``.

    With one tap and the compute type already, a permuted *view* (every (Og, Cg) matrix
    is then row- or column-major, which BLAS reads in place: transposing a 2048 x 1024
    matrix cost more than the product); otherwise a contiguous copy."""
    t = math.prod(spec.kernel)
    w = weights.reshape(spec.groups, spec.ocg, spec.icg, t)
    if t == 1 and w.dtype == dtype and weights.flags.c_contiguous:
        return w.transpose(order)
    return np.ascontiguousarray(w.transpose(order), dtype=dtype)


# Pointwise products multiply the canonical arrays' rows in place: one image's rows at a
# time when an image has enough rows for an efficient product (smaller images are packed
# instead), and all images of a block at once when an image is a single position.
# Measured (2 threads, float32): per-image products win from 14x14 images on (512 -> 512,
# mb8: 7.0 vs 7.5 ms bwd_weights; 1-D 812 rows: 1.8 vs 2.1 ms), packing wins at 7x7.
POINTWISE_MIN_ROWS = 128


def pointwise_spec(spec: ConvSpec) -> bool:
    """1x1 kernel, stride 1, no padding, and one position or large images (pure): the
    problem ``taps`` runs as plain products of the canonical arrays, with no copies."""
    rows = math.prod(spec.src)
    return unit_1x1(spec) and (rows >= POINTWISE_MIN_ROWS or rows == 1)


def unpadded_1x1(spec: ConvSpec) -> bool:
    """1x1 kernel, no padding, any stride (pure)."""
    return all(k == 1 for k in spec.kernel) and not any(spec.pads_begin) and not any(spec.pads_end)


def sampled_cells(spec: ConvSpec) -> tuple[slice, ...]:
    """Index of the (N, C, *spatial) cells an unpadded 1x1 layer's outputs read: every
    ``s``-th cell of each spatial axis from 0, one per output (pure)."""
    return (slice(None), slice(None)) + tuple(slice(0, o * s, s) for o, s in zip(spec.dst, spec.strides))


def unit_1x1(spec: ConvSpec) -> bool:
    """1x1 kernel, stride 1, no padding (pure)."""
    return unpadded_1x1(spec) and all(s == 1 for s in spec.strides)


# Small ungrouped stride-1 unpadded 1x1 problems (below PARALLEL_FLOPS, so one thread runs
# them anyway, and below SMALL_POINTWISE_MAX_FLOPS) are one NumPy product of the canonical
# arrays, with no plan, blocks or scratch. With P positions per image, X (N, C, P),
# dY (N, O, P) and W (O, C):
#   fwd        Y_n  = W @ X_n              (P == 1: Y  = X @ W^T over the batch's rows)
#   bwd_data   dX_n = W^T @ dY_n           (P == 1: dX = dY @ W)
#   bwd_weights dW  = dY_0 @ X_0^T (N == 1; P == 1: dW = dY^T @ X over the batch)
# The planned path spent ~120 us around a 30 us product (32 -> 32 channels, 842
# positions, AVX2 VM): its plan, block hand-off and a ctypes BLAS call (~15 us alone).
SMALL_POINTWISE_MAX_FLOPS = PARALLEL_FLOPS


def small_pointwise(spec: ConvSpec, direction: str, a: np.ndarray, b: np.ndarray, dtype) -> np.ndarray | None:
    """The result of a small ungrouped stride-1 unpadded 1x1 problem as one product, or
    None where the planned path runs it (``a``, ``b``: the canonical operands of
    ``direction`` in its argument order)."""
    flops = spec.flops
    if spec.groups != 1 or flops >= PARALLEL_FLOPS or flops >= SMALL_POINTWISE_MAX_FLOPS or not unit_1x1(spec):
        return None
    if a.dtype != dtype or b.dtype != dtype or not (a.flags.c_contiguous and b.flags.c_contiguous):
        return None
    n, p = spec.mb, math.prod(spec.src)
    if direction == "bwd_weights" and n > 1 and p > 1:
        return None
    with threads.pinned_blas():
        if direction == "fwd":                               # a: X, b: W
            w = b.reshape(spec.oc, spec.ic)
            out = a.reshape(n, spec.ic) @ w.T if p == 1 else np.matmul(w, a.reshape(n, spec.ic, p))
            return out.reshape(spec.dst_shape)
        if direction == "bwd_data":                          # a: dY, b: W
            w = b.reshape(spec.oc, spec.ic)
            out = a.reshape(n, spec.oc) @ w if p == 1 else np.matmul(w.T, a.reshape(n, spec.oc, p))
            return out.reshape(spec.src_shape)
        x, dy = a.reshape(n, spec.ic, p), b.reshape(n, spec.oc, p)  # a: X, b: dY
        out = dy[:, :, 0].T @ x[:, :, 0] if p == 1 else dy[0] @ x[0].T
        return out.reshape(spec.weights_shape)


def _in_place_on_pool(spec: ConvSpec) -> bool:
    """Pointwise products read in place (images of at least POINTWISE_MIN_ROWS positions)
    in a problem large enough for the thread pool (pure)."""
    return pointwise_spec(spec) and math.prod(spec.src) >= POINTWISE_MIN_ROWS and spec.flops >= PARALLEL_FLOPS


def _pointwise(spec: ConvSpec, *arrays: np.ndarray, dtype) -> bool:
    """``pointwise_spec`` with every input already in the compute type."""
    return pointwise_spec(spec) and all(a.dtype == dtype for a in arrays)


def _pointwise_mats(a: np.ndarray, b: Block, groups: int) -> list[np.ndarray]:
    """A block of a canonical array as (G, C/G, rows) matrices, views when ``a`` is
    C-contiguous: one per image (rows: its positions [r0, r1) of axis 0 on), or, when an
    image is one position, one for the whole block (rows: its images; column-major)."""
    part = a[b.n0:b.n0 + b.nb, :, b.r0:b.r1]
    if part[0, 0].size == 1:
        return [part.reshape(b.nb, groups, a.shape[1] // groups).transpose(1, 2, 0)]
    part = part.reshape(b.nb, groups, a.shape[1] // groups, -1)
    return [part[i] for i in range(b.nb)]


# The in-place pointwise products of a forward (Y_n = W @ X_n) or data gradient
# (dX_n = W^T @ dY_n) on images of fewer than POINTWISE_ITEM_MAX_POSITIONS positions run
# one image per item, and an odd batch's last image (one image too) as two items, each
# half of its result channels (rows of W or W^T, the same K reduction): blocks of several
# images had left one thread 11 images of 19 (blocks of 4, 4, 4, 4, 3) or 5 of 9, and one
# image's two row slabs made narrow products. Every item computes whole dot products over
# the same K, so results do not depend on the threads. In-process medians (2 threads,
# float32, 8 rounds of 5 calls, 64 MB of other traffic between rounds), items / blocks,
# data gradients: mobilenet conv8 (512 <- 512, 14^2, mb9) 0.88, conv7 (mb19) 0.83, conv6
# (256, 28^2, mb9) 0.88, conv5 (128 <- 256, mb19) 0.85, resnet_50 res4b_branch2a (mb9)
# 0.87, res3b_branch2a 0.87, res3a_branch2c 0.88; one image of 512 channels at 28^2 0.89.
# Five alternating pairs of harness runs: 0.82-0.96 on the ten 14^2-28^2 and 812-position
# layers of resnet_50, mobilenet and wavenet, both directions. Both halves of every image
# instead (two fixed channel chunks) lost on even batches (256 channels 28^2 mb32 1.11,
# mb12 1.08) and wherever a half held few channels (64 <- 256 at 28^2 1.25); at 56^2 the
# items lost (mb9, 128 channels: 1.03; one image of 256 channels 1.00-1.01).
POINTWISE_ITEM_MAX_POSITIONS = 2048
POINTWISE_HALF_MIN_CHANNELS = 64


def pointwise_items(spec: ConvSpec, direction: str) -> list[tuple[int, int, int]]:
    """(image, first, end) result channels per group of each item of a pointwise forward or
    data gradient (pure; derived above); [] where the planned blocks run it: too small a
    problem for the thread pool, images of POINTWISE_ITEM_MAX_POSITIONS positions or more,
    or one image whose halves would be short."""
    if not _in_place_on_pool(spec) or math.prod(spec.src) >= POINTWISE_ITEM_MAX_POSITIONS:
        return []
    return _image_items(spec.mb, spec.icg if direction == "bwd_data" else spec.ocg)


def _image_items(images: int, rows: int) -> list[tuple[int, int, int]]:
    """(image, first, end) result rows: one item per image, an odd batch's last image as
    two halves of its ``rows`` when each has POINTWISE_HALF_MIN_CHANNELS (pure); [] for
    a single item."""
    items = [(n, 0, rows) for n in range(images)]
    if images % 2 and rows >= 2 * POINTWISE_HALF_MIN_CHANNELS:
        items[-1:] = [(images - 1, 0, rows // 2), (images - 1, rows // 2, rows)]
    return items if len(items) > 1 else []


def _pointwise_items_run(spec: ConvSpec, w: np.ndarray, a: np.ndarray, out: np.ndarray,
                         items: list[tuple[int, int, int]], workspace_limit: int) -> None:
    """``out[n] = w @ a[n]`` group by group for ``pointwise_items``' items: ``w`` (G, R, K)
    the weights as the left operand, ``a`` and ``out`` C-contiguous (N, G*K, P), (N, G*R, P)."""
    g, positions = spec.groups, math.prod(spec.src)
    rows, k = w.shape[1], w.shape[2]
    a = a.reshape(spec.mb, g, k, positions)
    out = out.reshape(spec.mb, g, rows, positions)

    def work(item) -> None:
        n, r0, r1 = item
        for gi in range(g):
            matmul_into(w[gi, r0:r1], a[n, gi], out[n, gi, r0:r1], False)

    _run_blocks(work, items, 1, workspace_limit, (rows, positions, k))


# A pointwise weight gradient (dW = sum_n dY_n @ X_n^T, in place) of an odd batch runs as
# two halves of its images' positions: the middle image's positions split between the
# two, each half a partial sum (added in order, as the two whole-image blocks of
# ceil(mb / 2) and floor(mb / 2) images were, which left one thread 5 images of 9).
# Derivation: the positions of every image are terms of the one sum over (n, p), so any
# partition of them gives dW; the halves are fixed by the problem, not the threads.
# In-process medians (2 threads, float32, 8 rounds of 5 calls), halves / blocks: mobilenet
# conv8 (mb9) 0.94, conv6 0.93, resnet_50 res3b_branch2a 0.92, res3a_branch2c 0.94,
# res4a_branch2c 0.95, res4b_branch2a 0.96; at mb19 (10 / 9 images before) 0.97-1.02.
# Alternating harness pairs (six and eight) read 0.98-1.02 in geomean, the unchanged
# wavenet controls 1.01-1.04: inside that machine's noise.


def pointwise_weight_halves(spec: ConvSpec) -> list[list[tuple[int, int, int]]]:
    """The (image, first, end position) segments of the two halves of a pointwise weight
    gradient of an odd batch (pure; derived above), or [] where the planned blocks run it."""
    if not _in_place_on_pool(spec) or spec.mb < 3 or spec.mb % 2 == 0:
        return []
    return position_halves(spec.mb, math.prod(spec.src))


def position_halves(images: int, positions: int) -> list[list[tuple[int, int, int]]]:
    """The flat (image, position) range in two halves (the first ``floor`` of half), as
    (image, first, end position) segments in order (pure)."""
    total = images * positions
    halves = []
    for lo, hi in ((0, total // 2), (total // 2, total)):
        segments, at = [], lo
        while at < hi:
            n, p0 = divmod(at, positions)
            p1 = min(positions, p0 + hi - at)
            segments.append((n, p0, p1))
            at += p1 - p0
        halves.append(segments)
    return halves


# The other 1x1 unpadded weight gradients of an odd batch (strided, or images of fewer
# than POINTWISE_MIN_ROWS positions), where no channel chunks apply, run as the same two
# position halves, each packing its output positions' rows side by side, the input
# subsampled by the stride: dW_g = sum over (n, p) of dY[n, g, :, p] X[n, g, :, s*p]^T,
# so each half is one product dY_h @ X_h^T over its packed columns, and the two partials
# add in order. The whole-image blocks had left one thread 10 images of 19. In-process
# medians (2 threads, float32, 8 rounds of 5 calls), halves / blocks: resnet_50
# res5a_branch2a (1024 -> 512, stride 2, mb19) 0.90-0.91, mobilenet conv9 (512 -> 1024,
# 7^2, mb19) 0.95-0.96, 256 -> 1024 7^2 mb19 0.95-0.98, 96 -> 576 7^2 mb19 0.96 (1.08
# before whole images were copied in one call), 64 -> 256 9^2 mb19 1.01; eight alternating
# harness pairs: res5a_branch2a 0.95, conv9 0.97, 256 -> 1024 1.00, unchanged controls
# (res5a_branch1 mb4, conv10 mb9) 1.02-1.03.
def packed_weight_halves(spec: ConvSpec, algorithm: str) -> list[list[tuple[int, int, int]]]:
    """``position_halves`` of the output positions for ``_packed_weight_halves`` (pure), or []."""
    if not unpadded_1x1(spec) or pointwise_spec(spec) or spec.mb < 3 or spec.mb % 2 == 0:
        return []
    if spec.flops < PARALLEL_FLOPS or algorithm not in ("taps", "im2col"):
        return []
    if weight_chunks(spec, "bwd_weights", algorithm) > 1:
        return []
    return position_halves(spec.mb, math.prod(spec.dst))


def _runs(half: list[tuple[int, int, int]], positions: int) -> list[tuple[int, int, int, int]]:
    """(first image, end image, first, end position) runs of a half's segments: consecutive
    whole images merged (pure)."""
    runs: list[list[int]] = []
    for n, p0, p1 in half:
        if runs and p0 == 0 and p1 == positions and runs[-1][2:] == [0, positions] and runs[-1][1] == n:
            runs[-1][1] = n + 1
        else:
            runs.append([n, n + 1, p0, p1])
    return [tuple(r) for r in runs]


def _packed_weight_halves(spec: ConvSpec, src: np.ndarray, diff_dst: np.ndarray, dtype, halves: list,
                          workspace_limit: int) -> np.ndarray | None:
    """``packed_weight_halves``' weight gradient (derived there), or None when a half's
    packed rows and partial do not fit the cap."""
    g, cg, og = spec.groups, spec.icg, spec.ocg
    positions = math.prod(spec.dst)
    cols = max(sum(p1 - p0 for _, p0, p1 in h) for h in halves)
    worst = (g * (cg + og) * cols + g * og * cg) * np.dtype(dtype).itemsize
    if worst > workspace_limit:
        return None
    sampled = src[sampled_cells(spec)]
    dy = diff_dst.reshape(spec.mb, g, og, positions)

    def work(half) -> np.ndarray:
        width = sum(p1 - p0 for _, p0, p1 in half)
        xs = _scratch("a", (g, cg, width), dtype)
        ds = _scratch("b", (g, og, width), dtype)
        at = 0
        for n0, n1, p0, p1 in _runs(half, positions):     # whole images in one copy each
            k = (n1 - n0) * (p1 - p0)
            images = sampled[n0:n1].reshape((n1 - n0, g, cg) + spec.dst)
            if p1 - p0 == positions:        # straight from the strided view: no flat copy first
                xs[:, :, at:at + k].reshape((g, cg, n1 - n0) + spec.dst)[...] = images.transpose(
                    (1, 2, 0) + tuple(range(3, 3 + spec.nsp)))
            else:
                xs[:, :, at:at + k].reshape(g, cg, n1 - n0, p1 - p0)[...] = (
                    images.reshape(n1 - n0, g, cg, positions)[..., p0:p1].transpose(1, 2, 0, 3))
            ds[:, :, at:at + k].reshape(g, og, n1 - n0, p1 - p0)[...] = dy[n0:n1, :, :, p0:p1].transpose(1, 2, 0, 3)
            at += k
        part = np.empty((g, og, cg), dtype=dtype)
        matmul_into(ds, xs.swapaxes(1, 2), part, False)
        return part

    return _sum_in_order(work, halves, worst, workspace_limit, (og, cg, cols)).reshape(spec.weights_shape)


# ... and one image's runs as two chunks of the input channels (columns of dW), each
# reducing over every position into its own columns of the result, instead of two slabs of
# positions whose partial gradients were added: in-process medians (as above), chunks /
# slabs: wavenet conv1d_1x1_2 (256 <- 512, 812 positions) 0.88, conv1d_1x1_3 0.92, 512
# channels at 28^2 0.92, 256 at 56^2 0.83 (output-channel chunks: 0.93-0.97); eight
# alternating harness pairs: conv1d_1x1_2 0.88, conv1d_1x1_3 0.90, 512 at 28^2 0.91, 256
# at 40^2 0.87.
def pointwise_weight_columns(spec: ConvSpec) -> int:
    """Input-channel chunks of a pointwise weight gradient of one image (pure): 2 where the
    problem is one for the thread pool with at least CHUNK_MIN_CHANNELS input channels per
    group in each chunk; else 1."""
    return 2 if spec.mb == 1 and _in_place_on_pool(spec) and spec.icg >= 2 * CHUNK_MIN_CHANNELS else 1


# Pointwise data gradients of images too small for in-place products (more than one and
# fewer than POINTWISE_MIN_ROWS positions: resnet_50's and mobilenet's 7x7 layers) pack
# diff_dst once, every image side by side, and split the input channels into
# PACKED_POINTWISE_CHUNKS fixed chunks (the problem's, not the threads'), each one product
# over every image and one copy into dsrc. Derivation: with P positions per image and Y_g
# the packed (Og, N*P) rows of group g (Y_g[o, n*P + p] = dY[n, g*Og + o, p]),
#   dX[n, g*Cg + c, p] = sum_o W[g*Og + o, c] dY[n, g*Og + o, p] = (W_g^T @ Y_g)[c, n*P + p],
# so chunk [c0, c1) is W_g[:, c0:c1]^T @ Y_g, unpacked to dX[:, g*Cg + c0:g*Cg + c1].
# Blocks of whole images had made each product 1-10 images wide (and left one thread 5
# images of 9). In-process medians (2 threads, float32, 64 MB of other traffic before each
# call), two chunks / whole-image blocks: resnet_50 res5b_branch2a (2048 <- 512 channels)
# mb9 0.87-0.92, mb8 0.92, mb19 0.88; mobilenet conv10 (1024 <- 1024) mb9 0.94, mb10 0.92;
# 1024 <- 256 mb9 0.82; but with fewer input channels the chunks' products are too short:
# res5a_branch2c (512 <- 2048) 0.98, 512 <- 1024 mb9 0.99, mobilenet conv9 (mb19) 1.10, so
# each chunk has at least PACKED_POINTWISE_MIN_CHANNELS. Four chunks: 0.92-1.16.
PACKED_POINTWISE_CHUNKS = 2
PACKED_POINTWISE_MIN_CHANNELS = 512
# Strided 1x1 data gradients (no padding) run the same way, their products on the output
# grid spread to the cells they read with zeros around them (``spread``, as in
# ``strided_1x1_data`` below): dX[n, g*Cg + c, s*q] = (W_g^T @ Y_g)[c, n*P + q], zero on
# every other cell. The blocks had run products of a few images' 49 columns (7x7 outputs).
# In one process, the two paths alternating (24 rounds of a 0.05 s pause, a warm-up and 3
# calls), paired median ratios packed / blocks: resnet_50 res5a_branch2a (1024 <- 512,
# stride 2, mb19) 0.95 / 1.05 on 2 threads, 0.95 on one; res5a_branch1 (mb4) 0.96 / 0.98,
# 0.94 on one. Images of 14x14 outputs and more lost against ``strided_1x1_data``'s
# per-image products and keep that path (medians, three alternations of separate
# processes, 2 threads: res4a_branch2a 0.95-1.22, res4a_branch1 0.98-1.29, res3a_branch2a
# 1.19-1.28, res3a_branch1 1.03-1.41).
PACKED_STRIDED_MAX_POSITIONS = POINTWISE_MIN_ROWS
PACKED_STRIDED_MIN_CHANNELS = 128


def packed_pointwise_chunks(spec: ConvSpec) -> int:
    """Input-channel chunks of a 1x1 unpadded data gradient on packed rows (pure): a problem
    large enough for the thread pool, and either stride 1 with 2 to POINTWISE_MIN_ROWS - 1
    positions per image and chunks of at least PACKED_POINTWISE_MIN_CHANNELS channels, or
    strided (``PACKED_STRIDED_*`` above); 0 where the other lowerings run it."""
    if not unpadded_1x1(spec) or spec.flops < PARALLEL_FLOPS:
        return 0
    positions = math.prod(spec.dst)
    if unit_1x1(spec):
        fits = 1 < positions < POINTWISE_MIN_ROWS and spec.icg >= PACKED_POINTWISE_CHUNKS * PACKED_POINTWISE_MIN_CHANNELS
    else:
        fits = (positions < PACKED_STRIDED_MAX_POSITIONS
                and spec.icg >= PACKED_POINTWISE_CHUNKS * PACKED_STRIDED_MIN_CHANNELS)
    return PACKED_POINTWISE_CHUNKS if fits else 0


def _packed_pointwise_data(spec: ConvSpec, diff_dst: np.ndarray, weights: np.ndarray, dtype, chunks: int,
                           workspace_limit: int) -> np.ndarray | None:
    """``packed_pointwise_chunks``' data gradient (derived there and at PACKED_STRIDED_*),
    or None when the packed rows and the chunks' results do not fit the workspace cap (or a
    strided problem finds no numba)."""
    g, cg, og, n = spec.groups, spec.icg, spec.ocg, spec.mb
    positions = math.prod(spec.dst)
    rows = n * positions
    itemsize = np.dtype(dtype).itemsize
    cuts = _bounds(cg, chunks)
    worst = max(b - a for a, b in zip(cuts, cuts[1:])) * rows * itemsize
    packed_bytes = g * og * rows * itemsize
    strided = not unit_1x1(spec)
    jit = _spread() if strided else None
    if packed_bytes + worst > workspace_limit or (strided and jit is None):
        return None
    packed = _scratch("b", (g * og, n, positions), dtype)          # the calling thread's
    _parallel_copy(packed, diff_dst.reshape(n, g * og, -1).swapaxes(0, 1), axis=0)
    packed = packed.reshape(g, og, rows)
    w = weights.reshape(g, og, cg)
    if w.dtype != dtype:
        w = w.astype(dtype)
    dsrc, _ = _result(spec.src_shape, dtype, zeroed=False)
    out = dsrc.reshape((n, g, cg, -1) + ((spec.src[-1],) if strided else ()))
    spread_rows = _spread_rows(spec) if strided else None

    def work(item) -> None:
        gi, c0, c1 = item
        z = _scratch("a", (c1 - c0, rows), dtype)
        matmul_into(w[gi, :, c0:c1].T, packed[gi], z, False)
        z = z.reshape(c1 - c0, n, positions)
        if not strided:
            out[:, gi, c0:c1] = z.swapaxes(0, 1)
            return
        for i in range(n):              # image i's products at the cells they read, zeros around
            jit.spread(z[:, i].reshape(c1 - c0, -1, spec.dst[-1]), out[i, gi, c0:c1], spread_rows,
                       spec.strides[-1])

    items = [(gi, a, b) for gi in range(g) for a, b in zip(cuts, cuts[1:])]
    _run_blocks(work, items, worst, workspace_limit - packed_bytes, (cuts[1], rows, og))
    return dsrc


# Strided 1x1 data gradients (no padding) image by image: the input cell x[n, c, s*q] is
# read by output q alone and every other cell by none, so
#   dX[n, g*Cg + c, s*q] = sum_o W[g*Og + o, c] dY[n, g*Og + o, q] = (W_g^T @ dY_n,g)[c, q]
# and dX is zero elsewhere: one product per image on the output grid into the thread's
# buffer (in cache), then ``spread`` (numba) writes the image's rows of dX once each, the
# products at the read cells and zeros around them. The ``taps`` blocks had zeroed their
# rows (a memset of up to 61 MB), then scattered each phase with strided NumPy copies that
# read those rows back. In-process, both paths' calls interleaved in one process (2
# threads), new / old: resnet_50 res3a_branch2a (mb19, 61 MB) 0.71-0.74, res4a_branch2a 0.79-0.83,
# res3a_branch1 (mb4) 0.92-0.93, res4a_branch1 0.97-0.99; but 7x7 outputs (res5a_branch2a 1.30,
# res5a_branch1 1.16: products of 49 columns) keep the blocks, hence images of at least
# POINTWISE_MIN_ROWS output positions.
def strided_1x1_data(spec: ConvSpec) -> bool:
    """A strided 1x1 data gradient without padding, large enough for the thread pool, of at
    least POINTWISE_MIN_ROWS output positions per image (pure): ``_strided_1x1_data``
    runs it (derived above)."""
    return (unpadded_1x1(spec) and any(s > 1 for s in spec.strides) and spec.flops >= PARALLEL_FLOPS
            and math.prod(spec.dst) >= POINTWISE_MIN_ROWS)


def _spread():
    """The numba loop of ``_strided_1x1_data``, or None (no numba, or ``CONVGRAD_NUMBA=0``)."""
    from . import depthwise
    return _spread_module() if depthwise.available() else None


@functools.lru_cache(maxsize=1)
def _spread_module():
    try:
        from . import _spread_jit
    except ImportError:
        return None
    return _spread_jit


@functools.lru_cache(maxsize=256)
def _spread_rows(spec: ConvSpec) -> np.ndarray:
    """For each input row (every spatial axis but the last, row-major) the output row that
    reads it, or -1 (pure)."""
    outer = [np.where((np.arange(i) % s == 0) & (np.arange(i) // s < o), np.arange(i) // s, -1)
             for i, o, s in zip(spec.src[:-1], spec.dst[:-1], spec.strides[:-1])]
    rows = np.zeros(1, dtype=np.int64)
    for m, o in zip(outer, spec.dst[:-1]):
        rows = np.where((rows[:, None] >= 0) & (m[None, :] >= 0), rows[:, None] * o + m[None, :], -1).reshape(-1)
    return rows.astype(np.int64)


def _strided_1x1_data(spec: ConvSpec, diff_dst: np.ndarray, weights: np.ndarray, dtype,
                      workspace_limit: int) -> np.ndarray | None:
    """``strided_1x1_data``'s gradient (derived above), or None without numba or where a
    thread's buffer exceeds the cap."""
    jit = _spread()
    g, cg, og, n = spec.groups, spec.icg, spec.ocg, spec.mb
    pos = math.prod(spec.dst)
    worst = spec.ic * pos * np.dtype(dtype).itemsize
    if jit is None or worst > workspace_limit:
        return None
    w = _weights(spec, weights, (3, 0, 2, 1), dtype)[0]                # (G, Cg, Og): W_g^T
    dy = np.ascontiguousarray(diff_dst, dtype=dtype).reshape(n, g, og, pos)
    dsrc, _ = _result(spec.src_shape, dtype, zeroed=False)
    out = dsrc.reshape(n, spec.ic, -1, spec.src[-1])
    rows = _spread_rows(spec)

    def work(i) -> None:
        z = _scratch("a", (g, cg, pos), dtype)
        for gi in range(g):
            matmul_into(w[gi], dy[i, gi], z[gi], False)
        jit.spread(z.reshape(spec.ic, -1, spec.dst[-1]), out[i], rows, spec.strides[-1])

    _run_blocks(work, list(range(n)), worst, workspace_limit, (cg, pos, og))
    return dsrc


# Strided 1x1 forwards (no padding) image by image, the mirror of ``strided_1x1_data``:
#   Y[n, g*Og + o, q] = sum_c W[g*Og + o, c] X[n, g*Cg + c, s*q] = (W_g @ Xs_n,g)[o, q]
# with Xs_n the cells image n's outputs read, gathered (one strided NumPy copy) into the
# thread's buffer right before the image's products, which write its rows of Y in place;
# items as ``pointwise_items`` (an odd batch's last image as two halves of the output
# channels, each gathering the image). The ``taps`` blocks had gathered a few images' phase
# grids into one flat copy, then written the products back through the grid. In one
# process, the two paths alternating (16 rounds of a 0.05 s pause, a warm-up and 3 calls, 2
# threads), paired medians, per image / blocks: resnet_50 res3a_branch2a (256 -> 128, 56^2,
# mb19) 0.87, res4a_branch2a (512 -> 256, 28^2) 0.85, res3a_branch1 (mb4) 0.97,
# res4a_branch1 0.96. Same rule as the data gradient: images of at least
# POINTWISE_MIN_ROWS output positions.
def strided_1x1_forward(spec: ConvSpec) -> bool:
    """A strided unpadded 1x1 forward that ``_strided_1x1_forward`` runs (pure): the
    conditions of ``strided_1x1_data``."""
    return strided_1x1_data(spec)


def _strided_1x1_forward(spec: ConvSpec, src: np.ndarray, weights: np.ndarray, dst: np.ndarray, dtype,
                         workspace_limit: int) -> bool:
    """``strided_1x1_forward``'s products into ``dst`` (derived above); False, with
    nothing written, where one image's gathered cells exceed the cap."""
    g, cg, og = spec.groups, spec.icg, spec.ocg
    positions = math.prod(spec.dst)
    worst = spec.ic * positions * np.dtype(dtype).itemsize
    items = _image_items(spec.mb, og) or [(n, 0, og) for n in range(spec.mb)]
    if worst > workspace_limit:
        return False
    w = _weights(spec, weights, (0, 1, 2, 3), dtype)[..., 0]              # (G, Og, Cg)
    sampled = src[sampled_cells(spec)]
    out = dst.reshape(spec.mb, g, og, positions)

    def work(item) -> None:
        n, r0, r1 = item
        xs = _scratch("a", (spec.ic,) + spec.dst, dtype)
        xs[...] = sampled[n]
        xs = xs.reshape(g, cg, positions)
        for gi in range(g):
            matmul_into(w[gi, r0:r1], xs[gi], out[n, gi, r0:r1], False)

    _run_blocks(work, items, worst, workspace_limit, (og, positions, cg))
    return True


# Framed 1-D problems: a kernel of whole strides, k = m*s with s >= FRAME_MIN_STRIDE,
# undilated and unpadded (an STFT written as a convolution; an ISTFT is its data gradient,
# ``conv_transpose1d`` with a window of n_fft and a hop of s). Derivation: the P = dst
# outputs read the first Q = P + m - 1 frames of s cells of each input row, so x[n, c,
# :Q*s] is the (Q, s) matrix X_nc (a view: frame q holds cells q*s .. q*s + s - 1). Tap
# t = j*s + r of output p reads x[n, c, p*s + t] = X_nc[p + j, r]; with W_cj = w[:, c,
# j*s : (j+1)*s] (O x s, a view with the weights' row stride), per group:
#   fwd          Y_n             = sum over c, then j, of W_cj @ X_nc[j : j+P]^T     (O x P)
#   bwd_data     dX_nc[j : j+P] += dY_n^T @ W_cj, j = 0 .. m-1 in order              (P x s)
#   bwd_weights  dW_cj           = sum over n of dY_n @ X_nc[j : j+P]                (O x s)
# Every operand is a view of the canonical arrays: no column matrix, no col2im, no phase
# grid (im2col had copied the ISTFT's 224 x 1024 windows, or added its 1024 x 224 product
# back into the signal). Work items write disjoint parts of the result, cut from the
# problem alone: the data gradient's columns (or whole rows X_nc), the weights' (c, j)
# blocks, the forward's output channels, in chunks of at least FRAME_MIN_CHANNELS; so the
# bits do not depend on the threads.
# Measured in one process (2 threads, float32, 6 rounds of a pause, a warm-up and 3 calls;
# medians, ms, im2col / framed, fwd, bwd_weights, bwd_data): the ISTFT (1 -> 1026 channels,
# k 1024, s 256, 58112 samples) 3.15 / 2.94, 3.01 / 2.94, 3.46 / 3.11; k 512 s 128 on
# 160000 samples 4.49 / 4.06, 4.40 / 3.78, 4.55 / 4.19; k 256 s 64, 4 x 32000 samples
# 2.13 / 2.01, 2.23 / 2.03, 2.86 / 2.06; k 512 s 128, 8 x 48000 10.7 / 9.3, 10.5 / 9.9,
# 11.5 / 10.8; even in repeats: k 2048 s 512 (3.9 GFLOP; 21-23 ms both) and 16 -> 64
# channels k 256 s 64. FRAME_BLOCKS 4 instead of 2: the ISTFT's data gradient 3.32 / 3.11
# (two column chunks of 64). In the harness against torch, the ISTFT's data gradient 0.96
# and 0.99 (1.15 in Z92), its weight gradient 0.99 and 1.04.
FRAME_MIN_STRIDE = 64
FRAME_BLOCKS = 2
FRAME_MIN_COLUMNS = 64
FRAME_MIN_CHANNELS = 32


def framed_spec(spec: ConvSpec) -> bool:
    """A 1-D problem whose kernel is a whole number of strides of at least
    ``FRAME_MIN_STRIDE`` cells, undilated and unpadded (pure)."""
    if spec.nsp != 1 or spec.dilations[0] != 1 or spec.pads_begin[0] or spec.pads_end[0]:
        return False
    s, k = spec.strides[0], spec.kernel[0]
    return s >= FRAME_MIN_STRIDE and k % s == 0


def _chunks(items: int, extent: int, minimum: int) -> int:
    """Chunks of ``extent`` per item so that ``items`` items make at least FRAME_BLOCKS
    blocks, each chunk at least ``minimum`` long (pure)."""
    return max(1, min(-(-FRAME_BLOCKS // max(1, items)), extent // minimum))


def framed_blocks(spec: ConvSpec, direction: str) -> list[tuple[int, ...]]:
    """The work items of ``_framed`` (pure): bwd_data (n, g, c, r0, r1) columns of X_nc,
    bwd_weights (g, c, j, o0, o1), fwd (n, g, o0, o1)."""
    g, cg, og, s = spec.groups, spec.icg, spec.ocg, spec.strides[0]
    m = spec.kernel[0] // s
    if direction == "bwd_data":
        cuts = _bounds(s, _chunks(spec.mb * spec.ic, s, FRAME_MIN_COLUMNS))
        return [(n, gi, c, r0, r1) for n in range(spec.mb) for gi in range(g) for c in range(cg)
                for r0, r1 in zip(cuts, cuts[1:])]
    if direction == "bwd_weights":
        cuts = _bounds(og, _chunks(spec.ic * m, og, FRAME_MIN_CHANNELS))
        return [(gi, c, j, o0, o1) for gi in range(g) for c in range(cg) for j in range(m)
                for o0, o1 in zip(cuts, cuts[1:])]
    cuts = _bounds(og, _chunks(spec.mb * g, og, FRAME_MIN_CHANNELS))
    return [(n, gi, o0, o1) for n in range(spec.mb) for gi in range(g) for o0, o1 in zip(cuts, cuts[1:])]


def _framed(spec: ConvSpec, direction: str, a: np.ndarray, b: np.ndarray, dtype,
            workspace_limit: int) -> np.ndarray | None:
    """The three directions of a ``framed_spec`` problem (derived above; None: inputs not
    in the compute type and C-contiguous, the general path runs them)."""
    if not all(x.dtype == dtype and x.flags.c_contiguous for x in (a, b)):
        return None
    g, cg, og, s, k, p = spec.groups, spec.icg, spec.ocg, spec.strides[0], spec.kernel[0], spec.dst[0]
    m = k // s
    q = p + m - 1                                           # frames the outputs read
    items = framed_blocks(spec, direction)

    def frames(arr: np.ndarray, n: int, gi: int, c: int) -> np.ndarray:      # X_nc, (Q, s)
        return arr[n, gi * cg + c, :q * s].reshape(q, s)

    if direction == "bwd_data":                             # a = diff_dst, b = weights
        dy, w = a, b.reshape(g, og, cg, k)
        out = np.empty(spec.src_shape, dtype=dtype)
        out[..., q * s:] = 0                                # cells no window reads

        def work(item) -> None:
            n, gi, c, r0, r1 = item
            dx, dyt = frames(out, n, gi, c), dy[n, gi * og:(gi + 1) * og].T
            dx[p:, r0:r1] = 0                               # rows only j >= 1 reaches
            for j in range(m):
                matmul_into(dyt, w[gi, :, c, j * s + r0:j * s + r1], dx[j:j + p, r0:r1], j > 0)
        _run_blocks(work, items, 0, workspace_limit, (p, s, og))
        return out
    if direction == "bwd_weights":                          # a = src, b = diff_dst
        x, dy = a, b
        out = np.empty(spec.weights_shape, dtype=dtype)

        def work(item) -> None:
            gi, c, j, o0, o1 = item
            dw = out[gi * og + o0:gi * og + o1, c, j * s:(j + 1) * s]
            for n in range(spec.mb):
                matmul_into(dy[n, gi * og + o0:gi * og + o1], frames(x, n, gi, c)[j:j + p], dw, n > 0)
        _run_blocks(work, items, 0, workspace_limit, (og, s, p))
        return out
    x, w = a, b                                             # a = src, b = weights
    out = np.empty(spec.dst_shape, dtype=dtype)

    def work(item) -> None:
        n, gi, o0, o1 = item
        y = out[n, gi * og + o0:gi * og + o1]
        for c in range(cg):
            xt = frames(x, n, gi, c)
            for j in range(m):
                matmul_into(w[gi * og + o0:gi * og + o1, c, j * s:(j + 1) * s], xt[j:j + p].T, y, c > 0 or j > 0)
    _run_blocks(work, items, 0, workspace_limit, (og, p, s))
    return out


# One window per image: a kernel exactly the size of the unpadded, undilated image (a
# dense layer written as a convolution; the data gradient of a transposed convolution from
# a 1x1x1 latent). Derivation: the only output position reads every input position once,
# so image n's column matrix is its own row src[n] flattened as (c, *k), the layout of a
# weight row; with X_g (N, Cg*T), W_g (Og, Cg*T), Y_g (N, Og) the views of group g:
#   fwd  Y_g = X_g @ W_g^T      bwd_data  dX_g = dY_g @ W_g      bwd_weights  dW_g = dY_g^T @ X_g
# on the canonical arrays, no copy. A fixed number of blocks (from the problem alone) cut
# the Cg*T columns of dX / dW, or the output channels of Y: disjoint parts of the result,
# no partial sums, so results do not depend on the thread count or the cap. Measured (latent 8 -> 16
# channels, 28^3 kernel, mb 8, fwd, 2 threads): 4.1 ms as an im2col copy, 1.1 ms a plain
# matmul.

def whole_window_spec(spec: ConvSpec) -> bool:
    """One output position per image whose window is the whole unpadded image (pure; a
    one-tap kernel is a ``pointwise_spec`` problem, already free of copies)."""
    return (spec.src == spec.kernel and math.prod(spec.kernel) > 1 and all(d == 1 for d in spec.dilations)
            and not any(spec.pads_begin) and not any(spec.pads_end))


def _whole_window(spec: ConvSpec, direction: str, a: np.ndarray, b: np.ndarray, dtype,
                  workspace_limit: int) -> np.ndarray | None:
    """The three directions of a ``whole_window_spec`` problem (None: inputs not in the
    compute type and C-contiguous; the general path runs them)."""
    if not all(x.dtype == dtype and x.flags.c_contiguous for x in (a, b)):
        return None
    g, cg, og = spec.groups, spec.icg, spec.ocg
    width = cg * math.prod(spec.kernel)
    nblocks = max(1, min(MIN_BLOCKS, spec.flops // max(1, PARALLEL_FLOPS), width))
    cuts = _bounds(width, nblocks)
    ranges = list(zip(cuts, cuts[1:]))
    if direction == "fwd":                                  # a = src, b = weights
        # the output (N, O) is small and the reduction long: blocks of output channels
        # (disjoint results, no partial sums; each reads all of X and its rows of W)
        x, w = a.reshape(spec.mb, g, width), b.reshape(g, og, width)
        out = np.empty((spec.mb, g, og), dtype=dtype)
        ocuts = _bounds(og, max(1, min(nblocks, og)))

        def work(i: int) -> None:
            o0, o1 = ocuts[i], ocuts[i + 1]
            for gi in range(g):
                matmul_into(x[:, gi], w[gi, o0:o1].T, out[:, gi, o0:o1], False)
        _run_blocks(work, list(range(len(ocuts) - 1)), 0, workspace_limit, (spec.mb, og, width))
        return out.reshape(spec.dst_shape)
    if direction == "bwd_data":                             # a = diff_dst, b = weights
        dy, w = a.reshape(spec.mb, g, og), b.reshape(g, og, width)
        out = np.empty((spec.mb, g, width), dtype=dtype)

        def work(i: int) -> None:
            k0, k1 = ranges[i]
            for gi in range(g):
                matmul_into(dy[:, gi], w[gi, :, k0:k1], out[:, gi, k0:k1], False)
        _run_blocks(work, list(range(len(ranges))), 0, workspace_limit, (spec.mb, width, og))
        return out.reshape(spec.src_shape)
    x, dy = a.reshape(spec.mb, g, width), b.reshape(spec.mb, g, og)     # a = src, b = diff_dst
    out = np.empty((g, og, width), dtype=dtype)

    def work(i: int) -> None:
        k0, k1 = ranges[i]
        for gi in range(g):
            matmul_into(dy[:, gi].T, x[:, gi, k0:k1], out[gi, :, k0:k1], False)
    _run_blocks(work, list(range(len(ranges))), 0, workspace_limit, (og, width, spec.mb))
    return out.reshape(spec.weights_shape)


# ---------------------------------------------------------------------------------------
# The three directions. Each block is one work item of fixed shape; blocks run on the
# thread pool of ``threads`` with BLAS pinned to one thread, so results never depend on
# the thread count. Blocks write disjoint parts of the result, or return partials that
# are added in block order.
# ---------------------------------------------------------------------------------------

class _Worker:
    """One pool thread with its own queue, so that the submitting thread knows which
    thread runs a task and can place it on a CPU first (``threads.call_plan``)."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.native_id: int | None = None
        self.cpu: int | None = None           # the CPU it is pinned to (None: not pinned)
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, name="convgrad-block", daemon=True)
        self.thread.start()
        self.started.wait()

    def _run(self) -> None:
        self.native_id = threading.get_native_id()
        self.started.set()
        while True:
            fn, fut = self.queue.get()
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as e:   # noqa: BLE001 - handed to the caller
                    fut.set_exception(e)
            # drop the task now, not at the next one: its closure holds the call's arrays,
            # and a result kept alive here stays out of ``results``' cache
            del fn, fut

    def place(self, cpu: int | None) -> None:
        """Pin to ``cpu``; None: unpin (the caller's allowed CPUs) if pinned."""
        if cpu is not None:
            if cpu != self.cpu and threads.pin(self.native_id, {cpu}):
                self.cpu = cpu
        elif self.cpu is not None:
            allowed = threads.allowed_cpus()
            if allowed and threads.pin(self.native_id, allowed):
                self.cpu = None

    def submit(self, fn, *args) -> Future:
        fut: Future = Future()
        self.queue.put((functools.partial(fn, *args), fut))
        return fut


class _Pool:
    """One persistent set of worker threads for the blocks of every call (starting threads
    per call would cost more than a small convolution). Recreated after a fork."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.workers: list[_Worker] = []

    def get(self, n: int, caller_works: bool) -> tuple[list[_Worker], int | None]:
        """``n`` workers, each placed on a CPU for this call, and the CPU the placement
        took the caller to run on (None: no placement)."""
        with self.lock:
            while len(self.workers) < n:
                self.workers.append(_Worker())
            chosen = self.workers[:n]
        plan = threads.call_plan(n, caller_works)
        for w, cpu in zip(chosen, plan[0] if plan else [None] * n):
            w.place(cpu)
        return chosen, (plan[1] if plan else None)

    def reset(self) -> None:
        self.__init__()


_POOL = _Pool()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_POOL.reset)


def _ignore(_result) -> None:
    return None


# Pool chunks of the thin kernel's tiles and ``blocked``'s rows are guided: each takes 1 /
# (GUIDED_SHARE * workers) of the items still left (``guided_chunks``). Equal chunks (4
# per worker) let one thread idle for up to a chunk at the end, an eighth of the call (the
# thin kernel's figures; ``blocked``'s are at its rows): in one process, the two plans
# alternating (16-20 rounds of a 0.05 s pause, a warm-up and 3 calls, 2 threads), paired
# median ratios guided / equal: grouped 8 x 16 channels 3x3 165^2 data gradient 0.87 /
# 0.96 / 0.93 / 0.92 (four sessions; CPU seconds per wall second 1.85 -> 1.90-1.95),
# forward 0.91; 3-D 3 -> 32 channels 54x61x61 data gradient 0.95; wavenet 32 channels k2
# data gradient 1.00 (mb2), 0.95 (mb8), 0.98 (mb256); weight gradients 0.99-1.03 (their
# few items change little).
GUIDED_SHARE = 2


def guided_chunks(items: int, workers: int) -> list[tuple[int, int]]:
    """Chunks ``[i0, i1)`` that cover ``range(items)`` in order (pure): one for one worker;
    else each holds ``ceil(left / (GUIDED_SHARE * workers))`` of the items still left, so
    the first are large (few hand-offs between threads) and the last are single items
    (threads that take the next chunk when free finish about one item apart)."""
    if workers <= 1:
        return [(0, items)] if items > 0 else []
    chunks, i = [], 0
    while i < items:
        n = -(-(items - i) // (GUIDED_SHARE * workers))
        chunks.append((i, i + n))
        i += n
    return chunks


def run_each(work, blocks: list, workers: int) -> None:
    """``work(b)`` for every block, for blocks that write their own part of the result: the
    calling thread and up to ``workers - 1`` pool threads each take the next block as soon
    as they are free, so none waits for a slower one."""
    if workers <= 1 or len(blocks) <= 1:
        for b in blocks:
            work(b)
        return
    it = iter(blocks)
    lock = threading.Lock()

    def loop() -> None:
        while True:
            with lock:
                b = next(it, None)
            if b is None:
                return
            work(b)

    pool, cpu = _POOL.get(min(workers, len(blocks)) - 1, caller_works=True)
    helpers = [w.submit(loop) for w in pool]
    with threads.held_on(cpu):        # on the CPU the placement left it (threads.py)
        try:
            loop()
        finally:
            for f in helpers:
                f.result()


def _in_order(work, blocks: list, workers: int, consume, alive: int | None = None) -> None:
    """``consume(work(b))`` for the blocks in block order, ``work`` running on up to
    ``workers`` pool threads while the calling thread consumes; at most ``alive`` block
    results (default ``workers``) exist at any time, counting those being computed.

    The pool threads take the next block themselves, so a finished thread starts its next
    block without waiting for the caller: the caller, a third thread on two cores, was
    woken up to 3.5 ms late (while both cores ran blocks), and a thread that had to be
    handed its next block by it sat idle that long. Measured (2 threads, 1x1 64 -> 256
    weights gradient, 8 images of 56^2 in 4 blocks): one thread idle 3.5 ms of an 11.5 ms
    call; the same call as pulled blocks: 8.5-9.5 ms. With ``alive = workers + 1`` a thread
    can start its next block before the caller has taken the previous one. Paired medians
    (12 rounds in one process, new / old, two sessions): mobilenet conv3 (mb19, 10 blocks)
    0.92 / 0.82, res4a_branch2a (mb19, 5 blocks) 0.96 / 0.88, mobilenet conv7 0.96 / 0.89,
    res2a_branch1 (mb9) 0.99 / 0.96, 64 -> 256 on 8 images of 56^2 0.85; resnet_50 conv1's
    data gradient (col2im blocks added in order) 1.03. Results do not depend on which
    thread runs a block (each block's products run whole on one thread), only on the block
    order of the adds.
    """
    if workers <= 1 or len(blocks) <= 1:
        for b in blocks:
            consume(work(b))
        return
    if consume is _ignore:
        run_each(work, blocks, workers)
        return
    n = len(blocks)
    slots = threading.Semaphore(max(1, workers if alive is None else alive))
    done = [threading.Event() for _ in blocks]
    results: list = [None] * n
    taken = iter(range(n))
    lock = threading.Lock()
    stop = []

    def loop() -> None:
        while True:
            slots.acquire()
            with lock:
                i = None if stop else next(taken, None)
            if i is None:
                slots.release()
                return
            try:
                results[i] = (True, work(blocks[i]))
            except BaseException as e:        # noqa: BLE001 - handed to the caller
                results[i] = (False, e)
            done[i].set()

    pool, _ = _POOL.get(min(workers, n), caller_works=False)
    helpers = [w.submit(loop) for w in pool]
    try:
        for i in range(n):
            done[i].wait()
            ok, value = results[i]
            results[i] = None
            if not ok:
                raise value
            consume(value)
            del value
            slots.release()
    finally:
        stop.append(True)
        for _ in helpers:                     # wake threads waiting for a slot: they stop
            slots.release()
        for f in helpers:
            f.result()


# OpenBLAS runs a product on the calling thread alone below these sizes whatever its
# thread setting (gemm: m*n*k <= 65536 * 4; gemv, taken when m or n is 1: m*n < 9216;
# dot: n <= 10000), so calls whose every product is smaller need no pin to be
# thread-count independent.
SERIAL_GEMM = 65536 * 4
SERIAL_GEMV = 9216
NO_PRODUCT = (0, 0, 0)


def _threads_in_blas(product: tuple[int, int, int]) -> bool:
    """Could the BLAS split this (m, n, k) product over threads (the largest of a call)?"""
    m, n, k = product
    if not blas_available():                  # another BLAS: assume any product may thread
        return m * n * k > 0
    return m * n * k > (SERIAL_GEMM if min(m, n) >= 2 else SERIAL_GEMV)


def _run_blocks(work, blocks: list, worst: int, workspace_limit: int, product: tuple[int, int, int],
                consume=_ignore) -> None:
    """``consume(work(b))`` over the blocks in block order; blocks alive at once fit in the cap.

    ``product`` is the largest (m, n, k) BLAS product a block runs (``NO_PRODUCT``: none).
    When the BLAS could thread it, the BLAS is pinned to one thread for the call
    (``threads.pinned_blas``), so every product runs whole on one thread and the
    parallelism comes from the blocks.
    """
    fit = max(1, workspace_limit // max(1, worst))        # blocks alive at once within the cap
    if _threads_in_blas(product):
        with threads.pinned_blas() as n:
            _in_order(work, blocks, min(n, fit), consume, min(n + 1, fit))
    else:
        n = threads.get_num_threads()
        _in_order(work, blocks, min(n, fit), consume, min(n + 1, fit))


def _sum_in_order(work, items: list, worst: int, workspace_limit: int, product: tuple[int, int, int]) -> np.ndarray:
    """The sum of ``work(item)``'s partial results, added in item order (``_run_blocks``):
    the first partial becomes the running total."""
    acc: list[np.ndarray] = []

    def consume(part: np.ndarray) -> None:
        if acc:
            acc[0] += part
        else:
            acc.append(part)

    _run_blocks(work, items, worst, workspace_limit, product, consume)
    return acc[0]


# Allocations of at least this many bytes get fresh pages from the system (glibc's largest
# dynamic mmap threshold on 64-bit hosts), zeroed by it when first touched: np.zeros costs
# no pass over them, so a data gradient this large asks ``results.take`` for zeros (fresh
# or cached memory; its blocks zero their rows only when it comes from the cache).
FRESH_PAGES_BYTES = 32 << 20

# Copies of at least this many bytes run in pieces on the thread pool.
PARALLEL_COPY = 1 << 20       # bytes


def _parallel_copy(out: np.ndarray, src: np.ndarray, axis: int) -> None:
    """``out[...] = src`` in pieces along ``axis``, one per thread (a plain copy: the
    result does not depend on the pieces)."""
    workers = min(threads.get_num_threads(), out.shape[axis]) if out.nbytes >= PARALLEL_COPY else 1
    cuts = _bounds(out.shape[axis], max(1, workers))
    pre = (slice(None),) * axis

    def piece(bounds) -> None:
        sl = pre + (slice(*bounds),)
        out[sl] = src[sl]
    _in_order(piece, list(zip(cuts, cuts[1:])), workers, _ignore)


def _block_rows(geom: PhaseGeometry, algorithm: str, blocks: list[Block]) -> int:
    """Rows (GEMM length) of the largest block."""
    if not blocks:
        return 0
    if algorithm == "im2col":
        inner = math.prod(geom.spec.dst[1:])
        return max(b.nb * (b.r1 - b.r0) * inner for b in blocks)
    return max(b.nb * _grid_rows(geom, b) * geom.row_len for b in blocks)


def _plan(geom: PhaseGeometry, direction: str, algorithm: str, dtype, workspace_limit: int,
          rows_target: int) -> tuple[list[Block], int]:
    return _plan_cached(geom, direction, algorithm, np.dtype(dtype).itemsize, workspace_limit, rows_target)


@functools.lru_cache(maxsize=256)
def _plan_cached(geom: PhaseGeometry, direction: str, algorithm: str, itemsize: int, workspace_limit: int,
                 rows_target: int) -> tuple[list[Block], int]:
    blocks = plan(geom, direction, algorithm, itemsize, workspace_limit, rows_target)
    worst = max((workspace_bytes(geom, direction, algorithm, b, itemsize) for b in blocks), default=0)
    return blocks, worst


def conv_forward(spec: ConvSpec, src: np.ndarray, weights: np.ndarray, *, dtype, algorithm: str,
                 workspace_limit: int, rows_target: int, reverse_taps: bool = False) -> np.ndarray:
    """Forward correlation; ``reverse_taps`` (``im2col`` only) correlates with every kernel
    axis of ``weights`` reversed (the flipped data gradient)."""
    if whole_window_spec(spec) and not reverse_taps:
        done = _whole_window(spec, "fwd", src, weights, dtype, workspace_limit)
        if done is not None:
            return done
    if framed_spec(spec) and not reverse_taps:
        done = _framed(spec, "fwd", src, weights, dtype, workspace_limit)
        if done is not None:
            return done
    dst = results.empty(spec.dst_shape, dtype)
    if algorithm == "taps" and strided_1x1_forward(spec) and _strided_1x1_forward(spec, src, weights, dst, dtype,
                                                                                 workspace_limit):
        return dst
    geom = geometry(spec)
    g, cg, og, t = spec.groups, spec.icg, spec.ocg, len(geom.taps)
    blocks, worst = _plan(geom, "fwd", algorithm, dtype, workspace_limit, rows_target)
    if algorithm == "im2col":
        w_cols = _weights(spec, weights, (0, 1, 2, 3), dtype).reshape(g, og, cg * t)

        def work(b: Block) -> None:
            cols = _src_cols(spec, src, b, dtype, reverse_taps)    # (G, Cg*T, rows)
            rows = cols.shape[2]
            y = _scratch("b", (g, og, rows), dtype)
            matmul_into(w_cols, cols, y, False)
            grid = y.reshape((spec.oc, b.nb, b.r1 - b.r0) + spec.dst[1:])
            dst[b.n0:b.n0 + b.nb, :, b.r0:b.r1] = grid.swapaxes(0, 1)
    else:
        w = _weights(spec, weights, (3, 0, 1, 2), dtype)                   # (T, G, Og, Cg)
        inner = tuple(slice(0, o) for o in spec.dst[1:])
        if _pointwise(spec, src, dtype=dtype):
            items = pointwise_items(spec, "fwd")
            if items:
                _pointwise_items_run(spec, w[0], src, dst, items, workspace_limit)
                return dst

            def work(b: Block) -> None:                                    # Y_n = W @ X_n
                for x, y in zip(_pointwise_mats(src, b, g), _pointwise_mats(dst, b, g)):
                    for gi in range(g):
                        matmul_into(w[0, gi], x[gi], y[gi], False)

            product = (og, _block_rows(geom, algorithm, blocks), cg)
            _run_blocks(work, blocks, worst, workspace_limit, product)
            return dst

        def work(b: Block) -> None:
            rows0 = _grid_rows(geom, b)
            flat = _src_flat(geom, src, b, rows0, dtype)
            rows = flat.shape[-1]
            span = rows - geom.max_off
            out = _rows_in_place(geom, dst, b, b.r0, b.r1 - b.r0, geom.q, g, dtype)
            pairs = ((w[i], flat[ph, :, :, off:off + span]) for i, (ph, off) in enumerate(geom.taps))
            if out is not None and out.shape[-1] == span:     # no halo after axis 0: write in place
                _sum_products(pairs, out)
                return
            y = _scratch("b", (g, og, rows), dtype)
            _sum_products(pairs, y[:, :, :span])
            grid = y.reshape((spec.oc, b.nb, rows0) + geom.q[1:])
            valid = grid[(slice(None), slice(None), slice(0, b.r1 - b.r0)) + inner]
            dst[b.n0:b.n0 + b.nb, :, b.r0:b.r1] = valid.swapaxes(0, 1)
    rows = _block_rows(geom, algorithm, blocks)
    product = (og, rows, cg * t) if algorithm == "im2col" else ((og, rows, cg) if cg > 1 else NO_PRODUCT)
    _run_blocks(work, blocks, worst, workspace_limit, product)
    return dst


def weight_chunk_axis(spec: ConvSpec, algorithm: str) -> int:
    """Axis of the (G, Og, Cg, T) weights gradient that ``weight_chunks`` splits (pure):
    2, the input channels, for ``im2col`` with enough of them, and for ``taps`` with enough
    of them whose phase grids are the larger operand; else 1, the output channels.

    Each chunk packs its part of the operand whose channels it splits and the whole other
    one, so the split goes to the larger packed operand: im2col's column matrix (T rows per
    input channel) nearly always; for ``taps`` the input's phase grids when there are more
    of their rows (C_in x phases) than of ``diff_dst`` (C_out). resnet_50 res5b_branch2a
    (2048 -> 512, 1x1, 7^2, mb9) had split its 512 output channels, each chunk packing all
    2048 input rows: its two chunks as raw copies and products, paired medians of 14 rounds,
    input / output chunks 0.93 (and the reverse layer, 512 -> 2048, 1.04).

    The ISTFT's weight gradient (1 input channel, 1026 outputs, 1024 taps, 224 rows) ran
    as two row slabs: two 4 MiB partials of 112-row products, then added, and each slab's
    ``diff_dst`` rows copied. Split over output channels, each half reduces over all 224
    rows into its rows of the result."""
    if spec.icg < 2 * CHUNK_MIN_CHANNELS:
        return 1
    if algorithm == "im2col":
        return 2
    if algorithm == "taps" and spec.icg * len(geometry(spec).phases) > spec.ocg:
        return 2
    return 1


def weight_chunks(spec: ConvSpec, direction: str, algorithm: str) -> int:
    """Channel chunks of a large weights gradient with few rows (pure).

    Deep layers (few rows, many channels) would otherwise be cut into two row blocks whose
    partial gradients, each as large as the result, are allocated and added. Splitting the
    channels in two instead gives each block its own part of the result, written in
    place: no partials, no adds. ``im2col`` splits the input channels (each chunk builds
    only its rows of the column matrix), ``taps`` the output channels (each chunk packs
    only its channels of ``diff_dst``); the other operand, small next to the result in
    exactly these layers, is then packed once per chunk. ``im2col`` with too few input
    channels splits the output channels too (``weight_chunk_axis``): each chunk builds
    the whole column matrix, small there, and reduces over every row at once.
    """
    split = spec.icg if weight_chunk_axis(spec, algorithm) == 2 else spec.ocg
    if direction != "bwd_weights" or spec.groups != 1 or split < 2 * CHUNK_MIN_CHANNELS:
        return 1
    if spec.flops < PARALLEL_FLOPS or (algorithm == "taps" and spec.icg == spec.ocg == 1):
        return 1
    geom = geometry(spec)
    rows = spec.mb * _img_rows(geom, algorithm)
    return 2 if rows * (spec.ic + spec.oc) < CHUNK_MAX_ROW_RATIO * spec.oc * spec.icg * len(geom.taps) else 1


def conv_backward_weights(spec: ConvSpec, src: np.ndarray, diff_dst: np.ndarray, *, dtype, algorithm: str,
                          workspace_limit: int, rows_target: int) -> np.ndarray:
    if whole_window_spec(spec):
        done = _whole_window(spec, "bwd_weights", src, diff_dst, dtype, workspace_limit)
        if done is not None:
            return done
    if framed_spec(spec):
        done = _framed(spec, "bwd_weights", src, diff_dst, dtype, workspace_limit)
        if done is not None:
            return done
    halves = packed_weight_halves(spec, algorithm)
    if halves:
        done = _packed_weight_halves(spec, src, diff_dst, dtype, halves, workspace_limit)
        if done is not None:
            return done
    geom = geometry(spec)
    g, cg, og, t = spec.groups, spec.icg, spec.ocg, len(geom.taps)
    blocks, worst = _plan(geom, "bwd_weights", algorithm, dtype, workspace_limit, rows_target)
    per, slabs = _natural(geom, "bwd_weights", algorithm, rows_target)
    nchunks = weight_chunks(spec, "bwd_weights", algorithm) if slabs == 1 and per >= spec.mb else 1
    ch = weight_chunk_axis(spec, algorithm) if nchunks > 1 else 1     # the chunked axis of (G, Og, Cg, T)
    cuts = _bounds(cg if ch == 2 else og, nchunks)
    items = [(b, o0, o1) for b in blocks for o0, o1 in zip(cuts, cuts[1:])]
    columns = 1                                               # input-channel chunks (pointwise)
    inputs = ch == 2                                          # input-channel chunks (one group)
    if algorithm == "im2col":
        layout, order = (g, og, cg, t), (0, 1, 2, 3)          # already (G, Og, Cg, T)

        def work(item, out=None) -> np.ndarray:
            b, j0, j1 = item                   # channels [j0, j1) of axis ch (all of them: one chunk)
            sub = dataclasses.replace(spec, ic=j1 - j0) if inputs else spec
            cols = _src_cols(sub, src, b, dtype, c0=j0 if inputs else 0)        # (G, Cg*T, rows)
            rows = cols.shape[2]
            o0, o1 = (j0, j1) if ch == 1 and nchunks > 1 else (0, spec.oc)    # chunks: one group
            dy = _dst_rows(spec, diff_dst, b, dtype, o0, o1).reshape(g, (o1 - o0) // g, rows)
            shape = (g, og, j1 - j0, t) if ch == 2 else (g, j1 - j0, cg, t)
            part = np.empty(shape, dtype=dtype) if out is None else out
            matmul_into(dy, cols.swapaxes(1, 2), part.reshape(g, shape[1], shape[2] * t), False)
            return part
    elif _pointwise(spec, src, diff_dst, dtype=dtype):
        layout, order = (1, g, og, cg), (1, 2, 3, 0)
        halves = pointwise_weight_halves(spec) if len(blocks) == 2 and nchunks == 1 else []
        columns = pointwise_weight_columns(spec) if nchunks == 1 else 1
        if halves:
            items = [(h, 0, og) for h in halves]
            positions = math.prod(spec.src)
            dy_n = diff_dst.reshape(spec.mb, g, og, positions)
            x_n = src.reshape(spec.mb, g, cg, positions)
        elif columns > 1:                                  # one whole block, input-channel chunks
            blocks = [Block(0, 1, 0, _extent(geom, "bwd_weights", algorithm)[0], True)]
            cuts = _bounds(cg, columns)
            items = [(blocks[0], c0, c1) for c0, c1 in zip(cuts, cuts[1:])]

        def work(item, out=None) -> np.ndarray:                            # dW = sum_n dY_n @ X_n^T
            b, j0, j1 = item                   # output channels [j0, j1), or input ones (columns, ch 2)
            o0, o1, c0, c1 = (0, og, j0, j1) if columns > 1 or inputs else (j0, j1, 0, cg)
            part = np.empty((1, g, o1 - o0, c1 - c0), dtype=dtype) if out is None else out
            if halves:                                                     # b: (n, p0, p1) segments
                pairs = ((dy_n[n, :, :, p0:p1], x_n[n, :, :, p0:p1]) for n, p0, p1 in b)
            else:
                pairs = zip(_pointwise_mats(diff_dst, b, g), _pointwise_mats(src, b, g))
            for i, (dy, x) in enumerate(pairs):
                for gi in range(g):
                    matmul_into(dy[gi, o0:o1], x[gi, c0:c1].T, part[0, gi], i > 0)
            return part
    else:
        layout, order = (t, g, og, cg), (1, 2, 3, 0)          # (T, G, Og, Cg) -> (G, Og, Cg, T)

        def work(item, out=None) -> np.ndarray:
            b, j0, j1 = item                  # channels [j0, j1) of axis ch (all of them: one chunk)
            o0, o1 = (0, og) if inputs else (j0, j1)
            rows0 = _grid_rows(geom, b)
            if inputs:                        # the chunk's input channels' phase grids only
                flat = _src_flat(geometry(dataclasses.replace(spec, ic=j1 - j0)), src[:, j0:j1], b, rows0, dtype)
            else:
                flat = _src_flat(geom, src, b, rows0, dtype)
            span = flat.shape[-1] - geom.max_off
            dy = _rows_in_place(geom, diff_dst, b, b.r0, b.r1 - b.r0, geom.q, g, dtype)
            if dy is None or dy.shape[-1] != span:
                part_dst = diff_dst if o1 - o0 == og else diff_dst[:, o0:o1]
                dy = _dst_grid(geom, part_dst, b, rows0, b.r0, dtype).reshape(g, o1 - o0, -1)[:, :, :span]
            else:
                dy = dy[:, o0:o1]
            part = np.empty((t, g, o1 - o0, flat.shape[2]), dtype=dtype) if out is None else out
            for i, (ph, off) in enumerate(geom.taps):
                if og == 1 and cg == 1:                # depthwise: one dot per group, no BLAS
                    np.einsum("gp,gp->g", dy[:, 0], flat[ph, :, 0, off:off + span], out=part[i, :, 0, 0])
                else:
                    matmul_into(dy, flat[ph, :, :, off:off + span].swapaxes(1, 2), part[i], False)
            return part
    rows = _block_rows(geom, algorithm, blocks)
    m = cuts[1] - cuts[0]
    if algorithm == "im2col":
        product = (og, m * t, rows) if ch == 2 else (m, cg * t, rows)
        at = ch                                                # the chunked axis of the layout
    else:
        product = NO_PRODUCT if og == cg == 1 else ((og, m, rows) if ch == 2 else (m, cg, rows))
        at = 3 if columns > 1 or ch == 2 else 2                # (T or 1, G, Og, Cg): Cg or Og
    if not blocks:
        return np.zeros(spec.weights_shape, dtype=dtype)
    if len(blocks) == 1 or nchunks > 1:
        # Each chunk's rows of the result, written in place (one row block) or as the sum
        # of that chunk's partials in block order.
        total = np.empty(layout, dtype=dtype)
        seen: set = set()

        def chunk_of(item):
            return total[(slice(None),) * at + (slice(item[1], item[2]),)]

        if len(blocks) == 1:
            _run_blocks(lambda item: work(item, chunk_of(item)), items, worst, workspace_limit, product)
        else:
            def consume(done) -> None:
                item, part = done
                view = chunk_of(item)
                if item[1] in seen:
                    view += part
                else:
                    view[...] = part
                    seen.add(item[1])
            _run_blocks(lambda item: (item, work(item)), items, worst, workspace_limit, product, consume)
    else:
        total = _sum_in_order(work, items, worst, workspace_limit, product)
    return np.ascontiguousarray(total.transpose(order)).reshape(spec.weights_shape)


@functools.lru_cache(maxsize=1024)
def flipped_spec(spec: ConvSpec) -> ConvSpec | None:
    """For stride 1, the data gradient as a forward convolution, or None.

    With stride 1, ``dsrc[i] = sum_k W[k] dY[i + pb - k*d]``. Flipping the kernel
    (``j = K - 1 - k``) gives ``dY[i - pb' + j*d]`` with ``pb' = (K - 1)*d - pb``: a
    forward correlation of ``dY`` padded by ``pb'`` in front and ``pe' = (K - 1)*d - pe``
    at the end, with the flipped kernel and input/output channels swapped per group. It
    needs no col2im scatter. None when a stride is not 1 or a pad exceeds ``(K - 1)*d``.
    """
    if any(st != 1 for st in spec.strides):
        return None
    pb = tuple((k - 1) * d - p for k, d, p in zip(spec.kernel, spec.dilations, spec.pads_begin))
    pe = tuple((k - 1) * d - p for k, d, p in zip(spec.kernel, spec.dilations, spec.pads_end))
    if min(pb + pe, default=0) < 0:
        return None
    out = ConvSpec(mb=spec.mb, ic=spec.oc, oc=spec.ic, groups=spec.groups, src=spec.dst, kernel=spec.kernel,
                   strides=spec.strides, dilations=spec.dilations, pads_begin=pb, pads_end=pe)
    return out if out.dst == spec.src else None


# The flipped forward gathers T * C_out columns per *input* position, col2im's Z holds
# T * C_in per *output* position. Flipping saves the scatter, but not when its column
# matrix is larger: a 28^3 kernel on a 1x1x1 output (a transposed convolution from a
# latent) made it 21952 times larger (1.1 GB, over the cap) where Z is 1.4M elements.
# Unpadded 3-D layers are milder: the flipped forward also multiplies (src / dst) times
# the flops, on the zero border of diff_dst. Since the scatter runs along contiguous rows
# or channels (``_scatter_layout``), col2im wins from a ratio of about 2 (measured, 2
# threads, 3d_unet data gradients, flipped / col2im: conv_4, ratio 3.3, 13.0 / 7.8 ms;
# conv_5, 1.8, 11.2 / 8.0; conv_7, 2.5, 15.5 / 8.8-12.6; conv_3, 1.45, a tie; resnet_50
# 3x3 layers, ratio 1: flipping ties or wins by up to 1.3x).
FLIP_MAX_RATIO = 1.5


# A col2im data gradient of one image that the plan would cut into row slabs splits Z's
# columns instead, in COLUMN_CHUNKS fixed chunks: halves of the input channels, or, with
# one channel per group, halves of the kernel's first axis. Each chunk is one product
# over every output position, scattered into its own zeroed block, which is added into
# dsrc in chunk order (the chunks of one channel overlap there). Derivation: Z =
# W_cols^T @ dY (rows: (c, k), columns: output positions y) and dX[window(y, k)] += Z[(c, k),
# y]; the rows of a chunk are contiguous in W_cols^T (channel-major, then the kernel's
# first axis), and a chunk of taps k0 in [a, b) is the same scatter with kernel axis 0
# of b - a taps, shifted by a * d along input axis 0. The slabs had made each product a
# few output positions wide: per-thread products (1 thread, float32) of the ISTFT
# (1024 x 1026 x 112 / 512 x 1026 x 224) 1.45-1.56 / 1.28-1.30 ms; the whole data
# gradient, in-process medians, chunks / slabs: 0.89-0.95 (four runs). The chunks scatter
# with ``_col2im``, so only problems whose slabs do too (``rows`` and ``classes``
# layouts, huge kernels) take them: 3d_unet conv_8's products ran faster in chunks (3456
# x 512 x 100: 2.35 ms against 3.4-3.8 for its slabs' 50 positions) but its channel-last
# scatter (``channels_ct``) on the K-major chunks lost more, 1.04-1.15.
COLUMN_CHUNKS = 2


def column_chunks(spec: ConvSpec, blocks: list) -> tuple[str, int]:
    """How a col2im data gradient of one image splits its column matrix (pure): ("channels",
    2) or ("taps", 2) where the plan cuts the image into row slabs (``blocks``) that
    scatter with ``_col2im`` and a chunk has at least one channel or kernel row; ("", 1)
    otherwise."""
    if spec.mb != 1 or len(blocks) < 2 or blocks[0].whole or _scatter_layout(spec, blocks[0]) not in ("rows", "classes"):
        return "", 1
    if spec.icg >= COLUMN_CHUNKS:
        return "channels", COLUMN_CHUNKS
    if spec.kernel[0] >= COLUMN_CHUNKS:
        return "taps", COLUMN_CHUNKS
    return "", 1


# A col2im data gradient of one image with many output channels on few output positions
# (3d_unet conv_6 - conv_8: 256-512 output channels, 100-294 output positions, 27 taps)
# runs as COLUMN_CHUNKS fixed chunks of its input channels, each one product over every
# output position (Z_chunk = W_cols^T[chunk] @ dY: 1728 x 256 x 294 for conv_6, where the
# row slabs had made 147 x 256 x 3456 products) scattered by a compiled loop
# (``_spread_jit.scatter_add``) straight into the chunk's own channels of dsrc: no padded
# block per slab, and no adds by the calling thread after the products (slabs of one
# image overlap; chunks of channels do not). Each cell's terms are added in one fixed
# order on one thread, so the bits do not depend on the threads. In one process, the two
# interleaved (10 rounds of a 0.05 s pause, 64 MB of other traffic, a warm-up and 3
# calls; medians, ms, and the paired ratio to ``blocked``, 2 threads, AMD EPYC Zen 3):
# conv_6 (128 <- 256) 5.40 / 6.15 (0.88), then, as the automatic choice, 0.81 and 0.91;
# conv_8 (256 <- 512) 6.75 / 10.08 (0.66; 8.09 its slabs), then 0.62; conv_7 (256 <- 256)
# even (0.80, 0.99, 1.02, 1.11); but conv_5 (128 <- 128, 729 positions) 8.53 / 5.88
# (1.46): the scatter's share grows as the output channels shrink (it adds C*T*P terms
# to the product's C*T*P*O multiply-adds). Nor did more positions or padding pay (paired,
# a test run on the other core): 128 <- 256 on an unpadded 10^3 input (512 positions)
# 1.08, padded to keep 8^3 (512) 1.39, padded 6x7x7 (294) 1.02. Measured on unpadded 3-D
# layers only, so only they take it.
SCATTER_MIN_OUTPUTS = 256
SCATTER_MAX_POSITIONS = 300


def scatter_chunks(spec: ConvSpec) -> bool:
    """Whether a col2im data gradient runs as the compiled scatter's channel chunks (pure;
    derived above): one unpadded image on three spatial axes, at least COLUMN_CHUNKS
    input channels per group, at least SCATTER_MIN_OUTPUTS output channels per group, at
    most SCATTER_MAX_POSITIONS output positions, and not one that ``im2col`` runs as the
    flipped forward (``flipped_data_gradient``, tried first)."""
    return (spec.mb == 1 and spec.nsp == 3 and not any(spec.pads_begin) and not any(spec.pads_end)
            and spec.icg >= COLUMN_CHUNKS and spec.ocg >= SCATTER_MIN_OUTPUTS
            and math.prod(spec.dst) <= SCATTER_MAX_POSITIONS and flipped_data_gradient(spec) is None)


def _col2im_column_chunks(spec: ConvSpec, diff_dst: np.ndarray, weights: np.ndarray, dtype, how: str, chunks: int,
                          workspace_limit: int) -> np.ndarray | None:
    """``column_chunks``' data gradient (derived there; ``how``: "channels" or "taps"), or
    ``scatter_chunks``' ("scatter": numba must be there), or None when a chunk's column
    matrix and scatter block do not fit the workspace cap."""
    g, cg, og = spec.groups, spec.icg, spec.ocg
    t = math.prod(spec.kernel)
    k0, d0 = spec.kernel[0], spec.dilations[0]
    per = t if how in ("channels", "scatter") else t // k0      # Z rows per channel, or per kernel row
    rows = math.prod(spec.dst)
    whole = Block(0, 1, 0, spec.dst[0], True)
    cuts = _bounds(k0 if how == "taps" else cg, chunks)
    items = [(gi, a, b) for gi in range(g) for a, b in zip(cuts, cuts[1:])]

    def sub(a: int, b: int) -> ConvSpec:          # the chunk's scatter as a problem of its own
        if how in ("channels", "scatter"):
            return dataclasses.replace(spec, ic=b - a, oc=og, groups=1)
        return dataclasses.replace(spec, ic=1, oc=og, groups=1, kernel=(b - a,) + spec.kernel[1:])

    itemsize = np.dtype(dtype).itemsize
    worst = max((b - a) * per * rows * itemsize
                + (0 if how == "scatter" else
                   math.prod(_padded_rows(sub(a, b), whole)) * (b - a if how == "channels" else 1) * itemsize)
                for a, b in zip(cuts, cuts[1:]))
    if worst > workspace_limit:
        return None
    w_cols = _weights(spec, weights, (0, 1, 2, 3), dtype).reshape(g, og, cg * t).swapaxes(1, 2)   # (G, Cg*T, Og)
    dy = _dst_rows(spec, diff_dst, whole, dtype).reshape(g, og, rows)
    dsrc, zero = _result(spec.src_shape, dtype, zeroed=True)
    if not zero:
        dsrc.fill(0)

    jit = _spread() if how == "scatter" else None        # (the caller checked it is there)
    one = (1,) * (3 - spec.nsp)                 # the loop's three axes: leading ones of size 1
    geometry3 = sum(_loop_axes(spec), ())

    def scatter(item) -> None:                  # straight into the chunk's own channels of dsrc
        gi, a, b = item
        z = _scratch("a", ((b - a) * per, rows), dtype)
        matmul_into(w_cols[gi, a * per:b * per], dy[gi], z, False)
        z = z.reshape((b - a,) + one + spec.kernel + one + spec.dst)
        out = dsrc[0, gi * cg + a:gi * cg + b].reshape((b - a,) + one + spec.src)
        jit.scatter_add(z, out, *geometry3)

    if jit is not None:
        _run_blocks(scatter, items, worst, workspace_limit, (cuts[1] * per, rows, og))
        return dsrc

    def work(item):
        gi, a, b = item
        cspec = sub(a, b)
        z = _scratch("a", ((b - a) * per, rows), dtype)
        matmul_into(w_cols[gi, a * per:b * per], dy[gi], z, False)
        padded = np.zeros((1, cspec.ic) + _padded_rows(cspec, whole), dtype=dtype)
        _col2im(cspec, z.reshape((1, cspec.ic) + cspec.kernel + (1,) + spec.dst), padded)
        return item, padded

    def consume(result) -> None:                # input cell x = padded cell + shift - pads_begin
        (gi, a, b), padded = result
        c0, c1 = (gi * cg, gi * cg + 1) if how == "taps" else (gi * cg + a, gi * cg + b)
        shift = (a * d0 if how == "taps" else 0,) + (0,) * (spec.nsp - 1)
        box, src = [], []
        for j in range(spec.nsp):
            lo = max(0, spec.pads_begin[j] - shift[j])
            hi = min(padded.shape[2 + j], spec.pads_begin[j] + spec.src[j] - shift[j])
            if hi <= lo:
                return
            box.append(slice(lo, hi))
            src.append(slice(lo + shift[j] - spec.pads_begin[j], hi + shift[j] - spec.pads_begin[j]))
        dsrc[(0, slice(c0, c1)) + tuple(src)] += padded[(0, slice(None)) + tuple(box)]

    _run_blocks(work, items, worst, workspace_limit, (cuts[1] * per, rows, og), consume)
    return dsrc


def flipped_data_gradient(spec: ConvSpec) -> ConvSpec | None:
    """``flipped_spec`` when ``im2col`` runs the data gradient that way, else None (col2im;
    pure): stride 1 and a flipped column matrix at most ``FLIP_MAX_RATIO`` times Z's."""
    flipped = flipped_spec(spec)
    if flipped is None or spec.oc * math.prod(spec.src) > FLIP_MAX_RATIO * spec.ic * math.prod(spec.dst):
        return None
    return flipped


def conv_backward_data(spec: ConvSpec, diff_dst: np.ndarray, weights: np.ndarray, *, dtype, algorithm: str,
                       workspace_limit: int, rows_target: int) -> np.ndarray:
    if whole_window_spec(spec):
        done = _whole_window(spec, "bwd_data", diff_dst, weights, dtype, workspace_limit)
        if done is not None:
            return done
    if framed_spec(spec):
        done = _framed(spec, "bwd_data", diff_dst, weights, dtype, workspace_limit)
        if done is not None:
            return done
    geom = geometry(spec)
    g, cg, og, t = spec.groups, spec.icg, spec.ocg, len(geom.taps)
    flipped = flipped_data_gradient(spec) if algorithm == "im2col" else None
    if flipped is not None:
        # weights (G*Og, Cg, *K) -> (G*Cg, Og, *K): a transposing copy of whole kernels (one
        # T-element record per (o, c), run on every thread: 1.0 ms for 512 x 512 x 3 x 3
        # where a copy that also reversed the taps took 1.8 ms, one thread). The flip itself
        # is read for free: the column gather reads every window back to front.
        w = weights.reshape(g, og, cg, t)
        if w.dtype != dtype or not w.flags.c_contiguous:
            w = np.ascontiguousarray(w, dtype=dtype)
        record = np.dtype((np.void, t * w.itemsize))
        flat = np.empty((g, cg, og, t), dtype=dtype)
        _parallel_copy(flat.view(record)[..., 0], w.view(record)[..., 0].swapaxes(1, 2), axis=1)
        return conv_forward(flipped, diff_dst, flat.reshape((spec.ic, og) + spec.kernel), dtype=dtype,
                            algorithm="im2col", workspace_limit=workspace_limit, rows_target=rows_target,
                            reverse_taps=True)
    chunks = packed_pointwise_chunks(spec) if algorithm == "taps" else 0
    if chunks:
        done = _packed_pointwise_data(spec, diff_dst, weights, dtype, chunks, workspace_limit)
        if done is not None:
            return done
    if algorithm == "taps" and strided_1x1_data(spec):
        done = _strided_1x1_data(spec, diff_dst, weights, dtype, workspace_limit)
        if done is not None:
            return done
    if algorithm == "im2col" and scatter_chunks(spec) and _spread() is not None:
        done = _col2im_column_chunks(spec, diff_dst, weights, dtype, "scatter", COLUMN_CHUNKS, workspace_limit)
        if done is not None:
            return done
    blocks, worst = _plan(geom, "bwd_data", algorithm, dtype, workspace_limit, rows_target)
    how, chunks = column_chunks(spec, blocks) if algorithm == "im2col" else ("", 1)
    if chunks > 1:
        done = _col2im_column_chunks(spec, diff_dst, weights, dtype, how, chunks, workspace_limit)
        if done is not None:
            return done
    pointwise = algorithm != "im2col" and _pointwise(spec, diff_dst, dtype=dtype)
    # the pointwise products write every element: no zeroing pass (1 ms of a 10 ms, 30 MB
    # data gradient on the AVX-512 VM, whose memory runs at ~20 GB/s for two cores); the
    # ``taps`` blocks zero their own rows just before they write them (``_block_src_rows``),
    # except for results so large that the allocator maps fresh pages, which come zeroed
    nbytes = math.prod(spec.src_shape) * np.dtype(dtype).itemsize
    rows = algorithm != "im2col" and not pointwise
    dsrc, zero = _result(spec.src_shape, dtype, zeroed=not (pointwise or rows) or nbytes >= FRESH_PAGES_BYTES)
    if algorithm == "im2col" and not zero:
        dsrc.fill(0)
    zero_rows = rows and not zero
    if algorithm == "im2col":
        # (G, Cg*T, Og) as the transpose of the weights' own (G, Og, Cg*T) layout: BLAS reads
        # it in place (transposing a 512 x 4608 weight matrix cost ~3 ms, a third of a call).
        w_cols = _weights(spec, weights, (0, 1, 2, 3), dtype).reshape(g, og, cg * t).swapaxes(1, 2)
        layouts = {b: _scatter_layout(spec, b) for b in blocks}
        w_tc = None
        if "channels" in layouts.values():
            # (G, Og, T, Cg): a transposing copy (taps outside the channels), on every thread
            w_tc = np.empty((g, og, t, cg), dtype=dtype)
            _parallel_copy(w_tc, weights.reshape(g, og, cg, t).swapaxes(2, 3), axis=1)
            w_tc = w_tc.reshape(g, og, t * cg)

        def work(b: Block):
            dy = _dst_rows(spec, diff_dst, b, dtype)
            rows = dy[0].size
            dy = dy.reshape(g, og, rows)
            block_dst = (b.nb, b.r1 - b.r0) + spec.dst[1:]
            nsp = spec.nsp
            layout = layouts[b]
            if layout == "channels":                   # Z^T = dY^T @ W_tc, stored (rows, G, T*Cg)
                z = _scratch("a", (rows, g, t * cg), dtype)
                matmul_into(dy.swapaxes(1, 2), w_tc, z.transpose(1, 0, 2), False)
                padded = np.zeros((b.nb,) + _padded_rows(spec, b) + (spec.ic,), dtype=dtype)
                _col2im_channels_last(spec, z.reshape(block_dst + (g, t, cg)),
                                      padded.reshape(padded.shape[:-1] + (g, cg)))
                return b, np.moveaxis(padded, -1, 1)   # (nb, C, *padded rows) view
            if layout in ("rows", "channels_ct"):      # Z^T = dY^T @ W_cols^T, stored (rows, G, Cg*T)
                z = _scratch("a", (rows, g, cg * t), dtype)
                matmul_into(dy.swapaxes(1, 2), w_cols.swapaxes(1, 2), z.transpose(1, 0, 2), False)
                if layout == "channels_ct":            # (nb, *dst_b, G, T, Cg) view, Cg strided by T
                    padded = np.zeros((b.nb,) + _padded_rows(spec, b) + (spec.ic,), dtype=dtype)
                    _col2im_channels_last(spec, z.reshape(block_dst + (g, cg, t)).swapaxes(-1, -2),
                                          padded.reshape(padded.shape[:-1] + (g, cg)))
                    return b, np.moveaxis(padded, -1, 1)
                z = z.reshape(block_dst + (g, cg) + spec.kernel)
                z = z.transpose((nsp + 1, nsp + 2) + tuple(range(nsp + 3, 2 * nsp + 3)) + tuple(range(nsp + 1)))
            else:
                z = _scratch("a", (g, cg * t, rows), dtype)
                matmul_into(w_cols, dy, z, False)
                z = z.reshape((g, cg) + spec.kernel + block_dst)
            padded = np.zeros((b.nb, spec.ic) + _padded_rows(spec, b), dtype=dtype)
            (_col2im_phases if layout == "phases" else _col2im)(spec, z, padded)
            return b, padded

        product = (cg * t, _block_rows(geom, algorithm, blocks), og)
        def consume(result) -> None:               # overlapping slabs add in block order
            b, padded = result
            inside = _padded_box(spec, b)
            if inside is not None:
                dsrc[(slice(b.n0, b.n0 + b.nb), slice(None)) + inside[1]] += padded[(slice(None), slice(None)) + inside[0]]
        _run_blocks(work, blocks, worst, workspace_limit, product, consume)
        return dsrc
    w = _weights(spec, weights, (3, 0, 2, 1), dtype)                       # (T, G, Cg, Og)
    if pointwise:
        items = pointwise_items(spec, "bwd_data")
        if items:
            _pointwise_items_run(spec, w[0], diff_dst, dsrc, items, workspace_limit)
            return dsrc

        def work(b: Block) -> None:                                        # dX_n = W^T @ dY_n
            for dy, dx in zip(_pointwise_mats(diff_dst, b, g), _pointwise_mats(dsrc, b, g)):
                for gi in range(g):
                    matmul_into(w[0, gi], dy[gi], dx[gi], False)

        _run_blocks(work, blocks, worst, workspace_limit, (cg, _block_rows(geom, algorithm, blocks), og))
        return dsrc
    by_phase = [[i for i, (ph, _) in enumerate(geom.taps) if ph == p] for p in range(len(geom.phases))]
    unit = _unit_phase(spec) and geom.q == spec.src

    def work(b: Block) -> None:
        # Zero the block's own rows of dsrc here, on the pool, right before the phases below
        # write theirs (rows no phase reaches stay zero): a serial np.zeros of the whole
        # result cost 1.8 ms of 12 for resnet_50 res4a_branch2a (30 MB, stride 2, where
        # three of the four phases have no tap) and left the rows cold for the scatter. A
        # result whose memory is known to be zero (fresh pages: ``results.take``, or
        # np.zeros from FRESH_PAGES_BYTES up with the result cache off) is not zeroed again:
        # that doubled the writes (res3a_branch2a, 61 MB: 17.4 -> 19.2 ms median).
        if zero_rows:
            dsrc[(slice(b.n0, b.n0 + b.nb), slice(None), _block_src_rows(geom, b))] = 0
        rows0 = _grid_rows(geom, b)
        lead = 0 if b.whole else geom.max_sh[0]
        dy = _dst_grid(geom, diff_dst, b, rows0, b.r0 - lead, dtype, front=geom.max_off)
        dy = dy.reshape(g, og, -1)
        first = lead * geom.row_len                   # flat row of the block's first phase row
        span = b.nb * rows0 * geom.row_len - first
        base = geom.max_off + first
        out_rows = (b.r1 - b.r0) if not b.whole else geom.q[0]
        q_lo = (b.r0,) + (0,) * (spec.nsp - 1)
        q_hi = (b.r0 + out_rows,) + geom.q[1:]
        res = _rows_in_place(geom, dsrc, b, b.r0, out_rows, geom.q, g, dtype) if unit else None
        if res is not None and res.shape[-1] == span:         # the one phase is dsrc itself
            _sum_products(((w[i], dy[:, :, base - off:base - off + span]) for i, (_, off) in enumerate(geom.taps)), res)
            return
        res = _scratch("a", (g, cg, span), dtype)
        for p, taps_p in enumerate(by_phase):
            sl = _phase_slices(spec, geom.phases[p], q_lo, q_hi)
            if sl is None:
                continue
            pairs = ((w[i], dy[:, :, base - geom.taps[i][1]:base - geom.taps[i][1] + span]) for i in taps_p)
            _sum_products(pairs, res)
            grid = res.reshape((spec.ic, b.nb, out_rows) + geom.q[1:])
            dsrc[(slice(b.n0, b.n0 + b.nb), slice(None)) + sl[1]] = grid[(slice(None), slice(None)) + sl[0]].swapaxes(0, 1)

    product = (cg, _block_rows(geom, algorithm, blocks), og) if og > 1 else NO_PRODUCT
    _run_blocks(work, blocks, worst, workspace_limit, product)
    return dsrc
