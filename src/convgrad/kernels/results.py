"""Memory for large results, recycled between calls.

A result of several MiB that NumPy allocates afresh comes from the system as new pages
(glibc maps every block of 32 MiB or more, and often returns smaller ones when they are
freed), and the system zeroes each page on its first touch: on the 61 MB data gradient of
resnet_50 res3a_branch2a that costs 2.6 ms of a 5.3 ms call, and the zeroing stalls
whenever no huge page is at hand (18-28 ms calls). The frameworks' own allocators keep
such memory (TensorFlow's BFC allocator; OpenVINO's requests keep their outputs).

Here a result of at least ``MIN_BYTES`` is a view of a buffer that returns to a small
cache when the caller drops the last array that uses it (a finalizer on the buffer's root
array: every view of a result keeps that root alive, NumPy collapses view chains onto it).
The cache keeps at most ``get_result_cache_limit()`` bytes of unused buffers (the oldest
go first); ``set_result_cache_limit(0)`` turns it off, ``release_result_cache()`` empties
it. A result taken from the cache holds old values: callers that need zeros ask
``take(..., zeroed=True)``, which tells them whether the memory is zero already.
"""
from __future__ import annotations

import collections
import contextlib
import math
import os
import threading
import weakref
from typing import Iterator

import numpy as np

from ..errors import ConvTypeError, ConvValueError

MIN_BYTES = 1 << 20          # smaller results stay with NumPy's allocator
GRAIN = 1 << 20              # buffer sizes are multiples of this (a few size classes)
DEFAULT_RESULT_CACHE_LIMIT = 256 << 20    # bytes of unused buffers kept

_limit = [DEFAULT_RESULT_CACHE_LIMIT]
_lock = threading.Lock()
_free: list[np.ndarray] = []                 # unused raw buffers, oldest first
_returned: collections.deque = collections.deque()   # handed back while _lock was busy
_stats = {"hits": 0, "misses": 0}


def _after_fork() -> None:
    # another thread may have held the lock at the fork: the child gets a fresh one
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def get_result_cache_limit() -> int:
    """Bytes of unused result buffers convgrad keeps for later calls (one cache for the
    process; default 256 MiB)."""
    return _limit[0]


def _check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)):
        raise ConvTypeError(f"result_cache_limit: must be an integer number of bytes, but got {limit!r}")
    if limit < 0:
        raise ConvValueError(f"result_cache_limit: must be a number of bytes >= 0, but got {limit}")
    return int(limit)


def set_result_cache_limit(limit: int) -> None:
    """Keep at most ``limit`` bytes of unused result buffers (0: keep none; every large
    result then comes fresh from NumPy)."""
    _limit[0] = _check_limit(limit)
    with _lock:
        _drain()
        _trim()


@contextlib.contextmanager
def result_cache_limit(limit: int) -> Iterator[None]:
    """``set_result_cache_limit`` for a ``with`` block."""
    old = get_result_cache_limit()
    set_result_cache_limit(limit)
    try:
        yield
    finally:
        set_result_cache_limit(old)


def release_result_cache() -> None:
    """Drop every unused result buffer."""
    with _lock:
        _drain()
        _free.clear()


def cached_bytes() -> int:
    """Bytes of unused buffers held now."""
    with _lock:
        _drain()
        return sum(b.nbytes for b in _free)


def _drain() -> None:
    while _returned:
        _free.append(_returned.popleft())


def _trim() -> None:
    total = sum(b.nbytes for b in _free)
    while _free and total > _limit[0]:
        total -= _free.pop(0).nbytes


def _give_back(raw: np.ndarray) -> None:
    # A finalizer: it may run inside this module's own locked section (a collection
    # triggered there), so it never waits for the lock.
    if _lock.acquire(blocking=False):
        try:
            _drain()
            _free.append(raw)
            _trim()
        finally:
            _lock.release()
    else:
        _returned.append(raw)


def _raw(nbytes: int) -> tuple[np.ndarray, bool]:
    """A raw buffer of ``nbytes`` (a multiple of GRAIN) and whether it is fresh (zero)."""
    with _lock:
        _drain()
        for i in range(len(_free) - 1, -1, -1):
            if _free[i].nbytes == nbytes:
                _stats["hits"] += 1
                return _free.pop(i), False
        _stats["misses"] += 1
    return np.zeros(nbytes, dtype=np.uint8), True     # pages come zeroed from the system


def take(shape: tuple[int, ...], dtype, zeroed: bool = False) -> tuple[np.ndarray, bool]:
    """A C-contiguous result array of ``shape`` and whether its contents are zero.

    ``zeroed=True`` promises nothing more than the flag: the caller zeroes what it needs
    when the flag is False (cheaper in its own blocks, while the rows are in cache)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < MIN_BYTES or _limit[0] == 0:
        if zeroed:
            return np.zeros(shape, dtype=dtype), True
        return np.empty(shape, dtype=dtype), False
    size = -(-nbytes // GRAIN) * GRAIN
    raw, fresh = _raw(size)
    root = np.frombuffer(memoryview(raw), dtype=np.uint8)   # views of the result collapse onto root
    weakref.finalize(root, _give_back, raw).atexit = False
    return root[:nbytes].view(dtype).reshape(shape), fresh


def empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialised result array."""
    return take(shape, dtype)[0]


def zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zeroed result array (zeroed here only when it comes from the cache)."""
    out, zero = take(shape, dtype, zeroed=True)
    if not zero:
        out.fill(0)
    return out
