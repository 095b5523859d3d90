"""OpenVINO IR reader (file layer): a hardened parser of IR v10/v11 ``.xml`` files and their ``.bin``.

Files come from strangers, so:

* the XML is parsed by ``defusedxml`` with DTDs forbidden (so no entity expansion and no
  external entities: IR files never declare a DTD), after checking the file's size;
* every dimension is checked to be a non-negative integer (dynamic ``-1``/``?`` dims are
  refused) before anything uses it;
* a ``Const`` layer's ``offset``/``size`` must agree with its ``element_type`` and ``shape`` and
  lie inside the ``.bin`` file; :func:`read_const` reads exactly those bytes, nothing else.

:func:`load` returns a :class:`Model` (layers, ports, edges) without reading any weights.
Nothing here computes: the command line runs the convolution layers through
``convgrad.openvino``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .errors import ConvValueError
from .spec import MAX_DIM

__all__ = ["CONV_TYPES", "FileError", "Layer", "Model", "Port", "element_type", "load", "read_const"]

MAX_TEXT_BYTES = 64 << 20   # largest .xml / .json accepted (a real conv IR is a few kB)
CONV_TYPES = ("Convolution", "GroupConvolution", "ConvolutionBackpropData", "GroupConvolutionBackpropData")
HELPER_TYPES = ("Parameter", "Const", "Convert", "Result")


class FileError(ConvValueError):
    """A file that cannot be used as given (malformed, hostile, inconsistent or unsupported)."""


def _ml_bfloat16() -> np.dtype:
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)


_TYPES = {
    "f64": np.float64, "fp64": np.float64, "f32": np.float32, "fp32": np.float32, "f16": np.float16,
    "fp16": np.float16, "i8": np.int8, "u8": np.uint8, "i16": np.int16, "u16": np.uint16, "i32": np.int32,
    "u32": np.uint32, "i64": np.int64, "u64": np.uint64,
}


def element_type(where: str, name: str) -> np.dtype:
    """An IR element type or port precision ('f32', 'FP32', 'bf16', 'i64', ...) -> NumPy dtype."""
    key = name.strip().lower()
    if key in ("bf16", "bfloat16"):
        return _ml_bfloat16()
    if key not in _TYPES:
        raise FileError(f"{where}: element type must be one of {sorted(set(_TYPES) | {'bf16'})}, but got {name!r}")
    return np.dtype(_TYPES[key])


@dataclass(frozen=True)
class Port:
    id: int
    dims: tuple[int, ...]
    precision: str | None


@dataclass(frozen=True)
class Layer:
    id: int
    name: str
    type: str
    version: str
    data: Mapping[str, str]
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]

    @property
    def label(self) -> str:
        return f"layer {self.id} {self.name!r} ({self.type})"

    def input_port(self, pid: int) -> Port:
        for p in self.inputs:
            if p.id == pid:
                return p
        raise FileError(f"{self.label}: has no input port {pid}")

    def output_port(self, pid: int) -> Port:
        for p in self.outputs:
            if p.id == pid:
                return p
        raise FileError(f"{self.label}: has no output port {pid}")


@dataclass(frozen=True)
class Model:
    path: str
    name: str
    version: int
    layers: Mapping[int, Layer]
    sources: Mapping[tuple[int, int], tuple[int, int]]   # (to layer, to port) -> (from layer, from port)
    bin_path: str | None
    bin_size: int | None

    def source(self, layer: Layer, port: Port) -> tuple[Layer, Port]:
        key = (layer.id, port.id)
        if key not in self.sources:
            raise FileError(f"{layer.label}: input port {port.id} has no incoming edge")
        lid, pid = self.sources[key]
        src = self.layers[lid]
        return src, src.output_port(pid)


def read_text(path: str, what: str) -> bytes:
    """A whole small text file, refusing anything larger than MAX_TEXT_BYTES before reading it."""
    try:
        size = os.path.getsize(path)
        if size > MAX_TEXT_BYTES:
            raise FileError(f"{path}: an {what} file must be at most {MAX_TEXT_BYTES} bytes, but this one has {size}")
        with open(path, "rb") as f:
            return f.read(MAX_TEXT_BYTES + 1)
    except FileNotFoundError:
        raise FileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise FileError(f"{path}: is a directory, not an {what} file") from None
    except PermissionError:
        raise FileError(f"{path}: permission denied") from None


def _parse_xml(path: str, text: bytes):
    try:
        import defusedxml
        import defusedxml.ElementTree as DET
    except ImportError:
        raise FileError("reading OpenVINO IR needs the 'defusedxml' package: pip install 'convgrad[cli]'") from None
    from xml.etree.ElementTree import ParseError
    try:
        return DET.fromstring(text, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except defusedxml.DTDForbidden:
        raise FileError(f"{path}: the XML declares a DTD (<!DOCTYPE>), which OpenVINO IR never does; refused "
                        f"(entity expansion and external entities are not allowed)") from None
    except defusedxml.EntitiesForbidden:
        raise FileError(f"{path}: the XML declares entities; refused (entity expansion is not allowed)") from None
    except defusedxml.ExternalReferenceForbidden:
        raise FileError(f"{path}: the XML refers to an external resource; refused") from None
    except defusedxml.DefusedXmlException as e:
        raise FileError(f"{path}: unsafe XML refused ({type(e).__name__})") from None
    except ParseError as e:
        raise FileError(f"{path}: malformed XML: {e}") from None
    except (ValueError, RecursionError) as e:
        raise FileError(f"{path}: malformed XML: {e}") from None


def _int(where: str, what: str, text: str | None, *, minimum: int = 0) -> int:
    if text is None:
        raise FileError(f"{where}: {what} is required, but it is missing")
    t = text.strip()
    if t in ("-1", "?") or t.startswith("-1..") or ".." in t:
        raise FileError(f"{where}: {what} must be a static non-negative integer, but got {text!r} "
                        f"(dynamic shapes are not supported)")
    try:
        v = int(t, 10)
    except ValueError:
        raise FileError(f"{where}: {what} must be an integer, but got {text!r}") from None
    if v < minimum or v > MAX_DIM:
        raise FileError(f"{where}: {what} must be an integer in [{minimum}, 2**40], but got {v}")
    return v


def _ports(where: str, elem) -> tuple[Port, ...]:
    if elem is None:
        return ()
    out = []
    for p in elem.findall("port"):
        pid = _int(where, "port id", p.get("id"))
        dims = tuple(_int(f"{where} port {pid}", "dim", d.text) for d in p.findall("dim"))
        out.append(Port(pid, dims, p.get("precision")))
    ids = [p.id for p in out]
    if len(set(ids)) != len(ids):
        raise FileError(f"{where}: port ids must be unique, but got {ids}")
    return tuple(out)


def load(path: str, bin_path: str | None = None) -> Model:
    """Parse an IR ``.xml`` (and locate its ``.bin`` when a Const layer needs one)."""
    root = _parse_xml(path, read_text(path, "OpenVINO IR .xml"))
    if root.tag != "net":
        raise FileError(f"{path}: the root element must be <net> (OpenVINO IR), but got <{root.tag}>")
    version = _int(path, "the <net> version attribute", root.get("version"))
    if version not in (10, 11):
        raise FileError(f"{path}: the IR version must be 10 or 11, but got {version}")
    layers_elem = root.find("layers")
    if layers_elem is None:
        raise FileError(f"{path}: <net> must contain <layers>, but it does not")
    layers: dict[int, Layer] = {}
    for el in layers_elem.findall("layer"):
        lid = _int(path, "layer id", el.get("id"))
        where = f"{path}: layer {lid}"
        if lid in layers:
            raise FileError(f"{where}: layer ids must be unique, but {lid} repeats")
        data_el = el.find("data")
        data = dict(data_el.attrib) if data_el is not None else {}
        layers[lid] = Layer(lid, el.get("name", ""), el.get("type", ""), el.get("version", ""), data,
                            _ports(where, el.find("input")), _ports(where, el.find("output")))
    sources: dict[tuple[int, int], tuple[int, int]] = {}
    edges_elem = root.find("edges")
    for e in ([] if edges_elem is None else edges_elem.findall("edge")):
        fl, fp = _int(path, "edge from-layer", e.get("from-layer")), _int(path, "edge from-port", e.get("from-port"))
        tl, tp = _int(path, "edge to-layer", e.get("to-layer")), _int(path, "edge to-port", e.get("to-port"))
        for lid, pid, out in ((fl, fp, True), (tl, tp, False)):
            if lid not in layers:
                raise FileError(f"{path}: an edge refers to layer {lid}, which does not exist")
            (layers[lid].output_port if out else layers[lid].input_port)(pid)
        if (tl, tp) in sources:
            raise FileError(f"{path}: layer {tl} input port {tp} has more than one incoming edge")
        sources[(tl, tp)] = (fl, fp)
    consts = [l for l in layers.values() if l.type == "Const"]
    bin_size = None
    if consts:
        bin_path = bin_path or os.path.splitext(path)[0] + ".bin"
        try:
            bin_size = os.path.getsize(bin_path)
        except OSError:
            raise FileError(f"{path}: its Const layers need the weights file {bin_path}, which cannot be read") from None
    model = Model(path, root.get("name", ""), version, layers, sources, bin_path if consts else None, bin_size)
    for layer in consts:
        _const_geometry(model, layer)  # every Const is checked against the .bin before anything runs
    return model


def _const_geometry(model: Model, layer: Layer) -> tuple[np.dtype, tuple[int, ...], int, int]:
    """(dtype, shape, offset, size) of a Const, checked against its port and the .bin bounds."""
    where = f"{model.path}: {layer.label}"
    d = layer.data
    if "element_type" not in d:
        raise FileError(f"{where}: element_type is required, but it is missing")
    dt = element_type(where, d["element_type"])
    shape_text = d.get("shape", "").strip()
    shape = tuple(_int(where, "shape entry", v) for v in shape_text.split(",")) if shape_text else ()
    offset = _int(where, "offset", d.get("offset"))
    size = _int(where, "size", d.get("size"))
    count = 1
    for v in shape:
        count *= v
    if count * dt.itemsize != size:
        raise FileError(f"{where}: size must be the element count of shape {list(shape)} times "
                        f"{dt.itemsize} bytes ({count * dt.itemsize}), but got {size}")
    if len(layer.outputs) != 1 or layer.outputs[0].dims != shape:
        got = [list(p.dims) for p in layer.outputs]
        raise FileError(f"{where}: its output port must declare the shape {list(shape)}, but got {got}")
    if model.bin_size is None or offset + size > model.bin_size:
        raise FileError(f"{where}: the weights at offset {offset} + size {size} = {offset + size} must lie "
                        f"inside {model.bin_path} ({model.bin_size} bytes), but do not")
    return dt, shape, offset, size


def read_const(model: Model, layer: Layer) -> np.ndarray:
    """A Const layer's value: exactly ``size`` bytes at ``offset`` of the .bin, nothing else."""
    dt, shape, offset, size = _const_geometry(model, layer)
    with open(model.bin_path, "rb") as f:  # type: ignore[arg-type]
        f.seek(offset)
        raw = f.read(size)
    if len(raw) != size:  # the file shrank after load()
        raise FileError(f"{model.path}: {layer.label}: {model.bin_path} ended before offset {offset} + size {size}")
    return np.frombuffer(raw, dtype=dt).reshape(shape).copy()
