"""TensorFlow front-end (front-end layer): ``tf.raw_ops`` convolution ops on NumPy arrays.

Each function has the TensorFlow raw op's name, its keyword-only arguments and TensorFlow's
defaults, e.g.::

    convgrad.tensorflow.raw_ops.Conv2DBackpropFilterV2(
        input=x, filter=w, out_backprop=dy, strides=[1, 2, 2, 1], padding="SAME")

Data is ``NHWC`` / ``NCHW`` (``NDHWC`` / ``NCDHW`` for the 3-D ops), filters are always
``[*kernel, in_channels / groups, out_channels]`` (HWIO); the depthwise ops use
``[filter_height, filter_width, in_channels, channel_multiplier]``. Attributes are checked
in ``_shapes`` (pure, shapes only) and every call becomes exactly one canonical call
(``convgrad.conv_forward`` / ``conv_backward_weights`` / ``conv_backward_data``) on
channels-first views; nothing TensorFlow-specific reaches the core.

Where TensorFlow's CPU build has no kernel for a case that its op definitions allow (NCHW,
grouped or dilated gradients, grouped 3-D convolutions, unequal depthwise strides), these
functions compute the math the op defines. Where TensorFlow would abort the process (a
``strides`` list of the wrong length reaching some kernels) they raise a clean
:class:`convgrad.ConvError`. Inputs must share one element type (TensorFlow's ``T``); the
result has that type; ``use_cudnn_on_gpu`` and ``name`` are accepted and have no effect.
"""

from __future__ import annotations

from typing import Sequence

import ml_dtypes
import numpy as np

from ..errors import ConvError, ConvTypeError, ConvValueError
from ..layout import from_canonical, to_canonical
from ..opdoc import Attr, OpDoc, register
from ..ops import as_array, check_output_size, conv_backward_data, conv_backward_weights, conv_forward
from . import _shapes as sh

__all__ = [
    "Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropFilterV2", "Conv2DBackpropInput", "Conv2DBackpropInputV2",
    "Conv3D", "Conv3DBackpropFilter", "Conv3DBackpropFilterV2", "Conv3DBackpropInput", "Conv3DBackpropInputV2",
    "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropFilter", "DepthwiseConv2dNativeBackpropInput",
]

# TensorFlow's element types (attribute T), by the name TensorFlow prints for them.
_TF_NAMES = {np.dtype(np.float16): "half", np.dtype(ml_dtypes.bfloat16): "bfloat16",
             np.dtype(np.float32): "float32", np.dtype(np.float64): "float64", np.dtype(np.int32): "int32"}
FLOATS = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32), np.dtype(np.float64))
FLOATS_INT32 = FLOATS + (np.dtype(np.int32),)
FLOATS_NO_BF16 = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


# ---------------------------------------------------------------------------------------------
# Arrays in, arrays out


def _tensor(op: str, name: str, value: object, rank: int, dtypes: tuple[np.dtype, ...], fmt: str) -> np.ndarray:
    arr = as_array(op, name, value)
    if arr.dtype not in dtypes:
        allowed = ", ".join(_TF_NAMES[t] for t in dtypes)
        raise ConvTypeError(f"{op}: {name} must have element type {allowed}, but got {arr.dtype}")
    if arr.ndim != rank:
        raise ConvValueError(f"{op}: {name} must be {rank}-dimensional ({fmt}), but got shape {arr.shape}")
    return arr


def _same_type(op: str, **arrays: np.ndarray) -> np.dtype:
    dts = {name: a.dtype for name, a in arrays.items()}
    first = next(iter(dts.values()))
    if any(d != first for d in dts.values()):
        got = ", ".join(f"{n} {d}" for n, d in dts.items())
        raise ConvTypeError(f"{op}: {', '.join(dts)} must share one element type (T), but got {got}")
    return first


def _flag(op: str, name: str, value: object) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise ConvTypeError(f"{op}: {name} must be a bool, but got {value!r}")


def _name(op: str, value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise ConvTypeError(f"{op}: name must be a string or None, but got {value!r}")


def _core(op: str, fn, *args, **kwargs) -> np.ndarray:
    """One canonical call; an error the front-end did not foresee still names the TF op."""
    try:
        return fn(*args, **kwargs)
    except ConvError as e:
        raise type(e)(f"{op}: {e}") from None


def _zeros(op: str, shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    check_output_size(op, shape, dtype.itemsize)
    return np.zeros(tuple(shape), dtype=dtype)


def _weights(f: np.ndarray, depthwise: bool) -> np.ndarray:
    """An HWIO filter as canonical (O, I, *kernel) weights (a view unless depthwise needs a reshape).

    Depthwise [*k, C, M] is a grouped convolution with groups = C and output channel c*M + m,
    which is exactly the C-order flattening of (C, M): the HWIO filter [*k, 1, C*M].
    """
    if depthwise:
        nsp = f.ndim - 2
        f = f.reshape(f.shape[:nsp] + (1, f.shape[nsp] * f.shape[nsp + 1]))
    return to_canonical(f, "XIO")


# ---------------------------------------------------------------------------------------------
# The three directions, shared by every op


def _forward(op: str, w: sh.Window, input, filter, dtypes, *, depthwise: bool = False) -> np.ndarray:
    rank = w.nsp + 2
    x = _tensor(op, "input", input, rank, dtypes, w.data_format)
    f = _tensor(op, "filter", filter, rank, dtypes, "filter_height, filter_width, ..." if depthwise else "HWIO")
    dt = _same_type(op, input=x, filter=f)
    mb, c, src = sh.data_shape(w, x.shape)
    p = sh.problem(op, w, mb=mb, in_depth=c, src=src, filter_shape=f.shape, depthwise=depthwise)
    if p.empty:
        return _zeros(op, sh.shape_in_format(w, p.mb, p.oc, p.dst), dt)
    y = _core(op, conv_forward, to_canonical(x, w.layout), _weights(f, depthwise), **p.canonical_kwargs())
    return from_canonical(y, w.layout)


def _backprop_filter(op: str, w: sh.Window, x: np.ndarray, filter_shape: Sequence[int], dy: np.ndarray,
                     *, filter_name: str, depthwise: bool = False) -> np.ndarray:
    filter_shape = tuple(int(v) for v in filter_shape)
    mb, c, src = sh.data_shape(w, x.shape)
    p = sh.problem(op, w, mb=mb, in_depth=c, src=src, filter_shape=filter_shape, depthwise=depthwise,
                   filter_name=filter_name)
    sh.check_out_backprop(op, p, dy.shape)
    if p.empty:  # no window: every weight meets only empty sums
        return _zeros(op, filter_shape, x.dtype)
    dw = _core(op, conv_backward_weights, to_canonical(x, w.layout), to_canonical(dy, w.layout), p.kernel,
               **p.canonical_kwargs())
    return from_canonical(dw, "XIO").reshape(filter_shape)


def _backprop_input(op: str, w: sh.Window, input_shape: Sequence[int], f: np.ndarray, dy: np.ndarray,
                    *, depthwise: bool = False) -> np.ndarray:
    mb, c, src = sh.data_shape(w, input_shape)
    p = sh.problem(op, w, mb=mb, in_depth=c, src=src, filter_shape=f.shape, depthwise=depthwise)
    sh.check_out_backprop(op, p, dy.shape)
    if p.empty:  # no window: no input element reaches the output
        return _zeros(op, tuple(input_shape), dy.dtype)
    dx = _core(op, conv_backward_data, to_canonical(dy, w.layout), _weights(f, depthwise), p.src,
               **p.canonical_kwargs())
    return from_canonical(dx, w.layout)


def _filter_sizes(op: str, value: object, nsp: int) -> tuple[int, ...]:
    return sh.sizes_vector(op, "filter_sizes", value, (nsp + 2,))


def _window2d(op, strides, padding, explicit_paddings, data_format, dilations) -> sh.Window:
    return sh.window(op, 2, strides=strides, padding=padding, explicit_paddings=explicit_paddings,
                     data_format=data_format, dilations=dilations)


def _window3d(op, strides, padding, data_format, dilations) -> sh.Window:
    return sh.window(op, 3, strides=strides, padding=padding, explicit_paddings=(),
                     data_format=data_format, dilations=dilations)


# ---------------------------------------------------------------------------------------------
# 2-D ops. The defaults are TensorFlow's (lists, as in tf.raw_ops; never mutated here).


def Conv2D(*, input, filter, strides, padding, use_cudnn_on_gpu=True, explicit_paddings=[],
           data_format="NHWC", dilations=[1, 1, 1, 1], name=None):
    """2-D convolution: input [N, H, W, C] (NHWC) and filter [kh, kw, C / groups, O]."""
    op = "Conv2D"
    _flag(op, "use_cudnn_on_gpu", use_cudnn_on_gpu)
    _name(op, name)
    w = _window2d(op, strides, padding, explicit_paddings, data_format, dilations)
    return _forward(op, w, input, filter, FLOATS_INT32)


def Conv2DBackpropFilter(*, input, filter_sizes, out_backprop, strides, padding, use_cudnn_on_gpu=True,
                         explicit_paddings=[], data_format="NHWC", dilations=[1, 1, 1, 1], name=None):
    """Gradient of Conv2D with respect to its filter, whose shape is ``filter_sizes`` (HWIO)."""
    op = "Conv2DBackpropFilter"
    _flag(op, "use_cudnn_on_gpu", use_cudnn_on_gpu)
    _name(op, name)
    w = _window2d(op, strides, padding, explicit_paddings, data_format, dilations)
    x = _tensor(op, "input", input, 4, FLOATS, w.data_format)
    dy = _tensor(op, "out_backprop", out_backprop, 4, FLOATS, w.data_format)
    _same_type(op, input=x, out_backprop=dy)
    return _backprop_filter(op, w, x, _filter_sizes(op, filter_sizes, 2), dy, filter_name="filter_sizes")


def Conv2DBackpropFilterV2(*, input, filter, out_backprop, strides, padding, use_cudnn_on_gpu=True,
                           explicit_paddings=[], data_format="NHWC", dilations=[1, 1, 1, 1], name=None):
    """Gradient of Conv2D with respect to ``filter`` (used for its shape only)."""
    op = "Conv2DBackpropFilterV2"
    _flag(op, "use_cudnn_on_gpu", use_cudnn_on_gpu)
    _name(op, name)
    w = _window2d(op, strides, padding, explicit_paddings, data_format, dilations)
    x = _tensor(op, "input", input, 4, FLOATS, w.data_format)
    f = _tensor(op, "filter", filter, 4, FLOATS, "HWIO")
    dy = _tensor(op, "out_backprop", out_backprop, 4, FLOATS, w.data_format)
    _same_type(op, input=x, filter=f, out_backprop=dy)
    return _backprop_filter(op, w, x, f.shape, dy, filter_name="filter")


def Conv2DBackpropInput(*, input_sizes, filter, out_backprop, strides, padding, use_cudnn_on_gpu=True,
                        explicit_paddings=[], data_format="NHWC", dilations=[1, 1, 1, 1], name=None):
    """Gradient of Conv2D with respect to its input, whose shape is ``input_sizes``.

    ``input_sizes`` has 4 entries (data_format order) or 2 (the spatial sizes; batch from
    ``out_backprop``, depth from the filter's in_channels, so groups = 1), as in TensorFlow.
    """
    op = "Conv2DBackpropInput"
    _flag(op, "use_cudnn_on_gpu", use_cudnn_on_gpu)
    _name(op, name)
    w = _window2d(op, strides, padding, explicit_paddings, data_format, dilations)
    f = _tensor(op, "filter", filter, 4, FLOATS_INT32, "HWIO")
    dy = _tensor(op, "out_backprop", out_backprop, 4, FLOATS_INT32, w.data_format)
    _same_type(op, filter=f, out_backprop=dy)
    sizes = sh.sizes_vector(op, "input_sizes", input_sizes, (4, 2))
    if len(sizes) == 2:
        sizes = sh.shape_in_format(w, sh.data_shape(w, dy.shape)[0], f.shape[2], sizes)
    return _backprop_input(op, w, sizes, f, dy)


def Conv2DBackpropInputV2(*, input, filter, out_backprop, strides, padding, use_cudnn_on_gpu=True,
                          explicit_paddings=[], data_format="NHWC", dilations=[1, 1, 1, 1], name=None):
    """Gradient of Conv2D with respect to ``input`` (used for its shape only)."""
    op = "Conv2DBackpropInputV2"
    _flag(op, "use_cudnn_on_gpu", use_cudnn_on_gpu)
    _name(op, name)
    w = _window2d(op, strides, padding, explicit_paddings, data_format, dilations)
    x = _tensor(op, "input", input, 4, FLOATS_INT32, w.data_format)
    f = _tensor(op, "filter", filter, 4, FLOATS_INT32, "HWIO")
    dy = _tensor(op, "out_backprop", out_backprop, 4, FLOATS_INT32, w.data_format)
    _same_type(op, input=x, filter=f, out_backprop=dy)
    return _backprop_input(op, w, x.shape, f, dy)


# ---------------------------------------------------------------------------------------------
# Depthwise 2-D ops: filter [kh, kw, in_channels, channel_multiplier], no groups attribute.


def DepthwiseConv2dNative(*, input, filter, strides, padding, explicit_paddings=[], data_format="NHWC",
                          dilations=[1, 1, 1, 1], name=None):
    """Depthwise 2-D convolution: output channel ``c * multiplier + m`` sees input channel ``c``."""
    op = "DepthwiseConv2dNative"
    _name(op, name)
    w = _window2d(op, strides, padding, explicit_paddings, data_format, dilations)
    return _forward(op, w, input, filter, FLOATS, depthwise=True)


def DepthwiseConv2dNativeBackpropFilter(*, input, filter_sizes, out_backprop, strides, padding,
                                        explicit_paddings=[], data_format="NHWC", dilations=[1, 1, 1, 1],
                                        name=None):
    """Gradient of DepthwiseConv2dNative with respect to its filter (shape ``filter_sizes``)."""
    op = "DepthwiseConv2dNativeBackpropFilter"
    _name(op, name)
    w = _window2d(op, strides, padding, explicit_paddings, data_format, dilations)
    x = _tensor(op, "input", input, 4, FLOATS, w.data_format)
    dy = _tensor(op, "out_backprop", out_backprop, 4, FLOATS, w.data_format)
    _same_type(op, input=x, out_backprop=dy)
    return _backprop_filter(op, w, x, _filter_sizes(op, filter_sizes, 2), dy, filter_name="filter_sizes",
                            depthwise=True)


def DepthwiseConv2dNativeBackpropInput(*, input_sizes, filter, out_backprop, strides, padding,
                                       explicit_paddings=[], data_format="NHWC", dilations=[1, 1, 1, 1],
                                       name=None):
    """Gradient of DepthwiseConv2dNative with respect to its input (shape ``input_sizes``, 4 entries)."""
    op = "DepthwiseConv2dNativeBackpropInput"
    _name(op, name)
    w = _window2d(op, strides, padding, explicit_paddings, data_format, dilations)
    f = _tensor(op, "filter", filter, 4, FLOATS, "filter_height, filter_width, in_channels, channel_multiplier")
    dy = _tensor(op, "out_backprop", out_backprop, 4, FLOATS, w.data_format)
    _same_type(op, filter=f, out_backprop=dy)
    sizes = sh.sizes_vector(op, "input_sizes", input_sizes, (4,))
    return _backprop_input(op, w, sizes, f, dy, depthwise=True)


# ---------------------------------------------------------------------------------------------
# 3-D ops: SAME / VALID only, no explicit_paddings. The "V1" gradients (deprecated in
# TensorFlow, data always NDHWC) take the other operand as a tensor used for its shape; the
# "V2" ones take its shape as a vector, the reverse of the 2-D naming.


def Conv3D(*, input, filter, strides, padding, data_format="NDHWC", dilations=[1, 1, 1, 1, 1], name=None):
    """3-D convolution: input [N, D, H, W, C] (NDHWC) and filter [kd, kh, kw, C / groups, O]."""
    op = "Conv3D"
    _name(op, name)
    w = _window3d(op, strides, padding, data_format, dilations)
    return _forward(op, w, input, filter, FLOATS)


def Conv3DBackpropFilter(*, input, filter, out_backprop, strides, padding, dilations=[1, 1, 1, 1, 1], name=None):
    """Deprecated TensorFlow op: Conv3D's filter gradient, ``filter`` used for its shape, NDHWC only."""
    op = "Conv3DBackpropFilter"
    _name(op, name)
    w = _window3d(op, strides, padding, "NDHWC", dilations)
    x = _tensor(op, "input", input, 5, FLOATS_NO_BF16, w.data_format)
    f = _tensor(op, "filter", filter, 5, FLOATS_NO_BF16, "DHWIO")
    dy = _tensor(op, "out_backprop", out_backprop, 5, FLOATS_NO_BF16, w.data_format)
    _same_type(op, input=x, filter=f, out_backprop=dy)
    return _backprop_filter(op, w, x, f.shape, dy, filter_name="filter")


def Conv3DBackpropFilterV2(*, input, filter_sizes, out_backprop, strides, padding, data_format="NDHWC",
                           dilations=[1, 1, 1, 1, 1], name=None):
    """Conv3D's filter gradient; the filter shape is ``filter_sizes`` (DHWIO)."""
    op = "Conv3DBackpropFilterV2"
    _name(op, name)
    w = _window3d(op, strides, padding, data_format, dilations)
    x = _tensor(op, "input", input, 5, FLOATS, w.data_format)
    dy = _tensor(op, "out_backprop", out_backprop, 5, FLOATS, w.data_format)
    _same_type(op, input=x, out_backprop=dy)
    return _backprop_filter(op, w, x, _filter_sizes(op, filter_sizes, 3), dy, filter_name="filter_sizes")


def Conv3DBackpropInput(*, input, filter, out_backprop, strides, padding, dilations=[1, 1, 1, 1, 1], name=None):
    """Deprecated TensorFlow op: Conv3D's input gradient, ``input`` used for its shape, NDHWC only."""
    op = "Conv3DBackpropInput"
    _name(op, name)
    w = _window3d(op, strides, padding, "NDHWC", dilations)
    x = _tensor(op, "input", input, 5, FLOATS_NO_BF16, w.data_format)
    f = _tensor(op, "filter", filter, 5, FLOATS_NO_BF16, "DHWIO")
    dy = _tensor(op, "out_backprop", out_backprop, 5, FLOATS_NO_BF16, w.data_format)
    _same_type(op, input=x, filter=f, out_backprop=dy)
    return _backprop_input(op, w, x.shape, f, dy)


def Conv3DBackpropInputV2(*, input_sizes, filter, out_backprop, strides, padding, data_format="NDHWC",
                          dilations=[1, 1, 1, 1, 1], name=None):
    """Conv3D's input gradient; the input shape is ``input_sizes`` (5 entries, int32 or int64)."""
    op = "Conv3DBackpropInputV2"
    _name(op, name)
    w = _window3d(op, strides, padding, data_format, dilations)
    f = _tensor(op, "filter", filter, 5, FLOATS, "DHWIO")
    dy = _tensor(op, "out_backprop", out_backprop, 5, FLOATS, w.data_format)
    _same_type(op, filter=f, out_backprop=dy)
    sizes = sh.sizes_vector(op, "input_sizes", input_sizes, (5,))
    return _backprop_input(op, w, sizes, f, dy)


# ---------------------------------------------------------------------------------------------
# Op documentation (docs/ops.md is generated from these records)

_CHECKED = ("TensorFlow 2.21 CPU (oneDNN kernels on) wherever it has a correct CPU kernel for the case (the V1/V2 "
            "twin op where this op has none); PyTorch 2.13 float64 on every case; adjoint identities through the "
            "public ops")


def _attrs(nsp: int, *, explicit: bool, cudnn: bool, data_format: bool = True) -> tuple[Attr, ...]:
    rank = nsp + 2
    fmts = sh.FORMATS[nsp]
    out = [Attr("strides", f"int[{rank}]", "required",
                "data_format order; batch and depth entries 1, spatial entries >= 1"),
           Attr("padding", "string", "required", ", ".join(sh.PADDINGS_2D if explicit else sh.PADDINGS_3D)
                + " (case-sensitive)")]
    if cudnn:
        out.append(Attr("use_cudnn_on_gpu", "bool", "True", "any (no effect)"))
    if explicit:
        out.append(Attr("explicit_paddings", "int[]", "[]",
                        f"empty, or {2 * rank} non-negative entries (before, after per dimension in data_format "
                        "order, batch and depth 0) when padding is EXPLICIT"))
    if data_format:
        out.append(Attr("data_format", "string", f'"{fmts[0]}"', ", ".join(fmts)))
    out.append(Attr("dilations", f"int[{rank}]", str([1] * rank),
                    "data_format order; batch and depth entries 1, spatial entries >= 1"))
    out.append(Attr("name", "string", "None", "any (no effect)"))
    return tuple(out)


_SAME_NOTE = ("SAME pads by TensorFlow's rule (output ceil(i / s), total pad max((o - 1)*s + d*(k - 1) + 1 - i, 0), "
              "the odd unit after); VALID/EXPLICIT outputs (i + pb + pe - d*(k - 1) - 1 + s) / s in C++ division, "
              "so an input shorter than the dilated filter gives an empty output (as TensorFlow's kernels do) "
              "unless the quotient is negative (an error).")
_T = "half, bfloat16 (ml_dtypes), float32, float64"


def _doc(name: str, inputs: tuple[str, ...], nsp: int, dtypes: str, notes: str, *, explicit: bool, cudnn: bool,
         data_format: bool = True, layouts: str | None = None) -> None:
    fmts = sh.FORMATS[nsp]
    args = ", ".join(inputs)
    register(OpDoc(
        framework="TensorFlow", name=name, python=f"convgrad.tensorflow.raw_ops.{name}(*, {args}, strides, padding, ...)",
        inputs=inputs, attributes=_attrs(nsp, explicit=explicit, cudnn=cudnn, data_format=data_format),
        layouts=layouts or f"data {' / '.join(fmts if data_format else fmts[:1])}; filter {'D' if nsp == 3 else ''}HWIO "
                           "([*kernel, in_channels / groups, out_channels])",
        dtypes=dtypes, checked_against=_CHECKED, notes=f"{notes} {_SAME_NOTE}"))


_GROUPS = "Groups = input depth / filter in_channels (TensorFlow's rule); out_channels must be a multiple of groups."
_DW_LAYOUT = "data NHWC / NCHW; filter [filter_height, filter_width, in_channels, channel_multiplier]"
_DW = ("Depthwise: output channel c * channel_multiplier + m reads input channel c (groups = in_channels). Unequal "
       "row/column strides and dilations are computed as the op defines them (TensorFlow's oneDNN CPU kernels accept "
       "them, its native kernels refuse them).")
_DW_GRAD = (" Dilations > 1: this is the exact gradient of the dilated DepthwiseConv2dNative. TensorFlow 2.21's CPU "
            "gradient kernels get it wrong: the native ones ignore the dilations (with SAME padding they silently "
            "return the undilated gradient), the oneDNN ones fail or return wrong values; checked against PyTorch.")

_doc("Conv2D", ("input", "filter"), 2, _T + ", int32 (exact)", _GROUPS, explicit=True, cudnn=True)
_doc("Conv2DBackpropFilter", ("input", "filter_sizes", "out_backprop"), 2, _T,
     "filter_sizes: 4 non-negative entries (HWIO). " + _GROUPS, explicit=True, cudnn=True)
_doc("Conv2DBackpropFilterV2", ("input", "filter", "out_backprop"), 2, _T,
     "filter is used for its shape only (TensorFlow 2.21 has no CPU kernel for this op). " + _GROUPS,
     explicit=True, cudnn=True)
_doc("Conv2DBackpropInput", ("input_sizes", "filter", "out_backprop"), 2, _T + ", int32 (exact)",
     "input_sizes: 4 entries in data_format order, or 2 spatial sizes (batch from out_backprop, depth = filter "
     "in_channels). " + _GROUPS, explicit=True, cudnn=True)
_doc("Conv2DBackpropInputV2", ("input", "filter", "out_backprop"), 2, _T + ", int32 (exact)",
     "input is used for its shape only (TensorFlow 2.21 has no CPU kernel for this op). " + _GROUPS,
     explicit=True, cudnn=True)
_doc("DepthwiseConv2dNative", ("input", "filter"), 2, _T, _DW, explicit=True, cudnn=False, layouts=_DW_LAYOUT)
_doc("DepthwiseConv2dNativeBackpropFilter", ("input", "filter_sizes", "out_backprop"), 2, _T,
     "filter_sizes: 4 entries. " + _DW + _DW_GRAD, explicit=True, cudnn=False, layouts=_DW_LAYOUT)
_doc("DepthwiseConv2dNativeBackpropInput", ("input_sizes", "filter", "out_backprop"), 2, _T,
     "input_sizes: 4 entries in data_format order. " + _DW + _DW_GRAD, explicit=True, cudnn=False, layouts=_DW_LAYOUT)
_G3 = (_GROUPS + " Grouped 3-D convolutions follow TensorFlow's shape functions; its CPU kernels have none, "
       "so they are checked against PyTorch.")
_doc("Conv3D", ("input", "filter"), 3, _T, _G3, explicit=False, cudnn=False)
_doc("Conv3DBackpropFilter", ("input", "filter", "out_backprop"), 3, "half, float32, float64",
     "Deprecated in TensorFlow (removed from GraphDef version 10; TensorFlow 2.21 refuses to run it): data NDHWC "
     "only, no data_format attribute, filter used for its shape only. Checked against Conv3DBackpropFilterV2. "
     + _G3, explicit=False, cudnn=False, data_format=False)
_doc("Conv3DBackpropFilterV2", ("input", "filter_sizes", "out_backprop"), 3, _T,
     "filter_sizes: 5 entries (DHWIO). " + _G3, explicit=False, cudnn=False)
_doc("Conv3DBackpropInput", ("input", "filter", "out_backprop"), 3, "half, float32, float64",
     "Deprecated in TensorFlow (removed from GraphDef version 10; TensorFlow 2.21 refuses to run it): data NDHWC "
     "only, no data_format attribute, input used for its shape only. Checked against Conv3DBackpropInputV2. "
     + _G3, explicit=False, cudnn=False, data_format=False)
_doc("Conv3DBackpropInputV2", ("input_sizes", "filter", "out_backprop"), 3, _T,
     "input_sizes: 5 entries in data_format order (int32 or int64 in TensorFlow; any integers here). " + _G3,
     explicit=False, cudnn=False)
