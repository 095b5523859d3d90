"""Hypothesis strategies and the fuzzing contract shared by every entry point's fuzz test.

The contract: a call either returns a correct result (checked by the caller against an
oracle) or raises ``convgrad.ConvError`` that is also a ValueError or TypeError and whose
message starts with the op's name. Anything else (another exception type, a crash, a
NumPy error from deep inside) fails the test.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

import convgrad

GOOD_DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
BAD_DTYPES = [np.bool_, np.complex64, np.object_, np.str_]
INT_DTYPES = [np.int8, np.int32, np.int64, np.uint8]

# Attribute values of every shape a user might pass by mistake.
odd_scalars = st.one_of(
    st.integers(-3, 6), st.just(0), st.just(2 ** 62), st.just(-(2 ** 62)),
    st.floats(allow_nan=True, allow_infinity=True), st.just(float("nan")),
    st.text(max_size=3), st.none(), st.booleans(), st.just(np.int64(2)), st.just(np.float32(1.0)),
)


def attr_values(nsp: int, lo: int = -1, hi: int = 4):
    """Mostly plausible per-axis attributes, sometimes wrong lengths or wrong types."""
    good = st.lists(st.integers(lo, hi), min_size=nsp, max_size=nsp)
    return st.one_of(good, good, good, st.integers(lo, hi),
                     st.lists(st.integers(lo, hi), min_size=0, max_size=nsp + 2),
                     st.lists(odd_scalars, min_size=nsp, max_size=nsp), odd_scalars)


def array(draw, shape, dtype):
    """A small random array of ``shape`` and ``dtype`` (strings/objects included)."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    size = int(np.prod(shape)) if shape else 1
    if np.dtype(dtype).kind in "fc":
        data = rng.standard_normal(size)
    else:
        data = rng.integers(-3, 4, size)
    return np.asarray(data.reshape(shape)).astype(dtype)


def expect_clean_error(op: str, exc: BaseException) -> None:
    """The fuzzing contract for an exception."""
    assert isinstance(exc, convgrad.ConvError), f"{op}: {type(exc).__name__}: {exc}"
    assert isinstance(exc, (ValueError, TypeError)), f"{op}: {type(exc).__mro__}"
    assert str(exc).startswith(op), f"message does not name {op}: {exc}"
