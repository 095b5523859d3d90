"""Channels-last register-blocked kernel, algorithm ``blocked`` (kernel layer: arrays and a
ConvSpec only).

The GEMM lowerings (``gemm.py``) move the data around BLAS: im2col copies, per-tap
products that pack their operands again, scatters. Here the convolution is its own GEMM:
the operands are copied once into channels-last layouts, and a register-blocked
micro-kernel compiled for this CPU (``_ukernel.py``, 512-bit vectors on AVX-512, 256-bit on
AVX2) reads them in place.

Forward (any stride, dilation and padding)::

    y[n, p, o] = sum_t sum_c x[n, p*s - pb + k_t*d, c] * W[o, c, k_t]

The input is copied to ``(N, rows, Wp, C)`` with zeros around the last spatial axis
(``rows``: every other spatial axis), so along that axis a tile of ``R`` consecutive
outputs reads ``R`` cells ``s_w * C`` apart for every tap; the other axes are resolved
per output row: a tap whose input row lies in the padding is left out of the row's term
list (no work on zero rows). The weights go into blocks ``(T, C_g, 64)`` of output
channels (the vector lanes); a tile sums ``x`` element (broadcast) times weight vector
over the taps and channels, in registers, and stores ``R x 64`` outputs once.

Data gradient (stride 1): the forward convolution of ``diff_dst`` with the kernel flipped
and channels swapped, pads ``(K - 1)*d - p`` (``gemm.flipped_spec``, derived there); the
flip is done while the weights are put in blocks.

1x1 layers (``pointwise_spec``) need no copy: the forward and data gradient put positions
in the lanes and broadcast the weights (``y[n, o, p] = sum_c W[o, c] x[n, c, p]``, the
last vector of an image masked; the data gradient of few channels strip by strip,
``pointwise_strips``, each strip of positions read once from memory). On AVX-512 hosts the
weight gradient of any unpadded 1x1 layer (strided too) is one product over every image and
position (``inplace_weights``): one operand read in place as the broadcast operand, the
other transposed block by block into a buffer of positions x channels, the vectors; where
that does not run, it sums ``dy[n, o, p] * x[n, c, p]`` along the lanes of both rows
(``dotkernel``) in blocks of positions, then across the lanes in a fixed halving order. 1-D stride-1 layers
(``line_spec``) run the same way on the rows themselves, each tap a shifted read of the
row, the weights broadcast from their own layout (flipped in place for the data gradient),
the outputs at the row ends whose taps reach the padding on a small zero-padded window;
their weight gradient (``line_weights``, few channels) sums each tap's ``dy`` row against the input row shifted
by ``t*d - pb`` along the lanes, over the outputs whose cell is in the row (no padding to
write: the padding adds nothing). Strided 1x1 forwards and data gradients run the same on
a copy of the input cells their outputs read (``strided_pointwise``; the data gradient is
zero on the other cells); their weight gradient is the general one below, on the cells
read where the stride along the last axis is 2 (``compressed_spec``: the copies gather
every other cell).

Weight gradient (any stride, dilation, padding)::

    dW[o, c, k_t] = sum_n sum_p x[n, p*s - pb + k_t*d, c] * dy[n, p, o]

the same micro-kernel with the roles turned: a tile is ``R`` input channels (broadcast from
the channels-last input) x 64 output channels (vectors of the channels-last ``diff_dst``)
of one tap, summed over the positions of every output row whose input row is real, the
rows taken in chunks that stay in cache while every tile walks them. With one group and
no dilation along the last axis, the taps of that axis join the channels (``(kw, c)`` pairs
are consecutive in a channels-last row), so first layers with 3 input channels still fill
tiles of up to 12 rows. Where the weights are small (``_weight_parts``) the copies are
streamed: a fixed number of parts of the rows, each with its own partial weights, copy
their chunks channels-last into cache-sized buffers just before the tiles read them (rows
longer than a chunk cut into segments), and the partial weights are added in order at
the end; otherwise both arrays are copied whole and the threads split the tiles. With
``WEIGHT_PARTS`` parts only ``diff_dst`` is copied (``ncx_weights``): the broadcast operand
is any strided array, so a tile's ``R`` input channels are planes of the NCX input read in
place (``a_rs`` a plane, ``a_ks`` the stride along the row), and each tap sums over the
positions whose cell is real, one range per tap along the last axis (no copy to put the
padding in). In-process, 2 threads, medians of 6 rounds, in place / copied (two
sessions): resnet_50 res3a_branch2a (1x1 stride 2, 256 -> 128, 56^2, mb19) 6.84 / 9.35
and 6.75 / 10.63 ms, res2b_branch2a (1x1, 256 -> 64, mb9) 5.05 / 6.97, res2a_branch2b (3x3,
64 ch) 4.43 / 4.83, 3d_unet conv_1 6.44 / 7.13, the grouped 3x3 layer (8 x 16 ch, 224^2)
6.80 / 8.07, mobilenet conv4 - conv7 0.82-0.98, conv1 and resnet_50 conv1 (3 input
channels, taps merged with the channels in the copies) 1.00 and 1.01, res3a_branch2c
0.99-1.09; with 2 parts (larger weights) it lost (res4a_branch1 9.89 / 6.58), so those
keep the copies.

The layout copies go through a compiled ``V x V`` block transpose (``_ukernel.transpose_ir``:
masked loads, ``log2 V`` stages of two-source shuffles, masked stores) instead of an element
loop: both whole copies of resnet_50 conv1's weight gradient (mb4) 2.4 -> 1.6 ms, of
res2a_branch2b 1.5 -> 1.0 ms (2 threads, memory-bound). A group of ``V`` channels goes
down all its rows before the next group, the rows two ahead prefetched, so that each
channel plane is read in ascending order (``_blocked_jit._copy_rows``).

Determinism: every sum runs in an order fixed by the problem (taps, then channel chunks
whose size depends on the problem only, then channels; for the weights, row chunks, rows,
positions, and the streamed parts, whose number and bounds the problem fixes); threads
split output rows (forward), weight tiles or parts, never a sum. So results
are bitwise identical whatever the thread count. Only float32 compute (half types are
converted); numba runs the loops around the micro-kernel (``_blocked_jit.py``).

Non-finite values: the zeros around the last axis and in the padded lanes are multiplied
like the GEMM lowerings' zero cells (an ``inf`` weight next to that padding gives NaN
there; the weight gradient read in place skips the last axis's padding); taps that fall
in the padding of the other axes are skipped.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .. import threads
from ..errors import WorkspaceError
from ..spec import ConvSpec
from . import _ukernel, depthwise, results
from .gemm import _scratch, flipped_spec, framed_spec, guided_chunks, pointwise_spec, run_each, unpadded_1x1
from .gemm import sampled_cells as _sampled_cells

# Bytes of one block of weights (taps x a chunk of input channels x 64 output channels)
# that the forward keeps in the L2 cache while the rows stream past it. The input channels
# of a block are cut into chunks of at most this size.
WEIGHT_BLOCK_BYTES = 512 * 1024
# Bytes of output rows (diff_dst and the input rows they read) per chunk of the weight
# gradient, by vector width: every tile of a thread walks the chunk, so it must stay close
# to the core. On AVX2 (a 4 x 24 tile: each step reads a line of the input and one and a
# half of diff_dst for 12 FMAs) 64 KiB against the 1 MiB that AVX-512 hosts keep (where
# 256 KiB - 2 MiB measured alike). Measured on an AMD EPYC Zen 3 (family 25 model 1, L2
# 512 KiB), 2 threads, in one process, 64 KiB / 1 MiB interleaved (6 rounds; paired
# medians): res2a_branch2b (64 ch 56^2 mb4) 0.70, 128 ch 28^2 0.74, 64 ch 28^2 mb8 0.83,
# 48 -> 80 ch 0.72, 3d_unet conv_2 0.70, 64 ch 16x18x18 0.74, mobilenet conv1 (3 -> 32, s2)
# 0.83, resnet_50 conv1 0.85, VGG conv1 0.78, 16 ch 128^2 1.05; 48 KiB, 80 KiB, 96 KiB and
# 128 KiB did no better over these (chunks of whole rows: the best count of rows moves with
# the row's size). Chunks of whole rows sum in the same order, so the bits stay (rows cut
# into segments do move the parts' bounds).
ROW_CHUNK_BYTES = {256: 64 * 1024, 512: 1024 * 1024}
# Weight-heavy forwards (and flipped data gradients) of one group run block by block
# (``block_order``): each thread takes a block of output channels, puts its weights in
# order (``weight_blocks``) and runs every output row on it while they are in L2, the next
# block going to whichever thread is free; the rows are then copied back to NCX in a
# second hand-off. Row order had first put all the weights in blocks (two threads copying
# at once: res5a_branch2b's 9.4 MB took 1.7 of a 7.4 ms data gradient) and then walked
# them from L3. Every output is the same sum either way, so the bits do not change. Where
# the weights are at least BLOCK_ORDER_MIN_WEIGHT_RATIO times the input's channels-last
# copy, there are at least BLOCK_ORDER_MIN_BLOCKS blocks (for the two threads to share)
# and one block's weights fit WEIGHT_BLOCK_BYTES. In one process, the two orders
# interleaved (20 rounds of a 0.05 s pause, 64 MB of other traffic, a warm-up and 3
# calls; 2 threads, AMD Zen 3), paired medians block / row order, data gradient and
# forward: res5a_branch2b (512 ch 7^2 mb4) 0.97 / 0.94 and 0.96 / 0.97, 512 ch 14^2
# 0.95 / 0.97, 384 ch 10^2 mb2 0.94 / 0.96, 256 ch 7^2 mb4 0.96 / 0.94; res4a_branch2b
# (weights 2.4x its input) 0.99 / 0.98. Blocks larger than the cache lost: 3d_unet conv_7
# (27 taps x 256 channels) 1.06 / 1.02; conv_6 1.00 / 1.00.
BLOCK_ORDER_MIN_WEIGHT_RATIO = 4
BLOCK_ORDER_MIN_BLOCKS = 8


def _row_chunk_bytes() -> int:
    """``ROW_CHUNK_BYTES`` for this host's vector width (512 where the kernel is unavailable)."""
    return ROW_CHUNK_BYTES[vector_bits() or 512]
# The streamed weight gradient (``_weight_parts``) cuts the output rows into this many
# parts (fixed: the parts' partial sums are added in order, so results do not depend on
# the threads), while their copies of the weight blocks fill at most WEIGHT_PARTS_BYTES.
WEIGHT_PARTS = 8
WEIGHT_PARTS_BYTES = 4 << 20
# Weights up to half this size stream in two parts (one per thread here). Measured, ms,
# mb4, two parts / whole copies, three alternating processes: resnet_50 res4b_branch2b
# (2.3 MiB) 4.1-4.5 / 4.4-4.7, res3b_branch2b (0.6 MiB) 3.8-4.0 / 4.4-4.8, the stride-2
# res4a_branch2b 4.4-4.8 / 5.4-5.7 and res3a_branch2b 4.2-4.4 / 5.8-6.5; but
# res5a_branch2b (9 MiB) 6.5 / 4.9 and 3d_unet conv_7 (7 MiB) 4.4 / 3.5, so larger weights
# are copied whole.
WEIGHT_TWO_PARTS_BYTES = 6 << 20
# Below this many multiply-adds a call runs on the calling thread alone.
PARALLEL_MACS = 3 << 19
# Copies of at least this many elements run on the pool.
PARALLEL_COPY = 1 << 16
# 1x1 convolutions (``pointwise_spec``) run on the NCX arrays in place, vectors along the
# positions: blocks of positions whose rows of every reduced channel fill at most this
# many bytes (they are read once from memory and then from cache by every row tile).
POINTWISE_BLOCK_BYTES = 512 * 1024
# The data gradient's products run strip by strip (``pointwise_strips``) where a strip of
# one register tile's positions (4 x 16 on AVX-512) down every reduced (output) channel
# stays in L1 or L2: at most POINTWISE_STRIP_MAX_CHANNELS of them (64 KiB). In-process
# medians, strip / row order, 64 MB of other traffic before each call (2 threads, three
# runs): mobilenet conv2 (32 <- 64 channels, 112^2) 0.91-0.92, conv3 (64 <- 128, 56^2)
# 0.81-0.90, conv4 (128 <- 128) 0.90, resnet_50 res2b_branch2a (256 <- 64) 0.97;
# mobilenet conv5 (128 <- 256 at 28^2) 0.92-0.98, conv6 (256 <- 256) 0.97 and 1.04-1.06;
# with more channels no gain (conv8, 512 <- 512 at 14^2, 1.01), and the forwards lose
# (64 -> 128 1.05, 64 -> 256 1.11, 128 -> 256 1.06).
POINTWISE_STRIP_MAX_CHANNELS = 256
# 1x1 weight gradients with more input + output channels per group than this take the
# streamed channels-last path (``pointwise_weights``). Measured (ms, in-process, streamed /
# lanes of the NCX rows / the GEMM lowering chosen before): 256 -> 64 at 56^2 mb9 6.6 /
# 7.5 / 7.4; 64 -> 256 6.4 / 6.8 / 7.1; 128 -> 128 5.0 / 6.4 / 6.4; 256 -> 512 at 14^2 mb19
# 5.4 / 9.7 / 6.3; 128 -> 512 at 28^2 5.4 / 8.3 / 5.3; 512 -> 128 5.8 / 8.6 / 5.5.
POINTWISE_WEIGHTS_MAX_CHANNELS = 192
# 1-D rows (``line_spec``) read every weight once per block of positions, so the weights
# must stay in the L2 cache: 512 channels k3 (3 MiB) ran 10.8 / 12.6 ms (fwd / bwd_data)
# against 10.7 / 10.9 on im2col, 128 channels k5 (320 KiB) 3.7 / 4.0 against 4.4 / 4.5.
LINE_MAX_WEIGHT_BYTES = 1 << 20


def available() -> bool:
    """Whether the kernel can run: numba (``depthwise.available``) and the micro-kernels
    (llvmlite on an x86-64 host with AVX2 + FMA or AVX-512)."""
    return depthwise.available() and _jit() is not None and _ukernel.compiled() is not None


def vector_bits() -> int:
    """Width of the micro-kernels' vectors on this host (512 or 256), 0 where unavailable."""
    c = _ukernel.compiled() if available() else None
    return 0 if c is None else 32 * c.lanes


def host_cpu() -> str:
    """LLVM's name of the CPU the micro-kernels were built for (``znver5``,
    ``skylake-avx512``, ...), "" where unavailable."""
    c = _ukernel.compiled() if available() else None
    return "" if c is None else c.cpu


def unavailable_reason() -> str:
    """Why ``available()`` is False, in words (for error messages)."""
    if not depthwise.available() or _jit() is None:
        return "numba is not installed or CONVGRAD_NUMBA=0"
    if _ukernel.compiled() is None:
        return "llvmlite could not build the micro-kernels for this CPU"
    return "it is available"


@functools.lru_cache(maxsize=1)
def _jit():
    try:
        from . import _blocked_jit
    except ImportError:
        return None
    return _blocked_jit


def eligible(spec: ConvSpec, direction: str) -> bool:
    """Problems the kernel runs: 1-3 spatial axes; the data gradient with stride 1 and
    pads at most ``(K - 1)*d`` (a forward convolution of ``diff_dst``), or of a strided 1x1
    layer (``strided_pointwise``)."""
    if not 1 <= spec.nsp <= 3 or 0 in spec.dst:
        return False
    return (direction != "bwd_data" or flipped_spec(spec) is not None or strided_pointwise(spec) is not None
            or framed_data(spec))


@functools.lru_cache(maxsize=256)
def strided_pointwise(spec: ConvSpec) -> ConvSpec | None:
    """A 1x1 problem with strides and no padding as the 1x1 stride-1 problem on the input
    positions the outputs read (``x[..., 0 : s*(dst-1)+1 : s]``, every other input cell has
    zero gradient), when that one runs on the NCX arrays (``pointwise_spec``); else None."""
    if (all(s == 1 for s in spec.strides) or any(k != 1 for k in spec.kernel) or any(spec.pads_begin)
            or any(spec.pads_end)):
        return None
    ones = (1,) * spec.nsp
    sub = ConvSpec(mb=spec.mb, ic=spec.ic, oc=spec.oc, groups=spec.groups, src=spec.dst, kernel=spec.kernel,
                   strides=ones, dilations=ones, pads_begin=(0,) * spec.nsp, pads_end=(0,) * spec.nsp)
    return sub if pointwise_spec(sub) else None


def _lanes() -> tuple[int, int, int]:
    """(lanes V, register tile rows R_MAX, output channels per block = OB_MAX * V)."""
    c = _ukernel.compiled()
    return c.lanes, c.r_max, c.ob_max * c.lanes


def _padded(count: int, lanes: int) -> int:
    return -(-count // lanes) * lanes


def _last_axis(spec: ConvSpec) -> tuple[int, int]:
    """(Wp, pad): the last axis of the channels-last input, every cell a tile reads, and
    where the input's first cell goes."""
    need = (spec.dst[-1] - 1) * spec.strides[-1] + (spec.kernel[-1] - 1) * spec.dilations[-1] + 1
    return max(need, spec.pads_begin[-1] + spec.src[-1]), spec.pads_begin[-1]


def _copied_elements(fspec: ConvSpec) -> tuple[int, int]:
    """Elements of the input's channels-last copy and of the weight blocks that the forward
    loop on ``fspec`` makes (pure)."""
    ogp = _padded(fspec.ocg, _lanes()[0] if available() else 16)
    xcl = fspec.mb * math.prod(fspec.src[:-1]) * _last_axis(fspec)[0] * fspec.ic
    return xcl, fspec.groups * math.prod(fspec.kernel) * fspec.icg * ogp


def _workspace(spec: ConvSpec, direction: str) -> int:
    """Bytes of the channels-last copies (the streamed weight gradient: every thread's
    chunk buffers and the parts' blocks), the weight blocks and any converted input."""
    fspec = flipped_spec(spec) if direction == "bwd_data" else spec
    rows_dst = fspec.mb * math.prod(fspec.dst[:-1])
    ogp = _padded(fspec.ocg, _lanes()[0] if available() else 16)
    xcl, blk = _copied_elements(fspec)
    ycl = rows_dst * fspec.dst[-1] * fspec.groups * ogp
    converted = math.prod(fspec.src_shape) + math.prod(fspec.dst_shape)
    if direction == "bwd_weights":
        parts, chunk_rows, _, seg = _weight_parts(fspec)
        if parts:      # per thread, at most an image's input rows and a chunk of diff_dst
            cells = (seg - 1) * fspec.strides[-1] + (fspec.kernel[-1] - 1) * fspec.dilations[-1] + 1
            bufs = math.prod(fspec.src[:-1]) * cells * fspec.ic + chunk_rows * seg * fspec.groups * ogp
            return 4 * ((parts + 1) * blk + converted + max(1, threads.get_num_threads()) * bufs)
    return 4 * (xcl + ycl + blk + converted)


def fits(spec: ConvSpec, direction: str, dtype, workspace_limit: int) -> bool:
    """Whether the copies fit in the cap (the automatic choice falls back otherwise; 1x1
    problems and 1-D rows make none, only conversions of inputs not in float32, counted as
    if made)."""
    if direction == "bwd_weights" and inplace_weights(spec):
        return _inplace_workspace(spec) <= workspace_limit
    if framed_weights(spec) and direction != "fwd":
        return 4 * (math.prod(spec.src_shape) + math.prod(spec.dst_shape)) <= workspace_limit
    if pointwise_spec(spec) or (direction != "bwd_weights" and (strided_pointwise(spec) is not None
                                                                or line_spec(spec))):
        return 4 * (math.prod(spec.src_shape) + math.prod(spec.dst_shape)) <= workspace_limit
    return _workspace(spec, direction) <= workspace_limit


def _check(spec: ConvSpec, direction: str, workspace_limit: int) -> None:
    need = _workspace(spec, direction)
    if need > workspace_limit:
        raise WorkspaceError(
            f"{direction}: the workspace limit ({workspace_limit} bytes) is too small for the channels-last "
            f"copies of problem {spec} ({need} bytes); raise it with convgrad.set_workspace_limit()")


def _check_conversions(spec: ConvSpec, direction: str, workspace_limit: int, *arrays: np.ndarray,
                       extra: int = 0) -> None:
    """Raise unless float32 copies of the ``arrays`` not in float32, plus ``extra`` bytes of
    buffers, fit in the cap (the paths that read the NCX arrays in place)."""
    need = extra + 4 * sum(a.size for a in arrays if a.dtype != np.float32)
    if need > workspace_limit:
        raise WorkspaceError(
            f"{direction}: the workspace limit ({workspace_limit} bytes) is too small for the converted inputs "
            f"and buffers of problem {spec} ({need} bytes); raise it with convgrad.set_workspace_limit()")


def _f32(arr: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(arr, dtype=np.float32)


def _workers(spec: ConvSpec) -> int:
    macs = spec.flops // 2
    return 1 if macs < PARALLEL_MACS else max(1, threads.get_num_threads())


def _tile_cuts(count: int, parts: int, rt: int) -> list[tuple[int, int]]:
    """``count`` rows in up to ``parts`` ranges of whole ``rt``-row tiles but the last (pure)."""
    parts = max(1, min(parts, -(-count // rt)))
    b = [min(count, round(count * i / parts / rt) * rt) for i in range(parts)] + [count]
    return [(b[i], b[i + 1]) for i in range(parts) if b[i + 1] > b[i]]


def _cuts(count: int, parts: int) -> list[tuple[int, int]]:
    parts = max(1, min(parts, count))
    b = [count * i // parts for i in range(parts + 1)]
    return [(b[i], b[i + 1]) for i in range(parts) if b[i + 1] > b[i]]


def _geometry(spec: ConvSpec) -> tuple[np.ndarray, ...]:
    """The outer axes (all spatial axes but the last) as int64 arrays: dst, src, kernel,
    strides, dilations, pads_begin."""
    outer = (spec.dst, spec.src, spec.kernel, spec.strides, spec.dilations, spec.pads_begin)
    return tuple(np.array(v[:-1], dtype=np.int64) for v in outer)


def _to_channels_last(arr: np.ndarray, groups: int, cg: int, cgp: int, wp: int, pad: int,
                      workers: int, slot: str) -> tuple[np.ndarray, list]:
    """(N, G*cg, *S) float32 -> (N, rows, Wp, G*cgp) float32 (module doc), in this
    thread's scratch buffer ``slot`` (reused from call to call: a fresh buffer is faulted
    in page by page). Returns the buffer and the copy in pieces (callables, one per
    thread for a large array) for the caller to run with its other independent work in
    one hand-off (``_run_pieces``)."""
    jit = _jit()
    n, sp = arr.shape[0], arr.shape[2:]
    rows = math.prod(sp[:-1])
    x4 = arr.reshape(n, groups * cg, rows, sp[-1])
    out = _scratch(slot, (n, rows, wp, groups * cgp), np.float32)
    parts = workers if arr.size >= PARALLEL_COPY else 1
    c = _ukernel.compiled()
    return out, [functools.partial(jit.to_channels_last, x4, out, q0, q1, groups, cg, cgp, -pad, 0,
                                   c.transpose_address, c.lanes, 1) for q0, q1 in _cuts(n * rows, parts)]


def _run_pieces(pieces: list, workers: int) -> None:
    """Independent pieces of work (copies writing disjoint parts) on the pool, one hand-off
    for all of them: each hand-off wakes the pool threads, ~0.1-0.3 ms here."""
    run_each(lambda piece: piece(), pieces, workers)


def _input_channels_last(spec: ConvSpec, x: np.ndarray):
    """The sizes both channels-last paths use (groups, C_in and C_out per group, C_out per
    group padded to the lanes, taps, threads, Wp), the input's channels-last buffer and
    the pieces that copy it there (``_to_channels_last``)."""
    g, cg, og = spec.groups, spec.icg, spec.ocg
    workers = _workers(spec)
    wp, pad = _last_axis(spec)
    xcl, pieces = _to_channels_last(_f32(x), g, cg, cg, wp, pad, workers, "blocked_x")
    return g, cg, og, _padded(og, _lanes()[0]), math.prod(spec.kernel), workers, wp, xcl, pieces


def _weight_blocks(w3: np.ndarray, blk: np.ndarray, groups: int, og: int, cg: int, ogp: int, obw: int, flip: bool,
                   workers: int) -> list:
    """The pieces (callables, a block of output channels per pool thread) that put the
    forward's weights in blocks (``_blocked_jit`` module doc, ``weight_blocks``), zero
    past ``og``; ``w3`` the forward's (G*og, cg, T) weights or, with ``flip``, the data
    gradient's original (G*cg, og, T) weights."""
    c = _ukernel.compiled()
    nblk = groups * -(-ogp // obw)
    parts = workers if blk.size >= PARALLEL_COPY else 1
    return [functools.partial(_jit().weight_blocks, w3, blk, b0, b1, groups, og, cg, ogp, obw, flip,
                              c.transpose_address, c.lanes) for b0, b1 in _cuts(nblk, parts)]


def _weights_from_blocks(blk: np.ndarray, dw: np.ndarray, groups: int, og: int, cg: int, ogp: int, obw: int,
                         workers: int) -> None:
    """Inverse of ``_weight_blocks`` without flip: blocks -> ``dw`` (G*og, cg, T)."""
    c = _ukernel.compiled()
    nblk = groups * -(-ogp // obw)
    parts = workers if blk.size >= PARALLEL_COPY else 1
    run_each(lambda b: _jit().weights_from_blocks(blk, dw, b[0], b[1], groups, og, cg, ogp, obw, c.transpose_address,
                                                  c.lanes), _cuts(nblk, parts), parts)


def block_order(fspec: ConvSpec, workers: int) -> bool:
    """Whether ``_forward`` runs ``fspec`` (a forward, or a data gradient's flipped spec)
    block by block of output channels (pure; the rule and its measurements at
    BLOCK_ORDER_MIN_WEIGHT_RATIO)."""
    if fspec.groups != 1 or workers < 2 or not available():
        return False
    lanes, _, obw = _lanes()
    copied, weights = _copied_elements(fspec)
    return (-(-_padded(fspec.ocg, lanes) // obw) >= BLOCK_ORDER_MIN_BLOCKS
            and weights >= BLOCK_ORDER_MIN_WEIGHT_RATIO * copied
            and 4 * math.prod(fspec.kernel) * fspec.icg * obw <= WEIGHT_BLOCK_BYTES)


def _forward(fspec: ConvSpec, x: np.ndarray, w: np.ndarray, flip: bool, workspace_limit: int,
             direction: str) -> np.ndarray:
    """The forward loop of ``fspec`` on ``x`` (N, C, *S); ``w`` the forward's weights, or
    with ``flip`` the original weights of the data gradient (module doc).

    Two hand-offs to the pool: the input copy and the weight blocks (independent) in one,
    then the output rows, each thread copying its rows back to (N, C, *S) right after it
    computed them (in cache; disjoint rows, so no thread waits for another). With
    ``block_order``: the input copy, then blocks of output channels (each one's weights
    put in order, then every row on them), then the rows back to (N, C, *S)."""
    _check(fspec, direction, workspace_limit)
    jit = _jit()
    lanes, _, obw = _lanes()
    g, cg, og, ogp, t, workers, wp, xcl, pieces = _input_channels_last(fspec, x)
    blk = _scratch("blocked_w", (g * t * cg * ogp,), np.float32)
    w3 = _f32(w).reshape(w.shape[0], w.shape[1], t)
    rows_src = math.prod(fspec.src[:-1])
    rows_dst = math.prod(fspec.dst[:-1])
    wout = fspec.dst[-1]
    ycl = _scratch("blocked_y", (fspec.mb, rows_dst, wout, g * ogp), np.float32)
    y = results.empty((fspec.mb, g * og, rows_dst, wout), np.float32)
    geo = np.array((g, cg, ogp, wp, wout, fspec.kernel[-1], fspec.strides[-1], fspec.dilations[-1],
                    rows_dst, rows_src), dtype=np.int64)
    cb = max(1, min(cg, WEIGHT_BLOCK_BYTES // (4 * t * obw)))
    c = _ukernel.compiled()
    dst_o, src_o, k_o, s_o, d_o, pb_o = _geometry(fspec)
    rlim = np.array(c.r_limits, dtype=np.int64)
    if block_order(fspec, workers):
        _run_pieces(pieces, workers)
        total = fspec.mb * rows_dst

        def block(b) -> None:                 # one block of output channels: its weights, every row
            jit.weight_blocks(w3, blk, b, b + 1, g, og, cg, ogp, obw, flip, c.transpose_address, c.lanes)
            jit.forward_rows(xcl.reshape(-1), blk, ycl.reshape(-1), geo, dst_o, src_o, k_o, s_o, d_o, pb_o, 0, total,
                             c.address, rlim, lanes, obw, cb, b * obw, (b + 1) * obw)

        run_each(block, list(range(-(-ogp // obw))), workers)
        run_each(lambda b: jit.from_channels_last(ycl, y, b[0], b[1], g, og, ogp, c.transpose_address, c.lanes),
                 _cuts(total, workers), workers)
        return y.reshape(fspec.dst_shape)
    pieces += _weight_blocks(w3, blk, g, og, cg, ogp, obw, flip, workers)
    _run_pieces(pieces, workers)

    def rows(b) -> None:
        jit.forward_rows(xcl.reshape(-1), blk, ycl.reshape(-1), geo, dst_o, src_o, k_o, s_o, d_o, pb_o, b[0], b[1],
                         c.address, rlim, lanes, obw, cb, 0, ogp)
        jit.from_channels_last(ycl, y, b[0], b[1], g, og, ogp, c.transpose_address, c.lanes)

    # Rows in guided chunks (``gemm.guided_chunks``: large first, single rows last), taken by
    # whichever thread is free, not one half each: this VM's second vCPU often runs slower,
    # and one timeline showed the two halves of a data gradient taking 6.1 and 9.0 ms.
    # Disjoint rows, so no bit changes. Paired medians guided / halves (20-24 rounds in one
    # process, the order alternating, two sessions): 3d_unet data gradients conv_2 0.96 /
    # 0.97, conv_3 0.98 / 0.93, conv_6 0.94 / 0.92; resnet_50 res2a_branch2b 0.96 / 0.96,
    # res4a_branch2b 0.93 / 0.94; forwards 0.98 (conv_2) and 1.02 (res3a_branch2b); an
    # im2col problem the change does not reach, as a control, 1.05 / 1.00.
    run_each(rows, guided_chunks(fspec.mb * rows_dst, workers), workers)
    return y.reshape(fspec.dst_shape)


def _pointwise(spec: ConvSpec, a: np.ndarray, b: np.ndarray, transposed: bool, workspace_limit: int,
               direction: str) -> np.ndarray:
    """A 1x1 convolution as products on the NCX arrays: the forward (``a`` the weights
    (G*M, K) read row by row, ``b`` the input) or, ``transposed``, the data gradient (``a``
    the weights (G*K, M) read column by column, ``b`` diff_dst)::

        y[n, g*M + m, p] = sum_k A_g[m, k] * b[n, g*K + k, p]

    Positions are the vector lanes; no copy is made (the converted inputs are the only
    workspace)."""
    _check_conversions(spec, direction, workspace_limit, a, b)
    jit = _jit()
    lanes, r_max, obw = _lanes()
    g = spec.groups
    m, k = (spec.icg, spec.ocg) if transposed else (spec.ocg, spec.icg)
    hw = math.prod(spec.src)
    a, b = _f32(a), _f32(b)
    y = results.empty((spec.mb, g * m) + spec.src, np.float32)
    pblk = max(obw, min(16 * obw, POINTWISE_BLOCK_BYTES // (4 * k) // obw * obw))
    # A_g[m, k] = W[g*K + k, m] (transposed: m along a row) or W[g*M + m, k]
    a_rs, a_ks, a_gs = (1, m, k * m) if transposed else (k, 1, m * k)
    strips = transposed and pointwise_strips(spec)
    geo = np.array((g, m, k, a_rs, a_ks, a_gs, g * k * hw, k * hw, g * m * hw, m * hw, hw, pblk, strips),
                   dtype=np.int64)
    items = spec.mb * -(-hw // pblk)
    workers = _workers(spec)
    c = _ukernel.compiled()
    run_each(lambda r: jit.pointwise_items(a.reshape(-1), b.reshape(-1), y.reshape(-1), geo, r[0], r[1], c.address,
                                           r_max, lanes, c.ob_max), _cuts(items, workers), workers)
    return y


def pointwise_strips(spec: ConvSpec) -> bool:
    """Whether a 1x1 data gradient on the NCX arrays runs strip by strip (pure): at most
    ``POINTWISE_STRIP_MAX_CHANNELS`` output channels per group to reduce over."""
    return pointwise_spec(spec) and spec.ocg <= POINTWISE_STRIP_MAX_CHANNELS


def line_spec(spec: ConvSpec) -> bool:
    """1-D with stride 1, a kernel of several taps and at most LINE_MAX_WEIGHT_BYTES of
    weights: the forward (or data gradient) runs on the NCX rows (``_line``)."""
    return (spec.nsp == 1 and spec.strides == (1,) and spec.kernel[0] > 1
            and 4 * math.prod(spec.weights_shape) <= LINE_MAX_WEIGHT_BYTES)


def _line(fspec: ConvSpec, x: np.ndarray, w: np.ndarray, flip: bool, workspace_limit: int, direction: str) -> np.ndarray:
    """The forward of a 1-D stride-1 problem ``fspec`` on the NCX rows, positions in the
    lanes, weights broadcast from their own layout (``flip``: the data gradient's original
    weights, read flipped); no copy but a window buffer for the blocks at the row ends."""
    jit = _jit()
    c = _ukernel.compiled()
    g, k, m = fspec.groups, fspec.icg, fspec.ocg
    t, d, pb = fspec.kernel[0], fspec.dilations[0], fspec.pads_begin[0]
    halo = (t - 1) * d
    pblk = max(c.ob_max * c.lanes, min(1 << 14, POINTWISE_BLOCK_BYTES // (4 * k)))
    _check_conversions(fspec, direction, workspace_limit, x, w, extra=4 * k * (pblk + halo) * threads.get_num_threads())
    x, w = _f32(x), _f32(w)
    y = results.empty(fspec.dst_shape, np.float32)
    geo = np.array((g, m, k, t, d, pb, fspec.src[0], fspec.dst[0], int(flip), pblk), dtype=np.int64)
    items = fspec.mb * -(-fspec.dst[0] // pblk)
    workers = _workers(fspec)

    def work(r) -> None:
        buf = _scratch("blocked_line", (k * (pblk + halo),), np.float32)
        jit.line_items(w, x, y, buf, geo, r[0], r[1], c.address, c.r_max, c.lanes, c.ob_max)

    run_each(work, _cuts(items, workers), workers)
    return y


def conv_forward(spec: ConvSpec, src: np.ndarray, weights: np.ndarray, *, dtype, workspace_limit: int) -> np.ndarray:
    if pointwise_spec(spec):
        return _pointwise(spec, weights, src, False, workspace_limit, "fwd")
    sub = strided_pointwise(spec)
    if sub is not None:                       # the read cells, copied (a slice of each row)
        return _pointwise(sub, weights, _f32(src[_sampled_cells(spec)]), False, workspace_limit, "fwd")
    if line_spec(spec):
        return _line(spec, src, weights, False, workspace_limit, "fwd")
    return _forward(spec, src, weights, False, workspace_limit, "fwd")


def conv_backward_data(spec: ConvSpec, diff_dst: np.ndarray, weights: np.ndarray, *, dtype,
                       workspace_limit: int) -> np.ndarray:
    if pointwise_spec(spec):
        return _pointwise(spec, weights, diff_dst, True, workspace_limit, "bwd_data")
    if framed_data(spec):
        return _framed_data(spec, diff_dst, weights, workspace_limit)
    sub = strided_pointwise(spec)
    if sub is not None:                       # the read cells' gradient; zero elsewhere
        dx = results.zeros(spec.src_shape, np.float32)
        dx[_sampled_cells(spec)] = _pointwise(sub, weights, diff_dst, True, workspace_limit, "bwd_data")
        return dx
    fspec = flipped_spec(spec)
    if line_spec(spec):
        return _line(fspec, diff_dst, weights, True, workspace_limit, "bwd_data")
    return _forward(fspec, diff_dst, weights, True, workspace_limit, "bwd_data")


def _weight_parts(spec: ConvSpec) -> tuple[int, int, int, int]:
    """(parts, chunk rows, segments per row, positions per segment) of the streamed weight
    gradient (``weight_parts``), or zeros where it runs on whole channels-last copies
    (pure: the problem decides, never the threads, so the parts' sum is the same on any
    pool).

    Streamed: ``WEIGHT_PARTS`` parts of the output rows (2 for weights up to
    ``WEIGHT_TWO_PARTS_BYTES / 2``), each summing into its own copy of the weight blocks
    (added in order at the end), each copying its chunks channels-last
    into buffers of about the chunk size (``ROW_CHUNK_BYTES``; rows of ``diff_dst`` and the input rows they
    read; a row longer than that is cut into segments). Where the weights are larger, or
    there are fewer chunks than parts, the whole arrays are copied once and the threads
    split the weight tiles instead."""
    lanes = _lanes()[0] if available() else 16
    ogp = _padded(spec.ocg, lanes)
    blk = 4 * spec.groups * math.prod(spec.kernel) * spec.icg * ogp
    nrows = spec.mb * math.prod(spec.dst[:-1])
    if WEIGHT_PARTS * blk <= WEIGHT_PARTS_BYTES:
        nparts = WEIGHT_PARTS
    elif 2 * blk <= WEIGHT_TWO_PARTS_BYTES:
        nparts = 2
    else:
        return 0, 0, 0, 0
    wout, sw = spec.dst[-1], spec.strides[-1]
    halo = (spec.kernel[-1] - 1) * spec.dilations[-1] + 1 - sw
    out_bytes = 4 * spec.groups * ogp                        # per position: diff_dst, and
    in_bytes = 4 * spec.ic * max(1, math.prod(spec.strides[:-1])) * sw       # its inputs
    row_bytes = wout * (out_bytes + in_bytes) + 4 * spec.ic * halo
    chunk = _row_chunk_bytes()
    if row_bytes <= chunk:
        nseg, seg = 1, wout
        chunk_rows = max(1, min(-(-nrows // nparts), chunk // row_bytes))
    else:
        in_bytes = 4 * spec.ic * max(1, math.prod(spec.kernel[:-1])) * sw    # one row: every outer tap
        seg = max(lanes, chunk // (out_bytes + in_bytes) // lanes * lanes)
        nseg, chunk_rows = -(-wout // seg), 1
    if nrows * nseg < nparts:
        return 0, 0, 0, 0
    return nparts, chunk_rows, nseg, seg


def streamed_weights(spec: ConvSpec) -> bool:
    """Whether the weight gradient streams its copies in ``WEIGHT_PARTS`` parts
    (``_weight_parts``; pure)."""
    return _weight_parts(spec)[0] == WEIGHT_PARTS


def pointwise_weights(spec: ConvSpec) -> bool:
    """Whether a 1x1 weight gradient sums along the lanes of the NCX rows (``dotkernel``):
    up to ``POINTWISE_WEIGHTS_MAX_CHANNELS`` input + output channels per group (every tile
    re-reads its rows from the L2 cache), or where the streamed channels-last path does not
    stream in ``WEIGHT_PARTS`` (pure)."""
    return pointwise_spec(spec) and (spec.icg + spec.ocg <= POINTWISE_WEIGHTS_MAX_CHANNELS
                                     or not streamed_weights(spec))


def _lane_sum_block(spec: ConvSpec, lanes: int) -> int:
    """Positions per block of the lane-sum weight gradients (``_pointwise_weights``,
    ``_line_weights``): the rows of every input and output channel fill at most
    ``POINTWISE_BLOCK_BYTES``, whole vectors (pure)."""
    return max(lanes, min(1 << 14, POINTWISE_BLOCK_BYTES // (4 * (spec.ic + spec.oc)) // lanes * lanes))


def _pointwise_weights(spec: ConvSpec, src: np.ndarray, diff_dst: np.ndarray, workspace_limit: int) -> np.ndarray:
    """The 1x1 weight gradient on the NCX arrays: each (output, input) channel pair is a
    sum along both rows' positions, computed in vector lanes (``dotkernel``) over blocks of
    positions that stay in cache for every tile of a thread; threads split the tiles."""
    _check_conversions(spec, "bwd_weights", workspace_limit, src, diff_dst)
    jit = _jit()
    c = _ukernel.compiled()
    g, cg, og = spec.groups, spec.icg, spec.ocg
    hw = math.prod(spec.src)
    x, dy = _f32(src), _f32(diff_dst)
    pblk = _lane_sum_block(spec, c.lanes)
    geo = np.array((g, og, cg, hw, spec.mb, pblk), dtype=np.int64)
    dw = np.zeros((spec.oc, cg), dtype=np.float32)
    tiles = g * -(-og // c.dot_r_max) * -(-cg // c.dot_j_max)
    workers = _workers(spec)
    run_each(lambda r: jit.pointwise_weight_tiles(dy.reshape(-1), x.reshape(-1), dw, geo, r[0], r[1], c.dot_address,
                                                  c.dot_r_max, c.dot_j_max), _cuts(tiles, workers), workers)
    return dw.reshape(spec.weights_shape)


def line_weights(spec: ConvSpec) -> bool:
    """Whether a 1-D stride-1 weight gradient (a kernel of several taps) sums along the
    lanes of the NCX rows (``_line_weights``): up to ``POINTWISE_WEIGHTS_MAX_CHANNELS``
    input + output channels per group, as ``pointwise_weights`` (pure)."""
    return (spec.nsp == 1 and spec.strides == (1,) and spec.kernel[0] > 1
            and spec.icg + spec.ocg <= POINTWISE_WEIGHTS_MAX_CHANNELS)


def _line_weights(spec: ConvSpec, src: np.ndarray, diff_dst: np.ndarray, workspace_limit: int) -> np.ndarray:
    """The weight gradient of a 1-D stride-1 problem on the NCX rows, no copies:
    ``dW[o, c, t] = sum over n, p of dY[n, o, p] * X[n, c, p + t*d - pb]``, each tap a sum
    along the lanes over the outputs whose cell is in the row (``line_weight_items``).
    The items (image, block of positions) are cut into ``WEIGHT_PARTS`` parts whatever the
    thread count, each summed into its own partial, and the partials are added in order:
    the same bits on any number of threads."""
    _check_conversions(spec, "bwd_weights", workspace_limit, src, diff_dst)
    jit = _jit()
    c = _ukernel.compiled()
    g, cg, og, t = spec.groups, spec.icg, spec.ocg, spec.kernel[0]
    x, dy = _f32(src).reshape(-1), _f32(diff_dst).reshape(-1)
    pblk = _lane_sum_block(spec, c.lanes)
    geo = np.array((g, og, cg, spec.src[0], spec.dst[0], pblk, t, spec.dilations[0], spec.pads_begin[0]),
                   dtype=np.int64)
    items = spec.mb * -(-spec.dst[0] // pblk)
    cuts = _cuts(items, WEIGHT_PARTS)
    parts = np.zeros((len(cuts), t, spec.oc, cg), dtype=np.float32)
    workers = _workers(spec)
    run_each(lambda k: jit.line_weight_items(dy, x, parts[k], geo, cuts[k][0], cuts[k][1],
                                             c.dot_address, c.dot_r_max, c.dot_j_max),
             list(range(len(cuts))), workers)
    total = parts[0]
    for k in range(1, len(cuts)):                 # the parts in order: the same sum on any threads
        total += parts[k]
    return np.ascontiguousarray(total.transpose(1, 2, 0)).reshape(spec.weights_shape)


@functools.lru_cache(maxsize=256)
def compressed_spec(spec: ConvSpec) -> ConvSpec | None:
    """A weight gradient whose last axis reads every other input cell only (kernel 1 and
    stride 2 along it, no pads there) as the problem on the cells read: the input's last
    axis cut to those ``dst[-1]`` cells, stride 1 (pure; None for other problems). The
    streamed weight gradient runs it, its copies gathering the cells from the input
    (``transpose_pairs``): res3a_branch2a's (1x1, stride 2, 56^2) input rows copied whole
    and read at stride 2 had made that call 1.6x the same sums at stride 1."""
    if spec.kernel[-1] != 1 or spec.strides[-1] != 2 or spec.pads_begin[-1] or spec.pads_end[-1]:
        return None
    return ConvSpec(mb=spec.mb, ic=spec.ic, oc=spec.oc, groups=spec.groups, src=spec.src[:-1] + (spec.dst[-1],),
                    kernel=spec.kernel, strides=spec.strides[:-1] + (1,), dilations=spec.dilations,
                    pads_begin=spec.pads_begin, pads_end=spec.pads_end)


# 1x1 weight gradients without padding (any stride) on AVX-512 hosts run as one product
# over every image and position (``inplace_weights``): dW[o, c] = sum over (n, q) of
# dY[n, o, q] * X[n, c, s*q]. The operand with more channels per group (the input where
# strided, whose cells are s apart) is read in place as the micro-kernel's broadcast
# operand, R channel planes per tile; the other is transposed, INPLACE_BLOCK_BYTES of its
# positions at a time, into a per-thread buffer (positions x channels) that every tile then
# reads from L2 as 64-lane vectors. Threads split the in-place operand's channels; every
# element of dW is one chain of FMAs over (image, position) in order, so the bits do not
# depend on the threads, the blocks or the tiles. Where the input is read in place the
# result comes out (C, O) and is transposed at the end. The GEMM lowerings ran the same
# sum as per-image products on two threads (each half of the positions: 72-80 GFLOP/s per
# thread on this VM's Zen 4, where one product alone reaches 92), the streamed path as
# tiles over channels-last chunks of both arrays. Measured on the AMD EPYC Zen 4 (family
# 25 model 17, 2 threads, in one process, the two alternating call by call, medians of 15
# calls, ms, new / the automatic choice before): resnet_50 res4b_branch2a (1024 -> 256,
# 14^2, mb9) 5.16 / 6.05, res4a_branch2a (512 -> 256, stride 2, mb19) 5.94 / 7.73,
# res3a_branch2a 6.18 / 6.68, res3b_branch2a 4.90 / 5.49, res5b_branch2a (2048 -> 512,
# 7^2) 5.23 / 5.42, res2a_branch1 (64 -> 256, 56^2; diff_dst in place) 5.14 / 6.50,
# res3a_branch2c 4.78 / 5.82, res4a_branch2c 4.76 / 5.32, res5a_branch2c 4.78 / 5.17;
# mobilenet conv2 - conv10 0.82-0.93 of before; wavenet conv1d_1x1_2 (512 -> 256, 812
# positions, one image) 1.20 / 1.35. The other orientation lost (prototype:
# res2b_branch2a, 256 -> 64, with diff_dst in place 1.26 of before, the input in place
# 0.96), as did the input in place with more output than input channels on small strided
# outputs (res4a_branch1, 512 -> 1024 onto 14^2, 1.04; res5a_branch1 onto 7^2 1.20),
# which the automatic choice leaves to the GEMMs.
INPLACE_BLOCK_BYTES = 256 * 1024
# False: the 1x1 weight gradients take the paths below again (the dot kernel, the streamed
# channels-last chunks), as on AVX2 hosts; the tests run both.
INPLACE_WEIGHTS = True


def inplace_weights(spec: ConvSpec) -> str | None:
    """Which array the 1x1 weight gradient of ``spec`` reads in place (pure): ``"src"``,
    ``"diff_dst"`` (stride 1 with at least as many output as input channels per group), or
    None where the one-product path does not run it (a kernel larger than 1x1, padding, or
    a host without 512-bit micro-kernels)."""
    if not INPLACE_WEIGHTS or not unpadded_1x1(spec) or not 1 <= spec.nsp <= 3 or 0 in spec.dst:
        return None
    if (_lanes()[0] if available() else 16) != 16:
        return None
    return "diff_dst" if all(s == 1 for s in spec.strides) and spec.ocg >= spec.icg else "src"


def _inplace_geometry(spec: ConvSpec, lanes: int) -> tuple[int, int, int, int, int, int]:
    """(rows of the in-place operand, channels of the packed one, positions per block, the
    in-place operand's plane, positions along a row, flat) for ``inplace_weights`` (pure)."""
    positions = math.prod(spec.dst)
    if inplace_weights(spec) == "diff_dst":
        ra, nb, plane = spec.ocg, spec.icg, positions
    else:
        ra, nb, plane = spec.icg, spec.ocg, math.prod(spec.src)
    flat = all(s == 1 for s in spec.strides)
    if flat:
        block = min(positions, max(lanes, INPLACE_BLOCK_BYTES // (4 * nb) // lanes * lanes))
    else:
        wout = spec.dst[-1]
        block = min(positions, max(1, INPLACE_BLOCK_BYTES // (4 * nb * wout)) * wout)
    return ra, nb, block, plane, spec.dst[-1], int(flat)


def _inplace_workspace(spec: ConvSpec) -> int:
    """Bytes of ``_inplace_weights``' buffers: a block per thread, the (C, O) product where
    the input is read in place, converted inputs counted as if made (pure)."""
    _, nb, block, *_ = _inplace_geometry(spec, _lanes()[0] if available() else 16)
    product = math.prod(spec.weights_shape) if inplace_weights(spec) == "src" else 0
    converted = math.prod(spec.src_shape) + math.prod(spec.dst_shape)
    return 4 * (max(1, threads.get_num_threads()) * block * nb + product + converted)


def _inplace_weights(spec: ConvSpec, src: np.ndarray, diff_dst: np.ndarray, workspace_limit: int) -> np.ndarray:
    """The 1x1 weight gradient as one product, one operand read in place (derived above)."""
    need = _inplace_workspace(spec)
    if need > workspace_limit:
        raise WorkspaceError(
            f"bwd_weights: the workspace limit ({workspace_limit} bytes) is too small for the buffers of problem "
            f"{spec} ({need} bytes); raise it with convgrad.set_workspace_limit()")
    jit = _jit()
    c = _ukernel.compiled()
    lanes, rt = c.lanes, c.r_max
    x, dy = _f32(src), _f32(diff_dst)
    g = spec.groups
    ra, nb, block, plane, wout, flat = _inplace_geometry(spec, lanes)
    dy_in_place = inplace_weights(spec) == "diff_dst"
    a, b = (dy, x) if dy_in_place else (x, dy)
    if flat:
        row_a = np.zeros(1, dtype=np.int64)
        row_b = np.zeros(1, dtype=np.int64)
    else:             # the first input cell of each output row: sum over the outer axes of q_i * s_i * pitch_i
        pitch = [math.prod(spec.src[i + 1:]) * spec.strides[i] for i in range(spec.nsp - 1)]
        row_a = np.zeros(1, dtype=np.int64)
        for count, step in zip(spec.dst[:-1], pitch):
            row_a = (row_a[:, None] + np.arange(count, dtype=np.int64)[None, :] * step).reshape(-1)
        row_b = np.arange(block // wout, dtype=np.int64) * wout * nb
    geo = np.array((spec.mb, g, ra, nb, plane, math.prod(spec.dst), wout, spec.strides[-1], block, flat),
                   dtype=np.int64)
    workers = _workers(spec)
    items = [(gi, r0, r1) for gi in range(g) for r0, r1 in _tile_cuts(ra, workers, rt)]
    y = np.empty((g, ra, nb), dtype=np.float32)

    def work(item) -> None:
        buf = _scratch("blocked_inplace", (block * nb,), np.float32)
        jit.inplace_weight_rows(a.reshape(-1), b.reshape(-1), y, buf, geo, row_a, row_b, item[0], item[1], item[2],
                                c.address, c.transpose_address, rt, lanes, c.ob_max)

    run_each(work, items, workers)
    if dy_in_place:                               # (G, O, C): the weights' own layout
        return y.reshape(spec.weights_shape)
    dw = np.empty((g, nb, ra), dtype=np.float32)  # (G, C, O) -> (G, O, C)
    run_each(lambda it: jit.transpose_planes(y, dw, it[0], it[1], it[2], c.transpose_address, lanes),
             [(gi, r0, r1) for gi in range(g) for r0, r1 in _cuts(ra, workers)], workers)
    return dw.reshape(spec.weights_shape)


# The weight gradient of a framed 1-D problem (``gemm.framed_spec``: a kernel of m whole
# strides s, undilated and unpadded; an ISTFT is its data gradient) is one product per
# input channel with both operands in place: dW[o, c, t] = sum over (n, p) of dY[n, o, p] *
# x[n, c, p*s + t], and x[n, c, p*s + t] for t < m*s is the (P, m*s) matrix whose row p
# starts at cell p*s (rows overlap; a BLAS cannot take a row step shorter than the row),
# so the micro-kernel's vectors read it with a row step of s while diff_dst's rows are
# broadcast. The GEMM lowering ran m products of s columns each per channel (``_framed``),
# each on one thread. Measured in one process (2 threads, medians of 30 calls,
# alternating, ms, new / framed products): the ISTFT's weight gradient (1 -> 1026
# channels, k 1024, s 256, 224 frames) 2.19 / 2.83.
def framed_weights(spec: ConvSpec) -> bool:
    """Whether the weight gradient runs as ``_framed_weights`` (pure): a ``framed_spec``
    problem on a host with 512-bit micro-kernels."""
    return framed_spec(spec) and (_lanes()[0] if available() else 16) == 16


def _framed_weights(spec: ConvSpec, src: np.ndarray, diff_dst: np.ndarray, workspace_limit: int) -> np.ndarray:
    """The framed weight gradient as one in-place product per input channel (derived above)."""
    _check_conversions(spec, "bwd_weights", workspace_limit, src, diff_dst)
    jit = _jit()
    c = _ukernel.compiled()
    x, dy = _f32(src), _f32(diff_dst)
    g, og = spec.groups, spec.ocg
    geo = np.array((spec.mb, g, spec.icg, og, spec.dst[0], spec.src[0], spec.strides[0], spec.kernel[0]),
                   dtype=np.int64)
    workers = _workers(spec)
    items = [(gi, r0, r1) for gi in range(g) for r0, r1 in _tile_cuts(og, workers, c.r_max)]
    dw = np.empty(spec.weights_shape, dtype=np.float32)
    run_each(lambda it: jit.framed_weight_rows(dy, x, dw, geo, it[0], it[1], it[2], c.address, c.r_max, c.lanes,
                                               c.ob_max), items, workers)
    return dw


# Its data gradient (the ISTFT itself) the same way round: frame f of dX[n, c] (cells f*s
# .. f*s + s - 1, the rows of a (Q, s) matrix with Q = P + m - 1) is sum over the taps j with
# 0 <= f - j < P and the output channels o of dY[n, o, f - j] * W[o, c, j*s + r]: tiles of R
# frames x 64 cells sum the m taps (diff_dst's frames shifted by -j, broadcast; the weights'
# columns j*s + r, the vectors) and FRAME_DATA_CHANNELS output channels at a time, so that
# those channels' weights and diff_dst stay in L2 while every tile reads them; the m - 1
# frames at each end, where fewer taps are real, one by one; cells past the last frame are
# zero. Items are (image, channel, 64 cells), each writing its own cells. The GEMM lowering
# added m products dY^T @ W_cj into overlapping rows of the frames, one after the other.
# In one process (2 threads, medians of 15 calls, alternating, ms, new / framed products):
# the ISTFT (1026 -> 1 channel, k 1024, s 256, 224 frames of diff_dst) 2.58 / 2.92, k 512 s
# 128 on 160000 samples 3.33 / 4.09, k 256 s 64 4 x 32000 0.72 / 0.96, 8 x 48000 (k 512)
# 4.06 / 4.57, 64 -> 16 channels 0.79 / 2.90; channels per step 128, 512 and 2048 alike
# (ISTFT 2.53, 2.57, 2.63 against 2.50 ms).
FRAME_DATA_CHANNELS = 256


def framed_data(spec: ConvSpec) -> bool:
    """Whether the data gradient runs as ``_framed_data`` (pure): as ``framed_weights``."""
    return framed_weights(spec)


def _framed_data(spec: ConvSpec, diff_dst: np.ndarray, weights: np.ndarray, workspace_limit: int) -> np.ndarray:
    """The framed data gradient, both operands in place (derived above)."""
    _check_conversions(spec, "bwd_data", workspace_limit, diff_dst, weights)
    jit = _jit()
    c = _ukernel.compiled()
    dy, w = _f32(diff_dst), _f32(weights)
    g, cg, s, L = spec.groups, spec.icg, spec.strides[0], spec.src[0]
    frames = spec.dst[0] + spec.kernel[0] // s - 1
    geo = np.array((spec.mb, g, cg, spec.ocg, spec.dst[0], L, s, spec.kernel[0]), dtype=np.int64)
    width = c.lanes * c.ob_max
    items = np.array([(n, gi, ci, r0, min(s, r0 + width)) for n in range(spec.mb) for gi in range(g)
                      for ci in range(cg) for r0 in range(0, s, width)], dtype=np.int64).reshape(-1, 5)
    dx = results.empty(spec.src_shape, np.float32)
    if frames * s < L:
        dx[..., frames * s:] = 0
    workers = _workers(spec)
    run_each(lambda b: jit.framed_data_columns(dy, w, dx, geo, items, b[0], b[1], c.address, c.r_max, c.lanes,
                                               FRAME_DATA_CHANNELS), _cuts(len(items), workers * 2), workers)
    return dx


# The streamed weight gradient reads the input in place (module doc); False: the streamed
# channels-last copies it replaced (the tests compare the two).
NCX_WEIGHTS = True


def ncx_weights(spec: ConvSpec) -> bool:
    """Whether the weight gradient streams in ``WEIGHT_PARTS`` parts reading the input in
    place (``weight_parts_ncx``; pure)."""
    return NCX_WEIGHTS and streamed_weights(spec)


def conv_backward_weights(spec: ConvSpec, src: np.ndarray, diff_dst: np.ndarray, *, dtype,
                          workspace_limit: int) -> np.ndarray:
    if inplace_weights(spec):
        return _inplace_weights(spec, src, diff_dst, workspace_limit)
    if framed_weights(spec):
        return _framed_weights(spec, src, diff_dst, workspace_limit)
    if pointwise_weights(spec):
        return _pointwise_weights(spec, src, diff_dst, workspace_limit)
    if line_weights(spec):
        return _line_weights(spec, src, diff_dst, workspace_limit)
    ncx = ncx_weights(spec)                     # the input read in place, diff_dst streamed
    width, xs = spec.src[-1], 1
    cspec = None if ncx else compressed_spec(spec)
    if cspec is not None and _weight_parts(cspec)[0]:
        spec, xs = cspec, spec.strides[-1]      # the cells read, gathered by the streamed copies
    _check(spec, "bwd_weights", workspace_limit)
    jit = _jit()
    lanes, _, obw = _lanes()
    g, cg, og, t = spec.groups, spec.icg, spec.ocg, math.prod(spec.kernel)
    ogp = _padded(og, lanes)
    wp, pad = _last_axis(spec)
    wout, kw_n = spec.dst[-1], spec.kernel[-1]
    rows_src = math.prod(spec.src[:-1])
    rows_dst = math.prod(spec.dst[:-1])
    nrows = spec.mb * rows_dst
    merged = g == 1 and spec.dilations[-1] == 1 and not ncx
    nparts, chunk_rows, nseg, seg = _weight_parts(spec)
    geo = np.array((g, cg, ogp, wp, wout, kw_n, spec.strides[-1], spec.dilations[-1],
                    rows_dst, rows_src, nrows, merged, og, chunk_rows), dtype=np.int64)
    c = _ukernel.compiled()
    rt = c.r_limits[min(ogp, obw) // lanes - 1]      # the widest block's limit holds for all
    tiles = g * -(-ogp // obw) * ((t // kw_n) * -(-(kw_n * cg) // rt) if merged else t * -(-cg // rt))
    outer = _geometry(spec)
    workers = _workers(spec)
    blk_elems = g * t * cg * ogp
    if nparts:
        x4 = _f32(src).reshape(spec.mb, spec.ic, rows_src, width)
        dy4 = _f32(diff_dst).reshape(spec.mb, spec.oc, rows_dst, wout)
        span = 0 if ncx else jit.part_input_rows(geo, *outer, nparts, nseg, seg)
        cells = (seg - 1) * spec.strides[-1] + (kw_n - 1) * spec.dilations[-1] + 1
        parts = np.empty((nparts, blk_elems), dtype=np.float32)

        def part(b) -> None:
            ybuf = _scratch("blocked_y", (1, chunk_rows, seg, g * ogp), np.float32)
            if ncx:
                jit.weight_parts_ncx(x4, dy4, parts, ybuf, geo, *outer, b[0], b[1], nparts, nseg, seg, pad,
                                     c.address, rt, lanes, obw, tiles, c.transpose_address)
                return
            xbuf = _scratch("blocked_x", (1, max(1, span), cells, spec.ic), np.float32)
            jit.weight_parts(x4, dy4, parts, xbuf, ybuf, geo, *outer, b[0], b[1], nparts, nseg, seg, pad, c.address,
                             rt, lanes, obw, tiles, c.transpose_address, xs,
                             c.transpose_pairs_address if xs == 2 else c.transpose_address)

        run_each(part, _cuts(nparts, workers), workers)
        blk = parts[0]
        for p in range(1, nparts):               # the parts in order: the same sum on any threads
            blk += parts[p]
    else:
        xcl, pieces = _to_channels_last(_f32(src), g, cg, cg, wp, pad, workers, "blocked_x")
        dycl, more = _to_channels_last(_f32(diff_dst), g, og, ogp, wout, 0, workers, "blocked_y")
        _run_pieces(pieces + more, workers)
        row_bytes = 4 * (wout * g * ogp + wp * spec.ic)
        chunk_rows = max(1, min(nrows, _row_chunk_bytes() // row_bytes))
        blk = _scratch("blocked_w", (blk_elems,), np.float32)
        run_each(lambda b: jit.weight_tiles(xcl.reshape(-1), dycl.reshape(-1), blk, geo, *outer, b[0], b[1],
                                            c.address, rt, lanes, obw, chunk_rows),
                 _cuts(tiles, workers), workers)
    dw = np.empty((spec.oc, cg, t), dtype=np.float32)
    _weights_from_blocks(blk, dw, g, og, cg, ogp, obw, workers)
    return dw.reshape(spec.weights_shape)
