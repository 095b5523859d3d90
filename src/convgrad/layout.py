"""Layout strings -> axis permutations (pure). A layout is only a permutation.

Data: ``NCX`` = (N, C, *spatial) is canonical; ``NXC`` = (N, *spatial, C) (TensorFlow's
``NHWC``/``NDHWC``, ``NWC``). Weights: canonical ``OIX`` = (O, I, *kernel); ``XIO`` =
(*kernel, I, O) (TensorFlow's ``HWIO``); ``IOX`` = (I, O, *kernel); ``XOI`` = (*kernel, O, I).
"""

from __future__ import annotations

import numpy as np

from .errors import ConvValueError


def _perm(layout: str, ndim: int) -> tuple[int, ...]:
    """Permutation taking canonical axes (N/O first, C/I second, spatial after) to ``layout``."""
    nsp = ndim - 2
    pos = {"N": 0, "O": 0, "C": 1, "I": 1}
    out = []
    for ch in layout:
        if ch == "X":
            out.extend(range(2, 2 + nsp))
        else:
            out.append(pos[ch])
    return tuple(out)


def to_canonical(arr: np.ndarray, layout: str) -> np.ndarray:
    """A view of ``arr`` (in ``layout``) in canonical NCX / OIX order."""
    return arr.transpose(np.argsort(_perm(layout, arr.ndim)))


def from_canonical(arr: np.ndarray, layout: str) -> np.ndarray:
    """A C-contiguous copy of canonical ``arr`` in ``layout``."""
    return np.ascontiguousarray(arr.transpose(_perm(layout, arr.ndim)))


def shape_to_canonical(shape, layout: str) -> tuple[int, ...]:
    perm = np.argsort(_perm(layout, len(shape)))
    return tuple(int(shape[i]) for i in perm)


def shape_from_canonical(shape, layout: str) -> tuple[int, ...]:
    return tuple(int(shape[i]) for i in _perm(layout, len(shape)))


def normalize(op: str, name: str, value: object, allowed: tuple[str, ...]) -> str:
    """Case-insensitive layout / mode string -> its upper-case spelling in ``allowed``."""
    if not isinstance(value, str):
        from .errors import ConvTypeError
        raise ConvTypeError(f"{op}: {name} must be a string, one of {allowed}, but got {value!r}")
    up = value.upper()
    for a in allowed:
        if a.upper() == up:
            return a
    raise ConvValueError(f"{op}: {name} must be one of {allowed}, but got {value!r}")
