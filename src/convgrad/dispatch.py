"""Algorithm choice and the workspace cap (pure functions of the problem; public).

``choose_algorithm(spec, direction, dtype)`` applies vetoes first (exact integer types go
to the reference kernel, which accumulates in int64), then a cost model,
``estimate_cost``, over the two fast lowerings of ``kernels/gemm.py``:

* ``taps`` runs one GEMM per kernel tap on shifted views of stride-phase grids (no
  column matrix) over *wide* rows: each image carries a halo of ``(k - 1) * d // s`` rows
  per axis, whose products are computed and thrown away. It wins on large images with
  many channels.
* ``im2col`` copies the exact column matrix (``taps x channels`` per output position) and
  runs one GEMM with a long reduction. It wins on small images (the halo would waste a
  large share of the flops) and on few channels (a per-tap GEMM of 3 channels is thin).
  Its data gradient scatters the columns back (col2im, along contiguous rows or channels,
  ~1 ns an element), except with stride 1, where it runs as the forward im2col of
  ``diff_dst`` with the flipped kernel (unless that column matrix is over
  ``FLIP_MAX_RATIO`` times larger: kernels larger than the output, unpadded 3-D layers).
  Measured (2 threads, ms, taps / im2col after the faster scatter): resnet_50 conv1 (7x7
  stride 2, 3 channels) 40-65 / 22-24; mobilenet conv1 (3x3 stride 2, 3 channels) 60 / 40;
  3d_unet conv_4 8.8 / 7.8, conv_7 17.8 / 8.8-12.6, but conv_2 (32 -> 64 channels, 20^3)
  10 / 12, which ``COL2IM_SECONDS`` keeps on ``taps``.
* ``direct`` is a compiled loop nest: ``kernels/depthwise.py`` for depthwise problems
  (one input channel per group, any channel multiplier, 1-3 spatial axes). It needs numba
  (extra ``convgrad[fast]``; ``CONVGRAD_NUMBA=0`` turns it off). There the GEMM lowerings
  degenerate into one element-wise NumPy multiply-add per tap, so when it is available it
  is chosen for depthwise problems with at most ``DIRECT_MAX_MULTIPLIER`` output channels
  per group before the cost model is asked (measured in-process
  against ``taps`` on the nine mobilenet depthwise layers, 2 threads, a loaded machine:
  1.2-4x faster in forward and data gradients; weight gradients 1.1-2x faster; the two
  that tied, 56x56 stride 2 and 28x28, now 0.35 vs 0.71 ms and 0.51 vs 0.83 ms). For the
  other problems with stride 1, ``kernels/thin.py`` runs all three directions as
  register-tiled direct loops; it is chosen for kernels of more than one tap with at most
  ``THIN_MAX_CHANNELS`` channels per group (fewer for weight gradients; ``thin_pays``,
  measured numbers there), where the GEMMs have a small dimension.
* ``blocked`` (``kernels/blocked.py``) is the convolution as its own GEMM: channels-last
  copies of the operands and a register-blocked micro-kernel compiled for this CPU with
  llvmlite (512-bit vectors on AVX-512, 256-bit on AVX2). It needs numba and an x86-64
  host with AVX2 and FMA, computes in float32, and is chosen before the thin kernel and the
  cost model where ``blocked_pays`` (multi-tap kernels with enough work per copied element;
  narrower rules on AVX2 hosts; measured numbers there).

One rule comes before the model among the two GEMM lowerings: a 1x1, stride-1, unpadded
weight gradient split into channel chunks with more output than input channels runs on
``taps``, whose chunks split the output channels (``_output_chunks``, measured there).

The model charges the GEMM flops at a rate that falls with the smallest GEMM dimension
(``RATE_KNEE``: a 64-wide GEMM runs at ~0.8 of peak), plus the copies and adds around
them at a fixed per-element price, plus a per-call price for every small NumPy/BLAS call.
Constants were measured on the development machine (AMD EPYC, 2 cores, OpenBLAS);
only the ratios matter. Callers may override the choice with the ``algorithm=`` keyword.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import Iterator

import numpy as np

from . import threads
from .errors import ConvTypeError, ConvValueError
from .kernels import blocked, depthwise, thin
from .kernels.gemm import (PARALLEL_FLOPS, flipped_data_gradient, framed_spec, pointwise_spec, scatter_chunks,
                           unit_1x1, unpadded_1x1, weight_chunks)
from .spec import ConvSpec

ALGORITHMS = ("reference", "im2col", "taps", "direct", "blocked")
DIRECTIONS = ("fwd", "bwd_data", "bwd_weights")

DEFAULT_WORKSPACE_LIMIT = 256 * 1024 * 1024
# Rows (output positions of the wide phase grid) per block: decided by the problem alone,
# so that results never depend on the workspace cap unless a block has to shrink to fit.
ROWS_TARGET = 8192

class _State(threading.local):
    limit = DEFAULT_WORKSPACE_LIMIT     # a class default: a missing attribute costs a caught exception


_state = _State()


def get_workspace_limit() -> int:
    """The cap, in bytes, on the temporaries of one call (default 256 MiB)."""
    return _state.limit


def _check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)):
        raise ConvTypeError(f"workspace_limit: must be an integer number of bytes, but got {limit!r}")
    if limit < 1:
        raise ConvValueError(f"workspace_limit: must be a positive number of bytes, but got {limit}")
    return int(limit)


def set_workspace_limit(limit: int) -> None:
    """Set the workspace cap (bytes) for this thread's later calls."""
    _state.limit = _check_limit(limit)


@contextlib.contextmanager
def workspace_limit(limit: int) -> Iterator[None]:
    """``with convgrad.workspace_limit(64 << 20): ...`` caps temporaries inside the block."""
    old = get_workspace_limit()
    set_workspace_limit(limit)
    try:
        yield
    finally:
        _state.limit = old


# Cost model constants (seconds, per element or per call; flops at PEAK_FLOPS per second).
PEAK_FLOPS = 90e9
RATE_KNEE = 10.0            # rate = peak / (1 + knee/m + knee/n + knee/k)
COPY_SECONDS = 0.4e-9       # per element copied along long rows (grids, crops)
COLS_SECONDS = 1.2e-9       # per element of a column matrix gathered (short rows, out of cache)
COL2IM_SECONDS = 1.2e-9     # per element of a column matrix scatter-added (adds, zeroing, merge)
ADD_SECONDS = 0.5e-9        # per element of an element-wise add or multiply-add
CALL_SECONDS = 6e-6         # per NumPy/BLAS call inside a block
DIRECT_SECONDS = 0.15e-9    # per multiply-add of the compiled depthwise loops
DIRECT_CHANNEL_SECONDS = 0.2e-6   # per channel and image of the compiled loops (set-up, copies)


def _prod(values) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


def _gemm_seconds(m: int, n: int, k: int, batch: int = 1) -> float:
    if min(m, n, k) <= 0:
        return 0.0
    rate = PEAK_FLOPS / (1 + RATE_KNEE / m + RATE_KNEE / n + RATE_KNEE / k)
    return 2.0 * m * n * k * batch / rate


def estimate_cost(spec: ConvSpec, direction: str, algorithm: str) -> float:
    """Modelled seconds (one thread) of one call with a fast lowering; pure.

    ``reference`` is costed as a very slow lowering (it is the float64 oracle).
    """
    if direction not in DIRECTIONS:
        raise ConvValueError(f"estimate_cost: direction must be one of {DIRECTIONS}, but got {direction!r}")
    g, cg, og = spec.groups, spec.icg, spec.ocg
    t = _prod(spec.kernel)
    exact = spec.mb * _prod(spec.dst)
    src_elems = spec.mb * spec.ic * _prod(spec.src)
    if algorithm == "reference":
        return 2.0 * g * og * cg * t * exact / 1e9 + CALL_SECONDS * t
    if algorithm == "direct":
        return (DIRECT_SECONDS * g * og * cg * t * exact + COPY_SECONDS * (src_elems + spec.oc * exact)
                + DIRECT_CHANNEL_SECONDS * spec.mb * spec.oc)
    if algorithm == "im2col":
        cols = t * spec.ic * exact
        blocks = max(1, -(-cols // (ROWS_TARGET * 512)))
        calls = CALL_SECONDS * blocks * 6
        moves = COLS_SECONDS * cols + COPY_SECONDS * (src_elems + spec.oc * exact)
        if direction == "fwd":
            return _gemm_seconds(og, exact, cg * t, g) + moves + calls
        if direction == "bwd_weights":
            return _gemm_seconds(og, cg * t, exact, g) + moves + calls
        flipped = flipped_data_gradient(spec)
        if flipped is not None:                     # stride 1: a forward im2col, no scatter
            return estimate_cost(flipped, "fwd", "im2col")
        loops = 1
        for k, s, d, o in zip(spec.kernel, spec.strides, spec.dilations, spec.dst):
            loops *= max(1, min(k, -(-(d * (k - 1) + 1) // s), o))
        return (_gemm_seconds(cg * t, exact, og, g) + COPY_SECONDS * (spec.oc * exact + 2 * src_elems)
                + COL2IM_SECONDS * cols + CALL_SECONDS * blocks * loops + calls)
    if algorithm != "taps":
        raise ConvValueError(f"estimate_cost: algorithm must be one of {ALGORITHMS}, but got {algorithm!r}")
    # Wide rows of the stride-phase grids: (dst + halo) per axis.
    wide = spec.mb * _prod(o + (k - 1) * d // s for o, k, d, s in
                           zip(spec.dst, spec.kernel, spec.dilations, spec.strides))
    img = max(1, wide // max(1, spec.mb))
    blocks = max(1, -(-wide // ROWS_TARGET)) if img <= ROWS_TARGET else spec.mb * -(-img // ROWS_TARGET)
    calls = CALL_SECONDS * blocks * (t + 6)
    moves = 0.0 if pointwise_spec(spec) else COPY_SECONDS * (spec.ic * wide + spec.oc * wide)
    if direction == "bwd_weights":
        # each of the T products packs both of its operands (BLAS copies them into panels):
        # T passes over the block's rows where im2col's one product packs its columns once.
        # Without it the model chose taps for 3x3 weight gradients that im2col ran faster
        # (measured, 2 threads, ms, im2col / taps: 128 ch 28^2 6.5 / 8.0; 96 ch 4.0 / 4.6;
        # 64 ch 56^2 7.1-7.7 / 7.8-9.9; 3-D 64 ch 16x18x18 7.8 / 9.4)
        packs = COPY_SECONDS * t * (cg + og) * g * wide
        return _gemm_seconds(og, cg, wide, g * t) + moves + calls + packs
    m, k = (og, cg) if direction == "fwd" else (cg, og)
    if k == 1:                                      # element-wise multiply-add per tap
        return ADD_SECONDS * g * m * wide * t + moves + calls
    adds = 0.0 if g == 1 else ADD_SECONDS * g * m * wide * (t - 1)
    return _gemm_seconds(m, wide, k, g * t) + adds + moves + calls


# ``direct`` is chosen automatically only up to this channel multiplier (output channels per
# group). Beyond it each group is a real GEMM (M = multiplier, K = taps) that BLAS runs far
# faster than the loop nest: the ISTFT (1 input channel, 1026 outputs, 1024 taps) took
# 31.5 ms on ``direct`` and 7.0 ms on ``im2col`` (measured, 2 threads).
DIRECT_MAX_MULTIPLIER = 4


def choose_algorithm(spec: ConvSpec, direction: str, dtype: object = np.float32, *, direct: bool = True) -> str:
    """The algorithm the canonical functions use for this problem (pure, overridable).

    Vetoes first (integer types: ``reference``; depthwise problems with at most
    ``DIRECT_MAX_MULTIPLIER`` output channels per group, and, in float32, the thin-channel
    problems of ``thin_pays``: ``direct`` when numba is available, unless ``direct=False``), then the
    cheaper of ``taps`` and ``im2col`` by ``estimate_cost``.
    """
    if direction not in DIRECTIONS:
        raise ConvValueError(f"choose_algorithm: direction must be one of {DIRECTIONS}, but got {direction!r}")
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        return "reference"
    pays = _direct_pays(spec, direction, dt == np.float64) if direct else None
    if pays == "depthwise" and depthwise.available():
        return "direct"
    if direct and dt != np.float64 and _blocked_pays(spec, direction) and blocked.available():
        return "blocked"
    if pays == "thin" and thin.available():
        return "direct"
    return _cheapest(spec, direction)


@functools.lru_cache(maxsize=1024)
def _direct_pays(spec: ConvSpec, direction: str, float64: bool) -> str | None:
    """Which compiled kernel the automatic choice runs this problem on, if numba is there
    (pure; remembered, as a small call would otherwise pay ~20 us for the rules)."""
    if depthwise.eligible(spec) and spec.ocg <= DIRECT_MAX_MULTIPLIER:
        return "depthwise"
    if not float64 and thin_pays(spec, direction):
        return "thin"
    return None


# The thin-channel kernel is chosen automatically for the problems it runs (stride 1) with a kernel of more than one tap and at most THIN_MAX_CHANNELS input and
# output channels per group. Measured in-process against the better of ``taps`` and
# ``im2col`` (float32, 1 and 2 threads on the loaded 2-core dev VM; ratio = GEMM time /
# direct time, fwd and bwd_data): wavenet 32 channels k2 1.3-1.5, grouped 8 x 16 channels
# 3x3 165^2 1.7, 8 -> 16 channels 2.0-2.4, 3 -> 64 (VGG conv1) 1.3-1.8, 32 groups of 4
# 2.5-2.6, 48 channels 3x3 1.15-1.7, 64 channels 56^2 1.26-1.31, 128 channels 28^2 1.08-1.35,
# 64 channels k3 1-D 1.15-1.19, 3-D 32 channels 3x3x3 24^3 1.26-1.36. It loses on 1x1
# kernels (a plain GEMM: 512 -> 256 channels 0.66-0.71, 32 channels 0.8-1.2), which stay
# with the GEMM lowerings, as do wider groups (not measured). Weight gradients: below.
# Only for float32 compute (half types included): in float64 the 3 x 32 register tile
# spills (wavenet 0.65-0.79, 64 channels 0.64-0.66, 3-D 0.70; grouped 1.2), so float64
# keeps the GEMMs.
# The kernel also computes the "wide" cells of the padded grid (a halo of (K - 1) * d per
# axis) and drops them, so it needs at least THIN_MIN_DENSITY real outputs per grid cell:
# 64 channels 3x3 on 7x7 images (density 0.60) 1.19-1.22 faster, on 4x4 (0.44) 0.99-1.12,
# a 8^3-kernel data gradient onto a 1^3 latent (1/512) 0.13 (2 threads).
THIN_MAX_CHANNELS = 128
THIN_MIN_DENSITY = 0.5
# Where the BLAS runs 512-bit kernels (``threads.blas_vector_bits``; an Intel Xeon with
# AVX-512, OpenBLAS SkylakeX) its GEMMs are twice as wide as the 8-lane register tiles and
# the 2-D limit drops. Measured there (2 threads, ms, best GEMM / direct, fwd and
# bwd_data): 16 ch 112^2 1.99-2.36, 32 ch 1.22-1.72, 48 ch 56^2 0.95-1.00, 64 ch 56^2
# 0.77-0.84, 96 ch 28^2 0.86-0.87, 128 ch 28^2 0.73-0.79. First layers keep the general
# rules (3 -> 64 ch 112^2: 1.30 / 1.97, weights 2.39), as do 1-D (64 ch 1.22-1.30) and 3-D
# (32 -> 64 ch fwd 1.08).
THIN_WIDE_BLAS_2D_MAX_CHANNELS = 48
# 3-D problems pay a halo on three axes and short rows, so there the kernel needs a denser
# grid and, for the data gradient (whose padded diff_dst copy grows with the halo), thin
# channels. Measured (2 threads, float32, ms, direct / best GEMM; 3d_unet layers at the
# benchmark's scale): fwd 32 -> 64 ch 19x22x22 (density 0.74) 6.3-7.1 / 7.4-7.7, 64 ch
# 16x18x18 (0.69) 8.2-8.9 / 8.2-9.3, 64 -> 128 12x14x14 (0.61) 10.5 / 6.3, 128 ch 11^3
# (0.55) 12.4 / 6.5; bwd_data 3 -> 32 54x61x61 14.3 / 27.9, 32 ch 24^3 8.5 / 9.2, but
# 32 -> 64 19x22x22 9.4 / 8.7, 64 ch 24^3 57 / 43, 64 -> 128 12x14x14 13.7 / 8.2.
THIN_3D_MIN_DENSITY = 0.7
THIN_3D_BWD_DATA_MAX_CHANNELS = 32
# The weight gradient (a lane-sum register tile, kernels/_thin_jit.py) wins where the
# GEMMs have a small side: at most THIN_BWD_WEIGHTS_MAX_CHANNELS channels per group, or a
# first layer with at most THIN_BWD_WEIGHTS_FEW_INPUTS input channels and at most 64
# outputs; on 1-D and 2-D problems (3-D halos make its tile copies outweigh it). Measured
# in-process on the final kernel (float32, best GEMM / direct, 1 and 2 threads; the
# 2-thread figures move by up to 2x on this VM): wavenet 32 ch k2 84350 1.20 / 1.40, mb32
# x 2635 1.33 / 1.50, mb512 x 164 1.36 / 1.12; grouped 8 x 16 ch 3x3 165^2 1.44 / 1.50;
# 32 groups of 4 1.86-2.72 / 1.19-2.81; 16 ch 128^2 1.80 / 2.00; 32 ch 28^2 mb8 1.32 /
# 1.52; 24 -> 40 ch 5x3 1.22 / 1.53; 3 -> 64 ch 112^2 1.43 / 1.22; 3 -> 32 224^2 1.53 /
# 1.20-2.02; 32 ch dilation 2 1.28 / 1.37; 8 -> 64 ch 5x5 1.09 / 0.61-1.45; 64 ch k3 1-D
# 1.00 / 1.17; 48 ch 40^2 0.93 / 1.22. Measured on a first version (tiles restarting
# from zero) and kept on the GEMMs: 64 ch 56^2 0.80 / 0.81, 128 ch 28^2 0.51 / 0.45,
# 3 -> 256 ch 0.64 / 0.97, 3-D 32 -> 64 ch 19x22x22 0.82 / 0.85. On the AVX-512 host (2
# threads): 48 ch 56^2 1.29, 64 ch 56^2 1.06, 96 ch 0.65, 128 ch 0.57.
THIN_BWD_WEIGHTS_MAX_CHANNELS = 48
THIN_BWD_WEIGHTS_FEW_INPUTS = 8
# 3-D weight gradients with at most 32 channels (on dense grids, as the other 3-D
# directions), measured on the AVX-512 host (2 threads, ms, best GEMM / direct):
# 32 ch 24^3 12.0 / 7.4, 16 -> 32 ch 40^3 20.9 / 15.1, 3 -> 32 ch 54x61x61 15.9 / 7.6.
# (The AVX2 machine had measured 32 -> 64 ch 0.82, still on the GEMMs.)
THIN_3D_BWD_WEIGHTS_MAX_CHANNELS = 32
# Strided first layers (dilation 1, at most THIN_BWD_WEIGHTS_FEW_INPUTS input channels and
# THIN_STRIDED_MAX_OUTPUTS outputs per group, 1-D/2-D): every direction runs as a stride-1
# problem on stride-phase channels (``thin.phase_spec``). The GEMMs there have a
# 27-147-long reduction over few channels, the loops a dense grid. Measured on the
# AVX-512 host (2 threads, ms, im2col / phases, whole public call): mobilenet conv1
# (3 -> 32, 3x3 stride 2, 224^2, mb 32) bwd_data 42-48 / 22-25, bwd_weights 24 / 15-16;
# resnet_50 conv1 (3 -> 64, 7x7 stride 2, mb 4) bwd_data 15-16 / 10-12, bwd_weights 10-12 /
# 8.5-8.9. The forward there, on a copied phase array and summing the zero taps too:
# mobilenet 20 ms + 2 for the copy against 26, resnet 7.7 against 7.7. Reading the phase
# cells from the input and summing only the real taps (147 of 192 terms for resnet's 7x7,
# 27 of 48 for 3x3), on the AVX2 machine (paired medians phases / im2col, the two
# alternating in one process, 10 rounds): resnet conv1 0.76-0.78 (2 threads; 12.4-13.7 ms
# against 16.2-17.7), 0.65 (1 thread); mobilenet conv1 0.68-0.72 (2; 24.7-25.5 against
# 35.4-36.1), 0.82 (1); 8 -> 48 ch 5x5 stride 2 64^2 mb8 0.88; 3 -> 16 ch 3x3 stride 2
# 64^2 mb16 0.81; 1-D 2 -> 32 ch k8 stride 4 16000 mb8 0.72.
THIN_STRIDED_MAX_OUTPUTS = 64


def thin_pays(spec: ConvSpec, direction: str) -> bool:
    """Whether the automatic choice runs this problem on the thin-channel kernel (pure)."""
    if depthwise.eligible(spec) or not thin.eligible(spec, direction) or _prod(spec.kernel) == 1:
        return False
    widest = max(spec.icg, spec.ocg)
    if widest > THIN_MAX_CHANNELS:
        return False
    few_inputs = spec.icg <= THIN_BWD_WEIGHTS_FEW_INPUTS
    if any(st != 1 for st in spec.strides):     # gradients on stride-phase channels
        return few_inputs and spec.ocg <= THIN_STRIDED_MAX_OUTPUTS and spec.nsp <= 2
    if (spec.nsp == 2 and widest > THIN_WIDE_BLAS_2D_MAX_CHANNELS and not few_inputs
            and threads.blas_vector_bits() > 256):
        return False
    if direction == "bwd_weights":
        if spec.nsp == 3 and widest > THIN_3D_BWD_WEIGHTS_MAX_CHANNELS:
            return False
        if spec.nsp < 3 and widest > THIN_BWD_WEIGHTS_MAX_CHANNELS and not (few_inputs and spec.ocg <= 64):
            return False
    out = spec.src if direction == "bwd_data" else spec.dst     # positions the loops walk
    grid = _prod(o + (k - 1) * d for o, k, d in zip(out, spec.kernel, spec.dilations))
    if spec.nsp == 3:
        if direction == "bwd_data" and max(spec.icg, spec.ocg) > THIN_3D_BWD_DATA_MAX_CHANNELS:
            return False
        return _prod(out) >= THIN_3D_MIN_DENSITY * grid
    return _prod(out) >= THIN_MIN_DENSITY * grid


# ``blocked`` (channels-last copies + a register-blocked micro-kernel) is chosen for float32
# problems where (measured in-process on the AVX-512 host, 2 threads, ms, blocked / the
# previous choice; fwd, bwd_data, bwd_weights):
#  - the kernel has more than one tap (through layout copies a 1x1 layer ran 23.8 / 7.0,
#    18.1 / 6.4, 18.6 / 7.9 on resnet_50 res2a_branch2a), or it is a 1x1 forward or data
#    gradient (``pointwise_spec``; run on the NCX arrays, no copies, positions in the lanes)
#    on images of at least BLOCKED_POINTWISE_MIN_POSITIONS positions with at least
#    BLOCKED_POINTWISE_MIN_ROWS output channels per group (broadcast rows): 56^2 layers
#    res2a_branch2a (64 -> 64) 5.7 / 7.2, 4.8 / 6.8; 256 -> 64 4.9 / 6.4, 4.1 / 5.9;
#    64 -> 256 4.0 / 5.3, 4.3 / 5.3; mobilenet conv2 (112^2, 32 -> 64) fwd 10.3 / 13.6, but
#    its data gradient (32 rows) 9.3 / 8.3; 28^2 ties or loses (128 -> 512 4.1 / 4.1,
#    4.3 / 3.9), 7^2 loses (1024 -> 1024 6.0 / 3.9: the weights are read once per image);
#    the 1x1 weight gradient (sums along the lanes of both rows, ``dotkernel``) on the same
#    images with at most BLOCKED_POINTWISE_WEIGHTS_MAX_CHANNELS input + output channels per
#    group (every tile re-reads its rows from the L2 cache): res2a_branch2a 7.1 / 9.4,
#    mobilenet conv2 7.7 / 13.9, conv3 (64 -> 128) 5.0 / 6.5, but 128 -> 128 5.7 / 5.2,
#    64 -> 256 5.0 / 5.2, 256 -> 64 6.4 / 6.2, 512 -> 128 at 28^2 7.2 / 4.6; wider 1x1
#    weight gradients take the streamed channels-last path where it streams in eight parts
#    (``blocked.pointwise_weights``, measurements there); and the data
#    gradient of a strided 1x1 layer (``blocked.strided_pointwise``: the 1x1 problem on the
#    read cells, zero elsewhere) with at least BLOCKED_STRIDED_POINTWISE_MIN_POSITIONS
#    outputs per image and at most BLOCKED_STRIDED_POINTWISE_MAX_REDUCTION output channels
#    per group: resnet_50 res3a_branch2a (256 -> 128, 56^2 -> 28^2) 15.9 / 28.0, res3a_branch1
#    (256 -> 512) 4.3 / 4.5, but res4a_branch1 (14^2 outputs, 1024) 6.1 / 4.1; its forward
#    loses (9.1 / 11.8: the copy of the read cells); its weight gradient runs like the
#    multi-tap ones where it streams (``blocked.streamed_weights``: only the rows a tap reads
#    are copied): res3a_branch2a (mb19) 7.9 / 12.1, res4a_branch2a 7.0 / 8.9, res3a_branch1
#    (mb4) 5.3 / 5.4, but res5a_branch2a (whole copies, 2 MiB of weights) 8.7 / 6.2;
#  - the output channels the vector lanes hold (forward and weight gradient: C_out per
#    group; data gradient: C_in per group) number at least BLOCKED_MIN_LANE_CHANNELS (16
#    channels fill a quarter of a 64-channel register tile: 16 ch 3x3 128^2 2.43 / 2.24,
#    2.37 / 2.24, 3.00 / 2.10; a 3-channel data gradient 10.3 / 3.7);
#  - there are at least BLOCKED_MIN_INTENSITY multiply-adds per element copied (the input
#    and output of the forward, diff_dst and dsrc, or src and diff_dst): the copies run at
#    memory speed. VGG conv1 (3 -> 64, 224^2, 26 per element) 8.5 / 3.6, 11.3 / 3.5,
#    6.6 / 2.9; 3d_unet conv_1 (73) bwd_weights 9.5 / 6.6; 1-D 64 channels k3 (96) 2.48 /
#    2.28; where it pays: 32 ch 3x3 112^2 (144) 2.42 / 2.97, 2.43 / 2.88, 2.97 / 2.91;
#    resnet_50 conv1 7x7 stride 2 (124) fwd 5.2 / 7.1, bwd_weights 6.0 / 7.7;
#  - the weights are at most BLOCKED_MAX_WEIGHT_RATIO times the copied elements (they
#    are put in blocks on every call, another pass over memory): 3d_unet conv_8 (ratio 28)
#    8.6 / 4.1, 9.4 / 5.0, 11.6 / 3.5; conv_7 (11) 5.3 / 4.5, 6.0 / 7.5, 3.3 / 3.2;
#    resnet_50 res5a_branch2b mb4 (12) 4.7 / 4.5, 4.9 / 5.7, 4.4 / 4.2;
#  - 1-D stride-1 forwards and data gradients with at most ``blocked.LINE_MAX_WEIGHT_BYTES``
#    of weights and at least BLOCKED_LINE_MIN_ROWS output channels per group run on the NCX
#    rows (no copies, so none of the rules above): wavenet 32 ch k2 (84350 cells, mb1; 10543,
#    mb8; 658, mb128; 164, mb512) 1.6 / 2.6, 1.6 / 2.6; 1.7 / 2.7, 1.7 / 2.6; 1.5 / 2.8,
#    1.7 / 2.9; 1.5 / 3.1, 1.7 / 3.1 against the thin kernel; 64 ch k3 1.6 / 2.3 (both);
#  - the micro-kernels run 512-bit vectors (``blocked.vector_bits``); on AVX2 hosts
#    (256-bit vectors, a 4 x 24 register tile) the narrower rules of ``_blocked_rule_256``;
#  - since the weight blocks go through the compiled transpose (2-2.5x faster), heavier
#    weights pay for the gradients (ms, blocked / previous choice, weight ratio):
#    3d_unet conv_8 (26) bwd_data 6.3-6.8 / 6.4-7.1 (even), bwd_weights 4.6-4.9 / 4.0-4.4
#    (stays); conv_7 (11) bwd_weights 3.5-3.8 / 4.2-4.4; res5a_branch2b mb4 (12)
#    bwd_weights 5.1 / 5.5; the forward keeps its limit (conv_7 3.9-4.3 / 5.6-6.0, but
#    res5a_branch2b 6.0 / 5.6, conv_8 5.8-6.7 / 4.9-5.4);
#  - the weight gradient streams its copies chunk by chunk through cache where the weights
#    are small (``blocked._weight_parts``), so it pays from 16 output channels and 16
#    multiply-adds per element (ms, blocked / the previous choice): mobilenet conv1 (3 -> 32,
#    3x3 s2, 20 per element) mb8 2.2 / 4.1, mb32 9.6 / 16.2; 3 -> 16 3x3 s2 mb8 1.7 / 3.1;
#    8 -> 32 2x2 s2 (16) 0.9 / 2.2; VGG conv1 3.0 / 3.3; 3d_unet conv_1 6.1 / 8.1; 1-D 3 -> 32
#    k7 (19) 0.9 / 1.1; wavenet 32 ch k2 (32) 2.3 / 2.9, 2.6 / 3.4, 2.3 / 3.2, 2.4 / 3.4;
#    1-D 64 ch k3 2.1 / 5.7; 16 ch 3x3 64^2 1.2 / 1.5, 128^2 2.1 / 2.3; but 8 output
#    channels (half a vector) lose: 3 -> 8 3x3 128^2 1.5 / 1.1, groups of 8 0.9 / 1.2.
# Where it is chosen: res2a_branch2b (64 ch 56^2 mb4) 4.0 / 4.7, 3.9 / 5.2, 4.5 / 8.2;
# res3a_branch2b 3.5 / 4.3, 3.5 / 4.8, 4.1 / 6.7; res4a_branch2b (ratio 1.5) 3.6 / 3.9,
# 3.6 / 4.4, 3.8 / 4.2; 3d_unet conv_3 (64 ch 16x18x18) 3.5 / 6.1, 3.5 / 6.2, 4.0 / 7.5;
# conv_2 (32 -> 64) 2.9 / 5.0, 3.6 / 6.1, 3.8 / 6.4; conv_5 (128 ch 11^3) 3.3 / 3.9, 3.6 /
# 4.4, 2.8 / 4.0; 48 ch 3x3 56^2 2.4 / 3.4, 2.4 / 3.4, 2.7 / 3.6.
BLOCKED_MIN_LANE_CHANNELS = {"fwd": 32, "bwd_data": 32, "bwd_weights": 16}
BLOCKED_POINTWISE_MIN_POSITIONS = 2048
BLOCKED_POINTWISE_MIN_ROWS = 64
BLOCKED_POINTWISE_WEIGHTS_MAX_CHANNELS = blocked.POINTWISE_WEIGHTS_MAX_CHANNELS
BLOCKED_STRIDED_POINTWISE_MIN_POSITIONS = 512
BLOCKED_STREAMED_POINTWISE_MIN_POSITIONS = 196     # measured down to 14^2 images
BLOCKED_STRIDED_POINTWISE_MAX_REDUCTION = 512
BLOCKED_LINE_MIN_ROWS = 16
BLOCKED_MIN_INTENSITY = {"fwd": 100, "bwd_data": 100, "bwd_weights": 16}
BLOCKED_MAX_WEIGHT_RATIO = {"fwd": 4, "bwd_data": 30, "bwd_weights": 12}


def blocked_pays(spec: ConvSpec, direction: str, vector_bits: int | None = None, cpu: str | None = None) -> bool:
    """Whether the automatic choice runs this float32 problem on ``blocked`` (pure), on
    micro-kernels of ``vector_bits`` (512: AVX-512, 256: AVX2) built for the LLVM CPU
    ``cpu``: an AMD Zen with AVX-512 (``znver*``) has its own rules, any other name the
    generic ones. Both None: this host's width and CPU; ``vector_bits`` alone: the generic
    rules of that width."""
    if direction not in DIRECTIONS:
        raise ConvValueError(f"blocked_pays: direction must be one of {DIRECTIONS}, but got {direction!r}")
    if vector_bits is None and cpu is None:
        return _blocked_pays(spec, direction)
    if vector_bits is None:
        vector_bits = blocked.vector_bits()
    if vector_bits not in (256, 512):
        raise ConvValueError(f"blocked_pays: vector_bits must be 256 or 512, but got {vector_bits!r}")
    return _host_rule(spec, direction, vector_bits, cpu or "")


def _host_rule(spec: ConvSpec, direction: str, vector_bits: int, cpu: str) -> bool:
    if vector_bits == 256:
        return _blocked_rule_256(spec, direction)
    if cpu == "znver4":
        return _blocked_rule_zen4(spec, direction)
    return _blocked_rule_zen(spec, direction) if cpu.startswith("znver") else _blocked_rule(spec, direction)


@functools.lru_cache(maxsize=1024)
def _blocked_pays(spec: ConvSpec, direction: str) -> bool:
    # the host check last: it compiles the micro-kernels (~1-2 s) on its first call
    if not (_blocked_rule(spec, direction) or _blocked_rule_256(spec, direction) or _zen_pointwise_data(spec, direction)
            or _zen4_inplace_weights(spec, direction) or (direction != "fwd" and framed_spec(spec))):
        return False
    bits = blocked.vector_bits()
    return _host_rule(spec, direction, bits, blocked.host_cpu()) if bits in (256, 512) else False


# On AMD Zen hosts with AVX-512 (LLVM ``znver*``; measured on a Zen 5, family 26, where
# OpenBLAS runs its SkylakeX kernels at 430 GFLOP/s on 2 threads) the 512-bit rules hold
# for multi-tap kernels (2 threads, in-process, ms, blocked / best GEMM lowering: res2a-
# res4a_branch2b 2.4 / 4.7, 2.2 / 3.7, 3.0 / 3.6 weight gradients, 2.4 / 3.3, 2.1 / 2.9,
# 2.2 / 3.1 data gradients; 3d_unet conv_2 - conv_7 1.5-3.2 / 2.0-5.4), but OpenBLAS's
# GEMMs win elsewhere. Median of 24 calls in the benchmark's conditions (a 0.1 s pause and
# 64 MB of other traffic before each warm-up and 3 timed calls, the two alternating):
#  - 1x1 weight gradients on the streamed channels-last path lost to ``taps`` (since then,
#    see BLOCKED_ZEN_STREAMED_1X1_MIN_POSITIONS): 64 -> 256
#    56^2 mb9 9.8 / 8.1, 128 -> 128 8.8 / 8.0, 128 -> 256 28^2 8.2 / 6.1, 256 -> 256 7.8 /
#    4.5, 512 -> 128 11.5 / 8.4, 128 -> 512 8.5 / 7.7, 256 -> 64 9.6 / 8.8, 256 -> 512 14^2
#    8.3 / 8.0, so only the NCX dot kernel stays (``blocked.pointwise_weights``, at most
#    192 channels: 64 -> 64 mb38 11.0 / 14.5, 32 -> 64 112^2 11.7 / 14.0, 64 -> 128 8.7 /
#    8.6); strided ones stream where they have at most BLOCKED_ZEN_STRIDED_WEIGHTS_MAX_CHANNELS
#    input + output channels: res3a_branch2a (256 -> 128) 12.3 / 16.0, but res3a_branch1
#    (256 -> 512) 9.5 / 7.8, res4a_branch2a (512 -> 256) 11.4 / 9.6. Since their copies
#    gather the cells read (``blocked.compressed_spec``; stride 2 along the last axis),
#    those that stream in WEIGHT_PARTS parts: res3a_branch2a 4.1 / 5.6 (taps), res4a_branch2a
#    3.8 / 4.1, res3a_branch1 (mb4) 2.6 / 2.6; not res4a_branch1 (2 parts) 3.9 / 2.6 or
#    res5a_branch2a 6.7 / 4.0 (medians of 24 calls, the conditions above);
#  - strided 1x1 data gradients lose: res3a_branch2a 16.7 / 14.6, res3a_branch1 7.8 / 6.9;
#    and, measured again at 17e6bc1, stride-1 ones too (5 alternating pairs of benchmark
#    runs of convgrad alone, medians, ms, blocked / taps: mobilenet conv3 64 -> 128 56^2
#    mb19 5.64 / 4.16, 64 -> 64 mb38 5.75 / 4.57, 128 -> 128 mb9 4.06 / 3.32, 256 -> 64
#    4.44 / 3.65, 64 -> 256 5.11 / 4.01); their forwards still win or tie (6 pairs: taps /
#    blocked 0.84-1.08, the fastest calls faster on blocked);
#  - data gradients with weights above BLOCKED_ZEN_MAX_WEIGHT_RATIO times the copied
#    elements lose: 3d_unet conv_8 (ratio 28) 15.5 / 8.4 (im2col); conv_7 (11) wins 3.2 /
#    5.4 and res5a_branch2b (12) ties 4.5 / 4.4 (back to back).
BLOCKED_ZEN_STRIDED_WEIGHTS_MAX_CHANNELS = 384
BLOCKED_ZEN_MAX_WEIGHT_RATIO = 16
# Since the layout copies take each channel group down all its rows (``blocked``), stride-1
# 1x1 weight gradients on the streamed path win from this many positions per image
# (medians of 18 calls, the conditions above, blocked / taps): 56^2 mb9 256 -> 64 2.80 /
# 3.84, 64 -> 256 2.80 / 3.06, 128 -> 128 2.59 / 3.21; but 28^2 512 -> 128 3.21 / 2.93,
# 128 -> 512 2.71 / 2.60, 14^2 1024 -> 256 5.79 / 2.49.
BLOCKED_ZEN_STREAMED_1X1_MIN_POSITIONS = 56 * 56
# Since the data gradient runs strip by strip (``blocked.pointwise_strips``: at most 256
# output channels to reduce over), stride-1 1x1 data gradients of images of at least
# BLOCKED_POINTWISE_MIN_POSITIONS positions and BLOCKED_ZEN_POINTWISE_DATA_MIN_ROWS input
# channels win. Alternating benchmark runs (convgrad alone, six pairs per set, new / old
# medians): mobilenet conv2 (32 <- 64, 112^2, mb19) 0.74 and 0.92, conv3 (64 <- 128,
# 56^2) 0.90 / 0.99, conv4 (128 <- 128, mb9) 0.67 / 0.90, resnet_50 res2a_branch2a (64 <-
# 64, mb38) 0.83 / 0.95, res2b_branch2a (256 <- 64) 0.83 / 0.91, res2a_branch1 (64 <- 256)
# 0.91 / 0.93. At 28^2 (784 positions) they lost: conv5 (128 <- 256) 1.14, conv6 1.21,
# res3b_branch2a (512 <- 128) 1.09. Since the micro-kernel's whole last vectors are plain
# accesses (``_ukernel``'s unmasked copies) smaller images win too where the weights stay
# in the L2 cache next to a strip (every strip reads all of them): at most
# BLOCKED_ZEN_POINTWISE_DATA_MAX_WEIGHTS elements, on images of at least
# BLOCKED_ZEN_POINTWISE_DATA_MIN_POSITIONS. In-process, the two algorithms' calls
# interleaved, 64 MB of other traffic before each warm-up (2 threads), blocked / taps:
# mobilenet conv5 (128 <- 256, 28^2) 0.88-0.90, conv6 (256 <- 256) 0.94-0.98, res3b_branch2a
# (512 <- 128) 0.99-1.01, 256 <- 256 at 14^2 0.92-0.93, 128 <- 512 at 14^2 0.93, 128 <- 256
# at 14^2 0.86, 64 <- 96 at 28^2 0.77, 128 <- 64 at 20^2 0.74; but 1 MB of weights lose
# (res4b_branch2a 1024 <- 256 at 14^2 1.23, at 20^2 1.06, at 28^2 1.07), as do 7^2 images
# (256 <- 256 1.11, 512 <- 128 1.08, 2048 <- 256 1.34).
BLOCKED_ZEN_POINTWISE_DATA_MIN_ROWS = 32
BLOCKED_ZEN_POINTWISE_DATA_MAX_WEIGHTS = 256 * 256
BLOCKED_ZEN_POINTWISE_DATA_MIN_POSITIONS = 14 * 14


def _zen_pointwise_data(spec: ConvSpec, direction: str) -> bool:
    if not (direction == "bwd_data" and blocked.pointwise_strips(spec)
            and spec.icg >= BLOCKED_ZEN_POINTWISE_DATA_MIN_ROWS):
        return False
    positions = _prod(spec.src)
    return positions >= BLOCKED_POINTWISE_MIN_POSITIONS or (
        positions >= BLOCKED_ZEN_POINTWISE_DATA_MIN_POSITIONS
        and spec.icg * spec.ocg <= BLOCKED_ZEN_POINTWISE_DATA_MAX_WEIGHTS)


def _blocked_rule_zen(spec: ConvSpec, direction: str) -> bool:
    if _zen_pointwise_data(spec, direction):
        return True
    if not _blocked_rule(spec, direction):
        return False
    if _prod(spec.kernel) == 1:
        if direction == "bwd_data":                             # strided, or more channels: the GEMMs
            return False
        if blocked.strided_pointwise(spec) is not None:
            if direction == "fwd":                              # (the strided forward loses too)
                return False
            cspec = blocked.compressed_spec(spec)
            if cspec is not None:
                return blocked.streamed_weights(cspec)
            return spec.icg + spec.ocg <= BLOCKED_ZEN_STRIDED_WEIGHTS_MAX_CHANNELS
        return direction == "fwd" or blocked.pointwise_weights(spec) or (
            blocked.streamed_weights(spec) and _prod(spec.src) >= BLOCKED_ZEN_STREAMED_1X1_MIN_POSITIONS)
    if direction == "bwd_data":
        return _prod(spec.weights_shape) <= BLOCKED_ZEN_MAX_WEIGHT_RATIO * (
            spec.mb * (spec.ic * _prod(spec.src) + spec.oc * _prod(spec.dst)))
    return True


# On a Zen 4 (LLVM ``znver4``, AMD EPYC family 25 model 17: AVX-512 on 256-bit units, each
# 512-bit operation two passes, 1 MiB L2 per core; OpenBLAS's SkylakeX kernels at 200
# GFLOP/s on 2 threads) the Zen rules above, measured on a Zen 5 with full-width units,
# lose in three places to OpenBLAS's GEMMs or the thin kernel. In one process, the
# algorithms alternating (12 rounds of a 0.05 s pause, 64 MB of other traffic, a warm-up
# and 3 calls; medians, ms, blocked / the better other; a 4-round sweep of every list
# agreed):
#  - stride-1 1x1 weight gradients on the streamed channels-last path: res2a_branch1
#    (64 -> 256, 56^2, mb9) 9.45 / 7.15 taps (sweep 9.43 / 7.28); 256 -> 64 and 128 -> 128
#    tie (8.56 / 8.85, 6.36 / 6.28), so only the NCX dot kernel stays. Since the streamed
#    path reads the input in place (``blocked.ncx_weights``; stop 47), those with at least
#    ZEN4_NCX_WEIGHTS_MIN_ROW_RATIO input channels per output channel (the vectors of
#    output channels are the part still copied) win again, two sessions of 6 rounds:
#    res2b_branch2a (256 -> 64, 56^2, mb9) 5.05 / 6.97 and 5.23 / 7.24 taps,
#    res3b_branch2a (512 -> 128, 28^2) 5.92 / 6.60 and 5.76 / 6.67; fewer do not: 128 ->
#    128 (mobilenet conv4) 6.18 / 6.99 and 6.78 / 6.76, 256 -> 256 (conv6) 0.97 and 0.95,
#    128 -> 256 (conv5) 1.06 and 0.92, 64 -> 256 (res2a_branch1) 0.99 and 1.01, 128 -> 512
#    (res3a_branch2c) 1.07 and 1.08;
#  - stride-1 1x1 data gradients strip by strip with more than
#    ZEN4_POINTWISE_DATA_MAX_ROW_RATIO input channels (rows) per output channel (the
#    reduction): res3b_branch2a (512 <- 128, 28^2, mb9) 6.65 / 5.79 taps (sweep 6.09 /
#    5.46), res2b_branch2a (256 <- 64, 56^2) 7.90 / 7.24 (7.48 / 6.91); those with fewer
#    rows still win or tie: mobilenet conv2 (32 <- 64, 112^2) 8.61 / 9.19, conv4 (128 <-
#    128) 5.92 / 6.30, res2a_branch1 (64 <- 256) 7.12 / 7.36, res3a_branch2c (128 <- 512)
#    5.61 / 5.70;
#  - 1-D data gradients on the NCX rows (``blocked.line_spec``) against the thin kernel:
#    wavenet 32 ch k2 mb1 x 84350 3.42 / 2.88, mb256 x 329 4.02 / 3.89 (sweep: 9 of the
#    10 dilated layers 1.03-1.14 slower on blocked, mb128 x 658 0.84).
#  Since stop 48 every unpadded 1x1 weight gradient of one group from
#  ZEN4_INPLACE_WEIGHTS_MIN_FLOPS runs as one product with an operand read in place
#  (``blocked.inplace_weights``, measured there: 0.77-0.99 of the choice before on 25 of
#  the 28 such layers of the lists), except strided ones with more output than input
#  channels on fewer than ZEN4_INPLACE_STRIDED_MIN_POSITIONS outputs per image, where the
#  input (fewer channels) must be the operand read in place: res4a_branch1 (512 -> 1024,
#  14^2 outputs) 1.04, res5a_branch1 (7^2) 1.20, against res3a_branch1 (28^2) 0.89. Below
#  20 MFLOP the GEMMs' single product wins (128 -> 128 at 16^2 1.59, 64 -> 128 at 28^2
#  0.96, 256 -> 256 at 14^2, 26 MFLOP, 0.77). Framed 1-D weight gradients (an ISTFT's;
#  ``blocked.framed_weights``) run there too, at any size: in one process, blocked / taps,
#  the ISTFT (1 -> 1026 channels, k 1024, s 256) 0.83, k 512 s 128 0.81-0.84, k 256 s 64
#  4 x 32000 samples 0.71, 16 -> 64 channels 0.27, 1 MFLOP ones 0.12-0.25; and their data
#  gradients (the ISTFT itself; ``blocked.framed_data``): 0.88, 0.81, 0.75, 0.27, 0.14-0.31.
ZEN4_POINTWISE_DATA_MAX_ROW_RATIO = 2
ZEN4_NCX_WEIGHTS_MIN_ROW_RATIO = 2
ZEN4_INPLACE_WEIGHTS_MIN_FLOPS = PARALLEL_FLOPS
ZEN4_INPLACE_STRIDED_MIN_POSITIONS = 512


def _zen4_inplace_weights(spec: ConvSpec, direction: str) -> bool:
    """Whether the Zen 4 rule runs this weight gradient as ``blocked``'s one product
    (pure; host-independent, so ``blocked_pays(..., cpu="znver4")`` answers anywhere)."""
    if direction != "bwd_weights" or not unpadded_1x1(spec) or spec.groups != 1 or 0 in spec.dst:
        return False
    if spec.flops < ZEN4_INPLACE_WEIGHTS_MIN_FLOPS or not 1 <= spec.nsp <= 3:
        return False
    strided = any(s != 1 for s in spec.strides)
    return not (strided and spec.ocg > spec.icg and _prod(spec.dst) < ZEN4_INPLACE_STRIDED_MIN_POSITIONS)


def _blocked_rule_zen4(spec: ConvSpec, direction: str) -> bool:
    if direction == "bwd_weights" and unpadded_1x1(spec) and spec.groups == 1:
        return _zen4_inplace_weights(spec, direction)
    if direction != "fwd" and framed_spec(spec):
        return True
    if direction == "bwd_weights" and pointwise_spec(spec):     # (a 1x1 kernel, stride 1)
        return _blocked_rule(spec, direction) and (blocked.pointwise_weights(spec) or (
            blocked.ncx_weights(spec) and spec.icg >= ZEN4_NCX_WEIGHTS_MIN_ROW_RATIO * spec.ocg))
    if not _blocked_rule_zen(spec, direction):
        return False
    if direction == "bwd_data" and blocked.line_spec(spec):
        return False
    if pointwise_spec(spec):
        if direction == "bwd_data":
            return spec.icg <= ZEN4_POINTWISE_DATA_MAX_ROW_RATIO * spec.ocg
    return True


# On AVX2 hosts (256-bit vectors, a 4 x 24 tile) ``blocked`` is chosen only where it was
# measured to win (AMD EPYC Zen 3, 2 threads, in-process, ms, blocked / the previous choice;
# SGEMM 166 GFLOP/s):
#  - data gradients of multi-tap kernels, with the lane, intensity and weight-ratio rules
#    above but weights at most BLOCKED_256_MAX_WEIGHT_RATIO times the copied elements:
#    resnet_50 res2a_branch2b 10.6 / 12.3, res3a_branch2b 7.9 / 11.1, res4a_branch2b
#    7.8 / 12.4, res5a_branch2b (ratio 12) 9.9 / 10.2; 3d_unet conv_2 9.4 / 13.8, conv_3
#    8.6 / 12.4, conv_4 7.0 / 10.6, conv_5 7.4 / 9.2, conv_7 (11) 9.0 / 11.8; but conv_8
#    (28) 13.5 / 10.0;
#  - forwards likewise (the 512-bit weight ratio, 4), with at least
#    BLOCKED_256_MIN_FORWARD_CHANNELS input channels per group: 3d_unet conv_2 7.5 / 9.6,
#    conv_3 7.1 / 11.7, conv_4 6.3 / 7.6, conv_5 6.6 / 7.0; since the transpose's plain
#    stores, res2a_branch2b 6.3 / 9.1, res3a_branch2b 7.3 / 9.3, res4a_branch2b 5.7 / 7.9;
#    but resnet_50 conv1 (3 input channels) 14.8 / 10.7;
#  - multi-tap weight gradients lose or tie (res3a_branch2b 12.4 / 11.6, res4a_branch2b
#    8.1 / 7.0, res5a_branch2b 9.9 / 7.1, 3d_unet conv_4 13.2 / 7.5; the tiles' strided reads
#    of two channels-last rows per step outrun the 512 KiB L2 cache), though some win
#    (res2a_branch2b 9.8 / 11.7, conv_2 7.0 / 10.4);
#  - 1x1 weight gradients on the NCX rows (``dotkernel``) with at most
#    BLOCKED_256_POINTWISE_WEIGHTS_MAX_CHANNELS input + output channels: mobilenet conv2
#    (32 -> 64, 112^2) 11.1 / 16.2, res2a_branch2a (64 -> 64) 9.6 / 9.9, but conv3
#    (64 -> 128) 8.6 / 9.0 is even; 1x1 forwards and data gradients lose to OpenBLAS's
#    GEMM (res2a_branch2a 11.3 / 9.5, 12.6 / 9.8), as do the 1-D rows (wavenet 32 ch k2
#    5.9 / 4.0, 6.5 / 4.6 against the thin kernel).
#  - multi-tap 3-D weight gradients with few channels do win: the rule was at most 128
#    input + output channels and at least 64 outputs (fewer were then the thin kernel's,
#    which tied or won: 32 ch 24^3 10.2 / 10.4, 16 -> 32 ch 40^3 11.7 / 13.2). Measured later (min / median
#    of 3 x 5 calls, ms, blocked / im2col): 3d_unet conv_2 (32 -> 64) 9.8 / 10.9 and 8.5 /
#    12.5, conv_3 (64 -> 64) 7.8 / 9.1 and 7.6 / 9.6, 48 -> 64 ch 20^3 mb2 8.8 / 12.9; but
#    conv_4 (64 -> 128) 6.8 / 6.4 and 8.2 / 6.8, conv_5 - conv_8 (128-512 channels) even or
#    slower, and 2-D res2a_branch2b (64 -> 64) 11.5 / 11.1.
#  - and 2-D ones with the same channels and at least 16 input channels per group
#    (then). Measured on an AMD EPYC Zen 2 (family 23 model 49; SGEMM 175-192 GFLOP/s),
#    2 threads, in-process, blocked / the previous choice interleaved (10 rounds of a 50 ms
#    pause, 16 MB of other traffic, a warm-up and 3 calls; medians, ms, and the paired
#    ratio): resnet_50 res2a_branch2b (64 -> 64, 56^2, mb4) 9.00 / 10.77 (im2col) 0.85,
#    64 -> 64 28^2 mb8 4.15 / 6.18 0.68, 64 -> 64 14^2 mb16 2.35 / 3.59 0.63, 48 -> 80 56^2
#    8.05 / 9.61 0.85, 32 -> 96 5.68 / 7.41 0.77, 64 -> 64 5x5 56^2 mb2 9.83 / 14.61 0.68;
#    but one image of 112^2 (64 -> 64) 9.10 / 8.72 (taps) 1.07, and, with more channels,
#    res3a_branch2b (128 -> 128) 8.76 / 8.46, res5a_branch2b 10.42 / 8.38. On the Zen 3
#    res2a_branch2b had measured 9.8 / 11.7 and, later, 11.5 / 11.1 (above).
#  - since the tiles walk chunks of 64 KiB on AVX2 (``blocked.ROW_CHUNK_BYTES``; 1 MiB
#    before, read from the L3 cache), 3-D ones up to BLOCKED_256_3D_WEIGHTS_MAX_CHANNELS
#    channels and 2-D ones on images of any size. Measured on an AMD EPYC Zen 3 (family 25
#    model 1), same method (5-8 rounds), blocked / the best GEMM: 3d_unet conv_4 (64 -> 128,
#    192 channels) 7.5 / 8.0 (im2col) 0.93, conv_5 (128 -> 128) 9.1 / 10.3-10.8 0.87, but
#    conv_6 (128 -> 256) 8.8 / 8.4 1.04; one 112^2 image (64 -> 64) 6.45 / 7.16 (taps) 0.90,
#    64 -> 64 224^2 28.2 / 28.0 (taps) 1.0, 32 -> 64 160^2 7.4 / 8.5 0.91; res2a_branch2b
#    6.7 / 7.6 (taps) 0.88; 2-D with more channels still loses: res3a_branch2b (128 ->
#    128) 7.3 / 6.8-7.1 (im2col) 1.04-1.09, 256 ch 14^2 8.8 / 6.9, 512 ch 7^2 10.2 / 6.4.
#    And from BLOCKED_256_WEIGHTS_MIN_INPUTS inputs and BLOCKED_256_2D_WEIGHTS_MIN_OUTPUTS
#    (2-D) or BLOCKED_256_3D_WEIGHTS_MIN_OUTPUTS (3-D) outputs per group (were 16 inputs in
#    2-D, none in 3-D, and 64 outputs), blocked / the previous choice (the thin kernel,
#    ``direct``, or im2col), 5-8 rounds. 2-D: 48 -> 48 ch 56^2 mb4 0.78-0.90
#    (direct), 28^2 mb8 0.70, 16 -> 48 0.80, 64 -> 48 mb2 0.73 (im2col), 16 -> 48 5x5 64^2
#    0.93, 8 -> 48 0.89, 8 -> 64 0.84-0.94 (direct), 8 -> 96 0.75 (im2col), 8 -> 128 28^2
#    0.86-0.94; even: 8 -> 64 on one 112^2 image 1.02, 32 -> 32 ch (1.03, left to the thin
#    kernel); resnet_50 conv1 (3 inputs, 7x7 stride 2) 1.20 stays on the thin kernel. 3-D
#    (direct unless said): 32 ch 24^3 0.79-0.89, 16 -> 32 ch 40^3 0.79, 16 ch 32^3 0.82,
#    32 -> 48 ch 0.94 (direct 1.08 of im2col), 48 ch 20^3 0.72, 8 -> 64 ch 0.83 (im2col); even:
#    8 -> 32 0.97; lost: 3d_unet conv_1 (3 -> 32) 1.30 and 3 -> 64 ch 40^3 1.14 (im2col),
#    which had run on blocked before: inputs below 8 now go back to the others.
#  - forwards with up to BLOCKED_256_MAX_WEIGHT_RATIO weights per copied element too (were
#    at most BLOCKED_MAX_WEIGHT_RATIO["fwd"], 4, measured on AVX-512 hosts). Zen 3, in one
#    process, the two interleaved (20 rounds of a 50 ms pause, 64 MB of other traffic, a
#    warm-up and 3 calls; medians, ms, and the paired ratio blocked / im2col, two sessions):
#    3d_unet conv_7 (256 -> 256, 7x8x8, ratio 11) 6.52 / 7.75 0.87 and 6.98 / 8.98 0.81,
#    conv_6 (128 -> 256, ratio 5.6) 0.99 and 0.90, res5a_branch2b (512 ch 7^2 mb4, 11.8) 0.97
#    and 0.96, 256 ch 7^2 mb4 (5.9) 0.92, 384 ch 10^2 mb2 (7.7) 0.97; even: 512 ch 14^2 mb1
#    (11.8) 1.03; beyond it conv_8 (256 -> 512, ratio 28) lost, 10.1 / 6.9 1.47.
BLOCKED_256_MAX_WEIGHT_RATIO = 12
BLOCKED_256_MIN_FORWARD_CHANNELS = 16
BLOCKED_256_POINTWISE_WEIGHTS_MAX_CHANNELS = 128
BLOCKED_256_WEIGHTS_MAX_CHANNELS = 128
BLOCKED_256_3D_WEIGHTS_MAX_CHANNELS = 256
BLOCKED_256_WEIGHTS_MIN_INPUTS = 8
BLOCKED_256_2D_WEIGHTS_MIN_OUTPUTS = 48
BLOCKED_256_3D_WEIGHTS_MIN_OUTPUTS = 16


def _blocked_rule_256(spec: ConvSpec, direction: str) -> bool:
    if spec.icg < 2 or not blocked.eligible(spec, direction):
        return False
    if direction == "bwd_data" and scatter_chunks(spec):   # im2col's compiled scatter (gemm.py)
        return False
    if _prod(spec.kernel) == 1:
        return (direction == "bwd_weights" and blocked.strided_pointwise(spec) is None and pointwise_spec(spec)
                and blocked.pointwise_weights(spec) and _prod(spec.src) >= BLOCKED_POINTWISE_MIN_POSITIONS
                and spec.icg + spec.ocg <= BLOCKED_256_POINTWISE_WEIGHTS_MAX_CHANNELS)
    if direction == "bwd_weights":
        if spec.nsp == 3:
            widest, fewest = BLOCKED_256_3D_WEIGHTS_MAX_CHANNELS, BLOCKED_256_3D_WEIGHTS_MIN_OUTPUTS
        else:
            widest, fewest = BLOCKED_256_WEIGHTS_MAX_CHANNELS, BLOCKED_256_2D_WEIGHTS_MIN_OUTPUTS
        if spec.ocg < fewest or spec.icg < BLOCKED_256_WEIGHTS_MIN_INPUTS or spec.icg + spec.ocg > widest:
            return False
        return spec.nsp >= 2 and _blocked_rule(spec, direction)
    if (direction == "fwd" and spec.icg < BLOCKED_256_MIN_FORWARD_CHANNELS) or blocked.line_spec(spec):
        return False
    return _blocked_rule(spec, direction, BLOCKED_256_MAX_WEIGHT_RATIO)


def _blocked_rule(spec: ConvSpec, direction: str, weight_ratio: float | None = None) -> bool:
    # weight_ratio: the most weights per copied element (src + dst), in place of
    # BLOCKED_MAX_WEIGHT_RATIO[direction] (the 256-bit rule's own, for multi-tap kernels)
    if spec.icg < 2 or not blocked.eligible(spec, direction):
        return False
    if direction != "bwd_weights" and blocked.line_spec(spec):
        return (spec.icg if direction == "bwd_data" else spec.ocg) >= BLOCKED_LINE_MIN_ROWS
    if _prod(spec.kernel) == 1:
        sub = blocked.strided_pointwise(spec)
        if sub is not None:
            if direction == "bwd_weights":
                return blocked.streamed_weights(spec)
            return (direction == "bwd_data" and _prod(sub.src) >= BLOCKED_STRIDED_POINTWISE_MIN_POSITIONS
                    and spec.ocg <= BLOCKED_STRIDED_POINTWISE_MAX_REDUCTION)
        if not pointwise_spec(spec):
            return False
        if direction == "bwd_weights" and not blocked.pointwise_weights(spec):     # channels-last
            return _prod(spec.src) >= BLOCKED_STREAMED_POINTWISE_MIN_POSITIONS and blocked.streamed_weights(spec)
        if _prod(spec.src) < BLOCKED_POINTWISE_MIN_POSITIONS:
            return False
        if direction == "bwd_weights":
            return spec.icg + spec.ocg <= BLOCKED_POINTWISE_WEIGHTS_MAX_CHANNELS
        return (spec.icg if direction == "bwd_data" else spec.ocg) >= BLOCKED_POINTWISE_MIN_ROWS
    lanes = spec.icg if direction == "bwd_data" else spec.ocg
    if lanes < BLOCKED_MIN_LANE_CHANNELS[direction]:
        return False
    src = spec.mb * spec.ic * _prod(spec.src)
    dst = spec.mb * spec.oc * _prod(spec.dst)
    macs = spec.flops // 2
    if macs < BLOCKED_MIN_INTENSITY[direction] * (src + dst):
        return False
    ratio = BLOCKED_MAX_WEIGHT_RATIO[direction] if weight_ratio is None else weight_ratio
    return _prod(spec.weights_shape) <= ratio * (src + dst)


def check_blocked(op: str, spec: ConvSpec, direction: str, dtype: np.dtype) -> None:
    """Raise unless ``algorithm="blocked"`` can run this problem here."""
    if not blocked.eligible(spec, direction):
        raise ConvValueError(
            f"{op}: algorithm 'blocked' expects 1 to 3 spatial axes and, for bwd_data, stride 1 with pads at most "
            f"(K - 1) * dilation (or a 1x1 kernel, or on AVX-512 a 1-D kernel of whole strides), but got {spec.nsp} spatial axes, strides {list(spec.strides)}, pads_begin "
            f"{list(spec.pads_begin)}, pads_end {list(spec.pads_end)} for {direction}")
    if np.dtype(dtype) == np.float64:
        raise ConvValueError(f"{op}: algorithm 'blocked' computes in float32 and expects float32, float16 or "
                             f"bfloat16 data, but got float64")
    if not blocked.available():
        raise ConvValueError(f"{op}: algorithm 'blocked' expects numba and llvmlite on an x86-64 CPU with AVX2 and "
                             f"FMA (pip install convgrad[fast]), but {blocked.unavailable_reason()}")


def direct_kernel(spec: ConvSpec):
    """The module that runs ``direct`` for this problem: ``depthwise`` (one input channel
    per group) or ``thin`` (the others; stride 1)."""
    return depthwise if depthwise.eligible(spec) else thin


def check_direct(op: str, spec: ConvSpec, direction: str | None = None) -> None:
    """Raise unless ``algorithm="direct"`` can run this problem here (``direction`` None:
    every direction)."""
    if not depthwise.eligible(spec):
        dirs = DIRECTIONS if direction is None else (direction,)
        if not all(thin.eligible(spec, d) for d in dirs):
            raise ConvValueError(
                f"{op}: algorithm 'direct' expects a depthwise problem (C_IN / groups = 1, 1 to 3 spatial axes), "
                f"or stride 1 on 1 to 3 spatial axes (for bwd_data also pads at most (K - 1) * dilation), "
                f"or any stride with dilation 1 and a non-empty output, "
                f"but got C_IN {spec.ic}, groups {spec.groups} ({spec.icg} channels per group), "
                f"{spec.nsp} spatial axes, strides {list(spec.strides)}, pads_begin {list(spec.pads_begin)}, "
                f"pads_end {list(spec.pads_end)}" + (f" for {direction}" if direction else ""))
    if not depthwise.available():
        why = "CONVGRAD_NUMBA=0" if os.environ.get("CONVGRAD_NUMBA", "1").strip() == "0" else "numba is not installed"
        raise ConvValueError(f"{op}: algorithm 'direct' expects numba (pip install convgrad[fast]), but {why}")


# A 1x1, stride-1, unpadded weight gradient is the same product on either lowering; the
# two differ in the channel chunks of ``weight_chunks``: ``taps`` splits the output
# channels (each chunk copies its own rows of diff_dst and all of src), ``im2col`` the
# input channels (each chunk copies all of diff_dst). With more output channels than input
# channels the output side is the one to split. Measured (in-process medians, 2 threads,
# float32, ms, taps / im2col, which the cost model chose): resnet_50 res5a_branch2c
# (512 -> 2048, 7^2, mb9) 3.07-3.42 / 3.50-4.47, 512 -> 2048 7^2 mb8 2.74 / 3.29, 1024 ->
# 2048 10^2 mb2 2.81 / 3.17, mobilenet_v2 160 -> 960 7^2 mb32 2.79 / 3.09, 256 -> 1024 7^2
# mb32 3.27 / 3.33, mobilenet conv9 (512 -> 1024, mb19) 3.38-4.16 / 3.35-4.28. Without
# chunks im2col stays (64 -> 256 9^2 mb16 0.59 / 0.58, 96 -> 576 7^2 mb32 1.22 / 1.12).
def _output_chunks(spec: ConvSpec, direction: str) -> bool:
    return (direction == "bwd_weights" and spec.oc > spec.ic and unit_1x1(spec)
            and weight_chunks(spec, direction, "taps") > 1)


@functools.lru_cache(maxsize=1024)
def _cheapest(spec: ConvSpec, direction: str) -> str:
    if _output_chunks(spec, direction):
        return "taps"
    costs = {alg: estimate_cost(spec, direction, alg) for alg in ("taps", "im2col")}
    return min(costs, key=costs.get)
