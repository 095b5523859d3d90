"""Thread control (dispatch layer): deterministic parallelism over fixed-shape work items.

OpenBLAS rounds the same GEMM differently with 1 and 2 threads, and even when the same
product is split into two GEMMs along M or N (measured here with NumPy's bundled OpenBLAS
0.3.31). So convgrad never lets BLAS choose: inside a call every GEMM runs with BLAS pinned
to one thread, and the parallelism comes from running independent work items (blocks of
the problem, each a fixed set of GEMMs of fixed shapes) on a thread pool. Results are then
bitwise identical for any thread count, and the copies around the GEMMs run in parallel
too. Weight-gradient partials are added in block order whatever finished first.

The pool size is ``convgrad.set_num_threads(n)`` when set, else the BLAS thread count the
caller has (so ``threadpoolctl.threadpool_limits(1)`` around a call makes it serial and
``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS`` are honoured).
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

from threadpoolctl import ThreadpoolController

from .errors import ConvTypeError, ConvValueError

T = TypeVar("T")
R = TypeVar("R")

_lock = threading.Lock()
_controller: ThreadpoolController | None = None
_num_threads: int | None = None
# Concurrent calls (a Dask threaded scheduler, user threads) share one pin: the first
# entrant saves the caller's BLAS thread count and pins it to 1, the last one restores it.
_pins = 0
_limiter = None
_saved_threads = 1


def _blas():
    global _controller
    with _lock:
        if _controller is None:
            _controller = ThreadpoolController()
        return _controller.select(user_api="blas")


def set_num_threads(n: int | None) -> None:
    """Threads convgrad uses per call (``None``: follow the BLAS thread count)."""
    global _num_threads
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise ConvTypeError(f"set_num_threads: n must be an integer or None, but got {n!r}")
        if n < 1:
            raise ConvValueError(f"set_num_threads: n must be positive, but got {n}")
    _num_threads = n


def _blas_threads(blas) -> int:
    counts = [info.get("num_threads") or 1 for info in blas.info()]
    return max(counts) if counts else (os.cpu_count() or 1)


def get_num_threads() -> int:
    """Worker threads a call uses now (outside a call: what the next call would use)."""
    if _num_threads is not None:
        return _num_threads
    with _lock:
        if _pins:
            return _saved_threads
    return _blas_threads(_blas())


@contextlib.contextmanager
def pinned_blas() -> Iterator[int]:
    """BLAS at one thread inside; yields the number of worker threads to use instead."""
    global _pins, _limiter, _saved_threads
    blas = _blas()
    with _lock:
        if _pins == 0:
            _saved_threads = _blas_threads(blas)
            _limiter = blas.limit(limits=1) if blas.info() else None
        _pins += 1
        n = _num_threads if _num_threads is not None else _saved_threads
    try:
        yield n
    finally:
        with _lock:
            _pins -= 1
            if _pins == 0 and _limiter is not None:
                _limiter.restore_original_limits()
                _limiter = None


def ordered_map(fn: Callable[[T], R], items: Sequence[T], workers: int) -> Iterable[R]:
    """``fn`` over ``items`` with up to ``workers`` in flight; results in item order."""
    if workers <= 1 or len(items) <= 1:
        for item in items:
            yield fn(item)
        return
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        for start in range(0, len(items), workers):
            yield from pool.map(fn, items[start:start + workers])
