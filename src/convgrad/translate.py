"""Translate one convolution op between TensorFlow, OpenVINO and oneDNN Graph (front-end layer,
pure: attributes and shapes in, attributes, shapes and tensor permutations out; no arrays).

    t = convgrad.translate.translate("tensorflow", "Conv2DBackpropFilterV2",
                                     {"strides": [1, 2, 2, 1], "padding": "SAME"},
                                     {"input": (1, 7, 7, 3), "filter": (3, 3, 3, 4)}, to="openvino")
    print(t.describe())                  # the target op, its attributes, explicit pads, layouts
    x_ov = t.convert_input("input", x)   # a source tensor in the target's layout
    dw = t.convert_output(ov_result)     # the target's result in the source's layout

How it works: a *reader* turns the source op into the canonical problem (direction ``fwd``,
``bwd_data`` or ``bwd_weights`` plus a :class:`~convgrad.spec.ConvSpec` with explicit pads),
following that framework's own padding rules; a *writer* expresses the canonical problem in the
target framework, or refuses (:class:`TranslationRefused`, with the reason) where the target has
no exact equivalent. Every tensor of an op call knows the steps (transpose / reshape / slice)
that take its canonical form to the framework's form; a source-to-target mapping is the inverse
of the source's steps followed by the target's.

Each framework's padding rules, as the readers apply them (per spatial axis; ``ek = d*(k-1)+1``):

* forward SAME (TF ``SAME``, oneDNN ``same_upper``/``same_lower``, OpenVINO forward auto_pad):
  ``o = ceil(i/s)``, ``total = max((o-1)*s + ek - i, 0)``; upper puts the odd unit at the end.
* oneDNN ``ConvolutionBackwardData`` applies the forward rule to ``dst_shape`` (the forward
  src); its ``output_padding`` changes nothing (measured, oneDNN 3.13.2).
* OpenVINO backprop ops compute the full transposed result of ``L = s*(i-1) + ek`` rows and
  return the window ``[offset, offset + size)`` of it (rows past ``L`` are zero): without
  ``output_shape`` ``offset = pads_begin``, ``size = L - pb - pe + output_padding`` (explicit)
  or ``offset = 0``, ``size = L + output_padding`` (valid/same_*: pads ignored); with it,
  ``size = output_shape`` and ``offset`` = ``pads_begin`` (explicit), 0 (valid), ``ceil(t/2)``
  (same_upper) or ``floor(t/2)`` (same_lower), ``t = max(L + output_padding - output_shape, 0)``.
  The canonical data gradient is that window with ``pads_begin = offset``: it exists when the
  window ends less than ``s`` rows past ``L`` (otherwise no forward convolution has it).
"""

from __future__ import annotations

import json
import numbers
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from .errors import ConvTypeError, ConvValueError
from .padding import same_pads
from .spec import MAX_DIM, ConvSpec, check_range, effective_kernel, int_list, make_spec

__all__ = ["FRAMEWORKS", "OPS", "Reading", "Step", "Tensor", "OpCall", "Translation", "TranslationRefused",
           "framework_name", "read", "translate"]

FRAMEWORKS = ("tensorflow", "openvino", "onednn")
_ALIASES = {"tensorflow": "tensorflow", "tf": "tensorflow", "openvino": "openvino", "ov": "openvino",
            "onednn": "onednn", "onednn-graph": "onednn", "onednn_graph": "onednn", "dnnl": "onednn",
            "graph": "onednn"}
_TITLE = {"tensorflow": "TensorFlow", "openvino": "OpenVINO", "onednn": "oneDNN Graph"}

# op name -> (direction, number of spatial axes or None for 1..3, family)
_TF_OPS = {
    "Conv2D": ("fwd", 2, "conv"), "Conv3D": ("fwd", 3, "conv"),
    "Conv2DBackpropFilter": ("bwd_weights", 2, "conv"), "Conv2DBackpropFilterV2": ("bwd_weights", 2, "conv"),
    "Conv3DBackpropFilterV2": ("bwd_weights", 3, "conv"),
    "Conv2DBackpropInput": ("bwd_data", 2, "conv"), "Conv2DBackpropInputV2": ("bwd_data", 2, "conv"),
    "Conv3DBackpropInputV2": ("bwd_data", 3, "conv"),
    "DepthwiseConv2dNative": ("fwd", 2, "depthwise"),
    "DepthwiseConv2dNativeBackpropFilter": ("bwd_weights", 2, "depthwise"),
    "DepthwiseConv2dNativeBackpropInput": ("bwd_data", 2, "depthwise"),
}
_OV_OPS = {
    "Convolution": ("fwd", None, "plain"), "GroupConvolution": ("fwd", None, "group"),
    "ConvolutionBackpropData": ("bwd_data", None, "plain"),
    "GroupConvolutionBackpropData": ("bwd_data", None, "group"),
}
_DNNL_OPS = {
    "Convolution": ("fwd", None, "conv"), "ConvolutionBackwardData": ("bwd_data", None, "conv"),
    "ConvolutionBackwardWeights": ("bwd_weights", None, "conv"),
}
OPS = {"tensorflow": _TF_OPS, "openvino": _OV_OPS, "onednn": _DNNL_OPS}

_AXES = {1: ("W",), 2: ("H", "W"), 3: ("D", "H", "W")}


class TranslationRefused(ConvValueError):
    """The target framework has no exact equivalent of the source op; the message says why."""


def framework_name(value: object, what: str = "framework") -> str:
    """'tf' / 'TensorFlow' / 'ov' / 'onednn-graph' ... -> 'tensorflow' / 'openvino' / 'onednn'."""
    if not isinstance(value, str) or value.lower() not in _ALIASES:
        raise ConvValueError(f"translate: {what} must be one of {FRAMEWORKS}, but got {value!r}")
    return _ALIASES[value.lower()]


def axis_names(nsp: int) -> tuple[str, ...]:
    return _AXES.get(nsp, tuple(str(a) for a in range(nsp)))


# ---------------------------------------------------------------------------------------------
# Tensor steps: what turns a canonical tensor into a framework's tensor


@dataclass(frozen=True)
class Step:
    """One array operation: ``transpose`` (axes), ``reshape`` (shape) or ``slice`` ((start, stop) per axis)."""

    kind: str
    arg: tuple

    def apply(self, a: np.ndarray) -> np.ndarray:
        if self.kind == "transpose":
            return a.transpose(self.arg)
        if self.kind == "reshape":
            return a.reshape(self.arg)
        return a[tuple(slice(b, e) for b, e in self.arg)]

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.kind == "transpose":
            return tuple(shape[p] for p in self.arg)
        if self.kind == "reshape":
            return tuple(self.arg)
        return tuple(e - b for b, e in self.arg)

    def to_dict(self) -> dict:
        return {"op": self.kind, "arg": [list(a) if isinstance(a, tuple) else a for a in self.arg]}

    def __str__(self) -> str:
        if self.kind == "slice":
            return "slice[" + ", ".join(f"{b}:{e}" for b, e in self.arg) + "]"
        return f"{self.kind}{tuple(self.arg)}"


def _simplify(steps: Sequence[Step], shape: tuple[int, ...]) -> tuple[Step, ...]:
    """Merge consecutive transposes and reshapes; drop identities and full slices."""
    out: list[tuple[Step, tuple[int, ...]]] = []  # (step, shape before it)
    cur = tuple(shape)
    for st in steps:
        nxt = st.shape(cur)
        if st.kind == "transpose" and tuple(st.arg) == tuple(range(len(cur))):
            continue
        if st.kind == "reshape" and tuple(st.arg) == cur:
            continue
        if st.kind == "slice" and all(b == 0 and e == n for (b, e), n in zip(st.arg, cur)):
            continue
        if out and out[-1][0].kind == st.kind == "transpose":
            prev, before = out.pop()
            st = Step("transpose", tuple(prev.arg[p] for p in st.arg))
            cur = before
            if st.arg == tuple(range(len(cur))):
                cur = nxt
                continue
        elif out and out[-1][0].kind == st.kind == "reshape":
            _, before = out.pop()
            cur = before
            if tuple(st.arg) == before:
                cur = nxt
                continue
        out.append((st, cur))
        cur = nxt
    return tuple(s for s, _ in out)


def _inverse(steps: Sequence[Step], shape: tuple[int, ...]) -> tuple[Step, ...]:
    """Steps that undo ``steps`` (applied to an array of ``shape``); slices cannot be undone."""
    shapes = [tuple(shape)]
    for st in steps:
        shapes.append(st.shape(shapes[-1]))
    inv = []
    for st, before in zip(reversed(steps), reversed(shapes[:-1])):
        if st.kind == "transpose":
            inv.append(Step("transpose", tuple(int(v) for v in np.argsort(st.arg))))
        elif st.kind == "reshape":
            inv.append(Step("reshape", before))
        else:
            raise ValueError("a slice cannot be inverted")  # internal: sources never slice
    return tuple(inv)


def _apply(steps: Sequence[Step], a: np.ndarray) -> np.ndarray:
    for st in steps:
        a = st.apply(a)
    return np.ascontiguousarray(a)


def _perm_from_canonical(layout: str, nsp: int) -> tuple[int, ...]:
    """Canonical (N|O, C|I, *X) axes -> ``layout`` (letters N/O, C/I, X for all spatial axes)."""
    out: list[int] = []
    for ch in layout:
        out.extend(range(2, 2 + nsp) if ch == "X" else [0 if ch in "NO" else 1])
    return tuple(out)


def _layout_steps(layout: str, nsp: int) -> tuple[Step, ...]:
    return (Step("transpose", _perm_from_canonical(layout, nsp)),)


@dataclass(frozen=True)
class Tensor:
    """One input or output of an op call: its framework name, its canonical role and form, and
    the steps from the canonical form (``src``/``dst``: (N, C, *X); weights: (O, C/groups, *k))."""

    name: str
    role: str                 # src, weights, dst, diff_src, diff_weights, diff_dst
    canonical_shape: tuple[int, ...]
    layout: str               # human-readable, e.g. "NHWC" or "[G, C_OUT, C_IN, k...]"
    from_canonical: tuple[Step, ...] = ()

    @property
    def shape(self) -> tuple[int, ...]:
        shp = self.canonical_shape
        for st in self.from_canonical:
            shp = st.shape(shp)
        return shp

    def to_canonical(self) -> tuple[Step, ...]:
        return _simplify(_inverse(self.from_canonical, self.canonical_shape), self.shape)

    def to_dict(self) -> dict:
        return {"name": self.name, "role": self.role, "shape": list(self.shape), "layout": self.layout,
                "from_canonical": [s.to_dict() for s in self.from_canonical]}


def _tensor(name: str, role: str, cshape: Sequence[int], layout: str, steps: Sequence[Step] = ()) -> Tensor:
    cshape = tuple(int(v) for v in cshape)
    return Tensor(name, role, cshape, layout, _simplify(steps, cshape))


@dataclass(frozen=True)
class OpCall:
    """One framework op with every attribute spelled out, its tensors, and notes."""

    framework: str
    op: str
    attrs: dict
    inputs: tuple[Tensor, ...]
    output: Tensor
    constants: dict = field(default_factory=dict)   # shape-valued inputs (TF input_sizes / filter_sizes)
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"framework": self.framework, "op": self.op, "attrs": self.attrs,
                "constants": {k: list(v) for k, v in self.constants.items()},
                "inputs": [t.to_dict() for t in self.inputs], "output": self.output.to_dict(),
                "notes": list(self.notes)}


@dataclass(frozen=True)
class Reading:
    """The canonical problem behind a framework op, with the per-axis derivation of its pads."""

    direction: str
    spec: ConvSpec
    call: OpCall
    pad_notes: tuple[str, ...]       # one per spatial axis: how the framework's rule resolved
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Translation:
    """The result of :func:`translate`: source and target op calls over one canonical problem."""

    direction: str
    spec: ConvSpec
    source: OpCall
    target: OpCall
    reading: Reading

    def _pair(self, name: str) -> tuple[Tensor, Tensor]:
        for t in self.source.inputs:
            if t.name == name:
                for u in self.target.inputs:
                    if u.role == t.role:
                        return t, u
        names = [t.name for t in self.source.inputs]
        raise ConvValueError(f"translate: input must be one of the source op's inputs {names}, but got {name!r}")

    def input_steps(self, name: str) -> tuple[Step, ...]:
        """Steps taking the source input ``name`` to the target's matching input."""
        s, t = self._pair(name)
        return _simplify(s.to_canonical() + t.from_canonical, s.shape)

    def output_steps(self) -> tuple[Step, ...]:
        """Steps taking the target's result to the source's result layout."""
        return _simplify(self.target.output.to_canonical() + self.source.output.from_canonical,
                         self.target.output.shape)

    def convert_input(self, name: str, array) -> np.ndarray:
        s, _ = self._pair(name)
        a = np.asarray(array)
        if a.shape != s.shape:
            raise ConvValueError(f"translate: {name} must have shape {s.shape}, but got {a.shape}")
        return _apply(self.input_steps(name), a)

    def convert_output(self, array) -> np.ndarray:
        a = np.asarray(array)
        if a.shape != self.target.output.shape:
            raise ConvValueError(f"translate: the target result must have shape {self.target.output.shape}, "
                                 f"but got {a.shape}")
        return _apply(self.output_steps(), a)

    def to_dict(self) -> dict:
        maps = []
        for t in self.source.inputs:
            u = self._pair(t.name)[1]
            maps.append({"from": t.name, "to": u.name, "steps": [s.to_dict() for s in self.input_steps(t.name)]})
        maps.append({"from": f"{self.target.op} result", "to": f"{self.source.op} result",
                     "steps": [s.to_dict() for s in self.output_steps()]})
        return {"direction": self.direction, "problem": str(self.spec),
                "pads_begin": list(self.spec.pads_begin), "pads_end": list(self.spec.pads_end),
                "source": self.source.to_dict(), "target": self.target.to_dict(), "mappings": maps}

    def describe(self) -> str:
        """A human-readable account: target op, attributes, tensors and how to map them."""
        src, tgt = self.source, self.target
        lines = [f"{_TITLE[src.framework]} {src.op}  ->  {_TITLE[tgt.framework]} {tgt.op}",
                 f"canonical problem ({self.direction}): {self.spec}",
                 f"explicit pads: begin {list(self.spec.pads_begin)}, end {list(self.spec.pads_end)}",
                 "", f"{tgt.op} attributes:"]
        lines += [f"  {k} = {json.dumps(v)}" for k, v in tgt.attrs.items()]
        if tgt.constants:
            lines.append("constant inputs:")
            lines += [f"  {k} = {list(v)}" for k, v in tgt.constants.items()]
        lines.append("tensors:")
        for t in src.inputs:
            u = self._pair(t.name)[1]
            steps = self.input_steps(t.name)
            how = ", ".join(str(s) for s in steps) or "as is"
            lines.append(f"  {src.op} {t.name} {t.layout} {t.shape}  ->  {tgt.op} {u.name} {u.layout} {u.shape}: {how}")
        steps = self.output_steps()
        how = ", ".join(str(s) for s in steps) or "as is"
        lines.append(f"  {tgt.op} {tgt.output.name} {tgt.output.layout} {tgt.output.shape}  ->  "
                     f"{src.op} {src.output.name} {src.output.layout} {src.output.shape}: {how}")
        notes = list(tgt.notes)
        if notes:
            lines.append("notes:")
            lines += [f"  - {n}" for n in notes]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Attribute helpers


def _unwrap(value: object) -> object:
    """oneDNN Graph JSON writes attributes as {"type": ..., "value": ...}."""
    if isinstance(value, Mapping) and "value" in value:
        return value["value"]
    return value


def _ints(op: str, name: str, value: object) -> tuple[int, ...]:
    value = _unwrap(value)
    if isinstance(value, str):  # OpenVINO IR spelling "1,2"
        text = value.strip()
        if not text:
            return ()
        try:
            return tuple(int(v) for v in text.split(","))
        except ValueError:
            raise ConvValueError(f"{op}: {name} must be a comma-separated list of integers, "
                                 f"but got {value!r}") from None
    if isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return (int(value),)
    return int_list(op, name, value)


def _per_axis(op: str, attrs: Mapping, name: str, nsp: int, default: int | None, minimum: int) -> tuple[int, ...]:
    """An attribute with one entry per spatial axis; ``default=None`` makes it required. An empty
    list means the default (OpenVINO's rule); a single value broadcasts only if given as a scalar."""
    if name not in attrs or _unwrap(attrs[name]) is None:
        if default is None:
            raise ConvValueError(f"{op}: attribute {name} is required, but it is missing")
        return (default,) * nsp
    raw = _unwrap(attrs[name])
    vals = _ints(op, name, raw)
    if not vals and default is not None:
        return (default,) * nsp
    if isinstance(raw, (numbers.Integral, np.integer)) and not isinstance(raw, (bool, np.bool_)):
        vals = vals * nsp
    if len(vals) != nsp:
        raise ConvValueError(f"{op}: {name} must have one entry per spatial axis ({nsp}), but got {len(vals)}: "
                             f"{list(vals)}")
    check_range(op, name, vals, minimum)
    return vals


def _string(op: str, attrs: Mapping, name: str, default: str, allowed: Sequence[str]) -> str:
    """A case-insensitive string attribute, returned in lower case."""
    value = _unwrap(attrs.get(name, default))
    if value is None:
        value = default
    if not isinstance(value, str):
        raise ConvTypeError(f"{op}: {name} must be a string, one of {list(allowed)}, but got {value!r}")
    if value.lower() not in allowed:
        raise ConvValueError(f"{op}: {name} must be one of {list(allowed)}, but got {value!r}")
    return value.lower()


def _int_attr(op: str, attrs: Mapping, name: str, default: int) -> int:
    value = _unwrap(attrs.get(name, default))
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        raise ConvTypeError(f"{op}: {name} must be an integer, but got {value!r}")
    return int(value)


def _check_known(op: str, attrs: Mapping, known: Sequence[str]) -> None:
    unknown = sorted(set(attrs) - set(known))
    if unknown:
        raise ConvValueError(f"{op}: attributes must be among {sorted(known)}, but got unknown {unknown}")


def _shape(op: str, shapes: Mapping, names: Sequence[str], rank: int | None, *, required: bool = True,
           what: str | None = None) -> tuple[int, ...] | None:
    """The shape given under any of ``names`` (the framework's input names and their aliases)."""
    given = [n for n in names if shapes.get(n) is not None]
    if not given:
        if required:
            raise ConvValueError(f"{op}: the shape of {what or names[0]} is required (give it as "
                                 f"{' or '.join(repr(n) for n in names)}), but it is missing")
        return None
    shp = _ints(op, f"{given[0]} shape", shapes[given[0]])
    check_range(op, f"{given[0]} shape", shp, 0)
    if rank is not None and len(shp) != rank:
        raise ConvValueError(f"{op}: {given[0]} must have rank {rank}, but got shape {list(shp)}")
    return shp


def _check_shape(op: str, name: str, given: tuple[int, ...] | None, want: tuple[int, ...]) -> None:
    if given is not None and tuple(given) != tuple(want):
        raise ConvValueError(f"{op}: {name} must have shape {tuple(want)} for these attributes, but got {tuple(given)}")


def _forward_rule_notes(mode: str, spec_src, kernel, strides, dilations, pb, pe, *, label: str) -> list[str]:
    notes = []
    for i, k, s, d, b, e in zip(spec_src, kernel, strides, dilations, pb, pe):
        ek = effective_kernel(k, d)
        if mode in ("same_upper", "same_lower"):
            o = -(-i // s)
            tot = b + e
            odd = "" if tot % 2 == 0 else (", the odd unit at the end" if mode == "same_upper"
                                           else ", the odd unit at the begin")
            notes.append(f"{label}: output ceil({i}/{s}) = {o}, total pad max(({o}-1)*{s} + {ek} - {i}, 0) = {tot}"
                         f" -> begin {b}, end {e}{odd}")
        elif mode == "valid":
            notes.append(f"{label}: no padding")
        else:
            notes.append(f"{label}: begin {b}, end {e}")
    return notes


# ---------------------------------------------------------------------------------------------
# Readers: framework op -> canonical problem


def _read_tensorflow(op: str, attrs: Mapping, shapes: Mapping) -> Reading:
    direction, nsp, family = _TF_OPS[op]
    rank = nsp + 2
    _check_known(op, attrs, ("strides", "padding", "explicit_paddings", "data_format", "dilations",
                             "use_cudnn_on_gpu", "name", "T"))
    fmts = ("nhwc", "nchw") if nsp == 2 else ("ndhwc", "ncdhw")
    fmt = _string(op, attrs, "data_format", fmts[0], fmts)
    cl = fmt.endswith("c")
    spatial = list(range(1, 1 + nsp)) if cl else list(range(2, 2 + nsp))
    bc = [0, rank - 1] if cl else [0, 1]
    def four(name: str, default_one: bool) -> tuple[int, ...]:
        if name not in attrs or _unwrap(attrs[name]) is None:
            if not default_one:
                raise ConvValueError(f"{op}: attribute {name} is required, but it is missing")
            return (1,) * nsp
        vals = _ints(op, name, attrs[name])
        if len(vals) != rank:
            raise ConvValueError(f"{op}: {name} must have {rank} entries in {fmt.upper()} order, but got "
                                 f"{len(vals)}: {list(vals)}")
        if any(vals[a] != 1 for a in bc):
            raise ConvValueError(f"{op}: {name} in the batch and channel dimensions must be 1, but got {list(vals)}")
        out = tuple(vals[a] for a in spatial)
        check_range(op, name, out, 1)
        return out
    strides = four("strides", False)
    dilations = four("dilations", True)
    padding = _string(op, attrs, "padding", "", ("same", "valid", "explicit") if nsp == 2 else ("same", "valid"))
    expl = _ints(op, "explicit_paddings", attrs.get("explicit_paddings", []))
    if padding == "explicit":
        if len(expl) != 2 * rank:
            raise ConvValueError(f"{op}: explicit_paddings must have {2 * rank} entries (before, after per "
                                 f"dimension in {fmt.upper()} order), but got {len(expl)}: {list(expl)}")
        if any(expl[2 * a] or expl[2 * a + 1] for a in bc):
            raise ConvValueError(f"{op}: explicit_paddings in the batch and channel dimensions must be 0, "
                                 f"but got {list(expl)}")
        check_range(op, "explicit_paddings", expl, 0)
    elif expl:
        raise ConvValueError(f"{op}: explicit_paddings must be empty unless padding is EXPLICIT, but got {list(expl)}")

    inp = _shape(op, shapes, ("input", "input_sizes"), rank, what="input")
    filt = _shape(op, shapes, ("filter", "filter_sizes"), rank, what="filter")
    mb, ic, src = inp[0], inp[bc[1]], tuple(inp[a] for a in spatial)
    kernel = tuple(filt[:nsp])
    if family == "depthwise":
        if filt[nsp] != ic:
            raise ConvValueError(f"{op}: filter in_channels ({filt[nsp]}) must equal the input channels ({ic}), "
                                 f"but got filter {list(filt)} and input {list(inp)}")
        groups, oc = ic, ic * filt[nsp + 1]
    else:
        if filt[nsp] < 1 or ic % filt[nsp]:
            raise ConvValueError(f"{op}: input channels ({ic}) must be a multiple of the filter's in_channels "
                                 f"({filt[nsp]}), but got input {list(inp)} and filter {list(filt)}")
        groups, oc = ic // filt[nsp], filt[nsp + 1]
    if padding == "same":
        pairs = [same_pads(i, k, s, d, upper=True) for i, k, s, d in zip(src, kernel, strides, dilations)]
        pb, pe = tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    elif padding == "valid":
        pb = pe = (0,) * nsp
    else:
        pb = tuple(expl[2 * a] for a in spatial)
        pe = tuple(expl[2 * a + 1] for a in spatial)
    spec = make_spec(op, mb=mb, ic=ic, oc=oc, groups=groups, src=src, kernel=kernel, strides=strides,
                     dilations=dilations, pads_begin=pb, pads_end=pe)
    mode = {"same": "same_upper", "valid": "valid", "explicit": "explicit"}[padding]
    pad_notes = _forward_rule_notes(mode, src, kernel, strides, dilations, pb, pe, label=padding.upper())
    call = _tf_call(op, direction, family, spec, fmt.upper(), dict(attrs))
    _check_shape(op, "out_backprop" if direction != "fwd" else "output",
                 _shape(op, shapes, ("out_backprop", "output"), rank, required=False),
                 call.output.shape if direction == "fwd" else _role_shape(call, "diff_dst"))
    return Reading(direction, spec, call, tuple(pad_notes))


def _role_shape(call: OpCall, role: str) -> tuple[int, ...]:
    for t in call.inputs + (call.output,):
        if t.role == role:
            return t.shape
    raise KeyError(role)  # internal


def _read_openvino(op: str, attrs: Mapping, shapes: Mapping) -> Reading:
    direction, _, family = _OV_OPS[op]
    back = direction == "bwd_data"
    _check_known(op, attrs, ("strides", "pads_begin", "pads_end", "dilations", "auto_pad")
                 + (("output_padding",) if back else ()))
    data = _shape(op, shapes, ("data", "input"), None, what="data")
    filters = _shape(op, shapes, ("filters", "filter"), None, what="filters")
    if not 3 <= len(data) <= 5:
        raise ConvValueError(f"{op}: data must have rank 3, 4 or 5 (N, C, *spatial), but got shape {list(data)}")
    nsp = len(data) - 2
    want = len(data) + (1 if family == "group" else 0)
    if len(filters) != want:
        raise ConvValueError(f"{op}: filters must have rank {want}, but got shape {list(filters)}")
    s = _per_axis(op, attrs, "strides", nsp, 1, 1)
    d = _per_axis(op, attrs, "dilations", nsp, 1, 1)
    auto = _string(op, attrs, "auto_pad", "explicit", ("explicit", "notset", "same_upper", "same_lower", "valid"))
    auto = "explicit" if auto == "notset" else auto
    # OpenVINO ignores the pads (even negative ones) unless auto_pad is explicit
    pb = _per_axis(op, attrs, "pads_begin", nsp, 0, 0 if auto == "explicit" else -MAX_DIM)
    pe = _per_axis(op, attrs, "pads_end", nsp, 0, 0 if auto == "explicit" else -MAX_DIM)
    if family == "group":
        g, a, b = filters[0], filters[1], filters[2]
        kernel = tuple(filters[3:])
    else:
        g, a, b = 1, filters[0], filters[1]
        kernel = tuple(filters[2:])
    mb, ch, sp = data[0], data[1], tuple(data[2:])
    layout_f = {("fwd", "plain"): "[C_OUT, C_IN, k...]", ("fwd", "group"): "[G, C_OUT, C_IN, k...]",
                ("bwd_data", "plain"): "[C_IN, C_OUT, k...]",
                ("bwd_data", "group"): "[G, C_IN, C_OUT, k...]"}[(direction, family)]
    c_in = a if back else b  # the channels per group that meet the data
    if ch != g * c_in:
        raise ConvValueError(f"{op}: data channels ({ch}) must equal groups * C_IN ({g} * {c_in} = {g * c_in}) "
                             f"of filters {layout_f} {list(filters)}")
    if not back:
        oc, icg = g * a, b
        if auto in ("same_upper", "same_lower"):
            pairs = [same_pads(i, k, si, di, upper=auto == "same_upper") for i, k, si, di in zip(sp, kernel, s, d)]
            pb, pe = tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
        elif auto == "valid":
            pb = pe = (0,) * nsp
        spec = make_spec(op, mb=mb, ic=g * icg, oc=oc, groups=g, src=sp, kernel=kernel, strides=s, dilations=d,
                         pads_begin=pb, pads_end=pe)
        pad_notes = _forward_rule_notes(auto, sp, kernel, s, d, pb, pe, label=f"auto_pad {auto}")
        return Reading(direction, spec, _ov_call(op, direction, family, spec, dict(attrs)), tuple(pad_notes))
    # Backprop data: the window [offset, offset + size) of the full transposed result of L rows.
    oc, icg = g * a, b
    opad = _per_axis(op, attrs, "output_padding", nsp, 0, -MAX_DIM)
    out_shape = _shape(op, shapes, ("output_shape",), None, required=False)
    if out_shape is not None and len(out_shape) != nsp:
        raise ConvValueError(f"{op}: output_shape must have one entry per spatial axis ({nsp}), but got "
                             f"{list(out_shape)}")
    full = [si * (i - 1) + effective_kernel(k, di) for i, k, si, di in zip(sp, kernel, s, d)]
    offset, size, notes = [], [], []
    for ax in range(nsp):
        L, o_p = full[ax], opad[ax]
        head = f"L = {s[ax]}*({sp[ax]}-1) + {effective_kernel(kernel[ax], d[ax])} = {L}"
        if out_shape is None:
            if auto == "explicit":
                off, n = pb[ax], L - pb[ax] - pe[ax] + o_p
                notes.append(f"{head}; explicit: output L - {pb[ax]} - {pe[ax]} + output_padding {o_p} = {n}, "
                             f"starting at row {off}")
            else:
                off, n = 0, L + o_p
                notes.append(f"{head}; auto_pad {auto} without output_shape ignores the pads: output L + "
                             f"output_padding {o_p} = {n}, starting at row 0")
        else:
            n = out_shape[ax]
            if auto == "explicit":
                off = pb[ax]
                notes.append(f"{head}; explicit with output_shape {n}: starts at pads_begin {off} (pads_end unused)")
            elif auto == "valid":
                off = 0
                notes.append(f"{head}; valid with output_shape {n}: starts at row 0")
            else:
                t = max(L + o_p - n, 0)
                off = t - t // 2 if auto == "same_upper" else t // 2
                where = "begin" if auto == "same_upper" else "end"
                odd = f", the odd unit at the {where} (the reverse of forward SAME)" if t % 2 else ""
                notes.append(f"{head}; {auto} with output_shape {n}: total crop max(L + {o_p} - {n}, 0) = {t}, "
                             f"starts at row {off}{odd}")
        if n < 0:
            raise ConvValueError(f"{op}: output spatial size must be non-negative, but axis {ax} gives {n}")
        offset.append(off)
        size.append(n)
    cpb, cpe = [], []
    for ax in range(nsp):
        L, off, n = full[ax], offset[ax], size[ax]
        if off < 0:
            raise TranslationRefused(f"{op}: axis {ax}: the output starts {-off} rows before the transposed "
                                     f"result (negative pads), which no forward convolution has as its gradient")
        end = L - off - n
        if end < 0 and -end >= s[ax]:
            raise TranslationRefused(
                f"{op}: axis {ax}: the output ends {-end} rows past the last row the kernel reaches (L = {L}), "
                f"at least one stride ({s[ax]}): those rows are zero padding that no forward convolution's "
                f"gradient has")
        cpb.append(off)
        cpe.append(max(end, 0))
    spec = make_spec(op, mb=mb, ic=g * icg, oc=oc, groups=g, src=size, kernel=kernel, strides=s, dilations=d,
                     pads_begin=cpb, pads_end=cpe)
    if spec.dst != sp:  # internal consistency of the window rule above
        raise TranslationRefused(f"{op}: no forward convolution maps {list(size)} to {list(sp)}")
    call = _ov_call(op, direction, family, spec, dict(attrs))
    if out_shape is not None:
        call = OpCall(call.framework, op, call.attrs, call.inputs, call.output, {"output_shape": tuple(out_shape)})
    return Reading(direction, spec, call, tuple(notes))


def _read_onednn(op: str, attrs: Mapping, shapes: Mapping) -> Reading:
    direction, _, _ = _DNNL_OPS[op]
    extra = {"fwd": (), "bwd_data": ("dst_shape", "output_padding"), "bwd_weights": ("weights_shape",)}[direction]
    _check_known(op, attrs, ("strides", "pads_begin", "pads_end", "dilations", "auto_pad", "groups",
                             "data_format", "weights_format") + extra)
    fmt = _string(op, attrs, "data_format", "nxc", ("nxc", "ncx")).upper()
    wfmt = _string(op, attrs, "weights_format", "xio", ("xio", "oix")).upper()
    auto = _string(op, attrs, "auto_pad", "none", ("none", "same_upper", "same_lower", "valid"))
    groups = _int_attr(op, attrs, "groups", 1)
    if direction == "bwd_data":
        src = _shape(op, shapes, ("src", "input", "diff_src"), None, required=False)
        if src is None and "dst_shape" in attrs:
            src = _ints(op, "dst_shape", attrs["dst_shape"])
        if src is None:
            raise ConvValueError(f"{op}: the forward src shape is required (attribute dst_shape, or the shape "
                                 f"'src'), but it is missing")
    else:
        src = _shape(op, shapes, ("src", "input"), None, what="src")
    if direction == "bwd_weights":
        w = _shape(op, shapes, ("weights", "filter", "diff_weights"), None, required=False)
        if w is None and "weights_shape" in attrs:
            w = _ints(op, "weights_shape", attrs["weights_shape"])
        if w is None:
            raise ConvValueError(f"{op}: the weights shape is required (attribute weights_shape, or the shape "
                                 f"'weights'), but it is missing")
    else:
        w = _shape(op, shapes, ("weights", "filter"), None, what="weights")
    if not 3 <= len(src) <= 5:
        raise ConvValueError(f"{op}: src must have rank 3, 4 or 5, but got shape {list(src)}")
    nsp = len(src) - 2
    if len(w) != len(src):
        raise ConvValueError(f"{op}: weights must have rank {len(src)} ({wfmt}), but got shape {list(w)}")
    s = _per_axis(op, attrs, "strides", nsp, None, 1)
    d = _per_axis(op, attrs, "dilations", nsp, None, 1)
    pb = _per_axis(op, attrs, "pads_begin", nsp, None, 0)
    pe = _per_axis(op, attrs, "pads_end", nsp, None, 0)
    perm = _perm_from_canonical(fmt, nsp)
    csrc = tuple(src[perm.index(a)] for a in range(nsp + 2))
    wperm = _perm_from_canonical(wfmt, nsp)
    cw = tuple(w[wperm.index(a)] for a in range(nsp + 2))
    mb, ic, sp = csrc[0], csrc[1], csrc[2:]
    if groups < 1 or ic % groups or cw[1] * groups != ic:
        raise ConvValueError(f"{op}: weights I ({cw[1]}) must equal src channels / groups ({ic} / {groups}), "
                             f"but got weights {list(w)} ({wfmt}) and src {list(src)} ({fmt})")
    if auto in ("same_upper", "same_lower"):
        pairs = [same_pads(i, k, si, di, upper=auto == "same_upper") for i, k, si, di in zip(sp, cw[2:], s, d)]
        pb, pe = tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    elif auto == "valid":
        pb = pe = (0,) * nsp
    spec = make_spec(op, mb=mb, ic=ic, oc=cw[0], groups=groups, src=sp, kernel=cw[2:], strides=s, dilations=d,
                     pads_begin=pb, pads_end=pe)
    pad_notes = _forward_rule_notes(auto, sp, cw[2:], s, d, pb, pe, label=f"auto_pad {auto}")
    call = _onednn_call(op, direction, spec, fmt, wfmt, dict(attrs))
    shape_attr = {"bwd_weights": "weights_shape", "bwd_data": "dst_shape"}.get(direction)
    if shape_attr is not None and shape_attr not in attrs:  # given as a shape: the op's optional input
        call = OpCall(call.framework, op, call.attrs, call.inputs, call.output, {shape_attr: call.output.shape})
    _check_shape(op, "diff_dst", _shape(op, shapes, ("diff_dst",), nsp + 2, required=False),
                 _role_shape(call, "diff_dst") if direction != "fwd" else call.output.shape)
    notes = ("ConvolutionBackwardData: output_padding changes nothing (oneDNN 3.13.2 applies the forward "
             "rule to dst_shape)",) if direction == "bwd_data" else ()
    return Reading(direction, spec, call, tuple(pad_notes), notes)


def read(framework: str, op: str, attrs: Mapping | None = None, shapes: Mapping | None = None) -> Reading:
    """The canonical problem behind one framework op (raises ConvError on bad attributes)."""
    fw = framework_name(framework)
    table = OPS[fw]
    if op not in table:
        raise ConvValueError(f"translate: op must be one of {_TITLE[fw]}'s {sorted(table)}, but got {op!r}")
    attrs = {} if attrs is None else attrs
    shapes = {} if shapes is None else shapes
    if not isinstance(attrs, Mapping):
        raise ConvTypeError(f"{op}: attributes must be a mapping of name to value, but got {type(attrs).__name__}")
    if not isinstance(shapes, Mapping):
        raise ConvTypeError(f"{op}: shapes must be a mapping of input name to shape, but got {type(shapes).__name__}")
    return {"tensorflow": _read_tensorflow, "openvino": _read_openvino, "onednn": _read_onednn}[fw](op, attrs, shapes)


# ---------------------------------------------------------------------------------------------
# Writers: canonical problem -> framework op (or a refusal)


def _roles(spec: ConvSpec) -> dict[str, tuple[int, ...]]:
    """Canonical shape of each tensor role."""
    return {"src": spec.src_shape, "weights": spec.weights_shape, "dst": spec.dst_shape,
            "diff_src": spec.src_shape, "diff_dst": spec.dst_shape, "diff_weights": spec.weights_shape}


def _tf_call(op: str, direction: str, family: str, spec: ConvSpec, fmt: str, attrs: dict) -> OpCall:
    nsp = spec.nsp
    cl = fmt.endswith("C")
    data_steps = _layout_steps("NXC" if cl else "NCX", nsp)
    if family == "depthwise":
        mult = spec.oc // spec.ic
        w_steps = _layout_steps("XIO", nsp) + (Step("reshape", spec.kernel + (spec.ic, mult)),)
        w_layout = "[k..., C, M]"
    else:
        w_steps = _layout_steps("XIO", nsp)
        w_layout = "HWIO" if nsp == 2 else "DHWIO"
    r = _roles(spec)
    data = lambda name, role: _tensor(name, role, r[role], fmt, data_steps)  # noqa: E731
    wt = lambda name, role: _tensor(name, role, r[role], w_layout, w_steps)  # noqa: E731
    consts = {}
    if direction == "fwd":
        ins, out = (data("input", "src"), wt("filter", "weights")), data("output", "dst")
    elif direction == "bwd_weights":
        ins, out = (data("input", "src"), data("out_backprop", "diff_dst")), wt("output", "diff_weights")
        consts["filter" if op.endswith("V2") and op.startswith("Conv2D") else "filter_sizes"] = out.shape
    else:
        ins, out = (wt("filter", "weights"), data("out_backprop", "diff_dst")), data("output", "diff_src")
        consts["input" if op.endswith("V2") and op.startswith("Conv2D") else "input_sizes"] = out.shape
    return OpCall("tensorflow", op, attrs, ins, out, consts)


def _ov_call(op: str, direction: str, family: str, spec: ConvSpec, attrs: dict) -> OpCall:
    r = _roles(spec)
    if family == "group":
        w_steps: tuple[Step, ...] = (Step("reshape", (spec.groups, spec.ocg, spec.icg) + spec.kernel),)
        w_layout = "[G, C_OUT, C_IN, k...]" if direction == "fwd" else "[G, C_IN, C_OUT, k...]"
    else:
        w_steps = ()
        w_layout = "[C_OUT, C_IN, k...]" if direction == "fwd" else "[C_IN, C_OUT, k...]"
    if direction == "fwd":
        ins = (_tensor("data", "src", r["src"], "NCX"), _tensor("filters", "weights", r["weights"], w_layout, w_steps))
        out = _tensor("output", "dst", r["dst"], "NCX")
    else:
        ins = (_tensor("data", "diff_dst", r["diff_dst"], "NCX"),
               _tensor("filters", "weights", r["weights"], w_layout, w_steps))
        out = _tensor("output", "diff_src", r["diff_src"], "NCX")
    return OpCall("openvino", op, attrs, ins, out)


def _onednn_call(op: str, direction: str, spec: ConvSpec, fmt: str, wfmt: str, attrs: dict) -> OpCall:
    r = _roles(spec)
    nsp = spec.nsp
    d_steps, w_steps = _layout_steps(fmt, nsp), _layout_steps(wfmt, nsp)
    names = {"fwd": (("src", "weights"), "dst"), "bwd_weights": (("src", "diff_dst"), "diff_weights"),
             "bwd_data": (("diff_dst", "weights"), "diff_src")}[direction]
    def mk(name: str) -> Tensor:
        is_w = "weights" in name
        return _tensor(name, name, r[name], wfmt if is_w else fmt, w_steps if is_w else d_steps)
    return OpCall("onednn", op, attrs, tuple(mk(n) for n in names[0]), mk(names[1]))


def _refuse(target: str, why: str) -> TranslationRefused:
    return TranslationRefused(f"translate: no exact {_TITLE[target]} equivalent: {why}")


def _write_tensorflow(direction: str, spec: ConvSpec, to_op: str | None, layout: str | None) -> OpCall:
    nsp = spec.nsp
    if nsp not in (2, 3):
        raise _refuse("tensorflow", f"TensorFlow's raw convolution ops are 2-D (Conv2D*) or 3-D (Conv3D*), but "
                                    f"this problem has {nsp} spatial axes (tf.nn.conv1d itself reshapes to Conv2D)")
    fmts = ("NHWC", "NCHW") if nsp == 2 else ("NDHWC", "NCDHW")
    fmt = fmts[0] if layout is None else layout.upper()
    if fmt not in fmts:
        raise ConvValueError(f"translate: the TensorFlow data_format must be one of {list(fmts)} for "
                             f"{nsp} spatial axes, but got {layout!r}")
    notes: list[str] = []
    depthwise_ok = (nsp == 2 and spec.groups > 1 and spec.groups == spec.ic
                    and all(d == 1 for d in spec.dilations) and len(set(spec.strides)) == 1)
    default = {("fwd", 2): "Conv2D", ("fwd", 3): "Conv3D", ("bwd_weights", 2): "Conv2DBackpropFilter",
               ("bwd_weights", 3): "Conv3DBackpropFilterV2", ("bwd_data", 2): "Conv2DBackpropInput",
               ("bwd_data", 3): "Conv3DBackpropInputV2"}[(direction, nsp)]
    if depthwise_ok and to_op is None:
        to_op = {"fwd": "DepthwiseConv2dNative", "bwd_weights": "DepthwiseConv2dNativeBackpropFilter",
                 "bwd_data": "DepthwiseConv2dNativeBackpropInput"}[direction]
    op = to_op or default
    if op not in _TF_OPS:
        raise ConvValueError(f"translate: the target op must be one of TensorFlow's {sorted(_TF_OPS)}, but got {op!r}")
    odir, onsp, family = _TF_OPS[op]
    if odir != direction or onsp != nsp:
        raise _refuse("tensorflow", f"{op} computes a {onsp}-D {odir} problem, but this is a {nsp}-D {direction} one")
    if family == "depthwise":
        if not (spec.groups == spec.ic and spec.icg == 1):
            raise _refuse("tensorflow", f"{op} needs groups = input channels (depthwise), but got groups "
                                        f"{spec.groups} with {spec.ic} input channels")
        if any(d != 1 for d in spec.dilations):
            raise _refuse("tensorflow", f"{op} does not support dilations (TensorFlow's kernels reject them and its "
                                        f"backprop shape checks ignore them), but got {list(spec.dilations)}")
        if len(set(spec.strides)) != 1:
            raise _refuse("tensorflow", f"{op} supports only equal strides in rows and columns, but got "
                                        f"{list(spec.strides)}")
    elif spec.groups > 1:
        if nsp == 3:
            raise _refuse("tensorflow", f"Conv3D ops need the filter's in_channels to equal the input channels "
                                        f"(no groups), but this problem has groups {spec.groups}")
        if direction != "fwd":
            notes.append("TensorFlow's CPU kernels do not implement gradients of grouped convolutions "
                         "(\"Gradients for grouped convolutions are not supported on CPU\"); the op is valid on GPU")
    same = [same_pads(i, k, s, d, upper=True) for i, k, s, d in zip(spec.src, spec.kernel, spec.strides,
                                                                       spec.dilations)]
    attrs: dict[str, Any] = {}
    cl = fmt.endswith("C")
    expand = (lambda v: [1, *v, 1]) if cl else (lambda v: [1, 1, *v])
    attrs["strides"] = expand(list(spec.strides))
    if [p[0] for p in same] == list(spec.pads_begin) and [p[1] for p in same] == list(spec.pads_end):
        attrs["padding"] = "SAME"
    elif not any(spec.pads_begin) and not any(spec.pads_end):
        attrs["padding"] = "VALID"
    elif nsp == 2:
        attrs["padding"] = "EXPLICIT"
        pairs = [[b, e] for b, e in zip(spec.pads_begin, spec.pads_end)]
        flat = [0, 0] + [v for p in pairs for v in p] + [0, 0] if cl else [0, 0, 0, 0] + [v for p in pairs for v in p]
        attrs["explicit_paddings"] = flat
    else:
        raise _refuse("tensorflow", f"Conv3D ops accept only SAME and VALID padding, but pads begin "
                                    f"{list(spec.pads_begin)} end {list(spec.pads_end)} are neither (SAME would be "
                                    f"begin {[p[0] for p in same]} end {[p[1] for p in same]})")
    attrs["data_format"] = fmt
    attrs["dilations"] = expand(list(spec.dilations))
    if any(d != 1 for d in spec.dilations) and (nsp == 3 or direction != "fwd"):
        notes.append(f"TensorFlow 2.21's CPU kernels of {op} reject dilations > 1 (\"Current CPU implementations "
                     f"do not yet support dilation rates larger than 1\"); the op is valid on GPU")
    if fmt.startswith("NC"):
        notes.append(f"TensorFlow's CPU kernels mostly support only {fmts[0]}; {fmt} runs on GPU")
    call = _tf_call(op, direction, family, spec, fmt, attrs)
    return OpCall(call.framework, op, attrs, call.inputs, call.output, call.constants, tuple(notes))


def _write_openvino(direction: str, spec: ConvSpec, to_op: str | None, layout: str | None) -> OpCall:
    nsp = spec.nsp
    if not 1 <= nsp <= 3:
        raise _refuse("openvino", f"OpenVINO convolutions take data of rank 3 to 5 (1 to 3 spatial axes), but this "
                                  f"problem has {nsp} spatial axes")
    if layout is not None and layout.upper() not in ("NCX", "NCHW", "NCDHW", "NCW"):
        raise ConvValueError(f"translate: OpenVINO data is always channels first (NCX), but got layout {layout!r}")
    grouped = spec.groups > 1
    attrs: dict[str, Any] = {"strides": list(spec.strides), "pads_begin": list(spec.pads_begin),
                             "pads_end": list(spec.pads_end), "dilations": list(spec.dilations),
                             "auto_pad": "explicit"}
    if direction == "bwd_weights":
        return _write_openvino_weights_gradient(spec, to_op, attrs)
    default = {"fwd": ("Convolution", "GroupConvolution"),
               "bwd_data": ("ConvolutionBackpropData", "GroupConvolutionBackpropData")}[direction][grouped]
    op = to_op or default
    if op not in _OV_OPS:
        raise ConvValueError(f"translate: the target op must be one of OpenVINO's {sorted(_OV_OPS)}, but got {op!r}")
    odir, _, family = _OV_OPS[op]
    if odir != direction:
        raise _refuse("openvino", f"{op} computes a {odir} problem, but this is a {direction} one")
    if family == "plain" and grouped:
        raise _refuse("openvino", f"{op} has no groups, but this problem has groups {spec.groups}: use Group{op}")
    notes = []
    if direction == "bwd_data":
        # canonical src size i = s*(o-1) + ek - pb - pe + rem with 0 <= rem < s (floor), and
        # OpenVINO's explicit output is L - pb - pe + output_padding: output_padding = rem.
        rem = [(i + b + e - effective_kernel(k, d)) % s for i, k, s, d, b, e in
               zip(spec.src, spec.kernel, spec.strides, spec.dilations, spec.pads_begin, spec.pads_end)]
        attrs["output_padding"] = rem
        if op == "GroupConvolutionBackpropData" and spec.groups == 1:
            notes.append("OpenVINO 2026.4's CPU plugin fails to compile GroupConvolutionBackpropData with one group; "
                         "ConvolutionBackpropData with filters[0] is the same op")
    call = _ov_call(op, direction, family, spec, attrs)
    return OpCall("openvino", op, attrs, call.inputs, call.output, {}, tuple(notes))


def _write_openvino_weights_gradient(spec: ConvSpec, to_op: str | None, attrs: dict) -> OpCall:
    """OpenVINO has no weights-gradient op, but the weights gradient is itself a convolution:

        dW[g*ocg+o, c, k] = sum_{n, x} src[n, g*icg+c, x*s + k*d - pb] * dy[n, g*ocg+o, x]

    which is a (grouped) forward convolution of data' = src with batch and channels swapped,
    data'[c, g*N+n, :] = src[n, g*icg+c, :], by filters'[g, o, n, :] = dy[n, g*ocg+o, :], with
    stride' = d, dilation' = s, the same pads_begin, and pads_end' chosen so that the output is
    exactly k: the input is first cropped to the rows a window reads, i' = min(i, (o-1)*s + ek - pb),
    then pads_end' = (o-1)*s + ek - pb - i' >= 0 gives floor((i' + pb + pe' - ((o-1)*s + 1)) / d) + 1
    = floor((ek - 1) / d) + 1 = k. Its output (icg, g*ocg, *k) is diff_weights with O and I swapped.
    """
    g, n = spec.groups, spec.mb
    op = to_op or ("GroupConvolution" if g > 1 else "Convolution")
    if op not in ("Convolution", "GroupConvolution"):
        raise _refuse("openvino", f"OpenVINO has no weights-gradient op; the weights gradient is expressed as a "
                                  f"(Group)Convolution with batch and channels swapped, not as {op}")
    if op == "Convolution" and g > 1:
        raise _refuse("openvino", f"Convolution has no groups, but this problem has groups {g}: use GroupConvolution")
    crop, pe2 = [], []
    for ax in range(spec.nsp):
        i, o, s, pb = spec.src[ax], spec.dst[ax], spec.strides[ax], spec.pads_begin[ax]
        reach = (o - 1) * s + effective_kernel(spec.kernel[ax], spec.dilations[ax]) - pb
        if reach < 1:
            raise _refuse("openvino", f"axis {ax}: no window reads the input (every window lies in pads_begin)")
        crop.append(min(i, reach))
        pe2.append(reach - crop[-1])
    attrs = dict(attrs, strides=list(spec.dilations), dilations=list(spec.strides), pads_end=pe2)
    nsp = spec.nsp
    sp = tuple(range(3, 3 + nsp))
    swap = (Step("transpose", (1, 0) + tuple(range(2, 2 + nsp))),)
    crop_step = (Step("slice", ((0, spec.icg), (0, g * n)) + tuple((0, c) for c in crop)),)
    if op == "Convolution":
        data_steps, f_steps = swap + crop_step, swap
        f_layout = "[C_OUT, C_IN, k...] = diff_dst [O, N, X...]"
    else:
        data_steps = (Step("reshape", (n, g, spec.icg) + spec.src), Step("transpose", (2, 1, 0) + sp),
                      Step("reshape", (spec.icg, g * n) + spec.src)) + crop_step
        f_steps = (Step("reshape", (n, g, spec.ocg) + spec.dst), Step("transpose", (1, 2, 0) + sp))
        f_layout = "[G, C_OUT, C_IN, k...] = diff_dst [G, O/G, N, X...]"
    ins = (_tensor("data", "src", spec.src_shape, "[C_IN, N, X...] (src with batch and channels swapped)",
                   data_steps),
           _tensor("filters", "diff_dst", spec.dst_shape, f_layout, f_steps))
    out = _tensor("output", "diff_weights", spec.weights_shape, "[C_IN/G, O, k...] (diff_weights transposed)",
                  (Step("transpose", (1, 0) + tuple(range(2, 2 + nsp))),))
    notes = ("OpenVINO has no weights-gradient operation; this is the weights gradient written as a forward "
             f"{op}: data = src with batch and channels swapped (cropped to the rows a window reads), filters = "
             "diff_dst with batch and channels swapped, strides and dilations exchanged; the result is "
             "diff_weights with its first two axes swapped",)
    return OpCall("openvino", op, attrs, ins, out, {}, notes)


def _write_onednn(direction: str, spec: ConvSpec, to_op: str | None, layout: str | None,
                  weights_layout: str | None) -> OpCall:
    nsp = spec.nsp
    if not 1 <= nsp <= 3:
        raise _refuse("onednn", f"oneDNN Graph convolutions take 1 to 3 spatial axes, but this problem has {nsp}")
    default = {"fwd": "Convolution", "bwd_data": "ConvolutionBackwardData",
               "bwd_weights": "ConvolutionBackwardWeights"}[direction]
    op = to_op or default
    if op not in _DNNL_OPS:
        raise ConvValueError(f"translate: the target op must be one of oneDNN Graph's {sorted(_DNNL_OPS)}, but got "
                             f"{op!r}")
    if _DNNL_OPS[op][0] != direction:
        raise _refuse("onednn", f"{op} computes a {_DNNL_OPS[op][0]} problem, but this is a {direction} one")
    fmt = "NXC" if layout is None else layout.upper()
    wfmt = "XIO" if weights_layout is None else weights_layout.upper()
    if fmt not in ("NXC", "NCX"):
        raise ConvValueError(f"translate: the oneDNN Graph data_format must be NXC or NCX, but got {layout!r}")
    if wfmt not in ("XIO", "OIX"):
        raise ConvValueError(f"translate: the oneDNN Graph weights_format must be XIO or OIX, but got "
                             f"{weights_layout!r}")
    attrs: dict[str, Any] = {"strides": list(spec.strides), "pads_begin": list(spec.pads_begin),
                             "pads_end": list(spec.pads_end), "dilations": list(spec.dilations),
                             "auto_pad": "None", "groups": spec.groups, "data_format": fmt, "weights_format": wfmt}
    notes = []
    nsp_perm = lambda lay, shp: [int(shp[a]) for a in _perm_from_canonical(lay, nsp)]  # noqa: E731
    if direction == "bwd_weights":
        attrs["weights_shape"] = nsp_perm(wfmt, spec.weights_shape)
    if direction == "bwd_data":
        attrs["dst_shape"] = nsp_perm(fmt, spec.src_shape)
        if spec.groups > 1:
            notes.append("oneDNN 3.13.2 fails to compile ConvolutionBackwardData with groups > 1 (a library bug); "
                         "run it per group")
    call = _onednn_call(op, direction, spec, fmt, wfmt, attrs)
    return OpCall("onednn", op, attrs, call.inputs, call.output, {}, tuple(notes))


def translate(framework: str, op: str, attrs: Mapping | None, shapes: Mapping | None, to: str, *,
              to_op: str | None = None, layout: str | None = None,
              weights_layout: str | None = None) -> Translation:
    """Translate ``op`` of ``framework`` (attributes and input shapes in its own names) to ``to``.

    ``shapes`` maps the source op's input names to shapes: TensorFlow ``input`` and ``filter``
    (also ``input_sizes``/``filter_sizes``, optional ``out_backprop``); OpenVINO ``data`` and
    ``filters`` (and the ``output_shape`` value); oneDNN Graph ``src`` and ``weights`` (or the
    ``dst_shape``/``weights_shape`` attributes; optional ``diff_dst``). ``to_op`` picks the target
    op where several fit; ``layout``/``weights_layout`` pick the target's layouts where it has a
    choice. Raises :class:`TranslationRefused` where the target has no exact equivalent.
    """
    reading = read(framework, op, attrs, shapes)
    target = framework_name(to, "target framework")
    direction, spec = reading.direction, reading.spec
    if target == "tensorflow":
        if weights_layout is not None and weights_layout.upper() not in ("HWIO", "DHWIO", "XIO"):
            raise ConvValueError(f"translate: TensorFlow filters are always HWIO, but got {weights_layout!r}")
        call = _write_tensorflow(direction, spec, to_op, layout)
    elif target == "openvino":
        call = _write_openvino(direction, spec, to_op, layout)
    else:
        call = _write_onednn(direction, spec, to_op, layout, weights_layout)
    return Translation(direction, spec, reading.call, call, reading)
