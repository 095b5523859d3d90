"""oneDNN Graph JSON reader (file layer): the serialisation that oneDNN's graph dump and
benchdnn's graph driver use, parsed and checked without computing anything::

    {"version": "3.7.0", "engine_kind": "cpu", "fpmath_mode": "strict",
     "input_ports": [...], "output_ports": [...],
     "graph": [{"id": 0, "name": "CONV_0", "kind": "ConvolutionBackwardWeights",
                "attrs": {"strides": {"type": "s64[]", "value": [2, 2]}, ...},
                "inputs": [{"id": 0, "dtype": "f32", "shape": [1, 32, 28, 28], "stride": [...],
                            "layout_type": "strided", "property_type": "undef"}, ...],
                "outputs": [...]}]}

Logical tensors connect ops by ``id``. A dimension of ``-1`` means "unknown" (allowed on
outputs, which are inferred; inputs must be known before running). The file's size is
checked before reading, every value's type is checked, and NaN/Infinity literals are refused.
"""

from __future__ import annotations

import json
import numbers
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .ir import FileError, read_text
from .spec import MAX_DIM

__all__ = ["CONV_KINDS", "Graph", "LogicalTensor", "Op", "dtype_of", "load"]

# oneDNN Graph's convolution ops and their inputs in order (the last ones are optional)
CONV_KINDS = {
    "Convolution": ("src", "weights", "bias"),
    "ConvolutionBackwardData": ("diff_dst", "weights", "dst_shape"),
    "ConvolutionBackwardWeights": ("src", "diff_dst", "weights_shape"),
    "ConvTranspose": ("src", "weights", "bias"),
    "ConvTransposeBackwardData": ("diff_dst", "weights"),
    "ConvTransposeBackwardWeights": ("src", "diff_dst", "weights_shape"),
}
SHAPE_INPUTS = ("dst_shape", "weights_shape")   # inputs that carry a shape as an s32/s64 value
_ATTR_TYPES = ("s64", "s64[]", "f32", "f32[]", "string", "bool")


def dtype_of(where: str, name: object) -> np.dtype:
    if name == "bf16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    table = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "s32": np.int32, "s8": np.int8,
             "u8": np.uint8, "s64": np.int64}
    if name not in table:
        raise FileError(f"{where}: dtype must be one of {sorted(table) + ['bf16']}, but got {name!r}")
    return np.dtype(table[name])


@dataclass(frozen=True)
class LogicalTensor:
    id: int
    dtype: str
    shape: tuple[int, ...]          # -1 = unknown
    stride: tuple[int, ...]
    layout_type: str
    property_type: str

    @property
    def known(self) -> bool:
        return all(v >= 0 for v in self.shape)


@dataclass(frozen=True)
class Op:
    id: int
    name: str
    kind: str
    attrs: Mapping[str, Any]        # plain values ({"type", "value"} unwrapped, types checked)
    inputs: tuple[LogicalTensor, ...]
    outputs: tuple[LogicalTensor, ...]

    @property
    def label(self) -> str:
        return f"op {self.id} {self.name!r} ({self.kind})"


@dataclass(frozen=True)
class Graph:
    path: str
    version: str
    engine_kind: str
    fpmath_mode: str
    ops: tuple[Op, ...]

    def producers(self) -> dict[int, tuple[Op, int]]:
        """tensor id -> (the op producing it, output index)."""
        return {t.id: (op, k) for op in self.ops for k, t in enumerate(op.outputs)}


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_str(v: object) -> bool:
    return isinstance(v, str)


def _need(where: str, obj: Mapping, key: str, check, what: str) -> Any:
    if key not in obj:
        raise FileError(f"{where}: {key} is required, but it is missing")
    v = obj[key]
    if not check(v):
        raise FileError(f"{where}: {key} must be {what}, but got {v!r:.80}")
    return v


def _int_list(where: str, key: str, v: object, minimum: int) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(_is_int(x) for x in v):
        raise FileError(f"{where}: {key} must be a list of integers, but got {v!r:.80}")
    if any(x < minimum or x > MAX_DIM for x in v):
        raise FileError(f"{where}: {key} entries must be integers in [{minimum}, 2**40], but got {v!r:.80}")
    return tuple(v)


def _tensor(where: str, obj: object) -> LogicalTensor:
    if not isinstance(obj, dict):
        raise FileError(f"{where}: a logical tensor must be an object, but got {obj!r:.80}")
    tid = _need(where, obj, "id", _is_int, "an integer")
    where = f"{where} tensor {tid}"
    dtype = _need(where, obj, "dtype", _is_str, "a string")
    shape = _int_list(where, "shape", obj.get("shape", []), -1)
    stride = _int_list(where, "stride", obj.get("stride", []), -MAX_DIM)
    return LogicalTensor(tid, dtype, shape, stride, str(obj.get("layout_type", "strided")),
                         str(obj.get("property_type", "undef")))


def _attr(where: str, name: str, obj: object) -> Any:
    if not isinstance(obj, dict) or "value" not in obj:
        raise FileError(f"{where}: attribute {name} must be an object {{\"type\", \"value\"}}, but got {obj!r:.80}")
    typ, v = obj.get("type"), obj["value"]
    if typ not in _ATTR_TYPES:
        raise FileError(f"{where}: attribute {name} type must be one of {list(_ATTR_TYPES)}, but got {typ!r}")
    ok = {"s64": _is_int(v), "s64[]": isinstance(v, list) and all(_is_int(x) for x in v),
          "f32": isinstance(v, numbers.Real) and not isinstance(v, bool),
          "f32[]": isinstance(v, list) and all(isinstance(x, numbers.Real) and not isinstance(x, bool) for x in v),
          "string": isinstance(v, str), "bool": isinstance(v, bool)}[typ]
    if not ok:
        raise FileError(f"{where}: attribute {name} of type {typ} has a value of the wrong type: {v!r:.80}")
    if typ == "s64" and abs(v) > MAX_DIM or typ == "s64[]" and any(abs(x) > MAX_DIM for x in v):
        raise FileError(f"{where}: attribute {name} values must be at most 2**40 in magnitude, but got {v!r:.80}")
    return v


def _no_constants(name: str) -> None:
    raise ValueError(f"the literal {name} is not valid JSON")


def load(path: str) -> Graph:
    """Parse and check a oneDNN Graph JSON file (no tensor is allocated)."""
    text = read_text(path, "oneDNN Graph JSON")
    try:
        doc = json.loads(text, parse_constant=_no_constants)
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise FileError(f"{path}: malformed JSON: {e}") from None
    if not isinstance(doc, dict):
        raise FileError(f"{path}: the top level must be an object with a \"graph\" list, but got {type(doc).__name__}")
    graph = doc.get("graph")
    if not isinstance(graph, list):
        raise FileError(f"{path}: \"graph\" must be a list of ops, but got {graph!r:.80}")
    ops = []
    for k, obj in enumerate(graph):
        where = f"{path}: graph[{k}]"
        if not isinstance(obj, dict):
            raise FileError(f"{where}: an op must be an object, but got {obj!r:.80}")
        oid = _need(where, obj, "id", _is_int, "an integer")
        kind = _need(where, obj, "kind", _is_str, "a string")
        name = obj.get("name", f"op{oid}")
        if not isinstance(name, str):
            raise FileError(f"{where}: name must be a string, but got {name!r:.80}")
        where = f"{path}: op {oid} {name!r}"
        attrs_obj = obj.get("attrs", {})
        if not isinstance(attrs_obj, dict):
            raise FileError(f"{where}: attrs must be an object, but got {attrs_obj!r:.80}")
        attrs = {a: _attr(where, a, v) for a, v in attrs_obj.items()}
        ins, outs = obj.get("inputs", []), obj.get("outputs", [])
        if not isinstance(ins, list) or not isinstance(outs, list):
            raise FileError(f"{where}: inputs and outputs must be lists of logical tensors")
        ops.append(Op(oid, name, kind, attrs, tuple(_tensor(f"{where} input", t) for t in ins),
                      tuple(_tensor(f"{where} output", t) for t in outs)))
    ids = [op.id for op in ops]
    if len(set(ids)) != len(ids):
        raise FileError(f"{path}: op ids must be unique, but got {ids}")
    produced = [t.id for op in ops for t in op.outputs]
    if len(set(produced)) != len(produced):
        raise FileError(f"{path}: each tensor id must be produced by one op, but got outputs {produced}")
    return Graph(path, str(doc.get("version", "")), str(doc.get("engine_kind", "cpu")),
                 str(doc.get("fpmath_mode", "strict")), tuple(ops))
