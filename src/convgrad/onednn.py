"""oneDNN Graph front-end (front-end layer): the six convolution ops of the oneDNN Graph API.

``Convolution``, ``ConvolutionBackwardData``, ``ConvolutionBackwardWeights``,
``ConvTranspose``, ``ConvTransposeBackwardData`` and ``ConvTransposeBackwardWeights``, under
their oneDNN Graph names. Attributes are given at construction (keyword-only, oneDNN Graph
names and defaults; required ones have no default), inputs at call time in oneDNN Graph's
input order, and ``infer_shape(...)`` gives the output shape from input shapes alone.

This module only translates: layouts become permutations (``convgrad.layout``), ``auto_pad``
becomes explicit pads, and every op becomes one call of the canonical core
(``conv_forward`` / ``conv_backward_data`` / ``conv_backward_weights``). Every attribute and
shape is validated here, before the core runs, with messages that name the op class.

Layouts (oneDNN Graph's letters; ``X`` = the spatial axes)::

    data_format     NXC (default) = (N, *spatial, C)      NCX = (N, C, *spatial)
    Convolution*    XIO (default) = (*k, C_in/g, C_out)   OIX = (C_out, C_in/g, *k)
    ConvTranspose*  XOI (default) = (*k, C_out/g, C_in)   IOX = (C_in, C_out/g, *k)

Groups stay folded into the first weights dimension (O for convolution, I for ConvTranspose).
A ConvTranspose is the data gradient of the convolution that maps its dst back to its src,
so its IOX weights are exactly that convolution's OIX weights and XOI its XIO.

Semantics measured against oneDNN 3.13.2 (PyPI ``onednn`` 2026.1.0) through the ctypes
oracle in ``tests/oracles/onednn_graph.py``; where the library itself is inconsistent the
choice made here is stated (and repeated in each op's OpDoc notes):

* ``auto_pad`` replaces ``pads_begin``/``pads_end`` (which must still be valid). Convolution,
  ConvolutionBackwardData (on ``dst_shape``), ConvolutionBackwardWeights,
  ConvTransposeBackwardData and ConvTransposeBackwardWeights (on ``diff_dst``) use the
  forward rule of ``convgrad.padding``; ConvTranspose uses the library's deconvolution rule,
  ``total = max(0, d*(k-1)+1 - s)`` whatever the input size. ``same_upper`` puts the odd
  unit at the end, ``same_lower`` at the beginning.
* ConvTranspose output size: ``s*(i-1) + d*(k-1)+1 - pb - pe + output_padding`` with
  ``0 <= output_padding < s`` (the library aborts otherwise); rows past the transposed
  convolution's reach are zero.
* ConvolutionBackwardData: ``output_padding`` has no effect (``dst_shape`` fixes the output).
* Element types f32, bf16, f16 as in the library, plus f64; the result has the inputs'
  type. Half types accumulate in float32 and round once (bias included).
* Differences from the library, all where it aborts, fails or miscomputes: it cannot compile
  ConvolutionBackwardData with groups > 1, runs ConvTransposeBackwardData undilated, pads
  ConvTransposeBackwardWeights' kernel by another same_* rule than its shape inference, and
  aborts the process on many bad inputs; convgrad computes the first three and raises a
  ConvError for the rest. It also returns zeros for an empty output (stride 1, input one row
  short of the dilated kernel), where convgrad requires the padded input to cover the kernel.
  Any number of spatial axes is accepted (oneDNN documents 1 to 3).
"""

from __future__ import annotations

import numbers
import operator
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from . import layout
from .errors import ConvTypeError, ConvValueError
from .opdoc import Attr, OpDoc, register
from .ops import as_array, check_dtype, conv_backward_data, conv_backward_weights, conv_forward, same_dtype
from .padding import forward_auto_pads
from .spec import MAX_DIM, ConvSpec, effective_kernel, forward_size, int_list, make_spec

__all__ = ["Convolution", "ConvolutionBackwardData", "ConvolutionBackwardWeights", "ConvTranspose",
           "ConvTransposeBackwardData", "ConvTransposeBackwardWeights"]

FRAMEWORK = "oneDNN Graph"
DATA_FORMATS = ("NXC", "NCX")
CONV_WEIGHTS_FORMATS = ("XIO", "OIX")
DECONV_WEIGHTS_FORMATS = ("XOI", "IOX")
AUTO_PADS = ("none", "same_upper", "same_lower", "valid")
# Length of the library's default list attributes (its JSON dumps write 12 zeros).
DNNL_MAX_NDIMS = 12

# ConvTranspose weights seen as the weights of the convolution it is the data gradient of:
# its I (input channels) is that convolution's O, its O that convolution's I.
_DECONV_AS_CONV = {"IOX": "OIX", "XOI": "XIO"}


# --------------------------------------------------------------------------------------
# Attribute checks (construction time: types, signs, mutual lengths)
# --------------------------------------------------------------------------------------
def _int_attr_list(op: str, name: str, value: object, minimum: int) -> tuple[int, ...]:
    vals = int_list(op, name, value)
    if not vals:
        raise ConvValueError(f"{op}: {name} must have one entry per spatial axis, but got an empty list")
    bad = [v for v in vals if v < minimum or v > MAX_DIM]
    if bad:
        what = "positive" if minimum == 1 else "non-negative"
        raise ConvValueError(f"{op}: {name} must contain {what} integers, but got {list(vals)}")
    return vals


def _groups(op: str, value: object) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        raise ConvTypeError(f"{op}: groups must be an integer, but got {value!r} ({type(value).__name__})")
    g = operator.index(value)
    if g < 1 or g > MAX_DIM:
        raise ConvValueError(f"{op}: groups must be a positive integer, but got {g}")
    return g


def _choice(op: str, name: str, value: object, allowed: tuple[str, ...]) -> str:
    """Case-insensitive string attribute; the library writes ``None``/``SAME_UPPER``, its docs
    ``none``/``same_upper``: both are accepted."""
    return layout.normalize(op, name, value, allowed)


def _optional_shape(op: str, name: str, value: object) -> Optional[tuple[int, ...]]:
    """A shape attribute; ``None`` and the library's unset default (12 zeros) mean absent."""
    if value is None:
        return None
    vals = int_list(op, name, value)
    if len(vals) == DNNL_MAX_NDIMS and not any(vals):
        return None
    bad = [v for v in vals if v < 0 or v > MAX_DIM]
    if bad:
        raise ConvValueError(f"{op}: {name} must contain non-negative integers, but got {list(vals)}")
    return vals


def _optional_pads(op: str, name: str, value: object) -> Optional[tuple[int, ...]]:
    if value is None:
        return None
    vals = int_list(op, name, value)
    bad = [v for v in vals if v < 0 or v > MAX_DIM]
    if bad:
        raise ConvValueError(f"{op}: {name} must contain non-negative integers, but got {list(vals)}")
    return vals


# --------------------------------------------------------------------------------------
# Shape helpers (call time; pure functions of shapes)
# --------------------------------------------------------------------------------------
def _shape_of(op: str, name: str, shape: object) -> tuple[int, ...]:
    vals = int_list(op, name, shape)
    bad = [v for v in vals if v < 0]
    if bad:
        raise ConvValueError(f"{op}: {name} must contain non-negative sizes, but got {list(vals)}")
    return vals


def _split_data(shape: Sequence[int], fmt: str) -> tuple[int, int, tuple[int, ...]]:
    """(N, C, spatial) of a data shape in ``fmt``."""
    n, c, *sp = layout.shape_to_canonical(shape, fmt)
    return n, c, tuple(sp)


def _split_weights(shape: Sequence[int], fmt: str) -> tuple[int, int, tuple[int, ...]]:
    """(first, second, kernel) of a weights shape: (O, I/g) for XIO/OIX; (I, O/g) for XOI/IOX."""
    first, second, *k = layout.shape_to_canonical(shape, _DECONV_AS_CONV.get(fmt, fmt))
    return first, second, tuple(k)


def _join_data(n: int, c: int, sp: Sequence[int], fmt: str) -> tuple[int, ...]:
    return layout.shape_from_canonical((n, c, *sp), fmt)


def _join_weights(first: int, second: int, k: Sequence[int], fmt: str) -> tuple[int, ...]:
    return layout.shape_from_canonical((first, second, *k), _DECONV_AS_CONV.get(fmt, fmt))


def _layout_name(fmt: str) -> str:
    return {"NXC": "(N, *spatial, C)", "NCX": "(N, C, *spatial)", "XIO": "(*kernel, I, O)",
            "OIX": "(O, I, *kernel)", "XOI": "(*kernel, O, I)", "IOX": "(I, O, *kernel)"}[fmt]


def _size_terms(src: Sequence[int], kernel: Sequence[int], s: Sequence[int], d: Sequence[int],
                pb: Sequence[int], pe: Sequence[int]) -> str:
    """Every term of the forward output-size formula, axis by axis."""
    return "; ".join(
        f"axis {ax}: floor(({i} + {b} + {e} - ({dd}*({k}-1)+1)) / {ss}) + 1 = {forward_size(i, k, ss, dd, b, e)}"
        for ax, (i, k, ss, dd, b, e) in enumerate(zip(src, kernel, s, d, pb, pe)))


def _deconv_auto_pads(mode: str, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
                      pads_begin: Sequence[int], pads_end: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """ConvTranspose's auto_pad: the output is s * i (+ output_padding) whatever i is, so the
    total pad is fixed by the kernel alone: total = max(0, d*(k-1)+1 - s)."""
    if mode == "none":
        return tuple(pads_begin), tuple(pads_end)
    if mode == "valid":
        return (0,) * len(kernel), (0,) * len(kernel)
    tot = [max(0, effective_kernel(k, d) - s) for k, s, d in zip(kernel, strides, dilations)]
    small = [t // 2 for t in tot]
    if mode == "same_upper":
        return tuple(small), tuple(t - b for t, b in zip(tot, small))
    return tuple(t - b for t, b in zip(tot, small)), tuple(small)


@dataclass(frozen=True)
class _Plan:
    """One op call resolved to a canonical problem (shapes only)."""

    direction: str                    # "fwd", "bwd_data" or "bwd_weights" of ``spec``
    spec: ConvSpec                    # the canonical forward convolution
    out_shape: tuple[int, ...]        # the result, in the op's own layout
    tail: tuple[int, ...] = ()        # ConvTranspose: zero rows appended per spatial axis


class _ConvOpBase:
    """Attributes shared by the six ops; subclasses add their own and the call logic."""

    op_type = ""
    _weights_formats: tuple[str, ...] = CONV_WEIGHTS_FORMATS

    def _init_common(self, strides, pads_begin, pads_end, dilations, auto_pad, groups, data_format,
                     weights_format) -> None:
        op = self.op_type
        self.strides = _int_attr_list(op, "strides", strides, 1)
        self.pads_begin = _int_attr_list(op, "pads_begin", pads_begin, 0)
        self.pads_end = _int_attr_list(op, "pads_end", pads_end, 0)
        self.dilations = _int_attr_list(op, "dilations", dilations, 1)
        n = len(self.strides)
        for name in ("pads_begin", "pads_end", "dilations"):
            vals = getattr(self, name)
            if len(vals) != n:
                raise ConvValueError(f"{op}: {name} must have as many entries as strides ({n}), "
                                     f"but got {len(vals)}: {list(vals)}")
        self.auto_pad = _choice(op, "auto_pad", auto_pad, AUTO_PADS)
        self.groups = _groups(op, groups)
        self.data_format = _choice(op, "data_format", data_format, DATA_FORMATS)
        self.weights_format = _choice(op, "weights_format", weights_format, self._weights_formats)

    # ---- call-time checks -----------------------------------------------------------------
    def _rank(self, name: str, shape: Sequence[int]) -> int:
        if len(shape) < 3:
            raise ConvValueError(f"{self.op_type}: {name} must have rank >= 3 "
                                 f"({self.data_format} = {_layout_name(self.data_format)}), "
                                 f"but got shape {tuple(shape)}")
        nsp = len(shape) - 2
        if nsp != len(self.strides):
            raise ConvValueError(
                f"{self.op_type}: strides, dilations, pads_begin and pads_end must have one entry per "
                f"spatial axis ({nsp}, from {name} of shape {tuple(shape)}), but got {len(self.strides)}: "
                f"strides={list(self.strides)}")
        return nsp

    def _same_rank(self, name: str, shape: Sequence[int], rank: int, ref: str) -> None:
        if len(shape) != rank:
            raise ConvValueError(f"{self.op_type}: {name} must have the rank of {ref} ({rank}), "
                                 f"but got shape {tuple(shape)}")

    def _output_padding(self, nsp: int) -> tuple[int, ...]:
        """First ``nsp`` entries; longer lists (the library's 12-entry default) must be zero beyond."""
        vals = self.output_padding
        if vals is None:
            return (0,) * nsp
        if len(vals) < nsp or any(vals[nsp:]):
            raise ConvValueError(f"{self.op_type}: output_padding must have one entry per spatial axis ({nsp}) "
                                 f"(longer lists only with zeros beyond), but got {list(vals)}")
        return tuple(vals[:nsp])

    def _pads(self, src: Sequence[int], kernel: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Explicit pads of the forward convolution over ``src`` (forward auto_pad rule)."""
        return forward_auto_pads(self.op_type, self.auto_pad, src, kernel, self.strides, self.dilations,
                                 self.pads_begin, self.pads_end)

    def _spec(self, *, mb: int, ic: int, oc: int, src: Sequence[int], kernel: Sequence[int],
              pads: tuple[Sequence[int], Sequence[int]]) -> ConvSpec:
        return make_spec(self.op_type, mb=mb, ic=ic, oc=oc, groups=self.groups, src=src, kernel=kernel,
                         strides=self.strides, dilations=self.dilations, pads_begin=pads[0], pads_end=pads[1])

    def _pad_note(self) -> str:
        return "" if self.auto_pad == "none" else f" (pads from auto_pad={self.auto_pad})"

    def _check_groups(self, what: str, channels: int) -> None:
        if channels % self.groups:
            raise ConvValueError(f"{self.op_type}: {what} ({channels}) must be divisible by groups ({self.groups})")

    # ---- running a plan -------------------------------------------------------------------
    def _arrays(self, names: Sequence[str], values: Sequence[object]) -> list[np.ndarray]:
        arrs = [as_array(self.op_type, n, v) for n, v in zip(names, values)]
        for n, a in zip(names, arrs):
            check_dtype(self.op_type, n, a, integers=False)
        same_dtype(self.op_type, names, arrs)
        return arrs

    def attrs(self) -> dict:
        """The attributes as oneDNN Graph names them (strings in the library's spelling)."""
        out = {"strides": list(self.strides), "pads_begin": list(self.pads_begin),
               "pads_end": list(self.pads_end), "dilations": list(self.dilations),
               "auto_pad": "None" if self.auto_pad == "none" else self.auto_pad.upper(),
               "groups": self.groups, "data_format": self.data_format, "weights_format": self.weights_format}
        for extra in ("output_padding", "weights_shape", "dst_shape"):
            if hasattr(self, extra):
                val = getattr(self, extra)
                out[extra] = None if val is None else list(val)
        return out

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v!r}" for k, v in self.attrs().items())
        return f"convgrad.onednn.{self.op_type}({body})"


def _with_bias(run, dst_arrays: Sequence[np.ndarray], bias: Optional[np.ndarray],
               dt: np.dtype, c_axis: int) -> np.ndarray:
    """``run(*arrays)`` (canonical NCX result) plus bias on the channel axis, rounded once."""
    if bias is None:
        return run(*dst_arrays)
    # Half types: compute in float32 (exact widening), add the bias there, round once.
    wide = np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)
    out = run(*[a.astype(wide) for a in dst_arrays])
    shape = [1] * out.ndim
    shape[c_axis] = -1
    return (out + bias.astype(wide).reshape(shape)).astype(dt)


def _check_bias(op: str, bias: np.ndarray, channels: int) -> None:
    if bias.ndim != 1 or bias.shape[0] != channels:
        raise ConvValueError(f"{op}: bias must have shape ({channels},) (one value per output channel), "
                             f"but got {bias.shape}")


# --------------------------------------------------------------------------------------
# Convolution family
# --------------------------------------------------------------------------------------
class Convolution(_ConvOpBase):
    """oneDNN Graph ``Convolution``: ``dst = conv(src, weights) (+ bias)``."""

    op_type = "Convolution"

    def __init__(self, *, strides, pads_begin, pads_end, dilations, auto_pad="none", groups=1,
                 data_format="NXC", weights_format="XIO"):
        self._init_common(strides, pads_begin, pads_end, dilations, auto_pad, groups, data_format,
                          weights_format)

    def _plan(self, src_shape, weights_shape, bias_shape=None) -> _Plan:
        op = self.op_type
        src_shape = _shape_of(op, "src shape", src_shape)
        weights_shape = _shape_of(op, "weights shape", weights_shape)
        self._rank("src", src_shape)
        self._same_rank("weights", weights_shape, len(src_shape), "src")
        n, c, sp = _split_data(src_shape, self.data_format)
        o, i, k = _split_weights(weights_shape, self.weights_format)
        self._check_groups("src channels", c)
        self._check_groups("weights O (output channels)", o)
        if i != c // self.groups:
            raise ConvValueError(
                f"{op}: weights I must equal src channels / groups ({c} / {self.groups} = {c // self.groups}), "
                f"but got weights shape {tuple(weights_shape)} ({self.weights_format} = "
                f"{_layout_name(self.weights_format)}) with I = {i}")
        if bias_shape is not None:
            bias_shape = _shape_of(op, "bias shape", bias_shape)
            if tuple(bias_shape) != (o,):
                raise ConvValueError(f"{op}: bias must have shape ({o},) (one value per output channel), "
                                     f"but got {tuple(bias_shape)}")
        spec = self._spec(mb=n, ic=c, oc=o, src=sp, kernel=k, pads=self._pads(sp, k))
        return _Plan("fwd", spec, _join_data(n, o, spec.dst, self.data_format))

    def infer_shape(self, src_shape, weights_shape, bias_shape=None) -> tuple:
        """dst shape (``data_format`` layout) from the input shapes; computes nothing."""
        return self._plan(src_shape, weights_shape, bias_shape).out_shape

    def __call__(self, src, weights, bias=None) -> np.ndarray:
        names, vals = ["src", "weights"], [src, weights]
        if bias is not None:
            names.append("bias")
            vals.append(bias)
        arrs = self._arrays(names, vals)
        plan = self._plan(arrs[0].shape, arrs[1].shape, None if bias is None else arrs[2].shape)
        s = plan.spec
        x = layout.to_canonical(arrs[0], self.data_format)
        w = layout.to_canonical(arrs[1], self.weights_format)

        def run(x_, w_):
            return conv_forward(x_, w_, strides=s.strides, pads_begin=s.pads_begin, pads_end=s.pads_end,
                                dilations=s.dilations, groups=s.groups)

        out = _with_bias(run, [x, w], arrs[2] if bias is not None else None, arrs[0].dtype, 1)
        return layout.from_canonical(out, self.data_format)


class ConvolutionBackwardData(_ConvOpBase):
    """oneDNN Graph ``ConvolutionBackwardData``: ``diff_src`` of Convolution from ``diff_dst``.

    ``dst_shape`` (attribute or input; the input wins) is the full shape of the result, i.e.
    of the forward ``src``, in ``data_format`` layout; one of the two is required.
    """

    op_type = "ConvolutionBackwardData"

    def __init__(self, *, strides, pads_begin, pads_end, dilations, auto_pad="none", groups=1,
                 data_format="NXC", weights_format="XIO", output_padding=None, dst_shape=None):
        self._init_common(strides, pads_begin, pads_end, dilations, auto_pad, groups, data_format,
                          weights_format)
        self.output_padding = _optional_pads(self.op_type, "output_padding", output_padding)
        self.dst_shape = _optional_shape(self.op_type, "dst_shape", dst_shape)

    def _plan(self, diff_dst_shape, weights_shape, dst_shape=None) -> _Plan:
        op = self.op_type
        diff_dst_shape = _shape_of(op, "diff_dst shape", diff_dst_shape)
        weights_shape = _shape_of(op, "weights shape", weights_shape)
        nsp = self._rank("diff_dst", diff_dst_shape)
        self._same_rank("weights", weights_shape, len(diff_dst_shape), "diff_dst")
        self._output_padding(nsp)   # validated; the result's size comes from dst_shape alone
        if dst_shape is not None:
            src_shape = _shape_of(op, "dst_shape (input)", dst_shape)
        elif self.dst_shape is not None:
            src_shape = self.dst_shape
        else:
            raise ConvValueError(f"{op}: dst_shape (the shape of diff_src, i.e. of the forward src) must be "
                                 f"given as the attribute or the third input, but got neither")
        self._same_rank("dst_shape", src_shape, len(diff_dst_shape), "diff_dst")
        n, c, sp = _split_data(src_shape, self.data_format)
        o, i, k = _split_weights(weights_shape, self.weights_format)
        self._check_groups("weights O (output channels)", o)
        if c != i * self.groups:
            raise ConvValueError(
                f"{op}: dst_shape channels must equal weights I * groups ({i} * {self.groups} = {i * self.groups}), "
                f"but got dst_shape {tuple(src_shape)} with C = {c}")
        pads = self._pads(sp, k)
        spec = self._spec(mb=n, ic=c, oc=o, src=sp, kernel=k, pads=pads)
        want = _join_data(n, o, spec.dst, self.data_format)
        if tuple(diff_dst_shape) != want:
            raise ConvValueError(
                f"{op}: diff_dst must have shape {want} ({self.data_format} = {_layout_name(self.data_format)}: "
                f"N = dst_shape N = {n}, C = weights O = {o}, spatial from dst_shape{self._pad_note()}: "
                f"{_size_terms(sp, k, spec.strides, spec.dilations, *pads)}), but got {tuple(diff_dst_shape)}")
        return _Plan("bwd_data", spec, tuple(src_shape))

    def infer_shape(self, diff_dst_shape, weights_shape, dst_shape=None) -> tuple:
        """diff_src shape (= dst_shape, checked against diff_dst and weights)."""
        return self._plan(diff_dst_shape, weights_shape, dst_shape).out_shape

    def __call__(self, diff_dst, weights, dst_shape=None) -> np.ndarray:
        dy, w = self._arrays(["diff_dst", "weights"], [diff_dst, weights])
        plan = self._plan(dy.shape, w.shape, dst_shape)
        s = plan.spec
        out = conv_backward_data(layout.to_canonical(dy, self.data_format),
                                 layout.to_canonical(w, self.weights_format), s.src,
                                 strides=s.strides, pads_begin=s.pads_begin, pads_end=s.pads_end,
                                 dilations=s.dilations, groups=s.groups)
        return layout.from_canonical(out, self.data_format)


class ConvolutionBackwardWeights(_ConvOpBase):
    """oneDNN Graph ``ConvolutionBackwardWeights``: ``diff_weights`` of Convolution.

    ``weights_shape`` (attribute or input; the input wins) is the full weights shape in
    ``weights_format`` layout; one of the two is required.
    """

    op_type = "ConvolutionBackwardWeights"

    def __init__(self, *, strides, pads_begin, pads_end, dilations, auto_pad="none", groups=1,
                 data_format="NXC", weights_format="XIO", weights_shape=None):
        self._init_common(strides, pads_begin, pads_end, dilations, auto_pad, groups, data_format,
                          weights_format)
        self.weights_shape = _optional_shape(self.op_type, "weights_shape", weights_shape)

    def _plan(self, src_shape, diff_dst_shape, weights_shape=None) -> _Plan:
        op = self.op_type
        src_shape = _shape_of(op, "src shape", src_shape)
        diff_dst_shape = _shape_of(op, "diff_dst shape", diff_dst_shape)
        self._rank("src", src_shape)
        self._same_rank("diff_dst", diff_dst_shape, len(src_shape), "src")
        wshape = _weights_shape_arg(self, weights_shape, len(src_shape), "src")
        n, c, sp = _split_data(src_shape, self.data_format)
        o, i, k = _split_weights(wshape, self.weights_format)
        self._check_groups("src channels", c)
        self._check_groups("weights_shape O (output channels)", o)
        if i != c // self.groups:
            raise ConvValueError(
                f"{op}: weights_shape I must equal src channels / groups ({c} / {self.groups} = {c // self.groups}), "
                f"but got weights_shape {tuple(wshape)} ({self.weights_format} = "
                f"{_layout_name(self.weights_format)}) with I = {i}")
        pads = self._pads(sp, k)
        spec = self._spec(mb=n, ic=c, oc=o, src=sp, kernel=k, pads=pads)
        want = _join_data(n, o, spec.dst, self.data_format)
        if tuple(diff_dst_shape) != want:
            raise ConvValueError(
                f"{op}: diff_dst must have shape {want} ({self.data_format} = {_layout_name(self.data_format)}: "
                f"N = src N = {n}, C = weights_shape O = {o}, spatial from src{self._pad_note()}: "
                f"{_size_terms(sp, k, spec.strides, spec.dilations, *pads)}), but got {tuple(diff_dst_shape)}")
        return _Plan("bwd_weights", spec, tuple(wshape))

    def infer_shape(self, src_shape, diff_dst_shape, weights_shape=None) -> tuple:
        """diff_weights shape (= weights_shape, checked against src and diff_dst)."""
        return self._plan(src_shape, diff_dst_shape, weights_shape).out_shape

    def __call__(self, src, diff_dst, weights_shape=None) -> np.ndarray:
        x, dy = self._arrays(["src", "diff_dst"], [src, diff_dst])
        plan = self._plan(x.shape, dy.shape, weights_shape)
        s = plan.spec
        out = conv_backward_weights(layout.to_canonical(x, self.data_format),
                                    layout.to_canonical(dy, self.data_format), s.kernel,
                                    strides=s.strides, pads_begin=s.pads_begin, pads_end=s.pads_end,
                                    dilations=s.dilations, groups=s.groups)
        return layout.from_canonical(out, self.weights_format)


def _weights_shape_arg(op: _ConvOpBase, value, rank: int, ref: str) -> tuple[int, ...]:
    """The weights_shape input if given (it wins), else the attribute; one is required."""
    if value is not None:
        shape = int_list(op.op_type, "weights_shape (input)", value)
        bad = [v for v in shape if v < 1]
        if bad:
            raise ConvValueError(f"{op.op_type}: weights_shape (input) must contain positive sizes, "
                                 f"but got {list(shape)}")
    elif op.weights_shape is not None:
        shape = op.weights_shape
    else:
        raise ConvValueError(f"{op.op_type}: weights_shape must be given as the attribute or the third input, "
                             f"but got neither")
    op._same_rank("weights_shape", shape, rank, ref)
    if any(v < 1 for v in shape):
        raise ConvValueError(f"{op.op_type}: weights_shape must contain positive sizes, but got {list(shape)}")
    return tuple(shape)


# --------------------------------------------------------------------------------------
# ConvTranspose family. Derivation: ConvTranspose(x, W) with W in IOX = (C_in, C_out/g, *k)
# is the data gradient of the convolution conv(y, W) that maps a (N, C_out, *o) tensor y to
# (N, C_in, *i) with W read as OIX. So ConvTranspose = conv_backward_data,
# ConvTransposeBackwardData = conv_forward and ConvTransposeBackwardWeights =
# conv_backward_weights(src=diff_dst, diff_dst=src) of that convolution.
# --------------------------------------------------------------------------------------
class ConvTranspose(_ConvOpBase):
    """oneDNN Graph ``ConvTranspose`` (deconvolution): ``dst = conv_transpose(src, weights) (+ bias)``."""

    op_type = "ConvTranspose"
    _weights_formats = DECONV_WEIGHTS_FORMATS

    def __init__(self, *, strides, pads_begin, pads_end, dilations, auto_pad="none", groups=1,
                 data_format="NXC", weights_format="XOI", output_padding=None):
        self._init_common(strides, pads_begin, pads_end, dilations, auto_pad, groups, data_format,
                          weights_format)
        self.output_padding = _optional_pads(self.op_type, "output_padding", output_padding)

    def _plan(self, src_shape, weights_shape, bias_shape=None) -> _Plan:
        op = self.op_type
        src_shape = _shape_of(op, "src shape", src_shape)
        weights_shape = _shape_of(op, "weights shape", weights_shape)
        nsp = self._rank("src", src_shape)
        self._same_rank("weights", weights_shape, len(src_shape), "src")
        n, c, sp = _split_data(src_shape, self.data_format)
        wi, wo, k = _split_weights(weights_shape, self.weights_format)
        self._check_groups("src channels", c)
        if wi != c:
            raise ConvValueError(
                f"{op}: weights I must equal src channels ({c}), but got weights shape {tuple(weights_shape)} "
                f"({self.weights_format} = {_layout_name(self.weights_format)}) with I = {wi}")
        oc = wo * self.groups
        if bias_shape is not None:
            bias_shape = _shape_of(op, "bias shape", bias_shape)
            if tuple(bias_shape) != (oc,):
                raise ConvValueError(f"{op}: bias must have shape ({oc},) (weights O * groups = {wo} * "
                                     f"{self.groups}), but got {tuple(bias_shape)}")
        if any(v < 1 for v in sp):
            raise ConvValueError(f"{op}: src spatial sizes must be positive, but got src shape {tuple(src_shape)}")
        check = self._output_padding(nsp)
        bad = [ax for ax in range(nsp) if check[ax] >= self.strides[ax]]
        if bad:
            raise ConvValueError(f"{op}: output_padding must be smaller than strides on every axis "
                                 f"(the library aborts otherwise), but got output_padding={list(check)}, "
                                 f"strides={list(self.strides)}")
        pb, pe = _deconv_auto_pads(self.auto_pad, k, self.strides, self.dilations, self.pads_begin, self.pads_end)
        # Output size: s*(i-1) + d*(k-1)+1 - pb - pe + output_padding: rows [pb, pb + size) of the
        # full transposed result of L = s*(i-1) + d*(k-1)+1 rows, zero past L. The rows that lie
        # inside it, keep = min(max(L - pb, 0), size), are the data gradient of the convolution
        # reading an input of keep rows through pads (min(pb, L), L - min(pb, L) - keep); the other
        # size - keep rows are zero (when output_padding > pads_end, or pads_begin >= L).
        out, cut, pb_c, pe_c, src_c = [], [], [], [], []
        for ax in range(nsp):
            full = self.strides[ax] * (sp[ax] - 1) + effective_kernel(k[ax], self.dilations[ax])
            size = full - pb[ax] - pe[ax] + check[ax]
            if size < 1:
                raise ConvValueError(
                    f"{op}: the output must have positive spatial sizes, but axis {ax} gives "
                    f"{self.strides[ax]}*({sp[ax]}-1) + ({self.dilations[ax]}*({k[ax]}-1)+1) - {pb[ax]} - {pe[ax]} "
                    f"+ {check[ax]} = {size}{self._pad_note()}")
            keep = min(max(full - pb[ax], 0), size)
            out.append(size)
            cut.append(size - keep)
            src_c.append(keep)
            pb_c.append(min(pb[ax], full))
            pe_c.append(full - pb_c[-1] - keep)
        # (spec.dst == sp by construction: floor((s*(i-1) + ek - ek) / s) + 1 = i)
        spec = self._spec(mb=n, ic=oc, oc=wi, src=src_c, kernel=k, pads=(tuple(pb_c), tuple(pe_c)))
        return _Plan("bwd_data", spec, _join_data(n, oc, out, self.data_format), tuple(cut))

    def infer_shape(self, src_shape, weights_shape, bias_shape=None) -> tuple:
        """dst shape (``data_format`` layout) from the input shapes; computes nothing."""
        return self._plan(src_shape, weights_shape, bias_shape).out_shape

    def __call__(self, src, weights, bias=None) -> np.ndarray:
        names, vals = ["src", "weights"], [src, weights]
        if bias is not None:
            names.append("bias")
            vals.append(bias)
        arrs = self._arrays(names, vals)
        plan = self._plan(arrs[0].shape, arrs[1].shape, None if bias is None else arrs[2].shape)
        s = plan.spec
        x = layout.to_canonical(arrs[0], self.data_format)
        w = layout.to_canonical(arrs[1], _DECONV_AS_CONV[self.weights_format])

        def run(x_, w_):
            res = conv_backward_data(x_, w_, s.src, strides=s.strides, pads_begin=s.pads_begin,
                                     pads_end=s.pads_end, dilations=s.dilations, groups=s.groups)
            if any(plan.tail):
                res = np.pad(res, [(0, 0), (0, 0)] + [(0, t) for t in plan.tail])
            return res

        out = _with_bias(run, [x, w], arrs[2] if bias is not None else None, arrs[0].dtype, 1)
        return layout.from_canonical(out, self.data_format)


class ConvTransposeBackwardData(_ConvOpBase):
    """oneDNN Graph ``ConvTransposeBackwardData``: ``diff_src`` of ConvTranspose (a convolution)."""

    op_type = "ConvTransposeBackwardData"
    _weights_formats = DECONV_WEIGHTS_FORMATS

    def __init__(self, *, strides, pads_begin, pads_end, dilations, auto_pad="none", groups=1,
                 data_format="NXC", weights_format="XOI"):
        self._init_common(strides, pads_begin, pads_end, dilations, auto_pad, groups, data_format,
                          weights_format)

    def _plan(self, diff_dst_shape, weights_shape) -> _Plan:
        op = self.op_type
        diff_dst_shape = _shape_of(op, "diff_dst shape", diff_dst_shape)
        weights_shape = _shape_of(op, "weights shape", weights_shape)
        self._rank("diff_dst", diff_dst_shape)
        self._same_rank("weights", weights_shape, len(diff_dst_shape), "diff_dst")
        n, c, sp = _split_data(diff_dst_shape, self.data_format)
        wi, wo, k = _split_weights(weights_shape, self.weights_format)
        self._check_groups("diff_dst channels", c)
        self._check_groups("weights I (diff_src channels)", wi)
        if wo != c // self.groups:
            raise ConvValueError(
                f"{op}: weights O must equal diff_dst channels / groups ({c} / {self.groups} = {c // self.groups}), "
                f"but got weights shape {tuple(weights_shape)} ({self.weights_format} = "
                f"{_layout_name(self.weights_format)}) with O = {wo}")
        spec = self._spec(mb=n, ic=c, oc=wi, src=sp, kernel=k, pads=self._pads(sp, k))
        return _Plan("fwd", spec, _join_data(n, wi, spec.dst, self.data_format))

    def infer_shape(self, diff_dst_shape, weights_shape) -> tuple:
        """diff_src shape (``data_format`` layout) from the input shapes; computes nothing."""
        return self._plan(diff_dst_shape, weights_shape).out_shape

    def __call__(self, diff_dst, weights) -> np.ndarray:
        dy, w = self._arrays(["diff_dst", "weights"], [diff_dst, weights])
        s = self._plan(dy.shape, w.shape).spec
        out = conv_forward(layout.to_canonical(dy, self.data_format),
                           layout.to_canonical(w, _DECONV_AS_CONV[self.weights_format]),
                           strides=s.strides, pads_begin=s.pads_begin, pads_end=s.pads_end,
                           dilations=s.dilations, groups=s.groups)
        return layout.from_canonical(out, self.data_format)


class ConvTransposeBackwardWeights(_ConvOpBase):
    """oneDNN Graph ``ConvTransposeBackwardWeights``: ``diff_weights`` of ConvTranspose.

    ``weights_shape`` (attribute or input; the input wins) is the full weights shape in
    ``weights_format`` layout; one of the two is required.
    """

    op_type = "ConvTransposeBackwardWeights"
    _weights_formats = DECONV_WEIGHTS_FORMATS

    def __init__(self, *, strides, pads_begin, pads_end, dilations, auto_pad="none", groups=1,
                 data_format="NXC", weights_format="XOI", weights_shape=None):
        self._init_common(strides, pads_begin, pads_end, dilations, auto_pad, groups, data_format,
                          weights_format)
        self.weights_shape = _optional_shape(self.op_type, "weights_shape", weights_shape)

    def _plan(self, src_shape, diff_dst_shape, weights_shape=None) -> _Plan:
        op = self.op_type
        src_shape = _shape_of(op, "src shape", src_shape)
        diff_dst_shape = _shape_of(op, "diff_dst shape", diff_dst_shape)
        self._rank("src", src_shape)
        self._same_rank("diff_dst", diff_dst_shape, len(src_shape), "src")
        wshape = _weights_shape_arg(self, weights_shape, len(src_shape), "src")
        n, c, sp = _split_data(src_shape, self.data_format)
        dn, dc, dsp = _split_data(diff_dst_shape, self.data_format)
        wi, wo, k = _split_weights(wshape, self.weights_format)
        self._check_groups("src channels", c)
        if wi != c:
            raise ConvValueError(
                f"{op}: weights_shape I must equal src channels ({c}), but got weights_shape {tuple(wshape)} "
                f"({self.weights_format} = {_layout_name(self.weights_format)}) with I = {wi}")
        if dc != wo * self.groups:
            raise ConvValueError(
                f"{op}: diff_dst channels must equal weights_shape O * groups ({wo} * {self.groups} = "
                f"{wo * self.groups}), but got diff_dst shape {tuple(diff_dst_shape)}")
        if dn != n:
            raise ConvValueError(f"{op}: diff_dst batch must equal src batch ({n}), but got diff_dst shape "
                                 f"{tuple(diff_dst_shape)}")
        pads = self._pads(dsp, k)
        spec = self._spec(mb=n, ic=dc, oc=c, src=dsp, kernel=k, pads=pads)
        if spec.dst != sp:
            raise ConvValueError(
                f"{op}: src spatial sizes must be {spec.dst}, the convolution of diff_dst's{self._pad_note()} "
                f"({_size_terms(dsp, k, spec.strides, spec.dilations, *pads)}), but got src shape {tuple(src_shape)}")
        return _Plan("bwd_weights", spec, tuple(wshape))

    def infer_shape(self, src_shape, diff_dst_shape, weights_shape=None) -> tuple:
        """diff_weights shape (= weights_shape, checked against src and diff_dst)."""
        return self._plan(src_shape, diff_dst_shape, weights_shape).out_shape

    def __call__(self, src, diff_dst, weights_shape=None) -> np.ndarray:
        x, dy = self._arrays(["src", "diff_dst"], [src, diff_dst])
        s = self._plan(x.shape, dy.shape, weights_shape).spec
        out = conv_backward_weights(layout.to_canonical(dy, self.data_format),
                                    layout.to_canonical(x, self.data_format), s.kernel,
                                    strides=s.strides, pads_begin=s.pads_begin, pads_end=s.pads_end,
                                    dilations=s.dilations, groups=s.groups)
        return layout.from_canonical(out, _DECONV_AS_CONV[self.weights_format])


# --------------------------------------------------------------------------------------
# Op documentation (docs/ops.md is generated from these)
# --------------------------------------------------------------------------------------
def _common_attrs(weights_formats: tuple[str, str]) -> tuple[Attr, ...]:
    return (
        Attr("strides", "s64[]", "required", "positive, one per spatial axis"),
        Attr("pads_begin", "s64[]", "required", "non-negative, one per spatial axis (ignored unless auto_pad=none)"),
        Attr("pads_end", "s64[]", "required", "non-negative, one per spatial axis (ignored unless auto_pad=none)"),
        Attr("dilations", "s64[]", "required", "positive, one per spatial axis (1 = dense)"),
        Attr("auto_pad", "string", "none", "none, same_upper, same_lower, valid (any case)"),
        Attr("groups", "s64", "1", "positive, divides the channel counts"),
        Attr("data_format", "string", "NXC", "NXC, NCX (any case)"),
        Attr("weights_format", "string", weights_formats[0], f"{weights_formats[0]}, {weights_formats[1]} (any case)"),
    )


_DTYPES = "f32, bf16, f16 (as the library) and f64; all inputs one type; result of that type"
_CONV_LAYOUTS = "data NXC / NCX; weights XIO = (*k, C_in/g, C_out), OIX = (C_out, C_in/g, *k)"
_DECONV_LAYOUTS = "data NXC / NCX; weights XOI = (*k, C_out/g, C_in), IOX = (C_in, C_out/g, *k)"
_ORACLE = ("the real oneDNN Graph 3.13.2 (PyPI onednn 2026.1.0) through tests/oracles/onednn_graph.py, f32 "
           "(bf16 where the CPU has AVX512-BF16)")
_TORCH = "PyTorch 2.13 float64 (torch.ops.aten.convolution / convolution_backward)"

register(OpDoc(
    framework=FRAMEWORK, name="Convolution",
    python="convgrad.onednn.Convolution(strides=..., pads_begin=..., pads_end=..., dilations=..., ...)(src, weights, bias=None)",
    inputs=("src", "weights", "bias (optional, (C_out,))"),
    attributes=_common_attrs(CONV_WEIGHTS_FORMATS), layouts=_CONV_LAYOUTS, dtypes=_DTYPES,
    checked_against=f"{_ORACLE}; {_TORCH} for f64, f16 and bf16",
    notes="Output size floor((i + pb + pe - d*(k-1) - 1) / s) + 1. auto_pad uses the forward SAME rule on src."))

register(OpDoc(
    framework=FRAMEWORK, name="ConvolutionBackwardData",
    python="convgrad.onednn.ConvolutionBackwardData(strides=..., pads_begin=..., pads_end=..., dilations=..., "
           "..., output_padding=None, dst_shape=None)(diff_dst, weights, dst_shape=None)",
    inputs=("diff_dst", "weights", "dst_shape (optional, wins over the attribute)"),
    attributes=_common_attrs(CONV_WEIGHTS_FORMATS) + (
        Attr("output_padding", "s64[]", "zeros", "non-negative; no effect (dst_shape fixes the output), as in the library"),
        Attr("dst_shape", "s64[]", "none", "full diff_src shape in data_format; this or the input is required")),
    layouts=_CONV_LAYOUTS, dtypes=_DTYPES,
    checked_against=f"{_ORACLE} (groups > 1: the library run once per group, its grouped kernel fails); "
                    f"{_TORCH} for f64, f16 and bf16",
    notes="auto_pad applies the forward SAME rule to dst_shape's spatial sizes. oneDNN 3.13.2 fails to compile "
          "this op with groups > 1 (dnnl_invalid_shape); convgrad computes it."))

register(OpDoc(
    framework=FRAMEWORK, name="ConvolutionBackwardWeights",
    python="convgrad.onednn.ConvolutionBackwardWeights(strides=..., pads_begin=..., pads_end=..., dilations=..., "
           "..., weights_shape=None)(src, diff_dst, weights_shape=None)",
    inputs=("src", "diff_dst", "weights_shape (optional, wins over the attribute)"),
    attributes=_common_attrs(CONV_WEIGHTS_FORMATS) + (
        Attr("weights_shape", "s64[]", "none", "full diff_weights shape in weights_format; this or the input is required"),),
    layouts=_CONV_LAYOUTS, dtypes=_DTYPES,
    checked_against=f"{_ORACLE}; {_TORCH} for f64, f16 and bf16",
    notes="auto_pad applies the forward SAME rule to src. The library does not run the weights_shape input "
          "(partition unsupported); convgrad accepts it."))

register(OpDoc(
    framework=FRAMEWORK, name="ConvTranspose",
    python="convgrad.onednn.ConvTranspose(strides=..., pads_begin=..., pads_end=..., dilations=..., ..., "
           "output_padding=None)(src, weights, bias=None)",
    inputs=("src", "weights", "bias (optional, (C_out,))"),
    attributes=_common_attrs(DECONV_WEIGHTS_FORMATS) + (
        Attr("output_padding", "s64[]", "zeros", "0 <= output_padding < strides (the library aborts otherwise)"),),
    layouts=_DECONV_LAYOUTS, dtypes=_DTYPES,
    checked_against=f"{_ORACLE}; {_TORCH} for f64, f16 and bf16",
    notes="Output size s*(i-1) + d*(k-1)+1 - pb - pe + output_padding; rows past the transposed convolution's "
          "reach are zero. auto_pad: total = max(0, d*(k-1)+1 - s) whatever i (the library's deconvolution rule), "
          "same_upper puts the odd unit at the end."))

register(OpDoc(
    framework=FRAMEWORK, name="ConvTransposeBackwardData",
    python="convgrad.onednn.ConvTransposeBackwardData(strides=..., pads_begin=..., pads_end=..., dilations=..., "
           "...)(diff_dst, weights)",
    inputs=("diff_dst", "weights"),
    attributes=_common_attrs(DECONV_WEIGHTS_FORMATS), layouts=_DECONV_LAYOUTS, dtypes=_DTYPES,
    checked_against=f"{_ORACLE}, dilation 1 only (3.13.2 runs this op undilated: wrong results or an abort "
                    f"for dilations > 1); {_TORCH} for every case",
    notes="A forward convolution of diff_dst: output floor((o + pb + pe - d*(k-1) - 1) / s) + 1. auto_pad "
          "applies the forward SAME rule to diff_dst, as the library does (it equals ConvTranspose's rule "
          "when o is a multiple of s). No output_padding attribute (the library rejects one)."))

register(OpDoc(
    framework=FRAMEWORK, name="ConvTransposeBackwardWeights",
    python="convgrad.onednn.ConvTransposeBackwardWeights(strides=..., pads_begin=..., pads_end=..., "
           "dilations=..., ..., weights_shape=None)(src, diff_dst, weights_shape=None)",
    inputs=("src", "diff_dst", "weights_shape (optional, wins over the attribute)"),
    attributes=_common_attrs(DECONV_WEIGHTS_FORMATS) + (
        Attr("weights_shape", "s64[]", "none", "full diff_weights shape in weights_format; this or the input is required"),),
    layouts=_DECONV_LAYOUTS, dtypes=_DTYPES,
    checked_against=f"{_ORACLE} (same_upper/same_lower only where src and diff_dst sizes are multiples of "
                    f"the stride); {_TORCH} for every case",
    notes="auto_pad applies the forward SAME rule to diff_dst (the library's shape inference). oneDNN 3.13.2's "
          "kernel pads by the rule applied to src instead, so with same_upper/same_lower it aborts or disagrees "
          "with its own shape inference unless both sizes are multiples of the stride."))
