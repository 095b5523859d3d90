"""The canonical problem: :class:`ConvSpec` and the size formulas (pure, shapes only).

A ``ConvSpec`` is the only thing kernels see: channels-first data ``(N, C, *spatial)``,
grouped weights ``(O, C // groups, *kernel)`` and explicit, per-axis, non-negative pads.
Every framework quirk is translated into it by a front-end and never leaks past it.

Vocabulary (oneDNN's): ``mb`` batch, ``g`` groups, ``ic``/``oc`` total input/output
channels, ``src`` / ``dst`` spatial sizes, ``k`` kernel, ``s`` strides, ``d`` dilations
(1 = dense), ``pb``/``pe`` pads at the begin/end of each axis.

Forward output size per axis (floor semantics: input rows past the last window are never
read and get exactly zero gradient)::

    ek  = d * (k - 1) + 1                      # effective (dilated) kernel extent
    dst = floor((src + pb + pe - ek) / s) + 1

Transposed ("backprop data") natural output size per axis, the inverse of the above::

    src = s * (dst - 1) + ek - pb - pe (+ output_padding)
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .errors import ConvTypeError, ConvValueError

# Largest value any size or attribute may take: far beyond any real tensor, small enough
# that products of a few of them stay exact in int64 arithmetic where NumPy needs it.
MAX_DIM = 1 << 40


def _as_int(op: str, name: str, value: object) -> int:
    """One integer attribute entry: ints and NumPy integers, never bool, float or str."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        raise ConvTypeError(f"{op}: {name} must be integers, but got {value!r} ({type(value).__name__})")
    return operator.index(value)


def int_list(op: str, name: str, value: object) -> tuple[int, ...]:
    """A sequence of integers (list, tuple, 1-D integer array) as a tuple of Python ints."""
    if isinstance(value, (str, bytes)) or value is None:
        raise ConvTypeError(f"{op}: {name} must be a sequence of integers, but got {value!r}")
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise ConvValueError(f"{op}: {name} must be 1-D, but got an array of shape {value.shape}")
        value = value.tolist() if value.dtype.kind in "iu" else list(value)
    try:
        items = list(value)  # type: ignore[call-overload]
    except TypeError:
        raise ConvTypeError(f"{op}: {name} must be a sequence of integers, but got {value!r}") from None
    return tuple(_as_int(op, name, v) for v in items)


def per_axis(op: str, name: str, value: object, nsp: int, *, minimum: int) -> tuple[int, ...]:
    """A per-spatial-axis attribute: a scalar broadcasts; a sequence needs ``nsp`` entries."""
    if isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_)):
        vals = (operator.index(value),) * nsp
    elif isinstance(value, np.ndarray) and value.ndim == 0:
        vals = (_as_int(op, name, value.item()),) * nsp
    else:
        vals = int_list(op, name, value)
        if len(vals) != nsp:
            raise ConvValueError(
                f"{op}: {name} must have one entry per spatial axis ({nsp}), but got {len(vals)}: {list(vals)}")
    check_range(op, name, vals, minimum)
    return vals


def check_range(op: str, name: str, vals: Sequence[int], minimum: int) -> None:
    bad = [v for v in vals if v < minimum or v > MAX_DIM]
    if bad:
        what = "positive" if minimum == 1 else "non-negative" if minimum == 0 else f">= {minimum}"
        raise ConvValueError(f"{op}: {name} must be {what} integers (at most 2**40), but got {list(vals)}")


def effective_kernel(k: int, d: int) -> int:
    return d * (k - 1) + 1


def forward_size(src: int, k: int, s: int, d: int, pb: int, pe: int) -> int:
    """Forward output size of one axis (may be <= 0 when the window does not fit)."""
    return (src + pb + pe - effective_kernel(k, d)) // s + 1


def transposed_size(dst: int, k: int, s: int, d: int, pb: int, pe: int, output_padding: int = 0) -> int:
    """Natural output size of one axis of a transposed convolution (backprop data)."""
    return s * (dst - 1) + effective_kernel(k, d) - pb - pe + output_padding


@dataclass(frozen=True)
class ConvSpec:
    """One convolution problem in canonical form (all sizes resolved, pads explicit)."""

    mb: int
    ic: int
    oc: int
    groups: int
    src: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]

    def __hash__(self) -> int:      # the planners' caches look a spec up several times per call
        return self._hash

    @functools.cached_property      # (not a field: computed once, on first use)
    def _hash(self) -> int:
        return hash((self.mb, self.ic, self.oc, self.groups, self.src, self.kernel, self.strides,
                     self.dilations, self.pads_begin, self.pads_end))

    @property
    def nsp(self) -> int:
        return len(self.src)

    @property
    def icg(self) -> int:
        return self.ic // self.groups

    @property
    def ocg(self) -> int:
        return self.oc // self.groups

    @functools.cached_property       # read several times per call by the planners (not a field)
    def dst(self) -> tuple[int, ...]:
        return tuple(forward_size(*a) for a in zip(self.src, self.kernel, self.strides, self.dilations,
                                                   self.pads_begin, self.pads_end))

    @property
    def src_shape(self) -> tuple[int, ...]:
        return (self.mb, self.ic) + self.src

    @property
    def dst_shape(self) -> tuple[int, ...]:
        return (self.mb, self.oc) + self.dst

    @property
    def weights_shape(self) -> tuple[int, ...]:
        return (self.oc, self.icg) + self.kernel

    @property
    def flops(self) -> int:
        """Multiply-adds x 2 of one direction (the same count for fwd, bwd_data, bwd_weights)."""
        return 2 * self.mb * self.oc * self.icg * math.prod(self.kernel) * math.prod(self.dst)

    def __str__(self) -> str:
        """A benchdnn-style problem descriptor (dilations counted from 0 as benchdnn does)."""
        axes = "dhw"[3 - self.nsp:] if self.nsp <= 3 else None

        def part(tag: str, vals: Sequence[int]) -> str:
            if axes is None:
                return f"{tag}" + "x".join(map(str, vals))
            return "".join(f"{tag}{a}{v}" for a, v in zip(axes, vals))

        out = f"g{self.groups}mb{self.mb}ic{self.ic}"
        out += part("i", self.src) + f"oc{self.oc}" + part("o", self.dst) + part("k", self.kernel)
        out += part("s", self.strides) + part("p", self.pads_begin)
        out += part("pe", self.pads_end) + part("d", [d - 1 for d in self.dilations])
        return out


def _plain_key(value: object) -> object:
    """``value`` as a cache key when it is a plain ``int`` or a tuple/list of plain ints
    (what almost every caller passes), else None. Exact types only: ``True == 1`` and
    ``np.int64(1) == 1`` hash alike but must still reach the validation."""
    t = type(value)
    if t is int:
        return value
    if (t is tuple or t is list) and all(type(v) is int for v in value):
        return tuple(value)
    return None


# Specs already validated, keyed by their plain-int attributes (small calls repeat shapes;
# validating them again cost ~25 us of a 120 us call). Only successes are stored.
_SPECS: dict = {}
_SPECS_MAX = 1024


def make_spec(op: str, *, mb: int, ic: int, oc: int, groups: int, src: Sequence[int],
              kernel: Sequence[int], strides: object = 1, dilations: object = 1,
              pads_begin: object = 0, pads_end: object = 0) -> ConvSpec:
    """Validate attributes against the shapes and build a ConvSpec (raises ConvError).

    Plain-int attributes seen before return the spec built then (same validation outcome:
    the checks depend on nothing else)."""
    key = tuple(_plain_key(v) for v in (mb, ic, oc, groups, src, kernel, strides, dilations, pads_begin, pads_end))
    if None not in key:
        spec = _SPECS.get(key)
        if spec is None:
            spec = _make_spec(op, mb=mb, ic=ic, oc=oc, groups=groups, src=src, kernel=kernel, strides=strides,
                              dilations=dilations, pads_begin=pads_begin, pads_end=pads_end)
            if len(_SPECS) >= _SPECS_MAX:
                _SPECS.clear()
            _SPECS[key] = spec
        return spec
    return _make_spec(op, mb=mb, ic=ic, oc=oc, groups=groups, src=src, kernel=kernel, strides=strides,
                      dilations=dilations, pads_begin=pads_begin, pads_end=pads_end)


def _make_spec(op: str, *, mb: int, ic: int, oc: int, groups: int, src: Sequence[int],
               kernel: Sequence[int], strides: object, dilations: object,
               pads_begin: object, pads_end: object) -> ConvSpec:
    nsp = len(src)
    if nsp < 1:
        raise ConvValueError(f"{op}: data must have at least one spatial axis (rank >= 3), but got rank {nsp + 2}")
    src_t = tuple(int(v) for v in src)
    kernel_t = tuple(int(v) for v in kernel)
    check_range(op, "kernel", kernel_t, 1)
    s = per_axis(op, "strides", strides, nsp, minimum=1)
    d = per_axis(op, "dilations", dilations, nsp, minimum=1)
    pb = per_axis(op, "pads_begin", pads_begin, nsp, minimum=0)
    pe = per_axis(op, "pads_end", pads_end, nsp, minimum=0)
    g = groups
    if isinstance(g, (bool, np.bool_)) or not isinstance(g, (numbers.Integral, np.integer)):
        raise ConvTypeError(f"{op}: groups must be an integer, but got {g!r} ({type(g).__name__})")
    g = operator.index(g)
    if g < 1 or g > MAX_DIM:
        raise ConvValueError(f"{op}: groups must be a positive integer, but got {g}")
    if ic % g:
        raise ConvValueError(f"{op}: input channels ({ic}) must be divisible by groups ({g})")
    if oc % g:
        raise ConvValueError(f"{op}: output channels ({oc}) must be divisible by groups ({g})")
    for ax in range(nsp):
        ek = effective_kernel(kernel_t[ax], d[ax])
        padded = src_t[ax] + pb[ax] + pe[ax]
        if padded < ek:
            raise ConvValueError(
                f"{op}: spatial axis {ax}: the padded input must be at least the dilated kernel: "
                f"input {src_t[ax]} + pads_begin {pb[ax]} + pads_end {pe[ax]} = {padded}, but the "
                f"dilated kernel is dilation {d[ax]} * (kernel {kernel_t[ax]} - 1) + 1 = {ek}")
    return ConvSpec(mb=mb, ic=ic, oc=oc, groups=g, src=src_t, kernel=kernel_t, strides=s,
                    dilations=d, pads_begin=pb, pads_end=pe)


def describe_dst_mismatch(spec: ConvSpec, got: Sequence[int]) -> str:
    """Every term of the output-size formula, for a diff_dst whose shape is off."""
    terms = []
    for ax in range(spec.nsp):
        i, k, s, d = spec.src[ax], spec.kernel[ax], spec.strides[ax], spec.dilations[ax]
        pb, pe = spec.pads_begin[ax], spec.pads_end[ax]
        terms.append(f"axis {ax}: floor(({i} + {pb} + {pe} - ({d}*({k}-1)+1)) / {s}) + 1 = {forward_size(i, k, s, d, pb, pe)}")
    return (f"expected {spec.dst_shape} (N, O, *spatial) with {'; '.join(terms)}, "
            f"but got {tuple(got)}")
