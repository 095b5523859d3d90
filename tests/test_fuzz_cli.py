"""Fuzzing the ``convgrad`` command's parsers: IR / Graph JSON readers, argument parser, translate.

In-process (``convgrad.cli.main(argv)`` with stdout/stderr captured), on documents drawn valid
and then mutated:

* ``run`` / ``explain`` on OpenVINO IR v11 files (one convolution layer of any of the four
  types, a Parameter or Const filters in a ``.bin``, an optional output_shape Const and a
  Convert), mutated in the XML tree (attributes set to odd text or deleted, elements deleted
  or duplicated, dims changed), in the bytes (truncated, bytes flipped, a DTD with entities)
  or in the ``.bin`` (truncated, missing);
* ``run`` / ``explain`` on oneDNN Graph JSON files (one op of any of the six kinds), mutated
  in the document (a value anywhere replaced by an odd one or deleted, attribute types
  swapped) or in the text (truncated, NaN / huge literals, deep nesting);
* ``translate`` / ``explain`` with random ``--attrs`` JSON and shapes, and random argument
  lists for the parser itself.

The contract: exit status 0, 1, 2 or 3 (never 4, an internal error), no traceback, a user
error is exactly one line on stderr. A valid document must run (status 0, output shape
matching the declared one), and its result must equal the independent model of
``test_fuzz_frontends`` on the same inputs (given with ``--input``). Two subprocess runs check
the real executable on a valid and a corrupted document.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convgrad import cli

from .fuzzing import array
from .helpers import rel_err
from .test_fuzz_frontends import (DNNL_OPS, OV_OPS, Call, ceil_div, ek, forward_pads, onednn_calls, onednn_model,
                                  openvino_calls, openvino_model, perm_nxc, perm_xio, shape_from_canon, tolerance)

TALLY: dict[str, Counter] = {}
ODD_TEXT = ["", " ", "-1", "?", "1..3", "1.5", "abc", "99999999999999999999", "1,,2", "0", "2,2,2,2,2", "-3",
            "nan", "same_upper", "notset", "SAME", "1e3", "0x10", "\u00e9", "1, 2", ",", "None"]
ODD_VALUES = [None, "abc", "", -1, 0, 2 ** 62, -(2 ** 62), 1.5, [], {}, [1, 2], [1.5], ["1"], True,
              [[1]], {"type": "s64", "value": 1}, [-1, -1], "NaN", 10 ** 30]


@pytest.fixture(scope="module", autouse=True)
def _print_tally():
    yield
    for name, c in sorted(TALLY.items()):
        print(f"\n[fuzz cli {name}] " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))


@pytest.fixture(scope="module")
def workdir():
    d = tempfile.mkdtemp(prefix="convgrad-fuzz-cli-")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def run_main(argv: list[str]) -> tuple[int, str, str]:
    """``convgrad.cli.main`` in-process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main([str(a) for a in argv])
        except SystemExit as e:   # argparse: --help / --version (0) or a usage error (2)
            rc = e.code if isinstance(e.code, int) else 2
    return rc, out.getvalue(), err.getvalue()


def check_status(rc: int, out: str, err: str, argv) -> str:
    """The command-line contract; returns a tally key."""
    assert rc in (0, 1, 2, 3), (rc, argv, out, err)
    assert "Traceback" not in out + err, (argv, err)
    if rc in (2, 3):
        lines = [l for l in err.splitlines() if l.strip()]
        assert len(lines) == 1, (argv, err)
    return {0: "ok", 1: "mismatch", 2: "user error", 3: "refused"}[rc]


def fuzz(name: str, strategy, check, n: int) -> Counter:
    counts = TALLY.setdefault(name, Counter())
    local = Counter()

    @settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(strategy)
    def inner(case):
        outcome = check(case)
        counts[outcome] += 1
        local[outcome] += 1

    inner()
    total = sum(local.values())
    assert total >= 0.9 * n, local
    need = 0.1 * total if total >= 500 else 1
    assert local["ok"] >= need and local["user error"] >= need, local
    return local


def fresh_dir(root: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=root))


# ---------------------------------------------------------------------------------------------
# OpenVINO IR documents

IR_TYPES = {np.dtype(np.float32): ("f32", "FP32"), np.dtype(np.float16): ("f16", "FP16"),
            np.dtype(np.float64): ("f64", "FP64"), np.dtype(np.int32): ("i32", "I32"),
            np.dtype(ml_dtypes.bfloat16): ("bf16", "BF16")}


def _port(parent, pid: int, dims, precision: str | None):
    p = ET.SubElement(parent, "port", {"id": str(pid)} | ({"precision": precision} if precision else {}))
    for v in dims:
        ET.SubElement(p, "dim").text = str(v)
    return p


def _ints_text(vals) -> str:
    return ",".join(str(v) for v in vals)


@st.composite
def ir_case(draw):
    """A valid IR (tree, .bin bytes, --input arrays, model result), before mutation."""
    op = draw(st.sampled_from(OV_OPS))
    grouped, backprop = op.startswith("Group"), "Backprop" in op
    nsp = draw(st.integers(1, 3))
    g = draw(st.integers(1, 3)) if grouped else 1
    cin, cout, mb = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    k = [draw(st.integers(1, 3)) for _ in range(nsp)]
    d = [draw(st.integers(1, 2)) for _ in range(nsp)]
    s = [draw(st.integers(1, 3)) for _ in range(nsp)]
    mode = draw(st.sampled_from(("explicit", "explicit", "notset", "same_upper", "same_lower", "valid")))
    pb = [draw(st.integers(0, 2)) for _ in range(nsp)]
    pe = [draw(st.integers(0, 2)) for _ in range(nsp)]
    data_attrs = {"strides": _ints_text(s), "pads_begin": _ints_text(pb), "pads_end": _ints_text(pe),
                  "dilations": _ints_text(d)}
    if mode != "explicit" or draw(st.booleans()):
        data_attrs["auto_pad"] = mode
    explicit = mode in ("explicit", "notset")
    out_shape = None
    if backprop:
        opad = [draw(st.integers(0, 2)) for _ in range(nsp)]
        if any(opad) or draw(st.booleans()):
            data_attrs["output_padding"] = _ints_text(opad)
        i = [max(draw(st.integers(1, 4)), 1 + max(0, ceil_div(b + e - p - ek(kk, dd), ss)))
             for kk, dd, ss, b, e, p in zip(k, d, s, pb, pe, opad)]
        if draw(st.booleans()):
            out_shape = [draw(st.integers(1, ss * (ii - 1) + ek(kk, dd) + 2)) for ii, kk, ss, dd in zip(i, k, s, d)]
        fshape = ([g] if grouped else []) + [cin, cout, *k]
    else:
        need = [ek(kk, dd) - b - e for kk, dd, b, e in zip(k, d, pb, pe)] if explicit else \
            [ek(kk, dd) for kk, dd in zip(k, d)] if mode == "valid" else [1] * nsp
        i = [max(draw(st.integers(1, 6)), n) for n in need]
        fshape = ([g] if grouped else []) + [cout, cin, *k]
    dt = draw(st.sampled_from([np.dtype(np.float32)] * 3 + [np.dtype(np.float64), np.dtype(np.float16),
                                                               np.dtype(np.int32), np.dtype(ml_dtypes.bfloat16)]))
    dshape = [mb, g * cin, *i]
    data = array(draw, tuple(dshape), dt)
    filters = array(draw, tuple(fshape), dt)
    attrs = {k_: v for k_, v in data_attrs.items()}
    if attrs.get("auto_pad") == "notset":
        attrs["auto_pad"] = "explicit"
    model_attrs = {kk: ([int(x) for x in v.split(",")] if kk != "auto_pad" else v) for kk, v in attrs.items()}
    call = Call("openvino", op, model_attrs, [data, filters], {} if out_shape is None else {"output_shape": out_shape},
                ("data", "filters"))
    want = openvino_model(call)
    et, prec = IR_TYPES[dt]
    const_filters = draw(st.booleans())
    convert = const_filters and dt != np.float16 and draw(st.integers(0, 3)) == 0   # f16 Const + Convert
    blob = b""
    net = ET.Element("net", {"name": "fuzz", "version": "11"})
    layers = ET.SubElement(net, "layers")
    edges = ET.SubElement(net, "edges")
    inputs = {"data": data}

    def layer(lid, name, typ, attrs_, ins=(), outs=()):
        el = ET.SubElement(layers, "layer", {"id": str(lid), "name": name, "type": typ, "version": "opset1"})
        if attrs_ is not None:
            ET.SubElement(el, "data", attrs_)
        if ins:
            inp = ET.SubElement(el, "input")
            for pid, dims in ins:
                _port(inp, pid, dims, prec)
        if outs:
            o = ET.SubElement(el, "output")
            for pid, dims, pr in outs:
                _port(o, pid, dims, pr)
        return el

    def edge(a, ap, b, bp):
        ET.SubElement(edges, "edge", {"from-layer": str(a), "from-port": str(ap), "to-layer": str(b),
                                      "to-port": str(bp)})

    layer(0, "data", "Parameter", {"shape": _ints_text(dshape), "element_type": et}, outs=[(0, dshape, prec)])
    if const_filters:
        stored = filters.astype(np.float16) if convert else filters
        raw = stored.tobytes()
        layer(1, "filters", "Const", {"element_type": "f16" if convert else et, "shape": _ints_text(fshape),
                                      "offset": str(len(blob)), "size": str(len(raw))},
              outs=[(0, fshape, "FP16" if convert else prec)])
        blob += raw
        if convert:
            layer(5, "convert", "Convert", {"destination_type": et}, ins=[(0, fshape)], outs=[(1, fshape, prec)])
            edge(1, 0, 5, 0)
            filters = stored.astype(dt)
            call.args[1] = filters
            want = openvino_model(call)
    else:
        layer(1, "filters", "Parameter", {"shape": _ints_text(fshape), "element_type": et}, outs=[(0, fshape, prec)])
        inputs["filters"] = filters
    conv_ins = [(0, dshape), (1, fshape)]
    if out_shape is not None:
        raw = np.asarray(out_shape, np.int64).tobytes()
        layer(2, "output_shape", "Const", {"element_type": "i64", "shape": str(nsp), "offset": str(len(blob)),
                                           "size": str(len(raw))}, outs=[(0, [nsp], "I64")])
        blob += raw
        conv_ins.append((2, [nsp]))
    layer(3, "conv", op, data_attrs, ins=conv_ins, outs=[(3, list(want.shape), prec)])
    layer(4, "out", "Result", None, ins=[(0, list(want.shape))])
    edge(0, 0, 3, 0)
    edge(5 if convert else 1, 1 if convert else 0, 3, 1)
    if out_shape is not None:
        edge(2, 0, 3, 2)
    edge(3, 3, 4, 0)
    return net, blob, inputs, want, dt


def _elements(tree):
    return list(tree.iter())


@st.composite
def ir_docs(draw):
    net, blob, inputs, want, dt = draw(ir_case())
    mutations = []
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):
        what = draw(st.sampled_from(["attr", "attr", "del_attr", "del_elem", "dup_elem", "dim", "bytes",
                                     "dtd", "bin", "type"]))
        elems = _elements(net)
        if what == "attr":
            el = draw(st.sampled_from(elems))
            keys = sorted(el.attrib) + ["strides", "auto_pad", "output_padding", "offset"]
            el.set(draw(st.sampled_from(keys)), draw(st.sampled_from(ODD_TEXT)))
        elif what == "del_attr":
            el = draw(st.sampled_from([e for e in elems if e.attrib] or elems))
            if el.attrib:
                del el.attrib[draw(st.sampled_from(sorted(el.attrib)))]
        elif what in ("del_elem", "dup_elem"):
            parents = [e for e in elems if len(e)]
            if not parents:            # an earlier mutation removed every child
                continue
            parent = draw(st.sampled_from(parents))
            child = draw(st.sampled_from(list(parent)))
            if what == "del_elem":
                parent.remove(child)
            else:
                parent.append(copy_elem(child))
        elif what == "dim":
            dims = [e for e in elems if e.tag == "dim"]
            if not dims:
                continue
            draw(st.sampled_from(dims)).text = draw(st.sampled_from(ODD_TEXT + ["0", "1", "7", "-1"]))
        elif what == "type":
            layers = [e for e in elems if e.tag == "layer"]
            if not layers:
                continue
            el = draw(st.sampled_from(layers))
            el.set("type", draw(st.sampled_from(list(OV_OPS) + ["Add", "Parameter", "Const", "Result", "Convert"])))
        mutations.append(what)
    text = ET.tostring(net, encoding="unicode").encode()
    if "bytes" in mutations:
        text = corrupt_bytes(draw, text)
    if "dtd" in mutations:
        text = draw(st.sampled_from([
            b'<?xml version="1.0"?><!DOCTYPE net [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;">]>',
            b'<?xml version="1.0"?><!DOCTYPE net SYSTEM "file:///etc/passwd">',
            b'<!DOCTYPE net [<!ENTITY x SYSTEM "file:///etc/hostname">]>'])) + text.replace(b"fuzz", b"&b;", 1)
    if "bin" in mutations:
        blob = draw(st.sampled_from([blob[: len(blob) // 2], b"", None]))
    return text, blob, inputs, want, dt, mutations


def copy_elem(el):
    return ET.fromstring(ET.tostring(el))


def corrupt_bytes(draw, text: bytes) -> bytes:
    how = draw(st.sampled_from(["truncate", "flip", "insert"]))
    pos = draw(st.integers(0, max(len(text) - 1, 0)))
    if how == "truncate":
        return text[:pos]
    if how == "flip":
        return text[:pos] + bytes([draw(st.integers(0, 255))]) + text[pos + 1:]
    return text[:pos] + draw(st.sampled_from([b"<", b">", b"&", b"\x00", b"\xff\xfe", b"]]>", b'"', b"<a>"])) + text[pos:]


def write_inputs(d: Path, inputs: dict, use: bool) -> list[str]:
    args = []
    for name, a in inputs.items():
        p = d / f"{name.replace(':', '_')}.npy"
        # .npy has no bfloat16 (np.save writes raw 2-byte voids): save the exact float32 values,
        # which the command casts to the declared type
        np.save(p, a.astype(np.float32) if a.dtype == ml_dtypes.bfloat16 else a, allow_pickle=False)
        if use:
            args += ["--input", f"{name}={p}"]
    return args


def compare_result(got: np.ndarray, want: np.ndarray, dt: np.dtype) -> None:
    if dt == ml_dtypes.bfloat16:   # `run --out` writes bfloat16 results as exact float32 (.npy has no bf16)
        assert got.dtype == np.float32 and np.array_equal(got, got.astype(dt).astype(np.float32))
        got = got.astype(dt)
    assert got.shape == want.shape and got.dtype == dt, (got.shape, want.shape, got.dtype, dt)
    if dt.kind in "iu":
        np.testing.assert_array_equal(got, want.astype(dt))
    else:
        assert rel_err(got.astype(np.float64), want) <= tolerance(dt)


def check_ir(root: Path, doc) -> str:
    text, blob, inputs, want, dt, mutations = doc
    d = fresh_dir(root)
    try:
        xml = d / "net.xml"
        xml.write_bytes(text)
        if blob is not None:
            (d / "net.bin").write_bytes(blob)
        argv = ["run", xml, "--out", d / "out", *write_inputs(d, inputs, True)]
        rc, out, err = run_main(argv)
        outcome = check_status(rc, out, err, argv)
        if not mutations:
            assert rc == 0 and "1 computed" in out and "matches the declared" in out, (out, err)
            compare_result(np.load(d / "out" / "layer3_conv.npy"), want, dt)
        rc2, out2, err2 = run_main(["explain", xml])
        check_status(rc2, out2, err2, ["explain", xml])
        if not mutations:
            assert rc2 == 0, err2
        return outcome
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_fuzz_run_ir(workdir):
    fuzz("run IR", ir_docs(), lambda doc: check_ir(workdir, doc), 150)


@pytest.mark.slow
def test_fuzz_run_ir_slow(workdir):
    fuzz("run IR", ir_docs(), lambda doc: check_ir(workdir, doc), 4000)


# ---------------------------------------------------------------------------------------------
# oneDNN Graph JSON documents

JSON_TYPES = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(ml_dtypes.bfloat16): "bf16",
              np.dtype(np.float64): "f64"}


@st.composite
def json_case(draw):
    """A valid one-op Graph JSON (document, --input arrays by tensor id, model result)."""
    op = draw(st.sampled_from(DNNL_OPS))
    deconv = op.startswith("ConvTranspose")
    nsp = draw(st.integers(1, 3))
    g, a, b, mb = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    k = [draw(st.integers(1, 3)) for _ in range(nsp)]
    d = [draw(st.integers(1, 2)) for _ in range(nsp)]
    s = [draw(st.integers(1, 3)) for _ in range(nsp)]
    pb = [draw(st.integers(0, 2)) for _ in range(nsp)]
    pe = [draw(st.integers(0, 2)) for _ in range(nsp)]
    mode = draw(st.sampled_from(("None", "None", "SAME_UPPER", "SAME_LOWER", "VALID")))
    df = draw(st.sampled_from(["NXC", "NCX"]))
    wf = draw(st.sampled_from(["XOI", "IOX"] if deconv else ["XIO", "OIX"]))
    dperm = perm_nxc(nsp) if df == "NXC" else tuple(range(nsp + 2))
    wperm = perm_xio(nsp) if wf in ("XIO", "XOI") else tuple(range(nsp + 2))
    attrs = {"strides": s, "pads_begin": pb, "pads_end": pe, "dilations": d, "auto_pad": mode, "groups": g,
             "data_format": df, "weights_format": wf}
    lmode = mode.lower()
    shapes: dict[str, tuple] = {}
    if op == "ConvTranspose":
        tot = [max(0, ek(kk, dd) - ss) for kk, dd, ss in zip(k, d, s)]
        rpb = pb if lmode == "none" else [0] * nsp if lmode == "valid" else \
            [t // 2 if lmode == "same_upper" else t - t // 2 for t in tot]
        rpe = pe if lmode == "none" else [0] * nsp if lmode == "valid" else [t - x for t, x in zip(tot, rpb)]
        i = [max(draw(st.integers(1, 4)), 1 + max(0, ceil_div(x + y + 1 - ek(kk, dd), ss)))
             for kk, dd, ss, x, y in zip(k, d, s, rpb, rpe)]
        shapes = {"src": shape_from_canon((mb, g * a, *i), dperm), "weights": shape_from_canon((g * a, b, *k), wperm)}
    else:
        need = {"none": [ek(kk, dd) - x - y for kk, dd, x, y in zip(k, d, pb, pe)],
                "valid": [ek(kk, dd) for kk, dd in zip(k, d)]}.get(lmode, [1] * nsp)
        src = [max(draw(st.integers(1, 6)), n) for n in need]
        cpb, cpe = forward_pads(lmode, src, k, s, d, pb, pe)
        dst = [(ii + x + y - ek(kk, dd)) // ss + 1 for ii, kk, dd, ss, x, y in zip(src, k, d, s, cpb, cpe)]
        xs, ys = (mb, g * (b if deconv else a), *src), (mb, g * (a if deconv else b), *dst)
        ws = shape_from_canon((g * a, b, *k) if deconv else (g * b, a, *k), wperm)
        if op in ("Convolution", "ConvTransposeBackwardData"):
            shapes = {("src" if op == "Convolution" else "diff_dst"): shape_from_canon(xs, dperm), "weights": ws}
        elif op == "ConvolutionBackwardData":
            shapes = {"diff_dst": shape_from_canon(ys, dperm), "weights": ws}
            attrs["dst_shape"] = list(shape_from_canon(xs, dperm))
        else:
            shapes = {"src": shape_from_canon(ys if deconv else xs, dperm),
                      "diff_dst": shape_from_canon(xs if deconv else ys, dperm)}
            attrs["weights_shape"] = list(ws)
    dt = draw(st.sampled_from([np.dtype(np.float32)] * 3 + [np.dtype(np.float64), np.dtype(ml_dtypes.bfloat16)]))
    arrays = {n: array(draw, tuple(v), dt) for n, v in shapes.items()}
    call = Call("onednn", op, {kk: v for kk, v in attrs.items()}, list(arrays.values()), {}, tuple(arrays))
    want = onednn_model(call)
    typed = {}
    for name, v in attrs.items():
        typ = "s64" if name == "groups" else "string" if isinstance(v, str) else "s64[]"
        typed[name] = {"type": typ, "value": v}

    def lt(tid, shape):
        shape = list(shape)
        strides = [int(np.prod(shape[j + 1:])) for j in range(len(shape))]
        return {"id": tid, "dtype": JSON_TYPES[dt], "shape": shape, "stride": strides, "layout_type": "strided",
                "property_type": "undef"}

    declared = list(want.shape) if draw(st.integers(0, 3)) else [-1] * want.ndim
    doc = {"version": "3.13.0", "engine_kind": "cpu", "fpmath_mode": "strict",
           "input_ports": list(range(len(arrays))), "output_ports": [99],
           "graph": [{"id": 0, "name": "CONV_0", "kind": op, "attrs": typed,
                      "inputs": [lt(j, a_.shape) for j, a_ in enumerate(arrays.values())],
                      "outputs": [lt(99, declared)]}]}
    inputs = {str(j): a_ for j, a_ in enumerate(arrays.values())}
    return doc, inputs, want, dt


def _paths(obj, prefix=()):
    """Every (path) to a value inside nested dicts and lists."""
    out = [prefix]
    if isinstance(obj, dict):
        for k_, v in obj.items():
            out += _paths(v, prefix + (k_,))
    elif isinstance(obj, list):
        for j, v in enumerate(obj):
            out += _paths(v, prefix + (j,))
    return out


@st.composite
def json_docs(draw):
    doc, inputs, want, dt = draw(json_case())
    mutations = []
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):
        what = draw(st.sampled_from(["value", "value", "value", "delete", "attr_type", "text"]))
        paths = [p for p in _paths(doc) if p]
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if what == "value":
            parent[path[-1]] = draw(st.sampled_from(ODD_VALUES))
        elif what == "delete":
            if isinstance(parent, dict):
                del parent[path[-1]]
            else:
                parent.pop(path[-1])
        elif what == "attr_type":
            attrs = doc["graph"][0].get("attrs") if isinstance(doc.get("graph"), list) and doc["graph"] and \
                isinstance(doc["graph"][0], dict) else None
            if isinstance(attrs, dict) and attrs:
                name = draw(st.sampled_from(sorted(attrs)))
                attrs[name] = {"type": draw(st.sampled_from(["s64", "s64[]", "f32", "f32[]", "string", "bool", "u8"])),
                               "value": attrs[name].get("value") if isinstance(attrs[name], dict) else None}
        mutations.append(what)
    text = json.dumps(doc).encode()
    if "text" in mutations:
        how = draw(st.sampled_from(["bytes", "nan", "huge", "deep"]))
        if how == "bytes":
            text = corrupt_bytes(draw, text)
        elif how == "nan":
            text = text.replace(b'"groups": {"type": "s64", "value": ', b'"groups": {"type": "s64", "value": NaN, "x": ', 1)
            text = text if b"NaN" in text else text.replace(b"[", b"[Infinity, ", 1)
        elif how == "huge":
            text = text.replace(b'"strides": {"type": "s64[]", "value": [', b'"strides": {"type": "s64[]", "value": [1' +
                                b"0" * 400 + b", ", 1)
        else:
            text = text.replace(b'"fpmath_mode"', b'"x": ' + b"[" * 100000 + b"]" * 100000 + b', "fpmath_mode"', 1)
    return text, inputs, want, dt, mutations


def check_json(root: Path, doc) -> str:
    text, inputs, want, dt, mutations = doc
    d = fresh_dir(root)
    try:
        path = d / "graph.json"
        path.write_bytes(text)
        argv = ["run", path, "--out", d / "out", *write_inputs(d, inputs, True)]
        rc, out, err = run_main(argv)
        outcome = check_status(rc, out, err, argv)
        if not mutations:
            assert rc == 0 and "1 computed" in out, (out, err)
            compare_result(np.load(d / "out" / "op0_CONV_0.npy"), want, dt)
        rc2, out2, err2 = run_main(["explain", path])
        check_status(rc2, out2, err2, ["explain", path])
        if not mutations:
            assert rc2 == 0, err2
        return outcome
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_fuzz_run_json(workdir):
    fuzz("run JSON", json_docs(), lambda doc: check_json(workdir, doc), 150)


@pytest.mark.slow
def test_fuzz_run_json_slow(workdir):
    fuzz("run JSON", json_docs(), lambda doc: check_json(workdir, doc), 4000)


# ---------------------------------------------------------------------------------------------
# translate / explain with random attributes and shapes; the argument parser

def _jsonable(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return str(v)


def _dims(v) -> str | None:
    try:
        return ",".join(str(int(x)) for x in (np.shape(v) if isinstance(v, (np.ndarray, list)) else v))
    except (TypeError, ValueError):
        return None


# (framework, op) -> the strategy of test_fuzz_frontends that draws its calls
TRANSLATABLE = [("onednn", op) for op in DNNL_OPS[:3]] + [("openvino", op) for op in OV_OPS]


@st.composite
def translate_argv(draw):
    """A front-end call (valid or mutated, from test_fuzz_frontends) as translate / explain flags."""
    fw, op = draw(st.sampled_from(TRANSLATABLE))
    call = draw(onednn_calls(op) if fw == "onednn" else openvino_calls(op))
    attrs = dict(call.attrs)
    shapes = dict(zip(call.names, call.args))
    for key in ("dst_shape", "weights_shape"):     # oneDNN shape inputs become the attributes
        if key in call.kwargs:
            attrs[key] = call.kwargs[key]
    flags = []
    first, second = ("src", "weights") if fw == "onednn" else ("data", "filters")
    for name, value in shapes.items():
        dims = _dims(value)
        if dims is not None and name != "bias":
            flag = {first: "--input-shape", second: "--filter-shape"}.get(name)
            flags += [flag, dims] if flag else ["--shape", f"{name}={dims}"]
    if "output_shape" in call.kwargs:    # a shape value, not a tensor
        try:
            flags += ["--shape", "output_shape=" + ",".join(str(int(x)) for x in np.asarray(call.kwargs["output_shape"]).ravel())]
        except (TypeError, ValueError):
            pass
    text = json.dumps(attrs, default=_jsonable)
    cmd = draw(st.sampled_from(["translate", "explain"]))
    argv = [cmd, "--from" if cmd == "translate" else "--framework", fw, "--op", op, "--attrs", text, *flags]
    if cmd == "translate":
        to = draw(st.sampled_from(["tensorflow", "openvino", "onednn"]))
        argv += ["--to", to]
        if to == "onednn" and draw(st.booleans()):
            argv += ["--layout", draw(st.sampled_from(["NXC", "ncx"]))]
        if draw(st.booleans()):
            argv.append("--json")
    return argv, not call.mutations


def check_translate(case) -> str:
    argv, valid = case
    rc, out, err = run_main(argv)
    outcome = check_status(rc, out, err, argv)
    if valid:   # a valid op: explained / translated, or refused with the reason (no canonical form)
        assert rc in (0, 3), (argv, err)
    return outcome


def test_fuzz_translate_explain():
    fuzz("translate/explain", translate_argv(), check_translate, 150)


@pytest.mark.slow
def test_fuzz_translate_explain_slow():
    fuzz("translate/explain", translate_argv(), check_translate, 2000)


TOKENS = ["run", "translate", "explain", "--help", "-v", "--verbose", "--version", "--out", "--input", "--seed",
          "--memory-limit", "--shape-only", "--weights", "--format", "--from", "--to", "--op", "--attrs",
          "--input-shape", "--filter-shape", "--shape", "--json", "--layout", "ir", "json", "auto", "0", "-1",
          "1K", "2G", "0.5M", "abc", "x=y.npy", "=", "a=", "/nonexistent.xml", "/", "", "--", "-", "tf", "Conv2D"]


def test_fuzz_argument_parser():
    """Random argument lists: argparse's own errors (status 2) or a clean one-line error."""
    counts = TALLY.setdefault("argv", Counter())

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.lists(st.sampled_from(TOKENS), max_size=8))
    def inner(argv):
        rc, out, err = run_main(argv)
        assert rc in (0, 1, 2, 3), (rc, argv, err)
        assert "Traceback" not in out + err or {"-v", "--verbose"} & set(argv), (argv, err)
        counts[{0: "ok", 1: "mismatch", 2: "user error", 3: "refused"}[rc]] += 1
    inner()


@pytest.mark.parametrize("text", ["512", "512M", "2g", "1.5GiB", " 3 kb ", "0", "-1", "1e3", "abc", "", "10 TB",
                                  "99999999999999999999999T", "nan"])
def test_parse_size(text):
    try:
        v = cli.parse_size(text)
    except Exception as e:  # noqa: BLE001
        assert type(e).__name__ == "ArgumentTypeError", e
    else:
        assert isinstance(v, int) and v >= 1


# ---------------------------------------------------------------------------------------------
# The real executable: a valid and a corrupted document


def test_executable_on_generated_documents(tmp_path):
    exe = Path(sys.executable).parent / "convgrad"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    net, blob, inputs, want, dt = _fixed_ir()
    xml = tmp_path / "net.xml"
    xml.write_bytes(ET.tostring(net))
    (tmp_path / "net.bin").write_bytes(blob)
    args = write_inputs(tmp_path, inputs, True)
    p = subprocess.run([str(exe), "run", str(xml), "--out", str(tmp_path / "out"), *args], capture_output=True,
                       text=True, timeout=120, env=env)
    assert p.returncode == 0 and "1 computed" in p.stdout, p.stdout + p.stderr
    compare_result(np.load(tmp_path / "out" / "layer3_conv.npy"), want, dt)
    xml.write_bytes(ET.tostring(net)[:-40])      # truncated
    p = subprocess.run([str(exe), "run", str(xml)], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "malformed XML" in p.stderr


def _fixed_ir():
    """The smallest GroupConvolutionBackpropData case with more than 20 output elements (found and
    shrunk by hypothesis, so the same document every run)."""
    from hypothesis import find
    return find(ir_case(), lambda case: case[0].find("layers/layer[@type='GroupConvolutionBackpropData']")
                is not None and case[3].size > 20, settings=settings(database=None, max_examples=2000,
                                                                     suppress_health_check=list(HealthCheck)))
