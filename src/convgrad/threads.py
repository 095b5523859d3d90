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
import ctypes
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

from threadpoolctl import OpenBLASController, ThreadpoolController

from .errors import ConvTypeError, ConvValueError

T = TypeVar("T")
R = TypeVar("R")

_lock = threading.Lock()
_controller: ThreadpoolController | None = None
_num_threads: int | None = None


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


# OpenBLAS kernel families built on 512-bit vectors (threadpoolctl's ``architecture``).
_WIDE_BLAS = frozenset({"skylakex", "cooperlake", "sapphirerapids"})


@functools.lru_cache(maxsize=1)
def blas_vector_bits() -> int:
    """Vector width of the BLAS kernels NumPy runs: 512 for OpenBLAS's AVX-512 families,
    else 256 (AVX2 and anything not recognised). The compiled loops use 8-lane (256-bit)
    tiles, so this is how much wider the GEMMs they compete with are."""
    try:
        archs = {str(i.get("architecture", "")).lower() for i in _blas().info()}
    except Exception:  # noqa: BLE001 - an odd BLAS: assume the narrow case
        return 256
    return 512 if archs and archs <= _WIDE_BLAS else 256


_DIRECT = None        # (get, set) of NumPy's OpenBLAS thread count, looked up once
_DIRECT_LOOKED = False


def _direct():
    global _DIRECT, _DIRECT_LOOKED
    if not _DIRECT_LOOKED:
        from .kernels.blas import thread_count_functions

        _DIRECT, _DIRECT_LOOKED = thread_count_functions(), True
    return _DIRECT


def _blas_threads() -> int:
    direct = _direct()
    if direct is not None:
        return max(1, int(direct[0]()))
    counts = [info.get("num_threads") or 1 for info in _blas().info()]
    return max(counts) if counts else (os.cpu_count() or 1)


class _Pin:
    """Process-wide, reference-counted "BLAS on one thread while any call runs".

    Concurrent calls (user threads, a Dask threaded scheduler) share one pin: the first
    entrant saves the caller's BLAS thread count and pins it to 1, the last one restores
    it. The GEMMs run in NumPy's OpenBLAS, whose thread count is set directly (process-wide,
    microseconds). Where those functions are not found, threadpoolctl does it: it (>= 3.7)
    lets only one Python thread, the "controlling thread", change OpenBLAS's process-wide
    limit and silently ignores the others, so every change is then made by one dedicated
    thread that takes control first and gives it back after restoring.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:  # also in a forked child: the parent's threads are gone
        self.lock = threading.Lock()
        self.active = 0
        self.saved = 1
        self.limiter = None
        self.control: ThreadPoolExecutor | None = None

    def _in_control_thread(self, fn: Callable[[], None]) -> None:
        if self.control is None:
            self.control = ThreadPoolExecutor(1, thread_name_prefix="convgrad-blas-limit")
        self.control.submit(fn).result()

    @staticmethod
    def _release_control(force: bool) -> None:
        clear = getattr(OpenBLASController, "clear_controlling_thread", None)
        if clear is not None:  # threadpoolctl < 3.7 has no controlling thread
            clear(force=force)

    def _limit(self) -> None:
        self._release_control(force=True)
        self.limiter = _blas().limit(limits=1)

    def _restore(self) -> None:
        self.limiter.restore_original_limits()
        self.limiter = None
        self._release_control(force=False)

    def enter(self) -> int:
        with self.lock:
            if self.active == 0:
                self.saved = _blas_threads()
                if self.saved > 1:
                    direct = _direct()
                    if direct is not None:
                        direct[1](1)
                    else:
                        self._in_control_thread(self._limit)
            self.active += 1
            return self.saved

    def exit(self) -> None:
        with self.lock:
            self.active -= 1
            if self.active == 0 and self.saved > 1:
                direct = _direct()
                if direct is not None:
                    direct[1](self.saved)
                elif self.limiter is not None:
                    self._in_control_thread(self._restore)


_PIN = _Pin()
os.register_at_fork(after_in_child=_PIN.reset)


class _Local(threading.local):
    serial = False      # a class default: a missing attribute costs a caught exception


_local = _Local()


@contextlib.contextmanager
def serial() -> Iterator[None]:
    """Calls made by this thread inside run their blocks one at a time (a Dask task, whose
    parallelism is the scheduler's, uses this with ``pinned_blas``)."""
    old = _local.serial
    _local.serial = True
    try:
        yield
    finally:
        _local.serial = old


def get_num_threads() -> int:
    """Worker threads a call uses now (outside a call: what the next call would use)."""
    if _local.serial:
        return 1
    if _num_threads is not None:
        return _num_threads
    with _PIN.lock:
        if _PIN.active:
            return _PIN.saved
    return _blas_threads()


class pinned_blas:
    """``with pinned_blas() as n``: BLAS at one thread inside; ``n`` is the number of worker
    threads to use instead. (A class, not a generator: it wraps every product of a call.)"""

    __slots__ = ()

    def __enter__(self) -> int:
        saved = _PIN.enter()
        if _local.serial:
            return 1
        return _num_threads if _num_threads is not None else saved

    def __exit__(self, *exc) -> None:
        _PIN.exit()


# ---------------------------------------------------------------------------------------
# Placement of the pool's threads. Measured on the 2-vCPU development VM: after the
# process idles (a benchmark's pause, a training step's other work), Linux often woke a
# pool thread on the CPU the caller runs on, and both then shared one core for the whole
# call (cpu time / wall time 1.0): 14 of 30 calls
# of a 512 -> 512 1x1 data gradient ran at cpu/wall 1.0, median 11.8 ms against 7.6 ms
# with both cores. A thread that checks its CPU when it starts running is too late (it
# runs only once the other has finished), so the submitting thread pins each pool thread
# it is about to wake to its own CPU of the caller's allowed set, other CPUs than the
# caller's first when the caller works too.
# That alone left the caller free to move, and it did, presumably when it waited for the
# GIL (a pool thread running the Python between its products): a sleeping thread may be
# woken on the waking thread's CPU, here the pool thread's. Logged per block (ISTFT
# weight gradient, two blocks, 0.1 s pauses, 12 x 4 calls): the caller began its block on
# one CPU and ended it on the pool thread's, and calls ran 7.7-8.2 ms (median) against
# 4.3 back to back. So when the caller works too (``run_each``) it is held on the CPU the
# plan gave it for the call (``held_on``) and its own mask restored after: 5.3-6.4 ms in
# the same pattern (4.6-4.8 against 7.3-8.0 in old/new processes taking turns).
# The pins change nothing in what is computed. CONVGRAD_SPREAD=0 turns both off (the pool
# threads then get the caller's allowed CPUs back); a no-op where the platform lacks
# sched_getcpu or sched_setaffinity, or the caller may run on one CPU only.
# ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _getcpu():
    if not hasattr(os, "sched_setaffinity"):
        return None
    try:
        fn = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = []
    return fn


def cpu_plan(n: int, caller_works: bool) -> list[int] | None:
    """CPUs for ``n`` pool threads of one call (distinct while there are enough; the
    caller's current CPU last when it works too, else first), or None: leave them be."""
    plan = call_plan(n, caller_works)
    return None if plan is None else plan[0]


def call_plan(n: int, caller_works: bool) -> tuple[list[int], int | None] | None:
    """``cpu_plan`` and the CPU it took the caller to run on (None when that CPU is not
    in the caller's allowed set), or None: leave every thread be."""
    getcpu = _getcpu()
    if n < 1 or getcpu is None or os.environ.get("CONVGRAD_SPREAD", "1").strip() == "0":
        return None
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except OSError:
        return None
    if len(allowed) < 2:
        return None
    caller = int(getcpu())
    others = [c for c in allowed if c != caller]
    own = [caller] if caller in allowed else []
    order = others + own if caller_works else own + others
    return [order[i % len(order)] for i in range(n)], (caller if own else None)


class held_on:
    """``with held_on(cpu)``: the calling thread runs only on ``cpu`` inside, and gets its
    own CPU mask back after (None, a CPU outside the mask, or a one-CPU mask: no-op)."""

    __slots__ = ("cpu", "saved")

    def __init__(self, cpu: int | None) -> None:
        self.cpu = cpu
        self.saved: set[int] | None = None

    def __enter__(self) -> "held_on":
        if self.cpu is not None:
            try:
                saved = os.sched_getaffinity(0)
                if self.cpu in saved and len(saved) > 1:
                    os.sched_setaffinity(0, {self.cpu})
                    self.saved = saved
            except (AttributeError, OSError):
                pass
        return self

    def __exit__(self, *exc) -> None:
        if self.saved is not None:
            try:
                os.sched_setaffinity(0, self.saved)
            except OSError:  # pragma: no cover - the mask was the thread's own a moment ago
                pass
            self.saved = None


def allowed_cpus() -> set[int] | None:
    """The CPUs the calling thread may run on (None where the platform cannot tell)."""
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return None


def pin(native_id: int, cpus: set[int]) -> bool:
    """Restrict thread ``native_id`` (of this process) to ``cpus``; False if refused."""
    try:
        os.sched_setaffinity(native_id, cpus)
        return True
    except (AttributeError, OSError):
        return False


def ordered_map(fn: Callable[[T], R], items: Sequence[T], workers: int) -> Iterable[R]:
    """``fn`` over ``items`` with up to ``workers`` in flight; results in item order."""
    if workers <= 1 or len(items) <= 1:
        for item in items:
            yield fn(item)
        return
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        for start in range(0, len(items), workers):
            yield from pool.map(fn, items[start:start + workers])
