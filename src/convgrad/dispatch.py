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
  Its data gradient scatters the columns back (col2im), except with stride 1, where it
  runs as the forward im2col of ``diff_dst`` with the flipped kernel (unless that column
  matrix is many times larger: kernels far larger than the output).
* ``direct`` (``kernels/depthwise.py``) is a compiled loop nest for depthwise problems
  (one input channel per group, any channel multiplier, 1-3 spatial axes). It needs numba
  (extra ``convgrad[fast]``; ``CONVGRAD_NUMBA=0`` turns it off). There the GEMM lowerings
  degenerate into one element-wise NumPy multiply-add per tap, so when it is available it
  is chosen for depthwise problems with at most ``DIRECT_MAX_MULTIPLIER`` output channels
  per group before the cost model is asked (measured in-process
  against ``taps`` on the nine mobilenet depthwise layers, 2 threads, a loaded machine:
  1.2-4x faster in forward and data gradients; weight gradients 1.1-2x faster; the two
  that tied, 56x56 stride 2 and 28x28, after the perf-dw3 kernel changes 0.35 vs 0.71 ms
  and 0.51 vs 0.83 ms).

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

from .errors import ConvTypeError, ConvValueError
from .kernels import depthwise
from .kernels.gemm import flipped_data_gradient, pointwise_spec
from .spec import ConvSpec

ALGORITHMS = ("reference", "im2col", "taps", "direct")
DIRECTIONS = ("fwd", "bwd_data", "bwd_weights")

DEFAULT_WORKSPACE_LIMIT = 256 * 1024 * 1024
# Rows (output positions of the wide phase grid) per block: decided by the problem alone,
# so that results never depend on the workspace cap unless a block has to shrink to fit.
ROWS_TARGET = 8192

_state = threading.local()


def get_workspace_limit() -> int:
    """The cap, in bytes, on the temporaries of one call (default 256 MiB)."""
    return getattr(_state, "limit", DEFAULT_WORKSPACE_LIMIT)


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
COL2IM_SECONDS = 2.5e-9     # per element of a column matrix scatter-added
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
        return _gemm_seconds(og, cg, wide, g * t) + moves + calls
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
    ``DIRECT_MAX_MULTIPLIER`` output channels per group: ``direct`` when
    ``depthwise.available()``, unless ``direct=False``), then the cheaper of ``taps``
    and ``im2col`` by ``estimate_cost``.
    """
    if direction not in DIRECTIONS:
        raise ConvValueError(f"choose_algorithm: direction must be one of {DIRECTIONS}, but got {direction!r}")
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        return "reference"
    if direct and depthwise.eligible(spec) and spec.ocg <= DIRECT_MAX_MULTIPLIER and depthwise.available():
        return "direct"
    return _cheapest(spec, direction)


def check_direct(op: str, spec: ConvSpec) -> None:
    """Raise unless ``algorithm="direct"`` can run this problem here."""
    if not depthwise.eligible(spec):
        raise ConvValueError(
            f"{op}: algorithm 'direct' expects a depthwise problem (C_IN / groups = 1, 1 to 3 spatial axes), "
            f"but got C_IN {spec.ic}, groups {spec.groups} ({spec.icg} channels per group), {spec.nsp} spatial axes")
    if not depthwise.available():
        why = "CONVGRAD_NUMBA=0" if os.environ.get("CONVGRAD_NUMBA", "1").strip() == "0" else "numba is not installed"
        raise ConvValueError(f"{op}: algorithm 'direct' expects numba (pip install convgrad[fast]), but {why}")


@functools.lru_cache(maxsize=1024)
def _cheapest(spec: ConvSpec, direction: str) -> str:
    costs = {alg: estimate_cost(spec, direction, alg) for alg in ("taps", "im2col")}
    return min(costs, key=costs.get)
