"""Automatic padding rules -> explicit per-axis pads (pure functions on shapes).

Forward SAME (TensorFlow ``SAME``, oneDNN Graph ``auto_pad=same_upper/same_lower``, and the
forward OpenVINO ops): the output is ``ceil(i / s)`` and the total pad is whatever makes
the last window end on the last input row, never negative::

    o     = ceil(i / s)
    total = max((o - 1) * s + d * (k - 1) + 1 - i, 0)
    same_upper (TF SAME): pb = total // 2          (the odd unit goes at the end)
    same_lower:           pb = total - total // 2  (the odd unit goes at the begin)

When ``total`` clamps at 0 the floor formula of spec.py gives the same ``o``. ``valid``
means no padding. The backprop-data rules of OpenVINO, which run in the other direction,
live in its front-end.
"""

from __future__ import annotations

from typing import Sequence

from .errors import ConvValueError
from .spec import effective_kernel

FORWARD_MODES = ("none", "explicit", "same_upper", "same_lower", "valid")


def same_pads(i: int, k: int, s: int, d: int, *, upper: bool) -> tuple[int, int]:
    """(pad_begin, pad_end) of one axis under the forward SAME rule."""
    o = -(-i // s)
    total = max((o - 1) * s + effective_kernel(k, d) - i, 0)
    small = total // 2
    return (small, total - small) if upper else (total - small, small)


def forward_auto_pads(op: str, mode: str, src: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                      dilations: Sequence[int], pads_begin: Sequence[int], pads_end: Sequence[int]
                      ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Resolve a forward auto_pad mode (lower case) to explicit pads; explicit pads pass through."""
    if mode in ("none", "explicit"):
        return tuple(pads_begin), tuple(pads_end)
    if mode == "valid":
        return (0,) * len(src), (0,) * len(src)
    if mode in ("same_upper", "same_lower"):
        pairs = [same_pads(i, k, s, d, upper=mode == "same_upper")
                 for i, k, s, d in zip(src, kernel, strides, dilations)]
        return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    raise ConvValueError(f"{op}: auto_pad must be one of {FORWARD_MODES}, but got {mode!r}")
