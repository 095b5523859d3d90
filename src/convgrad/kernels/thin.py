"""Direct thin-channel kernel, part of algorithm ``direct`` (kernel layer: arrays and a ConvSpec only).

For problems with a few channels per group (``C_in / groups`` and ``C_out / groups`` of
16-64) the GEMMs of ``gemm.py`` have one small dimension and OpenBLAS runs them at a
fraction of its peak. Here the forward convolution with stride 1 is a compiled,
register-blocked direct loop nest (``_thin_jit.py``, where the index identity is derived):
tiles of consecutive positions of the images' padded grids, computed in register tiles of
``OB`` output channels x ``R`` positions that stay in vector registers over all the
(channel, tap) terms. Every problem is viewed as 3-D (unit leading spatial axes), so 1-,
2- and 3-D share one code path, compiled once per compute type.

The data gradient with stride 1 is the same forward loop: ``dsrc = conv(diff_dst, W')``
with ``W'[g, c, o, j] = W[g, o, c, K-1-j]`` (the kernel flipped on every axis, input and
output channels swapped per group) and pads ``(K-1)*d - p`` (``gemm.flipped_spec``, derived
there). The data gradient needs pads at most ``(K-1)*d`` here.

Strided problems (dilation 1): every direction runs as a stride-1 problem on stride-phase
channels (``phase_spec``, derived there): the input (or its gradient) is split into
``prod(strides)`` phase grids per channel, the kernel into the taps of each phase (zero
where a phase has fewer). The forward's and the weight gradient's tiles read their phase
cells straight from the input (``_fill_phases`` in ``_thin_jit.py``) and sum only the
terms whose tap lies in the kernel (``_live_terms``): each forward output sums exactly the
products of the direct formula. The data gradient's phase grids are copied back
(``phase_merge``). Cells that no real tap reads are zero in the phase input, so what lies
in input cells no output reads never enters a sum; a non-finite value met anyway by a
gradient (an ``inf`` times a zero tap) sends the call to ``im2col``.

The weight gradient with stride 1 walks the same flat grids the other way: for every
(output channel, term ``(c, k)``) pair, a sum over positions of diff_dst (zero in the wide
cells) times the input shifted by the tap's offset. Its register tile is 4 output channels
x 3 terms x 8 lanes of partial sums (``_thin_jit.py``). A first lane-sum tile (3 x 4 x 8)
had measured no faster than ``taps`` (0.93x). What decides it is the tile length: each
register tile is loaded from the lane sums and stored back once per tile, and the loop
alone ran at 51 / 70 / 84 GFLOP/s on one core with tiles of 256 / 512 / 1536 positions
(measured with a version whose tile started from zero and added its lanes: the same
per-tile cost), so tiles are sized to the L2 cache (``BW_BUFFER_BYTES``) rather than to L1.

numba is optional, as for ``depthwise.py`` (same :func:`depthwise.available`). Work is the
flat list of (group, position tile) items (tiles cut the images' padded grids laid end to
end), cut into chunks of consecutive items on
convgrad's own pool (``gemm.run_each``; no BLAS is called). Every forward output element is
computed inside one tile in a fixed order; the weight gradient's chunks are fixed by the
problem (``BW_CHUNKS``) and their partial sums added in chunk order. So results are bitwise
identical whatever the thread count or the workspace cap. Inputs that are C-contiguous in the
compute type are read in place; others (half types, strided views) are converted whole,
which is workspace and counted against the cap with each thread's scratch.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .. import threads
from ..errors import WorkspaceError
from ..spec import ConvSpec
from . import depthwise, results
from .gemm import flipped_spec, guided_chunks, run_each

# Bytes of one tile's input buffer (every input channel of a group, ``tile + halo`` cells
# each) that the tile size aims at. The buffer is re-read once per register tile of output
# channels. Measured (one thread, ms, 32 / 64 / 128 KiB): grouped 8 x 16 channels 3x3
# 165^2 fwd 18.2 / 15.8 / 15.8; wavenet fwd 5.10 / 5.51 / 5.80, bwd_data 5.63 / 5.23 / 5.07.
BUFFER_BYTES = 64 * 1024
MIN_TILE = 64
# A tile holds at least HALO_TILE times the halo (the cells past the tile that its taps
# read, ``max_off``; two planes of a 3-D grid for a 3x3x3 kernel), else the copies of the
# halo outweigh the tile's work: 3-D 32 channels 24^3 3x3x3 (halo 1406 cells) ran 22.6 ms
# with 64-position tiles where ``taps`` took 15.0; 13.2 / 12.6 / 12.6 / 12.8 ms with 1, 2,
# 4, 8 halos (resnet 64 channels 56x56: 3.15 / 3.11 / 3.02 / 3.30 ms; one thread).
HALO_TILE = 4
# Register tile of the compiled loops: OB output channels x R positions (a tile is a
# multiple of R positions). 3 x 32 float32 accumulators are 12 AVX2 registers, with 4
# for the inputs and weights of a term.
OB = 3
R = 32
MAX_TILE = 4096
# The output-channel loop re-reads a tile's buffer once per register tile; where the whole
# buffer (all input channels of the group) would not stay in the 512 KiB L2 cache (3-D
# problems, whose halo of two planes makes long tiles), the loop runs over chunks of input
# channels whose rows fill at most CHUNK_BYTES, the sums running on in the accumulators.
CHUNK_BYTES = 256 * 1024
# Below this many multiply-adds a call runs on the calling thread alone (as depthwise.py).
PARALLEL_MACS = 3 << 19      # 1.5M: depthwise.py's AMD-VM threshold, kept (these loops run larger problems)
# Stride-phase copies (``phase_spec``) of at least this many input cells run on the pool.
PHASE_PARALLEL_CELLS = 1 << 18


def available() -> bool:
    """Whether the compiled kernel can run (numba importable, ``CONVGRAD_NUMBA`` not ``0``)."""
    return depthwise.available() and _jit() is not None


@functools.lru_cache(maxsize=1)
def _jit():
    try:
        from . import _thin_jit
    except ImportError:
        return None
    return _thin_jit


def eligible(spec: ConvSpec, direction: str) -> bool:
    """Problems the kernel runs: 1-3 spatial axes, more than one input channel per group
    (one is ``depthwise.py``'s); with stride 1 every direction (bwd_data with pads at most
    ``(K-1)*d``, so that it is a forward convolution of ``diff_dst``); with larger strides
    and dilation 1 every direction too, on stride-phase channels (``phase_spec``)."""
    if not (1 <= spec.nsp <= 3 and spec.icg > 1):
        return False
    if any(s != 1 for s in spec.strides):
        return phase_spec(spec) is not None
    if direction in ("fwd", "bwd_weights"):
        return True
    return direction == "bwd_data" and flipped_spec(spec) is not None


@functools.lru_cache(maxsize=256)
def phase_spec(spec: ConvSpec) -> ConvSpec | None:
    """A strided problem (dilation 1) as a stride-1 problem on stride-phase channels, or None.

    Per axis with stride ``s``, write the tap as ``k = s*q + r`` (``0 <= r < s``). Output
    ``o`` reads padded input ``s*o + k = s*(o + q) + r``, i.e. cell ``o + q`` of phase
    grid ``r`` (``xph_r[j] = xpad[s*j + r]``). So the problem is a stride-1 correlation,
    no padding, over ``C * prod(s)`` channels (channel-major, phase-minor: groups stay
    contiguous), with kernel ``ceil(K/s)`` whose tap ``(r, q)`` is ``W[s*q + r]``, zero
    where ``s*q + r >= K``, on grids of ``dst + ceil(K/s) - 1`` cells. Those cells reach
    every padded cell a real tap reads (``s*o + k <= s*(dst - 1 + q_max) + r``), and every
    padded cell belongs to one phase cell, so the data gradient maps back with no sums.
    """
    if all(s == 1 for s in spec.strides) or any(d != 1 for d in spec.dilations) or 0 in spec.dst:
        return None
    kq = tuple(-(-k // s) for k, s in zip(spec.kernel, spec.strides))
    phases = math.prod(spec.strides)
    return ConvSpec(mb=spec.mb, ic=spec.ic * phases, oc=spec.oc, groups=spec.groups,
                    src=tuple(o + q - 1 for o, q in zip(spec.dst, kq)), kernel=kq,
                    strides=(1,) * spec.nsp, dilations=(1,) * spec.nsp,
                    pads_begin=(0,) * spec.nsp, pads_end=(0,) * spec.nsp)


def _as_forward(spec: ConvSpec, direction: str) -> ConvSpec:
    return flipped_spec(spec) if direction == "bwd_data" else spec


def _tile(fspec: ConvSpec, itemsize: int) -> tuple[int, int]:
    """Positions per tile (a multiple of R; decided by the problem alone) and the halo
    ``max_off`` (flat cells past a position that its taps read)."""
    ks = fspec.kernel
    q = [o + (k - 1) * d for o, k, d in zip(fspec.dst, ks, fspec.dilations)]
    max_off = 0
    for a in range(fspec.nsp):
        max_off = max_off * q[a] + (ks[a] - 1) * fspec.dilations[a]
    cells = max(BUFFER_BYTES // (fspec.icg * itemsize) - max_off, HALO_TILE * max_off)
    return int(min(max(MAX_TILE, R * -(-HALO_TILE * max_off // R)), max(MIN_TILE, cells // R * R))), max_off


def _chunk_channels(fspec: ConvSpec, itemsize: int) -> int:
    """Input channels per chunk of the forward loop: those whose buffer rows (``tile +
    halo`` cells each) fill at most CHUNK_BYTES. Every sum runs on through the chunks in
    the same order, so the chunking changes no bit of the result."""
    tile, max_off = _tile(fspec, itemsize)
    return max(1, min(fspec.icg, CHUNK_BYTES // ((tile + max_off) * itemsize)))


def _span(fspec: ConvSpec) -> int:
    """One past the flat index of the last output in the padded grids of all images."""
    dst = (1,) * (3 - fspec.nsp) + fspec.dst
    ks = (1,) * (3 - fspec.nsp) + fspec.kernel
    dl = (1,) * (3 - fspec.nsp) + fspec.dilations
    q0, q1, q2 = (o + (k - 1) * d for o, k, d in zip(dst, ks, dl))
    return (((fspec.mb - 1) * q0 + dst[0] - 1) * q1 + dst[1] - 1) * q2 + dst[2]


def _scratch(fspec: ConvSpec, itemsize: int) -> int:
    """Bytes one thread allocates: the tile buffer, the accumulators, the term offsets."""
    tile, max_off = _tile(fspec, itemsize)
    return (fspec.icg * (tile + max_off) + fspec.ocg * tile) * itemsize + fspec.icg * math.prod(fspec.kernel) * 8 + 1024


def _converted(arr_shape, arr_dtype, contiguous: bool, dtype) -> int:
    if np.dtype(arr_dtype) == np.dtype(dtype) and contiguous:
        return 0
    return math.prod(arr_shape) * np.dtype(dtype).itemsize


def fits(spec: ConvSpec, direction: str, dtype, workspace_limit: int) -> bool:
    """Whether one thread's scratch plus a converted copy of every input fits in the cap
    (the dispatcher's automatic choice falls back to the NumPy lowerings otherwise)."""
    item = np.dtype(dtype).itemsize
    pspec = phase_spec(spec)
    if direction == "bwd_weights":      # a phase problem reads the input in place (_fill_phases)
        ws = spec if pspec is None else pspec
        partials = (len(_bw_cuts(ws)) - 1) * math.prod(ws.weights_shape) * 8
        data = (math.prod(spec.src_shape) + math.prod(spec.dst_shape)) * item
        return _bw_scratch(ws, item) + data + partials <= workspace_limit
    if pspec is not None and direction == "fwd":    # reads ``src`` in place; the phase weights
        return (_scratch(pspec, item) + math.prod(pspec.weights_shape) * item * 2
                + math.prod(spec.src_shape) * item <= workspace_limit)
    if pspec is not None:               # plus the phase arrays (the data gradient's, weights)
        extra = (math.prod(pspec.src_shape) + math.prod(pspec.weights_shape)) * item
        return extra + math.prod(spec.src_shape) * item <= workspace_limit and fits(
            pspec, direction, dtype, workspace_limit - extra)
    fspec = _as_forward(spec, direction)
    data = math.prod(fspec.src_shape) * item
    weights = math.prod(fspec.weights_shape) * item
    return _scratch(fspec, item) + data + weights <= workspace_limit


def _plan(fspec: ConvSpec, items: int, fixed: int, per_thread: int, workspace_limit: int,
          direction: str) -> tuple[list[tuple[int, int]], int]:
    """Chunks ``[i0, i1)`` of the item list and the threads to run them on (every output
    element lies in one item, so neither changes a bit of the result)."""
    need = fixed + per_thread
    if need > workspace_limit:
        raise WorkspaceError(
            f"{direction}: the workspace limit ({workspace_limit} bytes) is too small for the "
            f"smallest tile of problem {fspec} ({need} bytes); raise it with convgrad.set_workspace_limit()")
    macs = fspec.mb * fspec.oc * math.prod(fspec.dst) * fspec.icg * math.prod(fspec.kernel)
    workers = 1 if macs < PARALLEL_MACS else max(1, min(items, threads.get_num_threads()))
    workers = max(1, min(workers, (workspace_limit - fixed) // per_thread))
    return guided_chunks(items, workers), workers


def _forward(fspec: ConvSpec, x: np.ndarray, w: np.ndarray, *, dtype, workspace_limit: int, fixed: int,
             direction: str, phases_of: ConvSpec | None = None) -> np.ndarray:
    """The forward loop on canonical ``x`` (N, C, *spatial) and ``w`` (G*Og, Cg, *kernel),
    both already C-contiguous in ``dtype``; ``fixed`` bytes of workspace are already held.
    With ``phases_of``, ``fspec`` is that strided problem's ``phase_spec``, ``x`` its own
    input and ``w`` the phase weights: only the live terms are summed (``_live_terms``)."""
    jit = _jit()
    pad = 3 - fspec.nsp
    xspec = fspec if phases_of is None else phases_of
    x3 = x.reshape((xspec.mb, xspec.ic) + (1,) * pad + xspec.src)
    y = results.empty((fspec.mb, fspec.oc) + (1,) * pad + fspec.dst, dtype)
    w3 = w.reshape(fspec.groups, fspec.ocg, fspec.icg * math.prod(fspec.kernel))
    if phases_of is None:
        live, pgeo = np.arange(w3.shape[2], dtype=np.int64), np.zeros(0, dtype=np.int64)
    else:
        live, pgeo = _live_terms(phases_of, fspec), _phase_geo(phases_of)
        w3 = np.ascontiguousarray(w3[:, :, live])
    tile, _ = _tile(fspec, dtype.itemsize)
    geo = np.array((1,) * pad + fspec.dilations + (0,) * pad + fspec.pads_begin + (tile,)
                   + (1,) * pad + fspec.kernel + (_chunk_channels(fspec, dtype.itemsize),), dtype=np.int64)
    items = fspec.groups * -(-_span(fspec) // tile)
    blocks, workers = _plan(fspec, items, fixed, _scratch(fspec, dtype.itemsize), workspace_limit, direction)
    run_each(lambda b: jit.forward(x3, w3, y, geo, b[0], b[1], live, pgeo), blocks, workers)
    return y.reshape(fspec.dst_shape)


def _contiguous(arr: np.ndarray, dtype) -> tuple[np.ndarray, int]:
    """``arr`` C-contiguous in ``dtype`` and the bytes that took (0: read in place)."""
    if arr.dtype == dtype and arr.flags.c_contiguous:
        return arr, 0
    out = np.ascontiguousarray(arr, dtype=dtype)
    return out, out.nbytes


def _check_conversion(spec: ConvSpec, direction: str, held: int, workspace_limit: int) -> None:
    if held > workspace_limit:
        raise WorkspaceError(
            f"{direction}: the workspace limit ({workspace_limit} bytes) is too small for the "
            f"converted inputs of problem {spec} ({held} bytes); raise it with convgrad.set_workspace_limit()")


def conv_forward(spec: ConvSpec, src: np.ndarray, weights: np.ndarray, *, dtype, workspace_limit: int) -> np.ndarray:
    dtype = np.dtype(dtype)
    pspec = phase_spec(spec)
    if pspec is not None:
        # A strided forward is the stride-1 forward of its phase problem; its tiles read
        # their phase cells from ``src`` and sum only the real taps (``_live_terms``: every
        # product is one of the direct sum's, so no zero tap meets an infinity).
        w = _phase_weights(spec, pspec, weights, dtype)
        # the phase weights and their live columns (``_forward``), a converted input
        held = 2 * w.nbytes + _converted(src.shape, src.dtype, src.flags.c_contiguous, dtype)
        _check_conversion(spec, "fwd", held, workspace_limit)
        x, _ = _contiguous(src, dtype)
        return _forward(pspec, x, w, dtype=dtype, workspace_limit=workspace_limit, fixed=held, direction="fwd",
                        phases_of=spec)
    w, held_w = _contiguous(weights, dtype)
    held = held_w + _converted(src.shape, src.dtype, src.flags.c_contiguous, dtype)
    _check_conversion(spec, "fwd", held, workspace_limit)
    x, _ = _contiguous(src, dtype)
    return _forward(spec, x, w, dtype=dtype, workspace_limit=workspace_limit, fixed=held, direction="fwd")


def _phase_axes(nsp: int, lead: int):
    """Axis orders between ``(lead..., L0, s0, L1, s1, ...)`` and ``(lead..., s0, s1, ...,
    L0, L1, ...)``."""
    to_phases = tuple(range(lead)) + tuple(lead + 2 * a + 1 for a in range(nsp)) + tuple(lead + 2 * a for a in range(nsp))
    return to_phases, tuple(np.argsort(to_phases))


def _phase_weights(spec: ConvSpec, pspec: ConvSpec, weights: np.ndarray, dtype) -> np.ndarray:
    """``(O, C * prod(s), *ceil(K/s))``: tap ``(r, q)`` of phase channel ``c*P + r`` is
    ``W[o, c, s*q + r]``, zero past the kernel."""
    wpad = np.zeros((spec.oc, spec.icg) + tuple(s * q for s, q in zip(spec.strides, pspec.kernel)), dtype=dtype)
    wpad[(slice(None), slice(None)) + tuple(slice(0, k) for k in spec.kernel)] = weights
    split = (spec.oc, spec.icg) + tuple(v for q, s in zip(pspec.kernel, spec.strides) for v in (q, s))
    to_phases, _ = _phase_axes(spec.nsp, 2)
    return np.ascontiguousarray(wpad.reshape(split).transpose(to_phases)).reshape(pspec.weights_shape)


def _phase_geo(spec: ConvSpec) -> np.ndarray:
    pad = 3 - spec.nsp
    return np.array((1,) * pad + spec.strides + (0,) * pad + spec.pads_begin + (1,) * pad + spec.kernel,
                    dtype=np.int64)


def _phase_shapes(spec: ConvSpec, pspec: ConvSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The input and the phase array as 3-D: ``(N, C, *S)`` and ``(N, C, *s, *L)``."""
    pad = 3 - spec.nsp
    return ((spec.mb, spec.ic) + (1,) * pad + spec.src,
            (spec.mb, spec.ic) + (1,) * pad + spec.strides + (1,) * pad + pspec.src)


def _by_pairs(spec: ConvSpec, fn) -> None:
    """``fn(k0, k1)`` over chunks of the (image, channel) pairs on the pool (element
    copies: any cut gives the same array)."""
    pairs = spec.mb * spec.ic
    n = min(pairs, threads.get_num_threads()) if math.prod(spec.src_shape) >= PHASE_PARALLEL_CELLS else 1
    n = max(1, n)
    cuts = [pairs * i // n for i in range(n + 1)]
    run_each(lambda r: fn(r[0], r[1]), list(zip(cuts, cuts[1:])), n)


def _fallback(spec: ConvSpec, direction: str, a: np.ndarray, b: np.ndarray, dtype, workspace_limit: int):
    """The GEMM lowering (``im2col``) for a phased problem that met a non-finite value, so
    that such inputs propagate as they do on the other strided lowerings: the phase
    kernel's zero taps turn ``0 * inf`` into NaN in data-gradient cells whose direct sums
    have no such term, and the weight-gradient loop multiplies input cells cropped by the
    stride with the zero wide cells of diff_dst."""
    from .. import dispatch              # the dispatcher imports this module
    from . import gemm
    fn = gemm.conv_backward_data if direction == "bwd_data" else gemm.conv_backward_weights
    return fn(spec, a, b, dtype=dtype, algorithm="im2col", workspace_limit=workspace_limit,
              rows_target=dispatch.ROWS_TARGET)


def _not_finite(arr: np.ndarray) -> bool:
    """Whether ``arr`` holds a NaN or an infinity (a sum is one fast pass; a sum that
    overflows also says so, and only costs a fallback)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return not np.isfinite(np.add.reduce(arr, axis=None))


def _phased_backward_data(spec: ConvSpec, diff_dst: np.ndarray, weights: np.ndarray, *, dtype,
                          workspace_limit: int) -> np.ndarray:
    """Data gradient of a strided problem: the stride-1 data gradient on phase channels,
    each phase cell written back to its one padded input cell (``phase_spec``)."""
    pspec = phase_spec(spec)
    w = _phase_weights(spec, pspec, weights, dtype)
    extra = w.nbytes + math.prod(pspec.src_shape) * dtype.itemsize
    dph = conv_backward_data(pspec, diff_dst, w, dtype=dtype, workspace_limit=workspace_limit - extra)
    if _not_finite(dph):
        return _fallback(spec, "bwd_data", diff_dst, weights, dtype, workspace_limit)
    # every input cell is one phase cell (cells no phase cell reaches are read by no tap)
    out = results.empty(spec.src_shape, dtype)
    shape3, phase3 = _phase_shapes(spec, pspec)
    out3, dph3, geo = out.reshape(shape3), dph.reshape(phase3), _phase_geo(spec)
    _by_pairs(spec, lambda k0, k1: _jit().phase_merge(dph3, geo, out3, k0, k1))
    return out


def _live_terms(spec: ConvSpec, pspec: ConvSpec) -> np.ndarray:
    """The terms (phase channel ``c*P + r``, tap ``q``) of the phase problem, in the order
    of its weights, whose tap ``s*q + r`` lies inside the kernel on every axis (pure). The
    others are the zero taps of ``_phase_weights``: their sums would be dropped, so the
    weight gradient skips them (resnet_50 conv1, 7x7 stride 2: 49 of 64 terms per channel
    are live; a 3x3 stride-2 kernel: 9 of 16)."""
    live = np.ones((spec.icg,) + tuple(spec.strides) + pspec.kernel, dtype=bool)
    for a, (s, k, q) in enumerate(zip(spec.strides, spec.kernel, pspec.kernel)):
        tap = s * np.arange(q)[None, :] + np.arange(s)[:, None]        # (r, q) -> s*q + r
        shape = [1] * (1 + 2 * spec.nsp)
        shape[1 + a], shape[1 + spec.nsp + a] = s, q
        live &= (tap < k).reshape(shape)
    return np.flatnonzero(live.reshape(-1)).astype(np.int64)


def _phased_backward_weights(spec: ConvSpec, src: np.ndarray, diff_dst: np.ndarray, *, dtype,
                             workspace_limit: int) -> np.ndarray:
    """Weight gradient of a strided problem: the stride-1 weight gradient on phase channels,
    its real taps read back (``phase_spec``)."""
    pspec = phase_spec(spec)
    dw = conv_backward_weights(pspec, src, diff_dst, dtype=dtype, workspace_limit=workspace_limit,
                               live=_live_terms(spec, pspec), phases_of=spec)
    if _not_finite(dw):
        return _fallback(spec, "bwd_weights", src, diff_dst, dtype, workspace_limit)
    split = (spec.oc, spec.icg) + tuple(spec.strides) + pspec.kernel
    _, from_phases = _phase_axes(spec.nsp, 2)
    full = dw.reshape(split).transpose(from_phases).reshape(
        (spec.oc, spec.icg) + tuple(s * q for s, q in zip(spec.strides, pspec.kernel)))
    return np.ascontiguousarray(full[(slice(None), slice(None)) + tuple(slice(0, k) for k in spec.kernel)])


def conv_backward_data(spec: ConvSpec, diff_dst: np.ndarray, weights: np.ndarray, *, dtype,
                       workspace_limit: int) -> np.ndarray:
    dtype = np.dtype(dtype)
    if phase_spec(spec) is not None:
        return _phased_backward_data(spec, diff_dst, weights, dtype=dtype, workspace_limit=workspace_limit)
    fspec = flipped_spec(spec)
    # (G*Og, Cg, *K) -> (G*Cg, Og, *K) with every kernel axis flipped: flipping them all
    # reverses the flat tap index, so it is one reversed axis of T elements
    g, og, cg, t = spec.groups, spec.ocg, spec.icg, math.prod(spec.kernel)
    w = np.ascontiguousarray(weights.reshape(g, og, cg, t)[..., ::-1].swapaxes(1, 2), dtype=dtype)
    held = w.nbytes + _converted(diff_dst.shape, diff_dst.dtype, diff_dst.flags.c_contiguous, dtype)
    _check_conversion(spec, "bwd_data", held, workspace_limit)
    dy, _ = _contiguous(diff_dst, dtype)
    return _forward(fspec, dy, w.reshape((spec.ic, og) + spec.kernel), dtype=dtype,
                    workspace_limit=workspace_limit, fixed=held, direction="bwd_data")


# Weight gradient (stride 1; the loops and the order of the sums are in ``_thin_jit.py``).
# A tile's buffers (the input rows of its group, ``tile + halo`` cells each, and the
# diff_dst rows, ``tile`` cells) aim at BW_BUFFER_BYTES, within the 512 KiB L2 cache of
# the development machine; the register tile walks a tile's positions for every
# (output channels, terms) pair, so longer tiles amortize its start and end. Measured
# (the register loop alone, 32 -> 32 channels, k2, float32, one thread, GFLOP/s; the
# zero-then-add version of the tile): tiles of 256 / 512 / 1024 / 1536 / 2048 positions
# 51 / 70 / 79 / 84 / 83.
BW_BUFFER_BYTES = 384 * 1024
BW_MIN_TILE = 256
BW_MAX_TILE = 8192
# Each group's positions are cut into chunks of at least BW_CHUNK_POSITIONS, at most
# BW_CHUNKS of them (fixed by the problem, never by the thread count or the tile); each
# (group, chunk) is one work item whose float64 partial sums are added in chunk order.
BW_CHUNKS = 8
BW_CHUNK_POSITIONS = 1024
# While a tile runs, the lines of the next tile's input and diff_dst cells are prefetched
# (``_stream``), and after an item's last tile those of the next item's first tile: a
# chunk is about 1.2 tiles of the grouped 8 x 16 channels 3x3 165^2 layer, so stopping at
# the item's end had left most tiles to be copied from memory. In one process, both
# versions interleaved (20 rounds of a 0.05 s pause, 64 MB of other traffic, a warm-up and
# 3 calls), paired medians with / without: that layer's weight gradient 0.90, 0.94, 0.96
# (2 threads, three sessions), 0.94 (one thread); wavenet conv1d_3, _6, _9 0.97-0.99.


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _bw_tile(spec: ConvSpec, itemsize: int) -> tuple[int, int]:
    """Positions per weight-gradient tile (a multiple of ``L``) and the halo ``max_off``."""
    jit = _jit()
    _, max_off = _tile(spec, itemsize)
    rows = spec.icg + _round_up(spec.ocg, jit.WO)
    cells = (BW_BUFFER_BYTES // itemsize - spec.icg * max_off) // rows
    return int(min(BW_MAX_TILE, max(BW_MIN_TILE, cells // jit.L * jit.L))), max_off


def _bw_scratch(spec: ConvSpec, itemsize: int) -> int:
    """Bytes one thread allocates for the weight gradient: input and diff_dst tile buffers,
    the lane sums, the term offsets."""
    jit = _jit()
    tile, max_off = _bw_tile(spec, itemsize)
    ocg_pad = _round_up(spec.ocg, jit.WO)
    n_u_pad = _round_up(spec.icg * math.prod(spec.kernel), jit.WU)
    return ((spec.icg * (tile + max_off) + ocg_pad * tile + ocg_pad * n_u_pad * jit.L) * itemsize
            + n_u_pad * 8 + 1024)


def _bw_cuts(spec: ConvSpec) -> list[int]:
    """Chunk boundaries on each group's flat positions (multiples of ``L``; from the problem alone)."""
    span = _span(spec)
    n = max(1, min(BW_CHUNKS, span // BW_CHUNK_POSITIONS))
    step = _round_up(-(-span // n), _jit().L)
    return [min(span, i * step) for i in range(n)] + [span]


def conv_backward_weights(spec: ConvSpec, src: np.ndarray, diff_dst: np.ndarray, *, dtype,
                          workspace_limit: int, live: np.ndarray | None = None,
                          phases_of: ConvSpec | None = None) -> np.ndarray:
    """The weight gradient; ``live`` (sorted term indices ``c*T + k``, the phase problem's
    ``_live_terms``) restricts the sums to those terms, the others are zero. With
    ``phases_of``, ``spec`` is that strided problem's ``phase_spec`` and ``src`` its input:
    the tiles read their phase cells from it (``_fill_phases``), no phase array is made."""
    dtype = np.dtype(dtype)
    if phases_of is None and phase_spec(spec) is not None:
        return _phased_backward_weights(spec, src, diff_dst, dtype=dtype, workspace_limit=workspace_limit)
    jit = _jit()
    item = dtype.itemsize
    n_terms = spec.icg * math.prod(spec.kernel)
    if spec.mb == 0 or 0 in spec.dst:
        return np.zeros(spec.weights_shape, dtype=dtype)
    if live is None:
        live = np.arange(n_terms, dtype=np.int64)
    held = (_converted(src.shape, src.dtype, src.flags.c_contiguous, dtype)
            + _converted(diff_dst.shape, diff_dst.dtype, diff_dst.flags.c_contiguous, dtype))
    cuts = _bw_cuts(spec)
    n_chunks = len(cuts) - 1
    partials = n_chunks * spec.groups * spec.ocg * n_terms * 8
    _check_conversion(spec, "bwd_weights", held + partials, workspace_limit)
    x, _ = _contiguous(src, dtype)
    dy, _ = _contiguous(diff_dst, dtype)
    pad = 3 - spec.nsp
    xspec = spec if phases_of is None else phases_of
    x3 = x.reshape((xspec.mb, xspec.ic) + (1,) * pad + xspec.src)
    dy3 = dy.reshape((spec.mb, spec.oc) + (1,) * pad + spec.dst)
    pgeo = np.zeros(0, dtype=np.int64) if phases_of is None else _phase_geo(phases_of)
    # no tile longer than a chunk (the sums do not depend on the tile length)
    tile = min(_bw_tile(spec, item)[0], _round_up(max(b - a for a, b in zip(cuts, cuts[1:])), jit.L))
    geo = np.array((1,) * pad + spec.dilations + (0,) * pad + spec.pads_begin + (tile,)
                   + (1,) * pad + spec.kernel, dtype=np.int64)
    items = spec.groups * n_chunks
    # runs of consecutive items per call (one set of buffers each; any grouping gives the
    # same bits, as every item writes its own partial)
    runs, workers = _plan(spec, items, held + partials, _bw_scratch(spec, item), workspace_limit, "bwd_weights")
    part = np.zeros((n_chunks, spec.groups, spec.ocg, live.size))
    ocg_pad, n_u_pad = _round_up(spec.ocg, jit.WO), _round_up(live.size, jit.WU)
    cut_arr = np.array(cuts, dtype=np.int64)
    run_each(lambda r: jit.backward_weights(x3, dy3, part, geo, cut_arr, r[0], r[1], ocg_pad, n_u_pad, live, pgeo),
             runs, workers)
    total = part[0]
    for p in part[1:]:
        total += p
    if live.size == n_terms:
        return total.astype(dtype).reshape(spec.weights_shape)
    dw = np.zeros((spec.groups, spec.ocg, n_terms), dtype=dtype)
    dw[:, :, live] = total
    return dw.reshape(spec.weights_shape)
