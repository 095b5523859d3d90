"""The ``convgrad`` command (application layer): run OpenVINO IR and oneDNN Graph files,
translate an op between frameworks, explain its shape inference.

    convgrad run examples/ov_group_deconv_1d.xml --out results/
    convgrad run examples/onednn_conv_bwd_w_2d.json --input 0=src.npy
    convgrad translate --from tensorflow --op Conv2DBackpropFilterV2 \\
        --attrs '{"strides": [1, 2, 2, 1], "padding": "SAME"}' \\
        --input-shape 1,7,7,3 --filter-shape 3,3,3,4 --to openvino
    convgrad explain examples/ov_group_deconv_2d.xml
    convgrad bench --lists resnet_50 --libraries convgrad,torch    (see convgrad.bench)

Exit status: 0 success; 1 a computed shape differs from the one the file declares; 2 a user
mistake (missing or malformed file, unsupported layer, bad attribute), reported in one line
(``--verbose`` adds the traceback); 3 ``translate`` found no exact equivalent (the line says
why); 4 an internal error (a bug: please report it with ``--verbose``).

Safety: XML is parsed by defusedxml with DTDs refused, ``.npy`` inputs are read with pickles
refused, an IR's ``.bin`` is read only inside the bounds its XML declares, and every tensor a
layer needs is checked against ``--memory-limit`` before anything is allocated: a layer over
the limit runs as shape inference only, and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import traceback
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .errors import ConvError, ConvValueError

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE, EXIT_REFUSED, EXIT_INTERNAL = 0, 1, 2, 3, 4
DEFAULT_MEMORY_LIMIT = 1 << 30
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}


class UsageError(ConvValueError):
    """A bad command line or input file (exit status 2)."""


# ---------------------------------------------------------------------------------------------
# Small parsers


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"must be a size such as 512M, 2G or 1073741824, but got {text!r}")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, but got {text!r}")
    return value


def parse_dims(text: str, what: str = "shape") -> tuple[int, ...]:
    t = text.strip().strip("[]()")
    if not t:
        return ()
    parts = re.split(r"\s*[,x]\s*", t)
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(f"{what} must be integers separated by ',' or 'x' (e.g. 1,7,7,3), but got {text!r}") from None
    if any(d < 0 for d in dims):
        raise UsageError(f"{what} must be non-negative, but got {text!r}")
    return dims


def human_bytes(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _nbytes(shape: Sequence[int], dtype: np.dtype) -> int:
    n = int(dtype.itemsize)
    for v in shape:
        n *= int(v)
    return n


def load_npy(path: str, limit: int, what: str) -> np.ndarray:
    """A ``.npy`` file, its header checked (no pickles, size within ``limit``) before its data is read."""
    from .ir import FileError
    fmt = np.lib.format
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise FileError(f"{what}: {path}: no such file") from None
    except OSError as e:
        raise FileError(f"{what}: {path}: cannot be read ({e.strerror})") from None
    with f:
        try:
            version = fmt.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = fmt.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, _, dtype = fmt.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy format version {version}")
        except (ValueError, SyntaxError, EOFError) as e:
            raise FileError(f"{what}: {path} is not a valid .npy file ({e})") from None
        header_end = f.tell()
    if dtype.hasobject:
        raise FileError(f"{what}: {path} holds Python objects (a pickle), which are refused; save a numeric "
                        f"array with np.save")
    nbytes = _nbytes(shape, dtype)
    if nbytes > limit:
        raise FileError(f"{what}: {path} declares shape {tuple(shape)} {dtype} = {human_bytes(nbytes)}, above the "
                        f"memory limit {human_bytes(limit)} (--memory-limit)")
    if os.path.getsize(path) - header_end < nbytes:
        raise FileError(f"{what}: {path} is shorter than its header's shape {tuple(shape)} {dtype} needs")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise FileError(f"{what}: {path} cannot be loaded ({e})") from None


# ---------------------------------------------------------------------------------------------
# A file as a list of convolution nodes (common to OpenVINO IR and oneDNN Graph JSON)


@dataclass
class In:
    name: str                          # the framework's input name
    shape: tuple[int, ...]
    dtype: np.dtype
    keys: tuple[str, ...]              # what --input NAME_OR_PORT may call it
    origin: tuple                      # cache key of its value: ("param", id), ("const", id), ("node", k)
    describe: str                      # "random", "const 'w' (480 bytes at offset 0 of x.bin)", ...
    load: Callable[[], np.ndarray] | None = None   # a constant's reader
    kwarg: str | None = None           # passed by keyword (optional inputs) rather than position
    is_shape: bool = False             # a shape-valued input (output_shape, dst_shape, weights_shape)


@dataclass
class Node:
    label: str
    framework: str                     # "openvino" or "onednn"
    op: str
    attrs: dict
    inputs: list[In]
    declared: tuple[int, ...] | None   # the declared output shape (-1 = unknown)
    out_dtype: np.dtype | None
    file_stem: str
    shapes_for_reading: dict = field(default_factory=dict)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64].lstrip(".") or "op"


def _topo(where: str, items: list, deps: Callable[[Any], list]) -> list:
    """Items ordered so that each comes after the ones it depends on (refusing cycles)."""
    order, state = [], {}
    for start in items:
        stack = [(start, iter(deps(start)))]
        if state.get(id(start)) == 2:
            continue
        state[id(start)] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                state[id(node)] = 2
                order.append(node)
            elif state.get(id(nxt)) == 1:
                raise UsageError(f"{where}: the graph has a cycle")
            elif state.get(id(nxt)) is None:
                state[id(nxt)] = 1
                stack.append((nxt, iter(deps(nxt))))
    return order


_OV_ATTRS = ("strides", "pads_begin", "pads_end", "dilations", "auto_pad", "output_padding")


def ir_nodes(path: str, bin_path: str | None) -> list[Node]:
    from . import ir
    model = ir.load(path, bin_path)
    bad = [l for l in model.layers.values() if l.type not in ir.CONV_TYPES + ir.HELPER_TYPES]
    if bad:
        l = bad[0]
        raise ir.FileError(f"{path}: {l.label} has a type convgrad cannot run; supported layers are "
                           f"{list(ir.CONV_TYPES)} fed by {list(ir.HELPER_TYPES[:3])}")
    convs = [l for l in model.layers.values() if l.type in ir.CONV_TYPES]
    if not convs:
        raise ir.FileError(f"{path}: the model has no convolution layer ({', '.join(ir.CONV_TYPES)})")
    order = _topo(path, convs, lambda l: _conv_feeders(model, l))
    index = {l.id: k for k, l in enumerate(order)}
    nodes = []
    for layer in order:
        attrs = {}
        for k, v in layer.data.items():
            if k not in _OV_ATTRS or (k == "output_padding" and "Backprop" not in layer.type):
                raise ir.FileError(f"{path}: {layer.label}: attribute {k} is not one of {layer.type}'s "
                                   f"{[a for a in _OV_ATTRS if a != 'output_padding' or 'Backprop' in layer.type]}")
            if k == "auto_pad":
                attrs[k] = "explicit" if v.lower() == "notset" else v
            else:
                attrs[k] = _ov_ints(path, layer, k, v)
        names = ("data", "filters", "output_shape")
        if len(layer.inputs) not in ((2, 3) if "Backprop" in layer.type else (2,)):
            raise ir.FileError(f"{path}: {layer.label} must have {'2 or 3' if 'Backprop' in layer.type else 2} "
                               f"input ports, but has {len(layer.inputs)}")
        ins = []
        for k, port in enumerate(sorted(layer.inputs, key=lambda p: p.id)):
            ins.append(_ir_input(model, layer, port, names[k], index, k == 2))
        outp = sorted(layer.outputs, key=lambda p: p.id)
        if len(outp) != 1:
            raise ir.FileError(f"{path}: {layer.label} must have one output port, but has {len(outp)}")
        out_dt = ir.element_type(f"{path}: {layer.label} output", outp[0].precision) if outp[0].precision else None
        nodes.append(Node(f"{layer.label}", "openvino", layer.type, attrs, ins, outp[0].dims, out_dt,
                          f"layer{layer.id}_{_safe(layer.name)}"))
    return nodes


def _conv_feeders(model, layer) -> list:
    """The convolution layers a layer depends on (through Convert layers)."""
    from . import ir
    out, todo = [], [layer]
    seen = set()
    while todo:
        cur = todo.pop()
        for p in cur.inputs:
            src, _ = model.source(cur, p)
            if src.id in seen:
                continue
            seen.add(src.id)
            if src.type in ir.CONV_TYPES:
                out.append(src)
            else:
                todo.append(src)
    return out


def _ov_ints(path: str, layer, key: str, text: str) -> list[int]:
    from .ir import FileError
    t = text.strip()
    if not t:
        return []
    try:
        return [int(v) for v in t.split(",")]
    except ValueError:
        raise FileError(f"{path}: {layer.label}: {key} must be a comma-separated list of integers, "
                        f"but got {text!r}") from None


def _ir_input(model, layer, port, name: str, index: dict, optional: bool) -> In:
    from . import ir
    src, sport = model.source(layer, port)
    where = f"{model.path}: {layer.label} input port {port.id} ({name})"
    if sport.dims != port.dims:
        raise ir.FileError(f"{where}: declares {list(port.dims)}, but its producer {src.label} declares "
                           f"{list(sport.dims)}")
    keys = (f"{layer.name}:{port.id}", f"{layer.id}:{port.id}")
    kw = "output_shape" if optional else None
    if src.type in ir.CONV_TYPES:
        prec = src.outputs[0].precision
        dt = ir.element_type(where, prec) if prec else np.dtype(np.float32)
        return In(name, port.dims, dt, keys, ("node", index[src.id]), f"output of {src.label}", kwarg=kw,
                  is_shape=optional)
    convert = None
    if src.type == "Convert":
        if "destination_type" not in src.data:
            raise ir.FileError(f"{model.path}: {src.label}: destination_type is required, but it is missing")
        convert = ir.element_type(f"{model.path}: {src.label}", src.data["destination_type"])
        if len(src.inputs) != 1:
            raise ir.FileError(f"{model.path}: {src.label} must have one input port, but has {len(src.inputs)}")
        inner, _ = model.source(src, src.inputs[0])
        if inner.type not in ("Const", "Parameter"):
            raise ir.FileError(f"{where}: a Convert feeding a convolution must read a Const or a Parameter, "
                               f"but reads {inner.label}")
        src = inner
    if src.type == "Parameter":
        et = src.data.get("element_type") or (src.outputs[0].precision if src.outputs else None)
        if not et:
            raise ir.FileError(f"{model.path}: {src.label}: element_type is required, but it is missing")
        dt = ir.element_type(f"{model.path}: {src.label}", et)
        shape_text = src.data.get("shape")
        if shape_text is not None and shape_text.strip():
            declared = tuple(ir._int(f"{model.path}: {src.label}", "shape entry", v) for v in shape_text.split(","))
            if declared != src.outputs[0].dims:
                raise ir.FileError(f"{model.path}: {src.label}: shape {list(declared)} must equal its output port's "
                                   f"{list(src.outputs[0].dims)}")
        dt_out = convert or dt  # a converted Parameter is drawn directly in the converted type
        return In(name, port.dims, dt_out, (src.name,) + keys, ("param", src.id, str(dt_out)),
                  f"Parameter {src.name!r}, random" + (f" in {convert} (Converted)" if convert is not None else ""), None,
                  kw, optional)
    if src.type == "Const":
        dt, shape, offset, size = ir._const_geometry(model, src)
        conv = convert

        def load(model=model, src=src, conv=conv):
            v = ir.read_const(model, src)
            return v if conv is None else v.astype(conv)
        return In(name, port.dims, conv or dt, (src.name,) + keys, ("const", src.id, str(conv or dt)),
                  f"Const {src.name!r} ({size} bytes at offset {offset} of {os.path.basename(model.bin_path)})"
                  + (f" converted to {conv}" if conv is not None else ""), load, kw, optional)
    raise ir.FileError(f"{where}: is fed by {src.label}; convolution inputs must come from a Parameter, a Const, "
                       f"a Convert of those, or another convolution layer")


def json_nodes(path: str) -> list[Node]:
    from . import graphjson as gj
    from .ir import FileError
    graph = gj.load(path)
    if not graph.ops:
        raise FileError(f"{path}: the graph has no ops")
    bad = [op for op in graph.ops if op.kind not in gj.CONV_KINDS]
    if bad:
        raise FileError(f"{path}: {bad[0].label} has a kind convgrad cannot run; supported kinds are "
                        f"{list(gj.CONV_KINDS)}")
    prod = graph.producers()
    order = _topo(path, list(graph.ops), lambda op: [prod[t.id][0] for t in op.inputs if t.id in prod])
    index = {op.id: k for k, op in enumerate(order)}
    nodes = []
    for op in order:
        names = gj.CONV_KINDS[op.kind]
        if not 2 <= len(op.inputs) <= len(names):
            raise FileError(f"{path}: {op.label} must have 2 to {len(names)} inputs {list(names)}, but has "
                            f"{len(op.inputs)}")
        if len(op.outputs) != 1:
            raise FileError(f"{path}: {op.label} must have one output, but has {len(op.outputs)}")
        attrs = dict(op.attrs)
        ins = []
        for k, t in enumerate(op.inputs):
            name = names[k]
            where = f"{path}: {op.label} input {k} ({name}, tensor {t.id})"
            dt = gj.dtype_of(where, t.dtype)
            keys = (str(t.id), f"{op.name}:{k}", f"{op.id}:{k}")
            kw = name if k >= 2 else None
            is_shape = name in gj.SHAPE_INPUTS
            if t.id in prod:
                ins.append(In(name, t.shape, dt, keys, ("node", index[prod[t.id][0].id]),
                              f"output of {prod[t.id][0].label}", kwarg=kw, is_shape=is_shape))
                continue
            if not t.known:
                raise FileError(f"{where}: a graph input must have a known shape, but got {list(t.shape)}")
            ins.append(In(name, t.shape, dt, keys, ("tensor", t.id, str(dt)), f"graph input {t.id}, random",
                          kwarg=kw, is_shape=is_shape))
        out = op.outputs[0]
        out_dt = gj.dtype_of(f"{path}: {op.label} output", out.dtype)
        shapes = {}
        for t, name in zip(op.inputs, names):
            shapes[name] = t.shape if t.known and name not in gj.SHAPE_INPUTS else None
        if out.known:
            shapes["diff_src" if op.kind == "ConvolutionBackwardData" else
                   "diff_weights" if op.kind == "ConvolutionBackwardWeights" else "dst"] = out.shape
        nodes.append(Node(op.label, "onednn", op.kind, attrs, ins, out.shape, out_dt,
                          f"op{op.id}_{_safe(op.name)}", {k: v for k, v in shapes.items() if v is not None}))
    return nodes


def file_nodes(path: str, fmt: str, bin_path: str | None) -> list[Node]:
    if fmt == "auto":
        ext = os.path.splitext(path)[1].lower()
        if ext == ".xml":
            fmt = "ir"
        elif ext == ".json":
            fmt = "json"
        else:
            raise UsageError(f"{path}: the file must end in .xml (OpenVINO IR) or .json (oneDNN Graph), or give "
                             f"--format, but got {ext or 'no extension'!r}")
    return ir_nodes(path, bin_path) if fmt == "ir" else json_nodes(path)


# ---------------------------------------------------------------------------------------------
# Running nodes


def _front_end_op(node: Node):
    import importlib
    modname = {"openvino": "convgrad.openvino", "onednn": "convgrad.onednn"}[node.framework]
    try:
        mod = importlib.import_module(modname)
    except ImportError as e:
        raise UsageError(f"{node.label}: running it needs {modname}, which this installation lacks ({e})") from None
    cls = getattr(mod, node.op, None)
    if cls is None:
        raise UsageError(f"{node.label}: {modname} has no {node.op}")
    import inspect
    params = inspect.signature(cls).parameters
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(node.attrs) - set(params))
        if unknown:
            raise UsageError(f"{node.label}: attributes must be among {sorted(params)}, but got unknown {unknown}")
    missing = sorted(n for n, p in params.items() if p.kind == p.KEYWORD_ONLY and p.default is p.empty
                     and n not in node.attrs)
    if missing:
        raise UsageError(f"{node.label}: attributes {missing} are required by {node.op}, but the file does not give them")
    return cls(**node.attrs)


def _reading_shapes(node: Node, values: dict) -> dict:
    shapes = dict(node.shapes_for_reading)
    for inp in node.inputs:
        if inp.is_shape:
            if inp.name in values:
                shapes[inp.name] = [int(v) for v in np.asarray(values[inp.name]).ravel()]
        else:
            shapes[inp.name] = inp.shape
    return shapes


def _random(shape, dtype: np.dtype, seed: int, key: tuple) -> np.ndarray:
    """Seeded data, a pure function of (seed, the value's origin): the same for every run."""
    rng = np.random.default_rng([seed] + [zlib.crc32(str(k).encode()) for k in key])
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else -3
        return rng.integers(lo, 4, size=shape).astype(dtype)
    return rng.standard_normal(size=shape, dtype=np.float32).astype(dtype)


class Runner:
    def __init__(self, args, out):
        self.args = args
        self.out = out
        self.overrides = dict(args.input or [])
        self.used: set[str] = set()
        self.values: dict[tuple, np.ndarray] = {}
        self.results: list[np.ndarray | None] = []
        self.result_shapes: list[tuple[int, ...]] = []
        self.mismatches = 0
        self.computed = 0
        self.shape_only = 0

    def _override(self, inp: In) -> str | None:
        for k in inp.keys:
            if k in self.overrides:
                self.used.add(k)
                return self.overrides[k]
        return None

    def run_node(self, k: int, node: Node) -> list[str]:
        args = self.args
        lines = [node.label]
        shapes: list[tuple[int, ...]] = []
        values: dict[str, np.ndarray] = {}
        files: dict[int, str] = {}
        chained_shape_only = False
        for j, inp in enumerate(node.inputs):
            shp = inp.shape
            if inp.origin[0] == "node":
                shp = self.result_shapes[inp.origin[1]]
                if tuple(shp) != tuple(inp.shape) and all(v >= 0 for v in inp.shape):
                    raise UsageError(f"{node.label}: input {inp.name} declares {list(inp.shape)}, but its producer "
                                     f"computes {list(shp)}")
                if self.results[inp.origin[1]] is None:
                    chained_shape_only = True
            path = self._override(inp)
            if path is not None:
                if inp.origin[0] == "node":
                    raise UsageError(f"{node.label}: input {inp.name} is computed by another op and cannot be "
                                     f"given with --input")
                arr = load_npy(path, args.memory_limit, f"--input for {node.label} {inp.name}")
                if arr.shape != tuple(inp.shape):
                    raise UsageError(f"{node.label}: --input {path} for {inp.name} must have the declared shape "
                                     f"{tuple(inp.shape)}, but got {arr.shape}")
                if arr.dtype != inp.dtype:
                    if not np.can_cast(arr.dtype, inp.dtype, "same_kind"):
                        raise UsageError(f"{node.label}: --input {path} for {inp.name} must have element type "
                                         f"{inp.dtype} (or one that casts to it), but got {arr.dtype}")
                    arr = arr.astype(inp.dtype)
                self.values[inp.origin] = arr
                files[j] = path
            if inp.is_shape:
                if len(inp.shape) != 1 or inp.shape[0] > 8:
                    raise UsageError(f"{node.label}: input {inp.name} is a shape, so it must be 1-D with at most 8 "
                                     f"entries, but it is declared {list(inp.shape)}")
                v = self._value(inp, k, j)
                if v is None:
                    raise UsageError(f"{node.label}: input {inp.name} is a shape and needs a value: give it with "
                                     f"--input {inp.keys[0]}=FILE.npy")
                values[inp.name] = v
            shapes.append(tuple(shp))
        fe = _front_end_op(node)
        main = [s for s, inp in zip(shapes, node.inputs) if inp.kwarg is None]
        kw = {inp.name: [int(x) for x in values[inp.name].ravel()] for inp in node.inputs if inp.is_shape}
        inferred = tuple(int(v) for v in fe.infer_shape(*main, **kw))
        dt = next((inp.dtype for inp in node.inputs if not inp.is_shape), np.dtype(np.float32))
        need = sum(_nbytes(s, inp.dtype) for s, inp in zip(shapes, node.inputs) if not inp.is_shape)
        need_out = _nbytes(inferred, dt)
        for j, (inp, shp) in enumerate(zip(node.inputs, shapes)):
            how = "from " + files[j] if j in files else inp.describe
            if inp.is_shape:
                how += f" = {[int(x) for x in values[inp.name].ravel()]}"
            lines.append(f"  {inp.name:<13} {str(tuple(shp)):<24} {str(inp.dtype):<8} {how}")
        declared = node.declared
        if declared is None:
            check = "no declared shape to check"
        elif len(declared) == len(inferred) and all(d < 0 or d == v for d, v in zip(declared, inferred)):
            check = f"matches the declared {tuple(declared)}"
        else:
            check = f"MISMATCH: the file declares {tuple(declared)}"
            self.mismatches += 1
        lines.append(f"  {'output':<13} {str(inferred):<24} {str(dt):<8} {check}")
        try:
            from .translate import read
            lines.append(f"  {'problem':<13} {read(node.framework, node.op, node.attrs, _reading_shapes(node, values)).spec}")
        except ConvError:
            pass
        self.result_shapes.append(inferred)
        why = None
        if args.shape_only:
            why = "--shape-only"
        elif chained_shape_only:
            why = "an input comes from a layer that ran as shape inference only"
        elif need + need_out > args.memory_limit:
            why = (f"it needs {human_bytes(need + need_out)} (inputs {human_bytes(need)} + output "
                   f"{human_bytes(need_out)}), above the memory limit {human_bytes(args.memory_limit)} "
                   f"(--memory-limit)")
        if why:
            lines.append(f"  shape inference only: {why}")
            self.results.append(None)
            self.shape_only += 1
            return lines
        arrays, kwargs = [], {}
        for j, inp in enumerate(node.inputs):
            v = values[inp.name] if inp.is_shape else self._value(inp, k, j)
            if inp.kwarg is None:
                arrays.append(v)
            else:
                kwargs[inp.kwarg] = [int(x) for x in v.ravel()] if inp.is_shape else v
        res = np.asarray(fe(*arrays, **kwargs))
        self.results.append(res)
        self.computed += 1
        if self.out is not None:
            dest = os.path.join(self.out, node.file_stem + ".npy")
            # .npy has no bfloat16: such results are written as float32, which holds every
            # bfloat16 value exactly (NumPy would write opaque 2-byte void records)
            saved = res.astype(np.float32) if res.dtype.kind == "V" or res.dtype.name == "bfloat16" else res
            np.save(dest, saved, allow_pickle=False)
            note = " (bfloat16 values as float32)" if saved is not res else ""
            lines.append(f"  {'wrote':<13} {dest}{note}")
        return lines

    def _value(self, inp: In, k: int, j: int) -> np.ndarray | None:
        if inp.origin[0] == "node":
            return self.results[inp.origin[1]]
        if inp.origin in self.values:
            return self.values[inp.origin]
        if inp.load is not None:
            v = inp.load()
        elif inp.is_shape:
            return None
        else:
            v = _random(inp.shape, inp.dtype, self.args.seed, inp.origin)
        self.values[inp.origin] = v
        return v


def cmd_run(args) -> int:
    nodes = file_nodes(args.file, args.format, args.weights)
    out = args.out
    if out is not None:
        try:
            os.makedirs(out, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--out {out}: cannot create the directory ({e.strerror})") from None
    runner = Runner(args, out)
    bar = _progress(len(nodes))
    write = (lambda s: bar.write(s, file=sys.stdout)) if bar is not None else print
    for k, node in enumerate(nodes):
        for line in runner.run_node(k, node):
            write(line)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    unused = sorted(set(runner.overrides) - runner.used)
    if unused:
        raise UsageError(f"--input names must match an input of the file, but {unused} matched none")
    kind = "layer" if args.file.lower().endswith(".xml") else "op"
    print(f"{len(nodes)} {kind}{'s' if len(nodes) != 1 else ''}: {runner.computed} computed, "
          f"{runner.shape_only} shape inference only, {runner.mismatches} shape mismatch"
          f"{'es' if runner.mismatches != 1 else ''}")
    return EXIT_MISMATCH if runner.mismatches else EXIT_OK


def _progress(total: int):
    """A tqdm bar on stderr when it is a terminal; None when piped (quiet)."""
    if total < 2 or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        print("convgrad: note: install 'tqdm' (pip install 'convgrad[cli]') for a progress bar", file=sys.stderr)
        return None
    try:  # a terminal that reports no size (a bare pty) would make tqdm draw nothing
        cols, rows = os.get_terminal_size(sys.stderr.fileno())
    except OSError:
        cols, rows = 0, 0
    return tqdm(total=total, unit="op", file=sys.stderr, leave=False, ncols=cols if cols > 0 else 80,
                nrows=rows if rows > 0 else 24)


# ---------------------------------------------------------------------------------------------
# translate / explain


def _attrs_arg(text: str | None) -> dict:
    if text is None:
        return {}
    if text.startswith("@"):
        from .ir import read_text
        text = read_text(text[1:], "attributes JSON").decode("utf-8", "replace")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise UsageError(f"--attrs must be a JSON object, but it does not parse: {e}") from None
    if not isinstance(value, dict):
        raise UsageError(f"--attrs must be a JSON object of attribute names to values, but got {type(value).__name__}")
    return value


_DEFAULT_NAMES = {"tensorflow": ("input", "filter"), "openvino": ("data", "filters"), "onednn": ("src", "weights")}


def _shapes_arg(framework: str, args) -> dict:
    shapes: dict[str, Any] = {}
    inp, filt = _DEFAULT_NAMES[framework]
    if args.input_shape is not None:
        shapes[inp] = parse_dims(args.input_shape, "--input-shape")
    if args.filter_shape is not None:
        shapes[filt] = parse_dims(args.filter_shape, "--filter-shape")
    for item in args.shape or []:
        name, sep, dims = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--shape must be NAME=DIMS (e.g. out_backprop=1,4,4,4), but got {item!r}")
        shapes[name.strip()] = parse_dims(dims, f"--shape {name}")
    return shapes


def cmd_translate(args) -> int:
    from .translate import framework_name, translate
    fw = framework_name(args.source, "--from")
    t = translate(fw, args.op, _attrs_arg(args.attrs), _shapes_arg(fw, args), args.to, to_op=args.to_op,
                  layout=args.layout, weights_layout=args.weights_layout)
    print(json.dumps(t.to_dict(), indent=2) if args.json else t.describe())
    return EXIT_OK


def cmd_explain(args) -> int:
    from .explain import explain, explain_reading
    from .translate import OPS, TranslationRefused, framework_name, read
    if args.file is not None:
        if args.framework or args.op:
            raise UsageError("explain takes either FILE or --framework/--op, not both")
        nodes = file_nodes(args.file, args.format, args.weights)
        blocks = []
        for node in nodes:
            values = {}
            for inp in node.inputs:
                if inp.is_shape and inp.load is not None:
                    values[inp.name] = inp.load()
            if node.op not in OPS[node.framework]:
                blocks.append(f"{node.label}\nnot covered by explain (it covers {sorted(OPS[node.framework])})")
                continue
            try:
                text = explain_reading(read(node.framework, node.op, node.attrs, _reading_shapes(node, values)))
            except TranslationRefused as e:  # a valid op with no canonical form (e.g. a zero-filled tail)
                text = f"no canonical problem: {e}"
            blocks.append(f"{node.label}\n{text}")
        print("\n\n".join(blocks))
        return EXIT_OK
    if not args.framework or not args.op:
        raise UsageError("explain needs FILE, or --framework and --op (with --attrs and the shapes)")
    fw = framework_name(args.framework, "--framework")
    print(explain(fw, args.op, _attrs_arg(args.attrs), _shapes_arg(fw, args)))
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# Parser and entry point


def _input_pair(text: str) -> tuple[str, str]:
    name, sep, path = text.rpartition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"must be NAME_OR_PORT=FILE.npy, but got {text!r}")
    return name, path


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit status 2, as argparse does, without the usage block
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")
    p = _Parser(prog="convgrad", description="Run OpenVINO IR and oneDNN Graph convolution files, translate "
                "convolution ops between TensorFlow, OpenVINO and oneDNN Graph, and explain their shapes.",
                epilog="Exit status: 0 ok, 1 a computed shape differs from the declared one, 2 a user mistake, "
                "3 no exact translation exists, 4 an internal error.")
    p.add_argument("-v", "--verbose", action="store_true", default=False, help="show the traceback of an error")
    from . import __version__
    p.add_argument("--version", action="version", version=f"convgrad {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    r = sub.add_parser("run", parents=[common], help="run the convolution layers of an IR .xml or a Graph .json",
                       description="Run every convolution layer of an OpenVINO IR v10/v11 .xml file or every "
                       "convolution op of a oneDNN Graph JSON file, on seeded random inputs or given .npy files, and "
                       "check each computed output shape against the declared one.")
    r.add_argument("file", metavar="FILE", help="an OpenVINO IR .xml or a oneDNN Graph .json")
    r.add_argument("--input", metavar="NAME_OR_PORT=FILE.npy", action="append", type=_input_pair,
                   help="an input from a .npy file (pickles refused): a Parameter/Const name, LAYER:PORT or "
                   "LAYER_ID:PORT (IR); a tensor id, OPNAME:INDEX or OP_ID:INDEX (JSON). Repeatable.")
    r.add_argument("--out", metavar="DIR", help="write each output as DIR/<layer>.npy")
    r.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    r.add_argument("--memory-limit", type=parse_size, default=DEFAULT_MEMORY_LIMIT, metavar="SIZE",
                   help="largest memory one layer may use (inputs + output); layers above it run as shape "
                   "inference only (default 1G)")
    r.add_argument("--shape-only", action="store_true", help="run shape inference only")
    r.add_argument("--weights", metavar="BIN", help="the IR's .bin (default: FILE with .bin)")
    r.add_argument("--format", choices=("auto", "ir", "json"), default="auto", help="file format (default: by extension)")
    r.set_defaults(func=cmd_run)

    def op_flags(q, fw_flag: str, fw_dest: str, fw_help: str):
        q.add_argument(fw_flag, dest=fw_dest, metavar="FRAMEWORK", help=fw_help)
        q.add_argument("--op", help="the op's name in that framework, e.g. Conv2DBackpropFilterV2")
        q.add_argument("--attrs", metavar="JSON", help="attributes as a JSON object (or @file.json), in the "
                       "framework's names")
        q.add_argument("--input-shape", metavar="DIMS", help="shape of the op's data input: TensorFlow input, "
                       "OpenVINO data, oneDNN Graph src (e.g. 1,7,7,3)")
        q.add_argument("--filter-shape", metavar="DIMS", help="shape of the weights: TensorFlow filter, OpenVINO "
                       "filters, oneDNN Graph weights")
        q.add_argument("--shape", metavar="NAME=DIMS", action="append",
                       help="any input's shape (or a shape value) by its framework name, e.g. out_backprop=1,4,4,4 "
                       "or output_shape=15,15. Repeatable.")

    t = sub.add_parser("translate", parents=[common], help="translate an op to another framework",
                       description="Translate one convolution op with its attributes from one framework to the "
                       "exactly equivalent op of another, with explicit pads, layouts and tensor permutations; "
                       "refuse, with the reason, where no exact equivalent exists.")
    op_flags(t, "--from", "source", "source framework: tensorflow, openvino or onednn")
    t.add_argument("--to", required=True, metavar="FRAMEWORK", help="target framework")
    t.add_argument("--to-op", metavar="OP", help="target op where several fit (e.g. Conv2DBackpropFilterV2)")
    t.add_argument("--layout", metavar="FMT", help="target data layout where it has a choice (NHWC/NCHW, NXC/NCX)")
    t.add_argument("--weights-layout", metavar="FMT", help="target weights layout (oneDNN Graph XIO/OIX)")
    t.add_argument("--json", action="store_true", help="print the result as JSON")
    t.set_defaults(func=cmd_translate)

    e = sub.add_parser("explain", parents=[common], help="explain an op's shape inference term by term",
                       description="Explain the shape inference of one op (or of every convolution in a file): "
                       "effective kernel, resolved pads and where the odd unit went, output size.")
    e.add_argument("file", metavar="FILE", nargs="?", help="an OpenVINO IR .xml or a oneDNN Graph .json")
    op_flags(e, "--framework", "framework", "tensorflow, openvino or onednn")
    e.add_argument("--weights", metavar="BIN", help="the IR's .bin (default: FILE with .bin)")
    e.add_argument("--format", choices=("auto", "ir", "json"), default="auto", help="file format")
    e.set_defaults(func=cmd_explain)

    from . import bench  # the performance harness (its own module; light to import)
    b = sub.add_parser("bench", parents=[common], help="time convgrad against PyTorch, TensorFlow, OpenVINO, JAX",
                       description=(bench.__doc__ or "").strip().split("\n")[0] or None)
    bench.add_arguments(b)
    b.set_defaults(func=bench.run)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("convgrad: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `convgrad ... | head`: the reader left; stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except ConvError as e:
        from .translate import TranslationRefused
        if args.verbose:
            traceback.print_exc()
        print(f"convgrad {args.command}: {'refused' if isinstance(e, TranslationRefused) else 'error'}: {e}",
              file=sys.stderr)
        return EXIT_REFUSED if isinstance(e, TranslationRefused) else EXIT_USAGE
    except OSError as e:
        if args.verbose:
            traceback.print_exc()
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"convgrad {args.command}: error: {where}{e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE
    except MemoryError:
        if args.verbose:
            traceback.print_exc()
        print(f"convgrad {args.command}: error: out of memory; lower --memory-limit so that large layers run "
              f"as shape inference only", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:  # a bug in convgrad, not the user's mistake
        if args.verbose:
            traceback.print_exc()
        print(f"convgrad {args.command}: internal error: {type(e).__name__}: {e} (run with --verbose for the "
              f"traceback and report it)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
