"""Accumulating matrix products (kernel layer: arrays only).

``matmul_into(a, b, out, accumulate)`` computes ``out = a @ b`` or ``out += a @ b``.
NumPy's ``matmul`` cannot accumulate (BLAS ``beta = 1``), so every accumulation would cost
a temporary and an extra pass over ``out``. When the BLAS that NumPy itself loaded exports
``cblas_sgemm`` / ``cblas_dgemm`` (OpenBLAS in the NumPy wheels), 2-D products are sent
there directly with ``beta = 1``; the library is found among the shared objects already
mapped into this process, and a self-test against ``np.matmul`` must pass before it is
used. Anywhere else (other BLAS, stacked operands, odd strides, empty sizes) the NumPy
path runs, with the same result up to the rounding of one addition: the BLAS
micro-kernel adds the finished float32 product to ``out`` exactly as ``+=`` does.

Set ``CONVGRAD_NO_CBLAS=1`` to force the NumPy path. Threads: the BLAS thread pool is the
one NumPy uses, so ``threadpoolctl.threadpool_limits`` governs both paths alike.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112

# (symbol suffix, integer type): ILP64 builds name their symbols with a "64_" suffix.
_CANDIDATES = (
    ("scipy_cblas_{}gemm64_", ctypes.c_int64),
    ("cblas_{}gemm64_", ctypes.c_int64),
    ("scipy_cblas_{}gemm", ctypes.c_int32),
)


def _mapped_blas_paths() -> list[str]:
    """Shared objects already loaded into this process that look like NumPy's BLAS.

    Those shipped with NumPy (``numpy.libs/`` in its wheels) come first and, when there are
    any, alone: SciPy maps an OpenBLAS of its own, a different build that rounds
    differently, and results must not depend on whether SciPy happens to be imported.
    """
    paths = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) == 6 and ".so" in parts[5] and "blas" in parts[5].lower():
                    path = parts[5].strip()
                    if path not in paths:
                        paths.append(path)
    except OSError:
        pass
    root = os.path.dirname(os.path.dirname(os.path.abspath(np.__file__)))
    own = [p for p in paths if os.path.basename(os.path.dirname(p)) in ("numpy.libs", ".dylibs")
           or p.startswith(os.path.join(root, "numpy"))]
    return own or paths


def _load() -> dict:
    if os.environ.get("CONVGRAD_NO_CBLAS"):
        return {}
    np.ones((2, 2)) @ np.ones((2, 2))          # make sure NumPy's BLAS is mapped
    for path in _mapped_blas_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for pattern, itype in _CANDIDATES:
            found = {}
            for letter, ctype, dt in (("s", ctypes.c_float, np.float32), ("d", ctypes.c_double, np.float64)):
                fn = getattr(lib, pattern.format(letter), None)
                if fn is None:
                    break
                fn.restype = None
                fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, itype, itype, itype, ctype,
                               ctypes.c_void_p, itype, ctypes.c_void_p, itype, ctype, ctypes.c_void_p, itype]
                found[np.dtype(dt)] = (fn, ctype)
            if len(found) == 2 and _self_test(found):
                found["path"] = path
                return found
    return {}


def _self_test(found: dict) -> bool:
    rng = np.random.default_rng(0)
    for dt in found:
        a = rng.standard_normal((7, 5)).astype(dt)
        b = rng.standard_normal((9, 5)).astype(dt).T            # transposed operand
        c0 = rng.standard_normal((7, 12)).astype(dt)
        out = c0.copy()
        view = out[:, 1:10]                                     # ld larger than N
        if not _blas_call(found, a, b, view, True):
            return False
        want = c0.copy()
        want[:, 1:10] += a @ b
        if not np.allclose(out, want, rtol=1e-5, atol=1e-5):
            return False
        col = np.zeros((12, 7), dtype=dt).T[:, 2:11]              # column-major out
        if not _blas_call(found, a, b, col, False) or not np.allclose(col, a @ b, rtol=1e-5, atol=1e-5):
            return False
    return True


def _operand(x: np.ndarray):
    """(transpose flag, leading dimension) of a 2-D operand BLAS can read in place."""
    item = x.itemsize
    s0, s1 = x.strides
    rows, cols = x.shape
    if s1 == item and s0 % item == 0 and s0 // item >= max(1, cols):
        return _NO_TRANS, s0 // item
    if s0 == item and s1 % item == 0 and s1 // item >= max(1, rows):
        return _TRANS, s1 // item
    return None


def _blas_call(found: dict, a: np.ndarray, b: np.ndarray, out: np.ndarray, accumulate: bool) -> bool:
    entry = found.get(out.dtype)
    if entry is None or a.dtype != out.dtype or b.dtype != out.dtype:
        return False
    (m, k), (k2, n) = a.shape, b.shape
    if min(m, n, k) < 1 or k != k2 or out.shape != (m, n):
        return False
    po = _operand(out)
    if po is not None and po[0] == _TRANS:       # column-major out: out^T = b^T @ a^T
        a, b, out = b.T, a.T, out.T
        m, n = n, m
        po = _operand(out)
    pa, pb = _operand(a), _operand(b)
    if pa is None or pb is None or po is None or po[0] != _NO_TRANS:
        return False
    fn, ctype = entry
    fn(_ROW_MAJOR, pa[0], pb[0], m, n, k, ctype(1.0), a.ctypes.data, pa[1], b.ctypes.data, pb[1],
       ctype(1.0 if accumulate else 0.0), out.ctypes.data, po[1])
    return True


_FOUND = _load()


def thread_count_functions():
    """``(get, set)`` of the thread count of NumPy's OpenBLAS, called directly, or None.

    Calling them costs microseconds; going through threadpoolctl from a thread that is not
    its controlling thread needs a round trip to a control thread (about 80 us a change).
    """
    if not _FOUND:      # only the library whose GEMMs convgrad calls (SciPy may map another)
        return None
    for path in (_FOUND["path"],):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get_name, set_name, itype in (
                ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_", ctypes.c_int64),
                ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads", ctypes.c_int),
                ("openblas_get_num_threads", "openblas_set_num_threads", ctypes.c_int)):
            get, set_ = getattr(lib, get_name, None), getattr(lib, set_name, None)
            if get is None or set_ is None:
                continue
            get.restype, get.argtypes = ctypes.c_int, []
            set_.restype, set_.argtypes = None, [itype]
            return get, set_
    return None


def available() -> bool:
    """True when accumulating products go straight to NumPy's BLAS."""
    return bool(_FOUND)


def matmul_into(a: np.ndarray, b: np.ndarray, out: np.ndarray, accumulate: bool,
                tmp: np.ndarray | None = None) -> None:
    """``out (+)= a @ b`` for operands of shape (..., M, K), (..., K, N) and (..., M, N).

    ``tmp`` (the shape of ``out``), when given, holds the product on the NumPy path.
    """
    if out.ndim == 2 and _FOUND and _blas_call(_FOUND, a, b, out, accumulate):
        return
    if out.ndim == 3 and out.shape[0] == 1 and _FOUND and _blas_call(_FOUND, a[0], b[0], out[0], accumulate):
        return
    if accumulate:
        if tmp is None:
            out += np.matmul(a, b)
        else:
            np.matmul(a, b, out=tmp)
            out += tmp
    else:
        np.matmul(a, b, out=out)
