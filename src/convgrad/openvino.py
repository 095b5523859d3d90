"""OpenVINO front-end (front-end layer): the opset1 convolution ops under their OpenVINO names.

    Convolution(...)(data, filters)                        filters (C_OUT, C_IN, *k)
    GroupConvolution(...)(data, filters)                   filters (GROUPS, C_OUT, C_IN, *k)
    ConvolutionBackpropData(...)(data, filters, output_shape=None)       (C_IN, C_OUT, *k)
    GroupConvolutionBackpropData(...)(data, filters, output_shape=None)  (GROUPS, C_IN, C_OUT, *k)

Data is channels first, ``(N, C, *spatial)`` with 1, 2 or 3 spatial axes (rank 3 to 5); the
number of groups comes from the filters' shape. Attributes are given at construction with
OpenVINO's names (``strides``, ``pads_begin``, ``pads_end``, ``dilations``, ``auto_pad``,
``output_padding``); an empty list means the default, a scalar broadcasts. Every op has
``infer_shape(...)``, a pure function of shapes (OpenVINO's shape inference), and a call that
validates, resolves the problem to the canonical one and runs ``convgrad.ops``. Every numeric
element type is accepted; integer types are exact (int64 accumulation, wrapping to the
element type like C). Results are new C-contiguous arrays of the data's element type.

Where this module deliberately differs from the OpenVINO 2026.4 runtime (see the OpDoc notes):
negative explicit pads are rejected (shape inference accepts them, the CPU plugin does not
compile them), spatial sizes of 0 are rejected, and the CPU plugin's 1x1 / stride-1 shortcut
that drops the pads of a backprop op whose output is as large as its input is not copied.
"""

from __future__ import annotations

import numbers
import operator
from dataclasses import dataclass

import numpy as np

from .errors import ConvValueError
from .layout import normalize
from .opdoc import Attr, OpDoc, register
from .ops import as_array, check_dtype, check_output_size, conv_backward_data, conv_forward, same_dtype
from .padding import forward_auto_pads
from .spec import MAX_DIM, ConvSpec, check_range, effective_kernel, int_list, make_spec

__all__ = ["Convolution", "ConvolutionBackpropData", "GroupConvolution", "GroupConvolutionBackpropData"]

AUTO_PADS = ("explicit", "same_upper", "same_lower", "valid")


# ---------------------------------------------------------------------------------------------
# Attributes and shapes (pure)


@dataclass(frozen=True)
class _IntArray:
    """An ``int[]`` attribute as given: its values, or one value to broadcast to every axis."""

    values: tuple[int, ...]
    scalar: bool

    def resolve(self, op: str, name: str, nsp: int, default: int) -> tuple[int, ...]:
        if self.scalar:
            return self.values * nsp
        if not self.values:  # OpenVINO: an empty list means the default on every axis
            return (default,) * nsp
        if len(self.values) != nsp:
            raise ConvValueError(f"{op}: {name} must have one entry per spatial axis ({nsp}), "
                                 f"but got {len(self.values)}: {list(self.values)}")
        return self.values


def _is_int(value: object) -> bool:
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))


def _int_array(op: str, name: str, value: object, minimum: int | None) -> _IntArray:
    if _is_int(value):
        vals, scalar = (operator.index(value),), True  # type: ignore[arg-type]
    else:
        vals, scalar = int_list(op, name, value), False
    if minimum is not None:
        check_range(op, name, vals, minimum)
    elif any(abs(v) > MAX_DIM for v in vals):
        raise ConvValueError(f"{op}: {name} must be integers of magnitude at most 2**40, but got {list(vals)}")
    return _IntArray(vals, scalar)


def _shape(op: str, name: str, shape: object) -> tuple[int, ...]:
    dims = int_list(op, name, shape)
    if any(v < 0 for v in dims):
        raise ConvValueError(f"{op}: {name} must have non-negative dimensions, but got {list(dims)}")
    return dims


def _check_data(op: str, data_shape: tuple[int, ...]) -> int:
    """Rank and spatial sizes of ``data``; returns the number of spatial axes."""
    if not 3 <= len(data_shape) <= 5:
        raise ConvValueError(f"{op}: data must have rank 3, 4 or 5 (N, C, *spatial), but got shape {data_shape}")
    if any(v < 1 for v in data_shape[2:]):
        raise ConvValueError(f"{op}: data spatial sizes must be positive, but got shape {data_shape}")
    return len(data_shape) - 2


def _split_filters(op: str, grouped: bool, in_first: bool, layout: str, data_shape: tuple[int, ...],
                   filters_shape: tuple[int, ...]) -> tuple[int, int, int, tuple[int, ...]]:
    """(groups, C_IN, C_OUT, kernel) of the filters, with the rank and the data channels checked.

    ``in_first``: the channel axes are (C_IN, C_OUT) (backprop ops), else (C_OUT, C_IN)."""
    rank = len(data_shape) + grouped
    if len(filters_shape) != rank:
        raise ConvValueError(f"{op}: filters must have rank {rank} {layout} for data of rank {len(data_shape)}, "
                             f"but got shape {filters_shape}")
    groups = filters_shape[0] if grouped else 1
    first, second = filters_shape[grouped:grouped + 2]
    c_in, c_out = (first, second) if in_first else (second, first)
    kernel = filters_shape[grouped + 2:]
    if groups < 1 or c_in < 1:
        raise ConvValueError(f"{op}: filters must have at least one group and one input channel {layout}, "
                             f"but got shape {filters_shape}")
    if any(k < 1 for k in kernel):
        raise ConvValueError(f"{op}: filters kernel sizes must be positive, but got shape {filters_shape}")
    if data_shape[1] != groups * c_in:
        if grouped:
            raise ConvValueError(f"{op}: data channels ({data_shape[1]}) must equal groups * C_IN "
                                 f"({groups} * {c_in} = {groups * c_in})")
        raise ConvValueError(f"{op}: data channels ({data_shape[1]}) must equal filters C_IN ({c_in})")
    return groups, c_in, c_out, kernel


def _output_shape(op: str, value: object) -> tuple[int, ...]:
    """The optional ``output_shape`` input: a 1-D integer array or a sequence of integers."""
    if not isinstance(value, (list, tuple, np.ndarray)):
        value = as_array(op, "output_shape", value)
    out = int_list(op, "output_shape", value)
    check_range(op, "output_shape", out, 0)
    return out


class _Op:
    """Attributes shared by the four ops (validated at construction; lengths at call time)."""

    NAME = ""
    GROUPED = False
    IN_FIRST = False   # filters channel axes (C_IN, C_OUT) rather than (C_OUT, C_IN)
    LAYOUT = ""

    def __init__(self, *, strides, pads_begin, pads_end, dilations, auto_pad="explicit"):
        op = self.NAME
        self.auto_pad = normalize(op, "auto_pad", auto_pad, AUTO_PADS)
        self.strides = _int_array(op, "strides", strides, 1)
        self.dilations = _int_array(op, "dilations", dilations, 1)
        # The pads are ignored unless auto_pad is explicit (their lengths are still checked).
        pad_min = 0 if self.auto_pad == "explicit" else None
        self.pads_begin = _int_array(op, "pads_begin", pads_begin, pad_min)
        self.pads_end = _int_array(op, "pads_end", pads_end, pad_min)

    def _common(self, nsp: int):
        op = self.NAME
        return (self.strides.resolve(op, "strides", nsp, 1), self.dilations.resolve(op, "dilations", nsp, 1),
                self.pads_begin.resolve(op, "pads_begin", nsp, 0), self.pads_end.resolve(op, "pads_end", nsp, 0))

    def _inputs(self, data, filters) -> tuple[np.ndarray, np.ndarray]:
        op = self.NAME
        data = as_array(op, "data", data)
        filters = as_array(op, "filters", filters)
        check_dtype(op, "data", data, integers=True)
        check_dtype(op, "filters", filters, integers=True)
        same_dtype(op, ("data", "filters"), (data, filters))
        return data, filters

    def __repr__(self) -> str:
        attrs = ", ".join(f"{k}={v.values if isinstance(v, _IntArray) else v!r}" for k, v in vars(self).items())
        return f"convgrad.openvino.{self.NAME}({attrs})"


# ---------------------------------------------------------------------------------------------
# Forward ops


class _Forward(_Op):
    def _spec(self, data_shape, filters_shape) -> ConvSpec:
        op = self.NAME
        data_shape = _shape(op, "data shape", data_shape)
        filters_shape = _shape(op, "filters shape", filters_shape)
        nsp = _check_data(op, data_shape)
        groups, c_in, c_out, kernel = _split_filters(op, self.GROUPED, self.IN_FIRST, self.LAYOUT, data_shape,
                                                     filters_shape)
        s, d, pb, pe = self._common(nsp)
        pb, pe = forward_auto_pads(op, self.auto_pad, data_shape[2:], kernel, s, d, pb, pe)
        # make_spec checks that every padded input axis holds the dilated kernel, as OpenVINO does.
        return make_spec(op, mb=data_shape[0], ic=groups * c_in, oc=groups * c_out, groups=groups,
                         src=data_shape[2:], kernel=kernel, strides=s, dilations=d, pads_begin=pb, pads_end=pe)

    def infer_shape(self, data_shape, filters_shape) -> tuple[int, ...]:
        """Output shape ``(N, [GROUPS *] C_OUT, *spatial_out)``, floor sizes (OpenVINO's rule)."""
        return self._spec(data_shape, filters_shape).dst_shape

    def __call__(self, data, filters) -> np.ndarray:
        data, filters = self._inputs(data, filters)
        spec = self._spec(data.shape, filters.shape)
        check_output_size(self.NAME, spec.dst_shape, data.dtype.itemsize)
        if 0 in spec.dst_shape:
            return np.zeros(spec.dst_shape, dtype=data.dtype)
        weights = filters.reshape(spec.weights_shape)  # (GROUPS, C_OUT, C_IN, *k) -> (GROUPS*C_OUT, C_IN, *k)
        return conv_forward(data, weights, strides=spec.strides, pads_begin=spec.pads_begin,
                            pads_end=spec.pads_end, dilations=spec.dilations, groups=spec.groups)


class Convolution(_Forward):
    """OpenVINO ``Convolution-1``: data ``(N, C_IN, *i)``, filters ``(C_OUT, C_IN, *k)``."""

    NAME = "Convolution"
    LAYOUT = "(C_OUT, C_IN, *kernel)"


class GroupConvolution(_Forward):
    """OpenVINO ``GroupConvolution-1``: data ``(N, GROUPS * C_IN, *i)``, filters
    ``(GROUPS, C_OUT, C_IN, *k)``, output ``(N, GROUPS * C_OUT, *o)``."""

    NAME = "GroupConvolution"
    GROUPED = True
    LAYOUT = "(GROUPS, C_OUT, C_IN, *kernel)"


# ---------------------------------------------------------------------------------------------
# Backprop-data (transposed) ops
#
# Derivation. Per spatial axis, the transposed convolution of data x (size i) with a kernel w
# (size k) scatters every x[j] * w[t] to position q = s*j + d*t of a "full" result
#
#     full[q] = sum_{j, t : s*j + d*t = q} x[j] * w[t],     q in [0, L),  L = s*(i-1) + d*(k-1) + 1.
#
# OpenVINO's output is a window of it, out[o] = full[o + P] for o in [0, O), zero wherever
# o + P falls outside [0, L) (measured on the runtime, see PEERS.md):
#
#     no output_shape:   explicit: P = pads_begin, O = L - pads_begin - pads_end + output_padding
#                        valid / same_*: P = 0,    O = L + output_padding    (pads ignored)
#     with output_shape: O = output_shape; P = pads_begin (explicit, pads_end unused), 0 (valid),
#                        ceil(tot/2) (same_upper) or floor(tot/2) (same_lower),
#                        tot = max(L + output_padding - O, 0)
#
# The canonical conv_backward_data computes exactly such a window when it lies inside [0, L):
# a forward problem with src size n = b - a and pads (a, L - b) has padded size L and
# dst = floor((L - ek) / s) + 1 = i, so x is its diff_dst, and its diff_src is full[a : b] (the
# padded rows are dropped). So [a, b) = [P, P + O) clipped to [0, L) is computed canonically
# and written at offset a - P of a zero output: this covers crops (O < natural size, negative
# output_padding), zero fills (O > L, output_padding past the pads) and offsets beyond L alike.


@dataclass(frozen=True)
class _Transposed:
    """A resolved backprop-data problem: the window [offset, offset + out) of the full result."""

    mb: int
    groups: int
    c_in: int
    c_out: int
    src: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    offset: tuple[int, ...]
    out: tuple[int, ...]

    @property
    def full(self) -> tuple[int, ...]:
        return tuple(s * (i - 1) + effective_kernel(k, d)
                     for i, k, s, d in zip(self.src, self.kernel, self.strides, self.dilations))

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.mb, self.groups * self.c_out) + self.out


class _Backprop(_Op):
    def __init__(self, *, strides, pads_begin, pads_end, dilations, auto_pad="explicit", output_padding=None):
        super().__init__(strides=strides, pads_begin=pads_begin, pads_end=pads_end, dilations=dilations,
                         auto_pad=auto_pad)
        self.output_padding = _int_array(self.NAME, "output_padding", () if output_padding is None else output_padding,
                                         None)

    def _problem(self, data_shape, filters_shape, output_shape) -> _Transposed:
        op = self.NAME
        data_shape = _shape(op, "data shape", data_shape)
        filters_shape = _shape(op, "filters shape", filters_shape)
        nsp = _check_data(op, data_shape)
        groups, c_in, c_out, kernel = _split_filters(op, self.GROUPED, self.IN_FIRST, self.LAYOUT, data_shape,
                                                     filters_shape)
        s, d, pb, pe = self._common(nsp)
        op_pad = self.output_padding.resolve(op, "output_padding", nsp, 0)
        src = data_shape[2:]
        full = [si * (i - 1) + effective_kernel(k, di) for i, k, si, di in zip(src, kernel, s, d)]
        if output_shape is None:
            if self.auto_pad == "explicit":
                offset = pb
                out = tuple(L - b - e + p for L, b, e, p in zip(full, pb, pe, op_pad))
            else:
                offset = (0,) * nsp
                out = tuple(L + p for L, p in zip(full, op_pad))
            bad = [ax for ax in range(nsp) if out[ax] < 0]
            if bad:
                ax = bad[0]
                pads = f" - pads_begin {pb[ax]} - pads_end {pe[ax]}" if self.auto_pad == "explicit" else ""
                raise ConvValueError(
                    f"{op}: output spatial sizes must be non-negative, but got {list(out)}: axis {ax}: "
                    f"strides {s[ax]} * (data {src[ax]} - 1) + dilations {d[ax]} * (kernel {kernel[ax]} - 1) + 1"
                    f"{pads} + output_padding {op_pad[ax]} = {out[ax]}")
        else:
            out = _output_shape(op, output_shape)
            if len(out) != nsp:
                raise ConvValueError(f"{op}: output_shape must have one entry per spatial axis ({nsp}), "
                                     f"but got {len(out)}: {list(out)}")
            if self.auto_pad == "explicit":
                offset = pb
            elif self.auto_pad == "valid":
                offset = (0,) * nsp
            else:  # the reverse of forward SAME: the odd unit of the total crop at the end for upper
                tot = [max(L + p - o, 0) for L, p, o in zip(full, op_pad, out)]
                offset = tuple(t - t // 2 if self.auto_pad == "same_upper" else t // 2 for t in tot)
        return _Transposed(mb=data_shape[0], groups=groups, c_in=c_in, c_out=c_out, src=src, kernel=kernel,
                           strides=s, dilations=d, offset=tuple(offset), out=tuple(out))

    def infer_shape(self, data_shape, filters_shape, output_shape=None) -> tuple[int, ...]:
        """Output shape ``(N, [GROUPS *] C_OUT, *spatial_out)`` from shapes only."""
        return self._problem(data_shape, filters_shape, output_shape).shape

    def __call__(self, data, filters, output_shape=None) -> np.ndarray:
        data, filters = self._inputs(data, filters)
        pr = self._problem(data.shape, filters.shape, output_shape)
        check_output_size(self.NAME, pr.shape, data.dtype.itemsize)
        out = np.zeros(pr.shape, dtype=data.dtype)
        full = pr.full
        lo = [min(max(p, 0), L) for p, L in zip(pr.offset, full)]
        hi = [min(max(p + o, 0), L) for p, o, L in zip(pr.offset, pr.out, full)]
        if out.size == 0 or any(h <= l for l, h in zip(lo, hi)):
            return out  # nothing of the full result falls inside the requested window
        # (GROUPS, C_IN, C_OUT, *k) -> canonical (O, C // groups, *k) = (GROUPS*C_IN, C_OUT, *k)
        weights = filters.reshape((pr.groups * pr.c_in, pr.c_out) + pr.kernel)
        part = conv_backward_data(data, weights, [h - l for l, h in zip(lo, hi)], strides=pr.strides,
                                  pads_begin=lo, pads_end=[L - h for L, h in zip(full, hi)],
                                  dilations=pr.dilations, groups=pr.groups)
        out[(Ellipsis,) + tuple(slice(l - p, h - p) for l, h, p in zip(lo, hi, pr.offset))] = part
        return out


class ConvolutionBackpropData(_Backprop):
    """OpenVINO ``ConvolutionBackpropData-1``: data ``(N, C_IN, *i)``, filters ``(C_IN, C_OUT, *k)``."""

    NAME = "ConvolutionBackpropData"
    IN_FIRST = True
    LAYOUT = "(C_IN, C_OUT, *kernel)"


class GroupConvolutionBackpropData(_Backprop):
    """OpenVINO ``GroupConvolutionBackpropData-1``: data ``(N, GROUPS * C_IN, *i)``, filters
    ``(GROUPS, C_IN, C_OUT, *k)``, output ``(N, GROUPS * C_OUT, *o)``."""

    NAME = "GroupConvolutionBackpropData"
    GROUPED = True
    IN_FIRST = True
    LAYOUT = "(GROUPS, C_IN, C_OUT, *kernel)"


# ---------------------------------------------------------------------------------------------
# Op documentation

_DTYPES = "f16, bf16, f32, f64, every integer type (exact, wraps like C)"
_CHECKED = "openvino 2026.4 CPU runtime (f32, f64, i32); float64 reference"


def _attrs(backprop: bool) -> tuple[Attr, ...]:
    attrs = (
        Attr("strides", "int[]", "required", "positive; [] = all 1"),
        Attr("pads_begin", "int[]", "required", "non-negative; [] = all 0; ignored unless auto_pad is explicit"),
        Attr("pads_end", "int[]", "required", "non-negative; [] = all 0; ignored unless auto_pad is explicit"),
        Attr("dilations", "int[]", "required", "positive; [] = all 1"),
        Attr("auto_pad", "string", "explicit", "explicit, same_upper, same_lower, valid (any case)"),
    )
    if backprop:
        attrs += (Attr("output_padding", "int[]", "all 0", "any integer (negative crops; >= strides allowed)"),)
    return attrs


_FWD_NOTES = ("Output size floor((i + pb + pe - d*(k-1) - 1) / s) + 1; same_upper/same_lower pad as the forward "
              "SAME rule (odd unit at the end / begin); the padded input must hold the dilated kernel.")
_BWD_NOTES = ("Output window of the full transposed result L = s*(i-1) + d*(k-1) + 1: without output_shape "
              "explicit gives L - pb - pe + output_padding, the other modes L + output_padding (pads ignored); "
              "with output_shape the output is exactly output_shape, starting at pads_begin (explicit), 0 (valid) "
              "or ceil/floor(tot/2) (same_upper/same_lower), tot = max(L + output_padding - output_shape, 0); "
              "outside the full result it is zero. Differences from the OpenVINO 2026.4 CPU plugin: negative "
              "explicit pads are rejected (the plugin cannot compile them); its 1x1-kernel, stride-1 shortcut "
              "that drops the pads when the output is as large as the input is not copied.")

register(OpDoc("OpenVINO", "Convolution",
               "convgrad.openvino.Convolution(strides=, pads_begin=, pads_end=, dilations=, auto_pad='explicit')"
               "(data, filters)",
               ("data", "filters"), _attrs(False), "data (N, C_IN, *x); filters (C_OUT, C_IN, *k)", _DTYPES,
               _CHECKED, _FWD_NOTES))
register(OpDoc("OpenVINO", "GroupConvolution",
               "convgrad.openvino.GroupConvolution(strides=, pads_begin=, pads_end=, dilations=, auto_pad='explicit')"
               "(data, filters)",
               ("data", "filters"), _attrs(False),
               "data (N, GROUPS*C_IN, *x); filters (GROUPS, C_OUT, C_IN, *k)", _DTYPES, _CHECKED, _FWD_NOTES))
register(OpDoc("OpenVINO", "ConvolutionBackpropData",
               "convgrad.openvino.ConvolutionBackpropData(strides=, pads_begin=, pads_end=, dilations=, "
               "auto_pad='explicit', output_padding=None)(data, filters, output_shape=None)",
               ("data", "filters", "output_shape"), _attrs(True),
               "data (N, C_IN, *x); filters (C_IN, C_OUT, *k); output (N, C_OUT, *o)", _DTYPES, _CHECKED, _BWD_NOTES))
register(OpDoc("OpenVINO", "GroupConvolutionBackpropData",
               "convgrad.openvino.GroupConvolutionBackpropData(strides=, pads_begin=, pads_end=, dilations=, "
               "auto_pad='explicit', output_padding=None)(data, filters, output_shape=None)",
               ("data", "filters", "output_shape"), _attrs(True),
               "data (N, GROUPS*C_IN, *x); filters (GROUPS, C_IN, C_OUT, *k); output (N, GROUPS*C_OUT, *o)",
               _DTYPES, _CHECKED + " (one group: via ConvolutionBackpropData, the plugin cannot compile it)",
               _BWD_NOTES))
