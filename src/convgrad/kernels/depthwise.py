"""Direct depthwise kernel, algorithm ``direct`` (kernel layer: arrays and a ConvSpec only).

For problems with one input channel per group (``C_in / groups = 1``, any channel
multiplier ``M = C_out / groups``) a convolution is a set of independent per-channel
correlations with no channel contraction, so the GEMM lowerings of ``gemm.py`` reduce to
element-wise multiply-adds, one NumPy call per tap (about 1 GFLOP/s). Here the loops are
compiled with numba (``_depthwise_jit.py``, where the index identities are derived).
Every problem is viewed as 3-D (unit leading spatial axes), so each direction has one
code path for 1-, 2- and 3-D, in two loop nests: per-channel stride-phase grids (every
tap one long contiguous loop; large images) and channels-last blocks (channels
innermost; small images, ``channels_last``). Each compiles once per compute type
(float32, float64).

numba is optional (extra ``convgrad[fast]``): :func:`available` is false when it cannot
be imported or when the environment variable ``CONVGRAD_NUMBA`` is ``0``, and the
dispatcher then keeps the NumPy lowerings.

Work runs in chunks of whole input channels (with their ``M`` output channels) on
convgrad's own thread pool (``gemm.run_each``; ``set_num_threads``, threadpoolctl limits and
the workspace cap apply as for the other kernels; no BLAS is called; small calls, and
every call on one thread, are one chunk on the calling thread). Every output element is
computed inside one block in a fixed order, so results are bitwise identical whatever the
thread count, block size or cap. Inputs that are C-contiguous in the compute type are read
in place; others (half types, strided views) are converted one block of channels at a
time, which is the block's workspace.
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np

from .. import threads
from ..errors import WorkspaceError
from ..spec import ConvSpec
from . import results
from .gemm import flipped_spec, geometry, run_each

# Below this much work a call runs on the calling thread alone; work counts the
# multiply-adds plus CHANNEL_MACS per channel (each channel costs ~0.2 us of set-up and
# copies: 2048 x 14^2 took 0.84 ms on one thread where 512 x 28^2, the same 3.6M
# multiply-adds, took 0.51). Waking a pool thread costs 0.1-0.15 ms on the AMD VM and
# more on the Intel one, where whole public calls (one thread / two, ms, 0.5 ms pauses)
# measured: 256 x 28^2 at 1.8M 0.31 / 0.44-0.46, 128 x 56^2 and 32 x 112^2 at 3.6M 0.44-0.51
# / 0.48-0.52, 512 x 28^2 at 3.6M 0.50 / 0.50, 2048 x 14^2 0.84 / 0.63, and every 7.2M
# layer 20-30 % faster on two (0.76-0.89 / 0.64-0.72). On the AMD VM two threads had
# paid from 1.5-2M (0.02-0.04 ms at 3.6M), so the threshold sits between the two.
PARALLEL_MACS = 4_300_000
CHANNEL_MACS = 1500
# A weight gradient (phase grids) that reads and writes at least PARALLEL_CELLS cells of
# src and diff_dst uses the pool below the work threshold too: such a call streams images
# that a training step does not find in the cache, and two threads stream them faster.
# Measured on the AMD VM in the benchmark's conditions (a 0.2 s pause and 64 MB of other
# traffic before a warm-up and 3 timed calls; medians, pool / one thread, two sessions of
# 24-30 rounds): mobilenet conv2_1/dw (32 x 112^2, 0.8M cells) 0.78 / 0.91, conv2_2/dw
# (64 x 112^2 stride 2, 1.0M) 0.74 / 0.78, conv3_1/dw (128 x 56^2, 0.8M) 0.80 / 0.97,
# conv3_2/dw (0.5M) 0.91 / 0.92, conv4_1/dw (0.4M) 0.92 / 0.98, conv4_2/dw (0.25M) 1.15;
# in alternating benchmark runs conv4_1/dw's time rose (0.46-0.48 -> 0.51-0.53 ms), so the
# line sits above it. Forwards and data gradients gained nothing in the same conditions
# (0.88-1.25) and keep the work threshold alone.
# With the 0.1 s pause alone (images still in the cache) the pool measured 0.93 / 0.92 /
# 1.17 on conv2_1 / conv2_2 / conv3_1/dw: it pays where the images come from memory.
# Back to back (warm caches, medians of 200 calls, ms, pool / one thread): conv2_1/dw
# 0.37 / 0.37, conv2_2/dw 0.42 / 0.43, conv3_1/dw 0.46 / 0.58; an earlier trial of the
# same rule on warm caches had measured mixed medians (below) and was dropped then.
# The row kernels (no grid copies) do not take it: benchmark runs of the mobilenet_dw
# list, four alternating pairs, medians of the middle two, one thread / pool: conv2_1/dw
# 0.83x, conv2_2/dw 0.87x, conv3_1/dw 0.96x (one thread back to back, us, pool / one:
# 120-129 / 98-107, 121-131 / 116-117, 122-125 / 109).
PARALLEL_CELLS = 1 << 19
# Per loop nest and direction, the multiple of PARALLEL_MACS from which a call uses the
# pool. The channels-last forward and data gradient run about 3x more multiply-adds per
# second than the phase grids on small images, so a pool thread pays off only on twice as
# much work there. (Weight gradients had a factor 0.5 on the phase grids, from the AMD VM;
# on the Intel one 256 x 28^2 at 1.8M took 0.37 / 0.45 ms and 128 x 56^2 at 3.6M 0.48 / 0.50,
# so they share the threshold.)
# Tried on the AMD VM: the pool also for the phase grids of large images below the
# threshold (they stream src and dst from memory). The best of 150 calls gained 10-25 %,
# but the medians of 200 were mixed (ms, one thread -> two): conv2_1/dw weight gradient
# 0.33 -> 0.49, conv3_1/dw data gradient 0.44 -> 0.54, conv3_2/dw weight gradient 0.51 ->
# 0.46: handing a block to a pool thread costs 70 us at best and 140 in the median there.
PARALLEL_FACTOR = {False: {"fwd": 1.0, "bwd_data": 1.0, "bwd_weights": 1.0},
                   True: {"fwd": 2.0, "bwd_data": 2.0, "bwd_weights": 1.0}}
# Chunks per worker thread (threads take the next chunk when they are free, so a worker
# that wakes late takes fewer) and the fewest multiply-adds worth one chunk.
CHUNKS_PER_WORKER = 4
MIN_CHUNK_MACS = 1 << 17
# Partial sums per weight-gradient tap, positions p % LANES (the compiled loops read it
# from here): one AVX2 vector of float32, kept in a register while a block runs. (The
# register groups sum float64 weight gradients, and float32 ones where the compiled
# micro-kernels are missing; elsewhere the lane-sum micro-kernel does, ``_dot_plan``.
# 16 lanes here ran 8-13 % slower than 8 on the AMD Zen 5.)
LANES = 8
# Problems with at most SMALL_IMAGE output positions per image (weight gradient: at most
# SMALL_IMAGE_BWD_WEIGHTS) run channels-last (``*_cl``): blocks of CB_CHANNELS channels
# transposed to (position, channel), channels innermost. Measured crossover (mobilenet
# depthwise layers, 1 thread): channels-last wins on 7x7 outputs and loses badly on large
# images, whose transposed blocks leave the cache; weight gradient, whole call: 14x14
# outputs channels-last 0.33 ms, phase grids 0.47-0.65; 28x28 outputs 0.62 / 0.50 ms.
# 14x14 outputs (AMD VM, 2 threads, min of 3 x 100 calls, ms, phase grids / channels-last):
# mobilenet conv4_2/dw (256 x 28^2, stride 2) data gradient 0.29 / 0.24, forward 0.24 /
# 0.17; conv5_1/dw (512 x 14^2) 0.19 / 0.19 and 0.20 / 0.20.
SMALL_IMAGE = 196
SMALL_IMAGE_BWD_WEIGHTS = 400
CB_CHANNELS = 64


@functools.lru_cache(maxsize=1)
def _jit():
    try:
        from . import _depthwise_jit
    except ImportError:
        return None
    return _depthwise_jit


def available() -> bool:
    """Whether the compiled kernel can run (numba importable, ``CONVGRAD_NUMBA`` not ``0``)."""
    if os.environ.get("CONVGRAD_NUMBA", "1").strip() == "0":
        return False
    return _jit() is not None


def channels_last(spec: ConvSpec, direction: str, dtype=None) -> bool:
    """Whether the channels-last loops run this problem (small images), except, in float32,
    those whose rows the row kernels take (``_rows_take``)."""
    if math.prod(spec.dst) > (SMALL_IMAGE_BWD_WEIGHTS if direction == "bwd_weights" else SMALL_IMAGE):
        return False
    return not (dtype is not None and np.dtype(dtype) == np.float32 and _rows_take(spec, direction))


# Small images whose rows hold at least this many outputs (data gradient: inputs) run the
# row kernels rather than the channels-last blocks, in the directions where the row
# kernels cover them (not the stride-2 data gradient). One thread, us, blocks / rows:
# mobilenet conv4_2/dw (28^2 -> 14^2, stride 2) weight gradient 81-83 / 41-42, forward
# 53-54 / 42-43 (data gradient 75-76 / 83-85: kept); conv5_1/dw (14^2) 69 / 58, 64-65 /
# 59-61, 74-75 / 64; but 7-wide rows lose: conv5_6/dw forward 35 / 43, conv6/dw (7^2)
# weight gradient 47 / 67-68, forward 39-42 / 63-65.
# The stride-2 data gradient of a small image runs the compiled ``up2`` rows too where it
# has at least UP2_SMALL_MIN_OUTPUTS output positions: warm, one thread, it had lost
# (above), but in calls after a pause with 16 MB of other traffic (the benchmark's turns:
# a warm-up and three calls) the blocks' two transposes cost more. In-process, the two
# paths' calls interleaved (2 threads, 40 rounds, 10 ms pause and 16 MB before each
# warm-up), up2 / blocks: conv4_2/dw 0.77-0.84 (warm, back to back: 1.04); conv5_6/dw (7^2
# outputs) 1.28, conv6/dw (stride 1, 7^2) 1.28 keep the blocks.
ROW_MIN_WIDTH = 14
UP2_SMALL_MIN_OUTPUTS = 196


@functools.lru_cache(maxsize=1024)
def _rows_take(spec: ConvSpec, direction: str) -> bool:
    """Whether a small image's ``direction`` runs the row kernels (``ROW_MIN_WIDTH``; the
    stride-2 data gradient ``up2``, ``UP2_SMALL_MIN_OUTPUTS``; pure but for the host's
    micro-kernels)."""
    width = spec.src[-1] if direction == "bwd_data" else spec.dst[-1]
    if width < ROW_MIN_WIDTH or _micro_kernels() is None:
        return False
    from ._ukernel import ROW_KW, ROW_R
    if direction == "bwd_weights":
        return _row_plan(spec, ROW_R, ROW_KW, DOT_CHUNK) is not None
    if direction == "fwd":
        return _rowfwd_plan(spec, ROW_R, ROW_KW) is not None
    fspec = flipped_spec(spec)
    if fspec is None:                         # strided: the up2 rows, on larger small images
        return math.prod(spec.dst) >= UP2_SMALL_MIN_OUTPUTS and _up2_args(spec, np.float32, False) is not None
    return spec.ocg == 1 and _rowfwd_plan(fspec, ROW_R, ROW_KW) is not None


def eligible(spec: ConvSpec) -> bool:
    """Depthwise problems the kernel handles: one input channel per group, 1-3 spatial axes."""
    return spec.icg == 1 and 1 <= spec.nsp <= 3


def _as3d(shape: tuple[int, ...], lead: int) -> tuple[int, ...]:
    """``(lead..., *spatial)`` with spatial padded in front by unit axes to three."""
    spatial = shape[lead:]
    return shape[:lead] + (1,) * (3 - len(spatial)) + tuple(spatial)


@functools.lru_cache(maxsize=256)
def _geo(spec: ConvSpec) -> np.ndarray:
    """The compiled loops' geometry array (remembered: the loops only read it)."""
    pad = 3 - spec.nsp
    s = (1,) * pad + spec.strides
    d = (1,) * pad + spec.dilations
    p = (0,) * pad + spec.pads_begin
    return np.array(s + d + p + (spec.ocg,), dtype=np.int64)


def _fits(arr: np.ndarray, dtype) -> bool:
    return arr.dtype == dtype and arr.flags.c_contiguous


def _plan(spec: ConvSpec, per_channel_bytes: int, fixed_bytes: int, workspace_limit: int,
          direction: str, unit: int = 1, cells_rule: bool = True) -> tuple[tuple[tuple[int, int], ...], int]:
    """Channel chunks ``[c0, c1)`` and the number of threads to run them on.

    Every output element is computed inside one chunk in a fixed order, so neither the
    chunking nor which thread runs a chunk changes a bit of the result: chunks follow the
    thread count, and are smaller when the workspace cap demands it. A thread holds
    ``fixed_bytes`` (its scratch) plus ``per_channel_bytes`` per channel of its chunk.
    Chunks are multiples of ``unit`` channels (the channels-last block) unless the cap
    demands less. ``cells_rule`` False: the weight gradient's pool by image size
    (``PARALLEL_CELLS``) is off (the row kernels: measured there, below).
    """
    return _plan_cached(spec, per_channel_bytes, fixed_bytes, workspace_limit, direction, unit,
                        threads.get_num_threads(), PARALLEL_MACS, PARALLEL_CELLS if cells_rule else 1 << 62)


@functools.lru_cache(maxsize=256)
def _plan_cached(spec: ConvSpec, per_channel_bytes: int, fixed_bytes: int, workspace_limit: int,
                 direction: str, unit: int, num_threads: int,
                 parallel_macs: int, parallel_cells: int) -> tuple[tuple[tuple[int, int], ...], int]:
    # remembered: a small call repeats its plan (the rules cost ~5 us of a 35 us call); the
    # threshold is an argument, so that a changed module constant is a new key
    c = spec.ic
    per_channel = _macs_per_channel(spec)
    serial = parallel_macs * PARALLEL_FACTOR[unit > 1][direction]
    cells = spec.mb * (spec.ic * math.prod(spec.src) + spec.oc * math.prod(spec.dst))
    pool = (per_channel + CHANNEL_MACS) * c >= serial or (
        unit == 1 and direction == "bwd_weights" and cells >= parallel_cells)
    workers = max(1, min(c, num_threads)) if pool else 1
    # one thread: one chunk (each chunk is a compiled call, about 10 us of argument unboxing)
    chunk = c if workers == 1 else min(-(-c // workers), max(-(-c // (workers * CHUNKS_PER_WORKER)),
                                                             -(-MIN_CHUNK_MACS // max(1, per_channel))))
    chunk = -(-chunk // unit) * unit
    need = fixed_bytes + per_channel_bytes
    if need > workspace_limit:
        raise WorkspaceError(
            f"{direction}: the workspace limit ({workspace_limit} bytes) is too small for the "
            f"smallest tile of problem {spec} ({need} bytes); raise it with convgrad.set_workspace_limit()")
    if per_channel_bytes:
        chunk = max(1, min(chunk, (workspace_limit - fixed_bytes) // per_channel_bytes))
    workers = max(1, min(workers, workspace_limit // (fixed_bytes + chunk * per_channel_bytes)))
    blocks = tuple((c0, min(c, c0 + chunk)) for c0 in range(0, c, chunk))
    return blocks, max(1, min(workers, len(blocks)))


def _scratch(spec: ConvSpec, direction: str, itemsize: int) -> int:
    """Bytes the compiled loops allocate per call (per thread): the phase grids of one
    channel, one wide channel of dst / diff_dst, and the weight-gradient lanes."""
    cl = channels_last(spec, direction, np.float32 if itemsize == 4 else np.float64)
    return _scratch_bytes(spec, direction, itemsize, cl, CB_CHANNELS, LANES)


@functools.lru_cache(maxsize=256)
def _scratch_bytes(spec: ConvSpec, direction: str, itemsize: int, cl: bool, cb: int, lanes: int) -> int:
    # cached (asked twice per call, 7 us each): the module constants it reads are arguments
    geom = geometry(spec)
    total = math.prod(geom.q)
    grids = len(geom.phases) * total
    taps = math.prod(spec.kernel)
    if direction == "fwd":
        elems = grids + total
    elif direction == "bwd_data":
        elems = grids + geom.max_off + total + 6 * max(spec.src)     # + the dx cell map (int64)
    else:
        # + the margin before dyw (at most max_off), the lane-sum path's sums and tile
        elems = grids + total + geom.max_off + 2 * lanes + spec.ocg * (taps + 1) * (lanes + 1) + 16 + taps
    if cl:      # transposed blocks of src, dst (all multipliers), weights; the column tables
        cells = math.prod(spec.src)
        if direction == "bwd_weights":      # src as a zero-padded grid; the sums (+ a spare row)
            cells = max(cells, math.prod((o - 1) * s + (k - 1) * d + 1 for o, s, k, d in
                                         zip(spec.dst, spec.strides, spec.kernel, spec.dilations)))
            taps += 1
        elems = cb * (cells + spec.ocg * math.prod(spec.dst) + spec.ocg * taps) \
            + 2 * (max(spec.src) + 2) * max(spec.kernel)
    return int(elems) * itemsize + 1024


def _phase_setup(spec: ConvSpec) -> tuple:
    """The compiled loops' phase geometry of a problem (``_depthwise_jit._setup``: q, total,
    span, max_off, rank, res, nres, tap_phase, tap_off), for the planners here."""
    ins, outs, ks = (np.array(_as3d(v, 0), dtype=np.int64) for v in (spec.src, spec.dst, spec.kernel))
    return _jit()._setup(ins, outs, ks, _geo(spec))


def _even_runs(values: list[int], limit: int) -> list[tuple[int, int, int]]:
    """``values`` (sorted) cut into runs ``[i, j)`` of at most ``limit`` equally spaced
    values: ``(i, j, spacing)``, spacing 0 for a run of one (pure)."""
    out, i = [], 0
    while i < len(values):
        j = i + 1
        step = values[j] - values[i] if j < len(values) else 0
        while j < len(values) and j - i < limit and values[j] - values[j - 1] == step:
            j += 1
        out.append((i, j, step if j - i > 1 else 0))
        i = j
    return out


def _micro_kernels():
    """The compiled micro-kernels (``_ukernel``) when they can run here, else None (the
    phase-grid loops then keep their numba taps and register groups)."""
    from . import _ukernel
    return _ukernel.compiled()


@functools.lru_cache(maxsize=256)
def _dot_plan(spec: ConvSpec, r_max: int, j_max: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Calls of the lane-sum micro-kernel for the phase-grid weight gradient (pure):
    ``(calls, call_taps, margin)`` as ``_depthwise_jit._dot_taps`` reads them.

    In a phase, the taps with the same shifts on the outer axes lie at offsets ``outer +
    shift`` of the grid, their last-axis shifts ``(k*d) // s`` in steps of ``d /
    gcd(d, s)``; runs of up to ``r_max`` such taps become a call's R rows (``a``, the
    shifted ``diff_dst``), and up to ``j_max`` runs of the same phase, length, step and
    first shift whose outer offsets are equally spaced become its J rows (``b``, the grid).
    A 3x3 stride-1 kernel is one call of 3 x 3 sums; stride 2 gives four, one per phase.
    ``margin``: the zero cells ``diff_dst`` needs before its grid for the largest shift."""
    geo = _geo(spec)
    _, total, _, _, _, _, _, tap_phase, tap_off = _phase_setup(spec)
    s2, d2, k2 = int(geo[2]), int(geo[5]), int(spec.kernel[-1])
    lines: dict = {}
    for t in range(len(tap_phase)):
        shift = (t % k2) * d2 // s2
        lines.setdefault((int(tap_phase[t]), int(tap_off[t]) - shift), []).append((shift, t))
    runs: dict = {}        # (phase, length, step, first shift) -> [(outer, taps)]
    for (phase, outer), items in lines.items():
        items.sort()
        for i, j, step in _even_runs([v for v, _ in items], r_max):
            runs.setdefault((phase, j - i, step, items[i][0]), []).append((outer, [t for _, t in items[i:j]]))
    calls, taps, margin = [], [], 0
    for (phase, length, step, first), members in sorted(runs.items()):
        members.sort()
        for i, j, gap in _even_runs([outer for outer, _ in members], j_max):
            block = members[i:j]
            calls.append((length, len(block), step, phase * int(total) + block[0][0] + first, gap, len(taps)))
            taps += [block[jj][1][r] for r in range(length) for jj in range(len(block))]
            margin = max(margin, (length - 1) * step)
    return np.array(calls, dtype=np.int64).reshape(-1, 6), np.array(taps, dtype=np.int64), margin


@functools.lru_cache(maxsize=256)
def _stencil_plan(spec: ConvSpec, flip: bool, kh_max: int, kw_max: int) -> tuple[np.ndarray, np.ndarray]:
    """Calls of the compiled stencil (``_ukernel``) for the phase-grid forward (``flip``
    False: output cell ``p`` reads ``grid(t)[p + off(t)]``) or the stride-1 data gradient
    (``flip``: dx cell ``q`` reads ``dyw[q + max_off - off(t)]``, the taps mirrored), pure:
    ``(calls, call_taps)`` as ``_depthwise_jit._stencil_rows`` reads them.

    A tap's offset in its phase plane is ``row*q2 + col`` (``row`` over the outer axes,
    ``col`` its last-axis shift). Per phase and row, runs of up to ``kw_max`` equally
    spaced columns; runs of the same phase, first column, step and length on consecutive
    rows, up to ``kh_max`` of them, make one call's block (KH x KW taps, row-major), so the
    stencil's output rows share their input rows. Calls in (phase, row, column) order."""
    q, total, _, max_off, _, _, _, tap_phase, tap_off = _phase_setup(spec)
    q2 = int(q[2])
    lines: dict = {}
    for t in range(len(tap_phase)):
        off = int(max_off - tap_off[t]) if flip else int(tap_off[t])
        col = off % q2            # the last-axis shift: at most (K - 1)*d // s < q2
        lines.setdefault((int(tap_phase[t]), off // q2), []).append((col, t))
    runs: dict = {}        # (phase, first column, step, length) -> [(row, taps)]
    for (phase, row), items in lines.items():
        items.sort()
        for i, j, step in _even_runs([v for v, _ in items], kw_max):
            runs.setdefault((phase, items[i][0], step, j - i), []).append((row, [t for _, t in items[i:j]]))
    blocks = []
    for (phase, first, step, length), members in runs.items():
        members.sort()
        for i, j, gap in _even_runs([row for row, _ in members], kh_max):
            chain = members[i:j] if gap <= 1 else [[m] for m in members[i:j]]
            for part in (chain if gap > 1 else [chain]):
                blocks.append((phase, part[0][0], first, step, [t for _, ts in part for t in ts], len(part), length))
    blocks.sort()
    calls, taps = [], []
    for phase, row, first, step, block_taps, kh, kw in blocks:
        calls.append((kh, kw, phase * int(total) + row * q2 + first, step, len(taps), 0))
        taps += block_taps
    return np.array(calls, dtype=np.int64).reshape(-1, 6), np.array(taps, dtype=np.int64)


@functools.lru_cache(maxsize=256)
def _up2_plan(spec: ConvSpec, r_max: int, a_max: int, u_max: int, lanes: int) -> tuple | None:
    """Calls of the compiled ``up2`` (``_ukernel._up2_variant_ir``) for the data gradient of
    a 1-D or 2-D layer with stride 2 and dilation 1 along the rows, at most ``2*a_max``
    taps wide, one output channel per input channel, stride 1 or 2 and dilation 1 along
    the other axis with at most ``r_max`` kernel rows reaching each dx row; else None
    (pure). Returns ``(calls, widx, zero_rows, dims)`` as
    ``_depthwise_jit.backward_data_up2`` reads them.

    Derivation (along a row, padded column ``t = j + pw``): ``dx[j] = sum over kw with t -
    kw even of dy[(t - kw)/2] * w[kw]``; with ``t = 2p + e`` and ``kw = e + 2a`` that is
    ``sum_a dy[p - a] * w[e + 2a]``, so a vector of ``V`` padded columns from ``2p`` is
    ``sum_a dup(dy[p - a ..]) * (w[2a], w[2a + 1], ...)`` (``dy`` read from column ``-a``:
    the buffer's left margin ``ML = A - 1`` and right margin hold zeros). Along the other
    axis, dx row ``i`` (padded ``t = i + ph``) is reached by the kernel rows ``ky`` with
    ``t - ky`` a multiple of the stride and ``(t - ky)/sh`` a dy row: consecutive ``ky``
    of one residue, reading consecutive dy rows backwards; rows with the same ``ky`` set
    ``sh`` apart read consecutive dy rows, up to ``u_max`` of them one call."""
    if spec.nsp > 2 or spec.ocg != 1 or spec.strides[-1] != 2 or spec.dilations[-1] != 1:
        return None
    KW, W, OW, pw = spec.kernel[-1], spec.src[-1], spec.dst[-1], spec.pads_begin[-1]
    A = -(-KW // 2)
    if A > a_max:
        return None
    if spec.nsp == 2:
        KH, H, OH, sh, ph = spec.kernel[0], spec.src[0], spec.dst[0], spec.strides[0], spec.pads_begin[0]
        if spec.dilations[0] != 1 or sh not in (1, 2):
            return None
    else:
        KH, H, OH, sh, ph = 1, 1, 1, 1, 0
    lo, hi = pw, W + pw
    nvec = -(-hi // lanes)
    ML = A - 1
    Wd = ML + max(OW, nvec * lanes // 2)
    classes: dict = {}                     # kernel-row set -> its rows (first dy row, dx row)
    zero_rows = []
    for i in range(H):
        t = i + ph
        kys = tuple(ky for ky in range(KH) if (t - ky) % sh == 0 and 0 <= (t - ky) // sh < OH)
        if not kys:
            zero_rows.append(i)
            continue
        if len(kys) > r_max:
            return None
        classes.setdefault(kys, []).append(((t - kys[0]) // sh, i))
    widx = []
    for kys in classes:                    # weight pairs (r, a, e), -1 past the kernel
        for ky in kys:
            for a in range(A):
                widx += [ky * KW + kw if kw < KW else -1 for kw in (2 * a, 2 * a + 1)]
    wlen = {kys: 2 * A * len(kys) for kys in classes}
    woff, acc = {}, 0
    for kys in classes:
        woff[kys], acc = acc, acc + wlen[kys]
    # One call runs u_max rows of one kernel-row set (a class) that read consecutive dy
    # rows, ``sh`` dx rows apart; with stride 2 the classes alternate from row to row, so
    # the rows are grouped class by class (each dx row is stored by one call: the order
    # of the calls changes no bit). Taken in row order, every call had run one row:
    # mobilenet conv4_2/dw 28 calls of 4 vectors per channel, the calls' set-up the most
    # of the work.
    from ._ukernel import up2_key
    calls = []
    for kys, mine in classes.items():
        k = 0
        while k < len(mine):
            o0, i = mine[k]
            u = 1
            while u < u_max and k + u < len(mine) and mine[k + u] == (o0 + u, i + u * sh):
                u += 1
            if u != u_max:
                u = 1
            calls.append((up2_key(len(kys), A, u), o0 * Wd + ML, woff[kys], i * W - pw, sh * W))
            k += u
    return (np.array(calls, dtype=np.int64).reshape(-1, 5), np.array(widx, dtype=np.int64),
            np.array(zero_rows, dtype=np.int64), np.array((W, Wd, ML, nvec, lo, hi), dtype=np.int64))


def _up2_args(spec: ConvSpec, dtype, cl: bool) -> tuple | None:
    """(address, calls, widx, zero rows, dims) of the compiled stride-2 data gradient in
    float32 where the micro-kernels run and ``_up2_plan`` covers the layer, else None."""
    if cl or dtype != np.float32:
        return None
    compiled = _micro_kernels()
    if compiled is None:
        return None
    from ._ukernel import UP2_A, UP2_R, UP2_U
    plan = _up2_plan(spec, UP2_R, UP2_A, UP2_U, compiled.lanes)
    return None if plan is None else (compiled.up2_address,) + plan


ROW_STRIDES = (1, 2)
# Stride-1 forwards (and data gradients, as the flipped forward) run the row kernels where
# their output rows hold at most this many positions, the compiled stencil on the grids
# above it (one thread, us, stencil / rows: mobilenet conv4_1/dw (28^2) forward 107-112 /
# 68-71, data gradient 95-97 / 73-75; conv3_1/dw (56^2) 131-136 / 126-136 and 123 / 138-139;
# conv2_1/dw (112^2) forward 116 / 133: the stencil's rows share their input rows, which
# pays on long rows). Their weight gradients run the row kernel at any width (118 / 106,
# 141 / 107, 123 / 63 on conv2_1, conv3_1, conv4_1: no grid copies).
ROW_FWD_MAX_WIDTH = 32


@functools.lru_cache(maxsize=256)
def _row_plan(spec: ConvSpec, r_max: int, kw_max: int, chunk: int) -> tuple | None:
    """Calls of the compiled ``rowdot`` (``_ukernel._rowdot_variant_ir``) for the weight
    gradient of a 1-D or 2-D layer with stride 1 or 2 (``ROW_STRIDES``) and dilation 1
    along the rows, at most ``kw_max`` taps wide, one output channel per input channel,
    dilation 1 between rows; else None (pure). Returns ``(calls, dims)`` as
    ``_depthwise_jit.backward_weights_rows`` reads them.

    ``dw[ky, kw] = sum over dy rows o and columns p of dy[o, p] * x[sh*o + ky - ph, sw*p +
    kw - pw]``: a call takes consecutive dy rows whose kernel rows all read real input
    rows (the same range of ``ky``: the rows at the top and bottom edges have fewer), at
    most ``r_max`` kernel rows and ``chunk`` positions (the float32 lane sums then add at
    most ``chunk / V`` terms each, as ``DOT_CHUNK`` for the phase grids); the columns in
    the padding read as zero (``lo = pw``, ``hi = W + pw`` from the row's column ``-pw``),
    so the input is read in place, with no grid copy."""
    if (spec.nsp > 2 or spec.ocg != 1 or spec.strides[-1] not in ROW_STRIDES or spec.dilations[-1] != 1
            or spec.kernel[-1] > kw_max):
        return None
    KW, W, OW, pw = spec.kernel[-1], spec.src[-1], spec.dst[-1], spec.pads_begin[-1]
    if spec.nsp == 2:
        KH, H, OH, sh, ph = spec.kernel[0], spec.src[0], spec.dst[0], spec.strides[0], spec.pads_begin[0]
        if spec.dilations[0] != 1:
            return None
    else:
        KH, H, OH, sh, ph = 1, 1, 1, 1, 0
    per = max(1, chunk // max(1, OW))
    calls: list = []
    o = 0
    while o < OH:
        k0 = max(0, ph - sh * o)
        k1 = min(KH, H + ph - sh * o)
        end = o + 1
        while (end < OH and end - o < per and max(0, ph - sh * end) == k0
               and min(KH, H + ph - sh * end) == k1):
            end += 1
        from ._ukernel import row_key
        for r0 in range(k0, k1, r_max):
            R = min(r_max, k1 - r0)
            calls.append((row_key(R, KW, spec.strides[-1]), (sh * o + r0 - ph) * W - pw, o * OW, r0 * KW, end - o))
        o = end
    return (np.array(calls, dtype=np.int64).reshape(-1, 5),
            np.array((OW, W, sh * W, pw, W + pw), dtype=np.int64))


@functools.lru_cache(maxsize=256)
def _rowfwd_plan(spec: ConvSpec, r_max: int, kw_max: int) -> tuple | None:
    """Calls of the compiled ``rowfwd`` (``_ukernel._rowfwd_variant_ir``) for the forward of the
    layers ``_row_plan`` covers (stride 1: rows of at most ``ROW_FWD_MAX_WIDTH`` outputs),
    where every output row takes all its kernel rows in one call (at most ``r_max``: the
    calls store, never add); else None (pure). Returns
    ``(calls, zero_rows, dims)`` as ``_depthwise_jit.forward_rows`` reads them: the calls
    and dims of ``_row_plan`` (its per-call tap offset is the first weight here), and the
    output rows no kernel row reaches (all padding), which are zero."""
    if spec.strides[-1] == 1 and spec.dst[-1] > ROW_FWD_MAX_WIDTH:
        return None
    plan = _row_plan(spec, r_max, kw_max, 1 << 62)
    if plan is None:
        return None
    calls, dims = plan
    if len(set(calls[:, 2].tolist())) != len(calls):      # a row's kernel rows split over calls
        return None
    ow = int(dims[0])
    covered = set()
    for _, _, y_off, _, rows in calls.tolist():
        covered.update(range(y_off // ow, y_off // ow + rows))
    oh = spec.dst[0] if spec.nsp == 2 else 1
    return calls, np.array([r for r in range(oh) if r not in covered], dtype=np.int64), dims


def _flipped_rows(spec: ConvSpec, dtype, cl: bool) -> tuple | None:
    """(address, calls, zero rows, dims) of the row forward kernel for a stride-1 data gradient
    as the forward of ``diff_dst`` with the kernel reversed (``gemm.flipped_spec``), in
    float32 where the micro-kernels run and ``_rowfwd_plan`` covers it; else None."""
    if cl or dtype != np.float32 or spec.ocg != 1:
        return None
    fspec = flipped_spec(spec)
    compiled = _micro_kernels()
    if fspec is None or compiled is None:
        return None
    from ._ukernel import ROW_KW, ROW_R
    plan = _rowfwd_plan(fspec, ROW_R, ROW_KW)
    return None if plan is None else (compiled.rowfwd_address,) + plan


_NO_STENCIL = (0, np.zeros((0, 6), dtype=np.int64), np.zeros(0, dtype=np.int64))


def _transpose_args(dtype) -> tuple[int, int]:
    """(address, lanes) of the compiled block transpose for the channels-last blocks in
    float32 where the micro-kernels run, else (0, 0): the numba element loops."""
    compiled = _micro_kernels() if dtype == np.float32 else None
    return (compiled.transpose_address, compiled.lanes) if compiled is not None else (0, 0)


def _stencil_args(spec: ConvSpec, direction: str, dtype, cl: bool) -> tuple:
    """(address, calls, taps) of the compiled stencil for a stride-1 phase-grid forward or
    data gradient in float32 where the micro-kernels run, else the numba taps (address 0).
    Strided forwards keep the numba taps: their phases split a 3x3 kernel into four blocks
    of 1-4 taps, each call adding into the output rows again (one thread, us, numba /
    stencil: mobilenet conv2_2/dw 161-168 / 198-200, conv3_2/dw 128 / 147-151)."""
    if cl or dtype != np.float32 or any(s != 1 for s in spec.strides):
        return _NO_STENCIL
    compiled = _micro_kernels()
    if compiled is None:
        return _NO_STENCIL
    from ._ukernel import STENCIL_KH, STENCIL_KW
    return (compiled.stencil_address,) + _stencil_plan(spec, direction == "bwd_data", STENCIL_KH, STENCIL_KW)


_NO_DOT = (np.zeros((0, 6), dtype=np.int64), np.zeros(0, dtype=np.int64), 0)
# Positions per lane-sum call of the weight gradient (each call's sums, from zero, are then
# added to the running sums): the float32 lanes then sum at most 128 terms each. Measured
# (largest error against float64, relative to the largest weight; one-thread time of the
# five mobilenet phase-grid layers): one call over the whole image 6.2e-7 / 3.1e-7 /
# 1.2e-6 on 32 x 112^2, 64 x 112^2 stride 2 and 8 x 224^2 mb8 5x5, 2048 positions 2.6e-7 /
# 2.1e-7 / 2.5e-7 (the register groups before: 1.7e-7 / 1.3e-7 / 9.1e-7), at the same
# speed (32 x 112^2: 117-123 us in chunks, 114-124 in one call).
DOT_CHUNK = 2048


def _macs_per_channel(spec: ConvSpec) -> int:
    return spec.mb * spec.ocg * math.prod(spec.dst) * math.prod(spec.kernel)


def _weights4(spec: ConvSpec, weights: np.ndarray, dtype) -> np.ndarray:
    return np.ascontiguousarray(weights, dtype=dtype).reshape((spec.oc,) + _as3d(spec.kernel, 0))


def fits(spec: ConvSpec, direction: str, dtype, workspace_limit: int) -> bool:
    """Whether one-channel chunks fit in the cap even when every input is converted
    (the dispatcher's automatic choice falls back to the NumPy lowerings otherwise, which
    can also split an image into row slabs)."""
    item = np.dtype(dtype).itemsize
    src = spec.mb * math.prod(spec.src) * item
    dst = spec.mb * spec.ocg * math.prod(spec.dst) * item
    weights = spec.oc * math.prod(spec.kernel) * item
    per = {"fwd": src + weights, "bwd_data": dst + weights, "bwd_weights": src + dst}[direction]
    return _scratch(spec, direction, item) + per <= workspace_limit


def _streamed(arr: np.ndarray, dtype, lead_shape: tuple[int, ...], mult: int):
    """A getter ``(c0, c1) -> (array, channel offset)`` for a data input of 3-D shape
    ``lead_shape``, whose channel ``c`` block spans channels ``[c0*mult, c1*mult)``,
    and the bytes it copies per input channel (0 when read in place)."""
    if _fits(arr, dtype):
        whole = arr.reshape(lead_shape)
        return (lambda c0, c1: (whole, 0)), 0
    view = arr.reshape(arr.shape[:2] + _as3d(arr.shape[2:], 0))

    def get(c0: int, c1: int):
        return np.ascontiguousarray(view[:, c0 * mult:c1 * mult], dtype=dtype), c0 * mult
    per = math.prod(lead_shape) // max(1, lead_shape[1]) * mult * np.dtype(dtype).itemsize
    return get, per


def conv_forward(spec: ConvSpec, src: np.ndarray, weights: np.ndarray, *, dtype, workspace_limit: int) -> np.ndarray:
    jit = _jit()
    dtype = np.dtype(dtype)
    x_shape = (spec.mb, spec.ic) + _as3d(spec.src, 0)
    y_shape = (spec.mb, spec.oc) + _as3d(spec.dst, 0)
    dst = results.empty(y_shape, dtype)
    w = _weights4(spec, weights, dtype)
    geo = _geo(spec)
    cl = channels_last(spec, "fwd", dtype)
    get_x, per = _streamed(src, dtype, x_shape, 1)
    blocks, workers = _plan(spec, per, w.nbytes + _scratch(spec, "fwd", dtype.itemsize), workspace_limit, "fwd",
                            CB_CHANNELS if cl else 1)

    compiled = _micro_kernels() if not cl and dtype == np.float32 else None
    rowfwd = None
    if compiled is not None:
        from ._ukernel import ROW_KW, ROW_R
        rowfwd = _rowfwd_plan(spec, ROW_R, ROW_KW)
    stencil = _stencil_args(spec, "fwd", dtype, cl) if rowfwd is None and not cl else _NO_STENCIL

    def work(b):
        x, xc0 = get_x(*b)
        if rowfwd is not None:
            jit.forward_rows(x, xc0, w, dst, 0, b[0], b[1], compiled.rowfwd_address, *rowfwd)
        elif cl:
            jit.forward_cl(x, xc0, w, dst, 0, b[0], b[1], geo, *_transpose_args(dtype))
        else:
            jit.forward(x, xc0, w, dst, 0, b[0], b[1], geo, *stencil)
    run_each(work, blocks, workers)
    return dst.reshape(spec.dst_shape)


def conv_backward_data(spec: ConvSpec, diff_dst: np.ndarray, weights: np.ndarray, *, dtype,
                       workspace_limit: int) -> np.ndarray:
    jit = _jit()
    dtype = np.dtype(dtype)
    x_shape = (spec.mb, spec.ic) + _as3d(spec.src, 0)
    y_shape = (spec.mb, spec.oc) + _as3d(spec.dst, 0)
    dsrc = results.empty(x_shape, dtype)
    w = _weights4(spec, weights, dtype)
    geo = _geo(spec)
    cl = channels_last(spec, "bwd_data", dtype)
    get_dy, per = _streamed(diff_dst, dtype, y_shape, spec.ocg)
    blocks, workers = _plan(spec, per, w.nbytes + _scratch(spec, "bwd_data", dtype.itemsize), workspace_limit,
                            "bwd_data", CB_CHANNELS if cl else 1)

    up2 = _up2_args(spec, dtype, cl)
    rows = _flipped_rows(spec, dtype, cl) if up2 is None else None
    stencil = _stencil_args(spec, "bwd_data", dtype, cl) if up2 is None and rows is None and not cl else _NO_STENCIL
    if rows is not None:       # the flipped forward: dx = dy correlated with the kernel reversed
        wf = np.ascontiguousarray(w[:, ::-1, ::-1, ::-1])

    def work(b):
        dy, dyc0 = get_dy(*b)
        if up2 is not None:
            jit.backward_data_up2(dy, dyc0, w, dsrc, 0, b[0], b[1], *up2)
        elif rows is not None:
            jit.forward_rows(dy, dyc0, wf, dsrc, 0, b[0], b[1], *rows)
        elif cl:
            jit.backward_data_cl(dy, dyc0, w, dsrc, 0, b[0], b[1], geo, *_transpose_args(dtype))
        else:
            jit.backward_data(dy, dyc0, w, dsrc, 0, b[0], b[1], geo, *stencil)
    run_each(work, blocks, workers)
    return dsrc.reshape(spec.src_shape)


def conv_backward_weights(spec: ConvSpec, src: np.ndarray, diff_dst: np.ndarray, *, dtype,
                          workspace_limit: int) -> np.ndarray:
    jit = _jit()
    dtype = np.dtype(dtype)
    x_shape = (spec.mb, spec.ic) + _as3d(spec.src, 0)
    y_shape = (spec.mb, spec.oc) + _as3d(spec.dst, 0)
    k3 = _as3d(spec.kernel, 0)
    dw = np.empty((spec.oc,) + k3, dtype=dtype)
    geo = _geo(spec)
    cl = channels_last(spec, "bwd_weights", dtype)
    get_x, per_x = _streamed(src, dtype, x_shape, 1)
    get_dy, per_dy = _streamed(diff_dst, dtype, y_shape, spec.ocg)
    compiled = _micro_kernels() if not cl and dtype == np.float32 else None
    plan = _dot_plan(spec, compiled.dot_r_max, compiled.dot_j_max) if compiled is not None else _NO_DOT
    addr = compiled.dot_address if compiled is not None else 0
    rowdot = None
    if compiled is not None:
        from ._ukernel import ROW_KW, ROW_R
        rowdot = _row_plan(spec, ROW_R, ROW_KW, DOT_CHUNK)
    blocks, workers = _plan(spec, per_x + per_dy, _scratch(spec, "bwd_weights", dtype.itemsize), workspace_limit,
                            "bwd_weights", CB_CHANNELS if cl else 1, cells_rule=rowdot is None)

    def work(b):
        x, xc0 = get_x(*b)
        dy, dyc0 = get_dy(*b)
        if rowdot is not None:
            jit.backward_weights_rows(x, xc0, dy, dyc0, dw, b[0], b[1], compiled.rowdot_address, *rowdot)
        elif cl:
            jit.backward_weights_cl(x, xc0, dy, dyc0, dw, b[0], b[1], geo, *_transpose_args(dtype))
        else:
            jit.backward_weights(x, xc0, dy, dyc0, dw, b[0], b[1], geo, addr, *plan, DOT_CHUNK)
    run_each(work, blocks, workers)
    return dw.reshape(spec.weights_shape)
