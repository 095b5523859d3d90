"""Algorithm choice and the workspace cap (pure functions of the problem; public).

``choose_algorithm(spec, direction, dtype)`` applies vetoes first (exact integer types go
to the reference kernel, which accumulates in int64), then a cost model: the ``im2col``
lowering copies ``taps x channels`` columns per row and wins when channels are few (the
GEMM's K is then too short per tap); ``taps`` runs one GEMM per kernel tap on strided
views without a copy and wins when channels are many. Callers may override it with the
``algorithm=`` keyword of every canonical function.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import numpy as np

from .errors import ConvTypeError, ConvValueError
from .spec import ConvSpec

ALGORITHMS = ("reference", "im2col", "taps")
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


def choose_algorithm(spec: ConvSpec, direction: str, dtype: object = np.float32) -> str:
    """The algorithm the canonical functions use for this problem (pure, overridable)."""
    if direction not in DIRECTIONS:
        raise ConvValueError(f"choose_algorithm: direction must be one of {DIRECTIONS}, but got {direction!r}")
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        return "reference"
    # Channels that meet one weight of a tap in one GEMM: the reduction of fwd is icg, of
    # bwd_data ocg; bwd_weights' reduction runs over rows and its GEMM M x N is icg x ocg.
    if direction == "fwd":
        per_tap = spec.icg
    elif direction == "bwd_data":
        per_tap = spec.ocg
    else:
        per_tap = min(spec.icg, spec.ocg)
    return "im2col" if per_tap < 64 else "taps"
