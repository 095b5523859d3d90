"""The ``convgrad`` command, convgrad.translate / explain and the IR / Graph JSON readers.

* Every subcommand runs as the real executable in a subprocess (``<venv>/bin/convgrad`` and
  ``python -m convgrad``); user mistakes and hostile files (billion laughs, external entity,
  pickled .npy, short .bin, a 10**12-element tensor, malformed XML/JSON, unsupported layers)
  must give exit status 2 and one line, never a traceback.
* ``run`` is compared with the real OpenVINO on the shipped IR examples and on an IR that
  OpenVINO itself serialised, and with the real oneDNN Graph library on the shipped JSON.
* Every translation direction is proven numerically: source and target computed by convgrad's
  own front-ends on random problems (float64, rel <= 1e-12), and by the real frameworks
  (TensorFlow, OpenVINO, oneDNN Graph; float32, rel <= 1e-5), including TF SAME, stride 2,
  odd sizes -> OpenVINO and -> oneDNN Graph.
"""

from __future__ import annotations

import json
import os
import pty
import resource
import select
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import convgrad
from convgrad.errors import ConvError
from convgrad.translate import TranslationRefused, read, translate

from .helpers import rel_err

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
EXE = Path(sys.executable).parent / "convgrad"
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")


def cli(*args, module: bool = False, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "convgrad", *map(str, args)] if module else [str(EXE), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV, **kw)


def user_error(p: subprocess.CompletedProcess, *fragments: str, status: int = 2) -> str:
    """Exit status 2 (or ``status``), exactly one line on stderr naming ``fragments``, no traceback."""
    assert p.returncode == status, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout, p.stderr
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, p.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def test_executable_is_installed():
    assert EXE.exists(), f"the convgrad executable must be installed next to {sys.executable}"
    for p in (cli("--help"), cli("--help", module=True)):
        assert p.returncode == 0, p.stderr
        for word in ("run", "translate", "explain"):
            assert word in p.stdout
        assert "bench" in p.stdout
    q = cli("bench", "--help")
    assert q.returncode == 0 and "--libraries" in q.stdout, q.stderr
    user_error(cli("bench", "--rounds", "many"), "--rounds")


@pytest.mark.slow
def test_bench_command_runs(tmp_path):
    p = cli("bench", "--lists", "--problem", "mb2ic3ih9oc4oh5kh3sh2ph1", "--libraries", "convgrad", "--directions",
            "bwd_weights", "--rounds", "1", "--reps", "1", "--warmup", "0", "--pause", "0", "--out", tmp_path,
            "--quiet", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = (tmp_path / "results.csv").read_text().splitlines()
    assert len(rows) == 2 and "g1mb2ic3ih9" in rows[1] and ",bwd_weights," in rows[1]


# ---------------------------------------------------------------------------------------------
# run: the shipped examples


def test_run_examples_1d_2d_computed():
    p = cli("run", EXAMPLES / "ov_group_deconv_1d.xml")
    assert p.returncode == 0, p.stderr
    assert "(1, 8, 447)" in p.stdout and "matches the declared" in p.stdout and "1 computed" in p.stdout
    assert p.stderr == ""  # piped: no progress bar
    p = cli("run", EXAMPLES / "ov_group_deconv_2d.xml", module=True)
    assert p.returncode == 0, p.stderr
    assert "(1, 8, 447, 447)" in p.stdout and "matches the declared" in p.stdout


def test_run_example_3d_is_shape_inference_only():
    p = cli("run", EXAMPLES / "ov_group_deconv_3d.xml", timeout=60)
    assert p.returncode == 0, p.stderr
    assert "(1, 8, 447, 447, 447)" in p.stdout and "matches the declared" in p.stdout
    assert "shape inference only" in p.stdout and "--memory-limit" in p.stdout


@pytest.mark.parametrize("name", ["onednn_conv_bwd_w_2d.json", "onednn_conv_bwd_d_2d.json"])
def test_run_json_examples(name):
    p = cli("run", EXAMPLES / name)
    assert p.returncode == 0, p.stderr
    assert "matches the declared" in p.stdout and "1 computed" in p.stdout


def test_run_outputs_match_real_openvino(tmp_path):
    import openvino as ov
    x = np.random.default_rng(1).standard_normal((1, 20, 224), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    xml = EXAMPLES / "ov_group_deconv_1d.xml"
    p = cli("run", xml, "--input", f"data={tmp_path / 'x.npy'}", "--out", tmp_path / "out")
    assert p.returncode == 0, p.stderr
    got = np.load(tmp_path / "out" / "layer5_upsampling_node.npy")
    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(xml)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    want = compiled([x])[0]
    err = rel_err(got, want)
    _record("run: OpenVINO IR example vs openvino", err)
    assert got.shape == want.shape == (1, 8, 447) and got.dtype == np.float32
    assert err <= 1e-5


def test_run_seeded_inputs_are_reproducible(tmp_path):
    for k in (1, 2):
        assert cli("run", EXAMPLES / "onednn_conv_bwd_d_2d.json", "--seed", "7", "--out", tmp_path / str(k)).returncode == 0
    a = np.load(tmp_path / "1" / "op0_CONV_0.npy")
    b = np.load(tmp_path / "2" / "op0_CONV_0.npy")
    assert a.shape == (1, 32, 28, 28) and np.array_equal(a, b) and np.abs(a).sum() > 0


# ---------------------------------------------------------------------------------------------
# run: an IR that OpenVINO itself serialised (f16 Consts + Convert, a chain of two layers,
# output_shape from a Const), against OpenVINO's own result


def _ov_chain_model():
    import openvino as ov
    import openvino.opset1 as ops
    from openvino.utils.node_factory import NodeFactory
    rng = np.random.default_rng(3)
    x = ops.parameter([2, 3, 9, 10], ov.Type.f32, name="x")
    w1 = ops.constant(rng.standard_normal((4, 3, 3, 2)).astype(np.float32))
    conv = ops.convolution(x, w1, [2, 1], [1, 0], [0, 1], [1, 2], "explicit")
    w2 = ops.constant(rng.standard_normal((2, 2, 3, 2, 3)).astype(np.float32))  # G=2, C_IN=2, C_OUT=3
    shp = ops.constant(np.array([11, 9], dtype=np.int64))
    deconv = NodeFactory("opset1").create("GroupConvolutionBackpropData", [conv.output(0), w2.output(0), shp.output(0)],
                                          {"strides": [2, 2], "pads_begin": [0, 0], "pads_end": [0, 0],
                                           "dilations": [1, 1], "auto_pad": "same_upper", "output_padding": [0, 0]})
    return ov.Model([deconv.output(0)], [x], "chain")


def test_run_ir_serialised_by_openvino(tmp_path):
    import openvino as ov
    model = _ov_chain_model()
    xml = tmp_path / "chain.xml"
    ov.save_model(model, str(xml), compress_to_fp16=True)   # f16 Consts + Convert, as OpenVINO writes them
    text = xml.read_text()
    assert "Convert" in text and 'element_type="f16"' in text
    x = np.random.default_rng(4).standard_normal((2, 3, 9, 10), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    p = cli("run", xml, "--input", f"x={tmp_path / 'x.npy'}", "--out", tmp_path / "out")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 computed" in p.stdout and "0 shape mismatches" in p.stdout
    outs = sorted((tmp_path / "out").glob("*.npy"))
    assert len(outs) == 2
    core = ov.Core()
    want = core.compile_model(core.read_model(str(xml)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})([x])[0]
    got = [np.load(f) for f in outs if np.load(f).shape == want.shape]
    assert len(got) == 1
    err = rel_err(got[0], want)
    _record("run: IR serialised by OpenVINO (chain, f16 Const, output_shape) vs openvino", err)
    assert err <= 1e-5
    q = cli("explain", xml)
    assert q.returncode == 0, q.stderr
    # the second layer's output_shape reaches 3 rows past its full result (zero-filled by OpenVINO,
    # as the comparison above shows): explain says it has no canonical problem, and why
    assert q.stdout.count("no canonical problem") == 1 and "past the last row the kernel reaches" in q.stdout


def test_run_json_matches_real_onednn(tmp_path):
    from .oracles import onednn_graph as og
    rng = np.random.default_rng(5)
    src = rng.standard_normal((1, 32, 28, 28), dtype=np.float32)
    dd = rng.standard_normal((1, 128, 14, 14), dtype=np.float32)
    np.save(tmp_path / "src.npy", src)
    np.save(tmp_path / "dd.npy", dd)
    p = cli("run", EXAMPLES / "onednn_conv_bwd_w_2d.json", "--input", f"0={tmp_path / 'src.npy'}",
            "--input", f"CONV_0:1={tmp_path / 'dd.npy'}", "--out", tmp_path)
    assert p.returncode == 0, p.stderr
    got = np.load(tmp_path / "op0_CONV_0.npy")
    [(status, want)] = og.run_batch([("conv_bwd_weights", (src, dd, [128, 32, 1, 1]),
                                      dict(strides=[2, 2], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1],
                                           data_format="NCX", weights_format="OIX"))])
    assert status == "ok", want
    err = rel_err(got, want)
    _record("run: oneDNN Graph JSON example vs onednn", err)
    assert err <= 1e-5


def _chain_json(path: Path, src_shape=(2, 3, 9, 8)) -> Path:
    """Convolution (tensors 0, 1 -> 2) then ConvolutionBackwardWeights (0, 2 -> 3): a chain with a shared input."""
    t = lambda tid, shape: {"id": tid, "dtype": "f32", "shape": list(shape), "stride": [],  # noqa: E731
                            "layout_type": "strided", "property_type": "undef"}
    attrs = {"strides": {"type": "s64[]", "value": [2, 1]}, "pads_begin": {"type": "s64[]", "value": [1, 0]},
             "pads_end": {"type": "s64[]", "value": [0, 1]}, "dilations": {"type": "s64[]", "value": [1, 2]},
             "auto_pad": {"type": "string", "value": "None"}, "groups": {"type": "s64", "value": 1},
             "data_format": {"type": "string", "value": "NCX"}, "weights_format": {"type": "string", "value": "OIX"}}
    n, c, h, w = src_shape
    oh, ow = (h + 1 - 3) // 2 + 1, (w + 1 - 3) // 1 + 1
    doc = {"version": "3.7.0", "engine_kind": "cpu", "fpmath_mode": "strict", "graph": [
        {"id": 0, "name": "fwd", "kind": "Convolution", "attrs": attrs,
         "inputs": [t(0, src_shape), t(1, (5, c, 3, 2))], "outputs": [t(2, (n, 5, oh, ow))]},
        {"id": 1, "name": "bwd_w", "kind": "ConvolutionBackwardWeights",
         "attrs": dict(attrs, weights_shape={"type": "s64[]", "value": [5, c, 3, 2]}),
         "inputs": [t(0, src_shape), t(2, (n, 5, oh, ow))], "outputs": [t(3, (-1, -1, -1, -1))]}]}
    path.write_text(json.dumps(doc))
    return path


def test_run_json_chain_and_shared_input(tmp_path):
    js = _chain_json(tmp_path / "chain.json")
    rng = np.random.default_rng(6)
    src = rng.standard_normal((2, 3, 9, 8))
    w = rng.standard_normal((5, 3, 3, 2))
    np.save(tmp_path / "src.npy", src.astype(np.float32))
    np.save(tmp_path / "w.npy", w.astype(np.float32))
    p = cli("run", js, "--input", f"0={tmp_path / 'src.npy'}", "--input", f"fwd:1={tmp_path / 'w.npy'}",
            "--out", tmp_path / "o")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 computed" in p.stdout and "output of op 0" in p.stdout
    kw = dict(strides=[2, 1], pads_begin=[1, 0], pads_end=[0, 1], dilations=[1, 2])
    dst = convgrad.conv_forward(src, w, **kw)
    want = convgrad.conv_backward_weights(src, dst, (3, 2), **kw)
    assert rel_err(np.load(tmp_path / "o" / "op0_fwd.npy"), dst) <= 1e-5
    assert rel_err(np.load(tmp_path / "o" / "op1_bwd_w.npy"), want) <= 1e-5


def test_progress_bar_on_a_terminal_only(tmp_path):
    js = _chain_json(tmp_path / "chain.json")
    piped = cli("run", js)
    assert piped.returncode == 0 and piped.stderr == ""
    master, slave = pty.openpty()
    try:
        p = subprocess.run([str(EXE), "run", str(js)], stdout=subprocess.PIPE, stderr=slave, text=True,
                           timeout=120, env=ENV)
        os.close(slave)
        slave = -1
        chunks = []
        while select.select([master], [], [], 0.5)[0]:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    bar = b"".join(chunks).decode("utf-8", "replace")
    assert p.returncode == 0
    assert "/2" in bar and "op/s" in bar, bar


# ---------------------------------------------------------------------------------------------
# run: hostile and broken files


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE net [
 <!ENTITY lol "lol">
 <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<net name="&lol9;" version="11"><layers/><edges/></net>
"""

EXTERNAL_ENTITY = """<?xml version="1.0"?>
<!DOCTYPE net [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<net name="&xxe;" version="11"><layers/><edges/></net>
"""


def _example_copy(tmp_path: Path, nsp: int = 1, edit=None, bin_bytes: bytes | None = None) -> Path:
    xml = (EXAMPLES / f"ov_group_deconv_{nsp}d.xml").read_text()
    if edit is not None:
        xml = edit(xml)
    dst = tmp_path / "m.xml"
    dst.write_text(xml)
    raw = (EXAMPLES / f"ov_group_deconv_{nsp}d.bin").read_bytes()
    (tmp_path / "m.bin").write_bytes(raw if bin_bytes is None else bin_bytes)
    return dst


def test_billion_laughs_refused(tmp_path):
    f = tmp_path / "laughs.xml"
    f.write_text(BILLION_LAUGHS)
    p = cli("run", f, timeout=30)
    user_error(p, "laughs.xml", "DTD")


def test_external_entity_refused(tmp_path):
    f = tmp_path / "xxe.xml"
    f.write_text(EXTERNAL_ENTITY)
    p = cli("run", f, timeout=30)
    user_error(p, "xxe.xml", "refused")
    assert "root:" not in p.stdout + p.stderr


class _Evil:
    """Unpickling this creates a marker file: proof that a pickle was (not) loaded."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickled_npy_refused(tmp_path):
    marker = tmp_path / "unpickled"
    evil = np.empty((1, 20, 224), dtype=object)
    evil[0, 0, 0] = _Evil(str(marker))
    np.save(tmp_path / "evil.npy", evil, allow_pickle=True)
    p = cli("run", EXAMPLES / "ov_group_deconv_1d.xml", "--input", f"data={tmp_path / 'evil.npy'}")
    user_error(p, "evil.npy", "pickle")
    assert not marker.exists()


def test_npy_header_beyond_memory_limit_refused(tmp_path):
    f = tmp_path / "huge.npy"
    with open(f, "wb") as fh:  # a header that declares 10**12 float32 elements, and no data
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False, "shape": (10**6, 10**6)})
    p = cli("run", EXAMPLES / "ov_group_deconv_1d.xml", "--input", f"data={f}")
    user_error(p, "huge.npy", "memory limit")


def test_short_bin_refused(tmp_path):
    xml = _example_copy(tmp_path, bin_bytes=b"\0" * 100)
    user_error(cli("run", xml), "m.bin", "offset 0 + size 480", "100 bytes")


def test_missing_bin_and_missing_file(tmp_path):
    xml = _example_copy(tmp_path)
    (tmp_path / "m.bin").unlink()
    user_error(cli("run", xml), "m.bin")
    user_error(cli("run", tmp_path / "nope.xml"), "nope.xml", "no such file")
    user_error(cli("run", tmp_path / "nope.json"), "nope.json", "no such file")


def _huge_json(path: Path) -> Path:
    """ConvolutionBackwardWeights whose src declares 10**12 elements (4 TB of float32)."""
    t = lambda tid, shape: {"id": tid, "dtype": "f32", "shape": shape, "stride": [],  # noqa: E731
                            "layout_type": "strided", "property_type": "undef"}
    attrs = {"strides": {"type": "s64[]", "value": [1, 1]}, "pads_begin": {"type": "s64[]", "value": [0, 0]},
             "pads_end": {"type": "s64[]", "value": [0, 0]}, "dilations": {"type": "s64[]", "value": [1, 1]},
             "data_format": {"type": "string", "value": "NCX"}, "weights_format": {"type": "string", "value": "OIX"},
             "weights_shape": {"type": "s64[]", "value": [8, 1000, 1, 1]}}
    doc = {"version": "3.0.0", "engine_kind": "cpu", "graph": [
        {"id": 0, "name": "huge", "kind": "ConvolutionBackwardWeights", "attrs": attrs,
         "inputs": [t(0, [1, 1000, 1000000, 1000]), t(1, [1, 8, 1000000, 1000])], "outputs": [t(2, [8, 1000, 1, 1])]}]}
    path.write_text(json.dumps(doc))
    return path


def test_json_with_a_10_to_12_element_tensor_is_not_allocated(tmp_path):
    js = _huge_json(tmp_path / "huge.json")

    def cap():  # 3 GiB of address space: allocating the 4 TB tensor (or any big part) would fail
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    p = subprocess.run([str(EXE), "run", str(js)], capture_output=True, text=True, timeout=60, env=ENV,
                       preexec_fn=cap)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "shape inference only" in p.stdout and "TiB" in p.stdout and "matches the declared" in p.stdout


def test_malformed_xml_and_json(tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text('<?xml version="1.0"?><net version="11"><layers><layer id="0"')
    user_error(cli("run", bad), "bad.xml", "malformed XML")
    notnet = tmp_path / "notnet.xml"
    notnet.write_text("<html/>")
    user_error(cli("run", notnet), "<net>")
    for text, frag in (("{", "malformed JSON"), ('{"graph": 5}', '"graph" must be a list'),
                       ("[1, 2]", "top level must be an object"), ('{"graph": [{"id": 0}]}', "kind is required"),
                       ('{"graph": [{"id": 0, "kind": "Convolution", "attrs": {"strides": 3}}]}', "attribute strides"),
                       ('{"graph": [{"id": NaN, "kind": "x"}]}', "NaN"), ("[" * 100000 + "]" * 100000, "malformed JSON")):
        f = tmp_path / "bad.json"
        f.write_text(text)
        user_error(cli("run", f), "bad.json", frag)


def test_unsupported_layer_and_op(tmp_path):
    def relu(xml: str) -> str:  # the Result becomes a ReLU
        return xml.replace('type="Result"', 'type="ReLU"')
    user_error(cli("run", _example_copy(tmp_path, edit=relu)), "ReLU", "cannot run")
    doc = json.loads((EXAMPLES / "onednn_conv_bwd_w_2d.json").read_text())
    doc["graph"][0]["kind"] = "MatMul"
    f = tmp_path / "mm.json"
    f.write_text(json.dumps(doc))
    user_error(cli("run", f), "MatMul", "cannot run")


def test_bad_attributes(tmp_path):
    user_error(cli("run", _example_copy(tmp_path, edit=lambda x: x.replace('strides="2"', 'strides="2,x"'))),
               "strides", "2,x")
    user_error(cli("run", _example_copy(tmp_path, edit=lambda x: x.replace('strides="2"', 'strides="0"'))),
               "GroupConvolutionBackpropData", "strides")
    user_error(cli("run", _example_copy(tmp_path, edit=lambda x: x.replace('strides="2"', 'strides="2" group="3"'))),
               "group")
    user_error(cli("run", _example_copy(tmp_path, edit=lambda x: x.replace("<dim>224</dim>", "<dim>-1</dim>", 1))),
               "dynamic")
    user_error(cli("run", _example_copy(tmp_path, edit=lambda x: x.replace('version="11"', 'version="7"'))),
               "version must be 10 or 11")
    user_error(cli("run", _example_copy(tmp_path, edit=lambda x: x.replace('size="480"', 'size="400"'))),
               "size must be")
    doc = json.loads((EXAMPLES / "onednn_conv_bwd_w_2d.json").read_text())
    doc["graph"][0]["attrs"]["strides"]["value"] = [2, 0]
    f = tmp_path / "s0.json"
    f.write_text(json.dumps(doc))
    user_error(cli("run", f), "ConvolutionBackwardWeights", "strides")
    doc["graph"][0]["attrs"]["strides"]["value"] = ["2", "2"]
    f.write_text(json.dumps(doc))
    user_error(cli("run", f), "strides", "wrong type")


def test_declared_shape_mismatch_exits_1(tmp_path):
    xml = _example_copy(tmp_path, edit=lambda x: x.replace("<dim>447</dim>", "<dim>446</dim>"))
    p = cli("run", xml)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "MISMATCH" in p.stdout and "(1, 8, 446)" in p.stdout


def test_bad_inputs_and_options(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((1, 20, 223), np.float32))
    user_error(cli("run", EXAMPLES / "ov_group_deconv_1d.xml", "--input", f"data={tmp_path / 'x.npy'}"),
               "declared shape", "(1, 20, 224)")
    np.save(tmp_path / "y.npy", np.zeros((1, 20, 224), np.float32))
    user_error(cli("run", EXAMPLES / "ov_group_deconv_1d.xml", "--input", f"nothing={tmp_path / 'y.npy'}"),
               "nothing", "matched none")
    user_error(cli("run", EXAMPLES / "ov_group_deconv_1d.xml", "--memory-limit", "lots"), "memory-limit")
    user_error(cli("run", ROOT / "README.md"), "README.md", ".xml")
    user_error(cli("frobnicate"), "frobnicate")


def test_verbose_shows_the_traceback(tmp_path):
    p = cli("run", "--verbose", tmp_path / "nope.xml")
    assert p.returncode == 2 and "Traceback" in p.stderr and "no such file" in p.stderr


# ---------------------------------------------------------------------------------------------
# translate / explain on the command line


LEAD_EXAMPLE = ("translate", "--from", "tensorflow", "--op", "Conv2DBackpropFilterV2", "--attrs",
                '{"strides":[1,2,2,1],"padding":"SAME","data_format":"NHWC"}', "--input-shape", "1,7,7,3",
                "--filter-shape", "3,3,3,4")


def test_translate_command():
    p = cli(*LEAD_EXAMPLE, "--to", "openvino")
    assert p.returncode == 0, p.stderr
    assert "OpenVINO Convolution" in p.stdout and "pads_begin = [1, 1]" in p.stdout and "transpose(" in p.stdout
    assert "no weights-gradient operation" in p.stdout
    q = cli(*LEAD_EXAMPLE, "--to", "onednn", "--json", module=True)
    assert q.returncode == 0, q.stderr
    doc = json.loads(q.stdout)
    assert doc["target"]["op"] == "ConvolutionBackwardWeights"
    assert doc["target"]["attrs"]["pads_begin"] == [1, 1] and doc["target"]["attrs"]["weights_shape"] == [3, 3, 3, 4]


def test_translate_command_refuses_with_the_reason():
    p = cli("translate", "--from", "openvino", "--op", "Convolution", "--attrs",
            '{"strides":[1,1,1],"pads_begin":[0,1,0],"pads_end":[1,0,0],"dilations":[1,1,1]}',
            "--input-shape", "1,2,5,6,7", "--filter-shape", "3,2,2,2,2", "--to", "tensorflow")
    user_error(p, "refused", "Conv3D", "SAME and VALID", status=3)


def test_translate_command_user_errors():
    user_error(cli("translate", "--from", "tf", "--op", "Conv2D", "--attrs", "{bad", "--to", "ov"), "--attrs")
    user_error(cli("translate", "--from", "caffe", "--op", "Conv2D", "--to", "ov"), "caffe")
    user_error(cli("translate", "--from", "tf", "--op", "Conv9D", "--to", "ov"), "Conv9D")
    user_error(cli("translate", "--from", "tf", "--op", "Conv2D", "--attrs", '{"strides":[1,2,2,1],"padding":"SAME"}',
                   "--input-shape", "1,7,7,3", "--to", "ov"), "filter")
    user_error(cli("translate", "--from", "tf", "--op", "Conv2D", "--attrs", '{"strides":[2,2],"padding":"SAME"}',
                   "--input-shape", "1,7,7,3", "--filter-shape", "3,3,3,4", "--to", "ov"), "strides", "4 entries")


def test_explain_command():
    p = cli("explain", "--framework", "tensorflow", "--op", "Conv2D", "--attrs", '{"strides":[1,2,2,1],"padding":"SAME"}',
            "--input-shape", "1,8,7,3", "--filter-shape", "3,2,3,4")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    # H: o = ceil(8/2) = 4, total = 3*2 + 3 - 8 = 1 (odd, at the end); W: o = 4, total = 3*2 + 2 - 7 = 1
    assert "effective kernel = 1*(3-1) + 1 = 3" in out
    assert "total pad max((4-1)*2 + 3 - 8, 0) = 1 -> begin 0, end 1, the odd unit at the end" in out
    assert "output = floor((8 + 0 + 1 - 3) / 2) + 1 = 4" in out
    q = cli("explain", "--framework", "openvino", "--op", "GroupConvolutionBackpropData", "--attrs",
            '{"strides":[2],"pads_begin":[0],"pads_end":[0],"dilations":[1],"auto_pad":"same_upper"}',
            "--input-shape", "1,4,5", "--filter-shape", "2,2,3,3", "--shape", "output_shape=8")
    assert q.returncode == 0, q.stderr
    # L = 2*(5-1) + 3 = 11, crop 11 - 8 = 3: same_upper starts at ceil(3/2) = 2 (the odd unit at the begin)
    assert "total crop max(L + 0 - 8, 0) = 3, starts at row 2, the odd unit at the begin" in q.stdout
    r = cli("explain", EXAMPLES / "onednn_conv_bwd_d_2d.json")
    assert r.returncode == 0 and "1 of them input rows, which get zero gradient" in r.stdout
    user_error(cli("explain"), "FILE")


# ---------------------------------------------------------------------------------------------
# translate: refusals where no exact equivalent exists (one per rule)


REFUSALS = [
    # (framework, op, attrs, shapes, to, fragment of the reason)
    ("openvino", "Convolution", {"strides": [1], "pads_begin": [0], "pads_end": [0], "dilations": [1]},
     {"data": (1, 2, 9), "filters": (3, 2, 2)}, "tensorflow", "2-D (Conv2D*) or 3-D"),
    ("onednn", "Convolution", {"strides": [1, 1, 1], "pads_begin": [1, 0, 0], "pads_end": [0, 0, 0],
                               "dilations": [1, 1, 1], "data_format": "NCX", "weights_format": "OIX"},
     {"src": (1, 2, 5, 5, 5), "weights": (3, 2, 2, 2, 2)}, "tensorflow", "SAME and VALID"),
    ("onednn", "Convolution", {"strides": [1, 1, 1], "pads_begin": [0, 0, 0], "pads_end": [0, 0, 0],
                               "dilations": [1, 1, 1], "groups": 2, "data_format": "NCX", "weights_format": "OIX"},
     {"src": (1, 4, 5, 5, 5), "weights": (6, 2, 2, 2, 2)}, "tensorflow", "no groups"),
    ("onednn", "Convolution", {"strides": [1, 1], "pads_begin": [0, 0], "pads_end": [0, 0],
                               "dilations": [2, 2], "groups": 3, "data_format": "NCX", "weights_format": "OIX"},
     {"src": (1, 3, 9, 9), "weights": (6, 1, 2, 2)}, ("tensorflow", "DepthwiseConv2dNative"), "dilations"),
    ("onednn", "Convolution", {"strides": [2, 1], "pads_begin": [0, 0], "pads_end": [0, 0],
                               "dilations": [1, 1], "groups": 3, "data_format": "NCX", "weights_format": "OIX"},
     {"src": (1, 3, 9, 9), "weights": (6, 1, 2, 2)}, ("tensorflow", "DepthwiseConv2dNative"), "equal strides"),
    ("openvino", "ConvolutionBackpropData", {"strides": [2], "pads_begin": [0], "pads_end": [0], "dilations": [1]},
     {"data": (1, 2, 4), "filters": (2, 3, 3), "output_shape": (13,)}, "onednn", "past the last row"),
    ("openvino", "ConvolutionBackpropData", {"strides": [2], "pads_begin": [0], "pads_end": [0], "dilations": [1],
                                             "auto_pad": "valid", "output_padding": [2]},
     {"data": (1, 2, 4), "filters": (2, 3, 3)}, "tensorflow", "past the last row"),
    ("tensorflow", "Conv2D", {"strides": [1, 1, 1, 1], "padding": "VALID"}, {"input": (1, 5, 5, 2),
     "filter": (2, 2, 2, 3)}, ("openvino", "ConvolutionBackpropData"), "but this is a fwd one"),
    ("tensorflow", "Conv2D", {"strides": [1, 1, 1, 1], "padding": "VALID"}, {"input": (1, 5, 5, 4),
     "filter": (2, 2, 2, 4)}, ("openvino", "Convolution"), "use GroupConvolution"),
]


@pytest.mark.parametrize("fw, op, attrs, shapes, to, why", REFUSALS)
def test_refusals(fw, op, attrs, shapes, to, why):
    to, to_op = (to, None) if isinstance(to, str) else to
    with pytest.raises(TranslationRefused) as e:
        translate(fw, op, attrs, shapes, to, to_op=to_op)
    assert why in str(e.value) and isinstance(e.value, ValueError) and isinstance(e.value, ConvError)


def test_translate_validation_errors():
    cases = [
        (("tensorflow", "Conv2D", {"strides": [2, 1, 1, 1], "padding": "SAME"}, {"input": (1, 5, 5, 2), "filter": (2, 2, 2, 3)}),
         "batch and channel"),
        (("tensorflow", "Conv2D", {"strides": [1, 1, 1, 1], "padding": "FULL"}, {"input": (1, 5, 5, 2), "filter": (2, 2, 2, 3)}),
         "padding must be one of"),
        (("tensorflow", "Conv2D", {"strides": [1, 1, 1, 1], "padding": "SAME", "explicit_paddings": [0] * 8},
          {"input": (1, 5, 5, 2), "filter": (2, 2, 2, 3)}), "explicit_paddings must be empty"),
        (("tensorflow", "Conv2D", {"strides": [1, 1, 1, 1], "padding": "VALID"}, {"input": (1, 5, 5, 3), "filter": (2, 2, 2, 3)}),
         "multiple of the filter's in_channels"),
        (("tensorflow", "Conv2D", {"strides": [1, 1, 1, 1], "padding": "VALID", "bogus": 1},
          {"input": (1, 5, 5, 2), "filter": (2, 2, 2, 3)}), "unknown ['bogus']"),
        (("openvino", "GroupConvolution", {"strides": [1], "pads_begin": [0], "pads_end": [0], "dilations": [1]},
          {"data": (1, 6, 5), "filters": (2, 3, 2, 2)}), "data channels (6) must equal groups * C_IN"),
        (("onednn", "ConvolutionBackwardData", {"strides": [1], "pads_begin": [0], "pads_end": [0], "dilations": [1]},
          {"weights": (2, 3, 4)}), "dst_shape"),
        (("onednn", "Convolution", {"strides": [1], "pads_begin": [0], "pads_end": [0]},
          {"src": (1, 5, 3), "weights": (2, 3, 4)}), "dilations is required"),
        (("tensorflow", "Conv2DBackpropFilter", {"strides": [1, 2, 2, 1], "padding": "SAME"},
          {"input": (1, 7, 7, 3), "filter": (3, 3, 3, 4), "out_backprop": (1, 3, 4, 4)}), "out_backprop must have shape"),
    ]
    for args, frag in cases:
        with pytest.raises(ConvError) as e:
            read(*args)
        assert frag in str(e.value), (frag, str(e.value))
    with pytest.raises(ConvError, match="target framework"):
        translate("tf", "Conv2D", {"strides": [1, 1, 1, 1], "padding": "VALID"}, {"input": (1, 5, 5, 2),
                  "filter": (2, 2, 2, 3)}, "caffe")


# ---------------------------------------------------------------------------------------------
# translate: numeric proofs. Both sides computed by convgrad's front-ends (float64) ...


def _cg_run(call, arrays: dict, dtype) -> np.ndarray:
    """One op call through convgrad's own front-end for its framework."""
    if call.framework == "tensorflow":
        from convgrad.tensorflow import raw_ops
        kw = dict(call.attrs)
        kw.update(arrays)
        for name, shape in call.constants.items():
            kw[name] = np.zeros(shape, dtype) if name in ("filter", "input") else list(shape)
        return getattr(raw_ops, call.op)(**kw)
    if call.framework == "openvino":
        import convgrad.openvino as ovf
        extra = {"output_shape": list(call.constants["output_shape"])} if "output_shape" in call.constants else {}
        return getattr(ovf, call.op)(**call.attrs)(arrays["data"], arrays["filters"], **extra)
    import convgrad.onednn as dnf
    return getattr(dnf, call.op)(**call.attrs)(*[arrays[t.name] for t in call.inputs],
                                                **{k: list(v) for k, v in call.constants.items()})


def _random_inputs(call, rng, dtype) -> dict:
    return {t.name: rng.standard_normal(t.shape).astype(dtype) for t in call.inputs}


def _check_convgrad_both_sides(t, rng) -> float:
    x = _random_inputs(t.source, rng, np.float64)
    want = np.asarray(_cg_run(t.source, x, np.float64))
    tx = {t._pair(name)[1].name: t.convert_input(name, a) for name, a in x.items()}
    got = t.convert_output(_cg_run(t.target, tx, np.float64))
    assert got.shape == want.shape, (got.shape, want.shape)
    return rel_err(got, want)


def _draw_case(rng):
    """A random valid op of a random framework: (framework, op, attrs, shapes)."""
    fw = ["tensorflow", "openvino", "onednn"][rng.integers(3)]
    pick = lambda seq: seq[rng.integers(len(seq))]  # noqa: E731
    if fw == "tensorflow":
        nsp = pick([2, 2, 3])
        depthwise = nsp == 2 and rng.random() < 0.3
        direction = pick(["fwd", "bwd_weights", "bwd_data"])
        if depthwise:
            op = {"fwd": "DepthwiseConv2dNative", "bwd_weights": "DepthwiseConv2dNativeBackpropFilter",
                  "bwd_data": "DepthwiseConv2dNativeBackpropInput"}[direction]
        else:
            op = {("fwd", 2): pick(["Conv2D"]), ("fwd", 3): "Conv3D",
                  ("bwd_weights", 2): pick(["Conv2DBackpropFilter", "Conv2DBackpropFilterV2"]),
                  ("bwd_weights", 3): "Conv3DBackpropFilterV2",
                  ("bwd_data", 2): pick(["Conv2DBackpropInput", "Conv2DBackpropInputV2"]),
                  ("bwd_data", 3): "Conv3DBackpropInputV2"}[(direction, nsp)]
        cl = rng.random() < 0.7
        k = [int(v) for v in rng.integers(1, 4, nsp)]
        s = [int(pick([1, 2, 3]))] * nsp if depthwise else [int(v) for v in rng.integers(1, 4, nsp)]
        d = [1] * nsp if depthwise or nsp == 3 else [int(v) for v in rng.integers(1, 3, nsp)]
        i = [int(v) for v in rng.integers(1, 10, nsp)]
        c = int(rng.integers(1, 4))
        g = 1 if (nsp == 3 or depthwise or direction != "fwd" or rng.random() < 0.7) else 2
        o = int(rng.integers(1, 4)) * g
        n = int(rng.integers(1, 3))
        padding = pick(["SAME", "VALID"] + (["EXPLICIT", "EXPLICIT"] if nsp == 2 else []))
        ex = lambda v: [1, *v, 1] if cl else [1, 1, *v]  # noqa: E731
        attrs = {"strides": ex(s), "padding": padding, "data_format": ("NHWC" if cl else "NCHW") if nsp == 2 else
                 ("NDHWC" if cl else "NCDHW"), "dilations": ex(d)}
        if padding == "EXPLICIT":
            pads = [int(v) for v in rng.integers(0, 3, 2 * nsp)]
            attrs["explicit_paddings"] = [0, 0] + pads + [0, 0] if cl else [0, 0, 0, 0] + pads
        ch = c * g
        shapes = {"input": (n, *i, ch) if cl else (n, ch, *i),
                  "filter": (*k, ch, int(rng.integers(1, 3))) if depthwise else (*k, c, o)}
        return fw, op, attrs, shapes
    nsp = int(rng.integers(1, 4))
    k = [int(v) for v in rng.integers(1, 4, nsp)]
    s = [int(v) for v in rng.integers(1, 4, nsp)]
    d = [int(v) for v in rng.integers(1, 3, nsp)]
    pb = [int(v) for v in rng.integers(0, 3, nsp)]
    pe = [int(v) for v in rng.integers(0, 3, nsp)]
    g = int(pick([1, 1, 2, 3]))
    ci, co, n = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.integers(1, 3))
    i = [int(v) for v in rng.integers(1, 9, nsp)]
    if fw == "openvino":
        op = pick(["Convolution", "GroupConvolution", "ConvolutionBackpropData", "GroupConvolutionBackpropData"])
        grouped = op.startswith("Group")
        g = g if grouped else 1
        attrs = {"strides": s, "pads_begin": pb, "pads_end": pe, "dilations": d,
                 "auto_pad": pick(["explicit", "explicit", "same_upper", "same_lower", "valid"])}
        if "Backprop" in op:
            filt = ((g,) if grouped else ()) + (ci, co, *k)
            shapes = {"data": (n, g * ci, *i), "filters": filt}
            if rng.random() < 0.5:
                attrs["output_padding"] = [int(rng.integers(0, v)) for v in s]
            if rng.random() < 0.4:
                full = [si * (x - 1) + di * (ki - 1) + 1 for si, x, di, ki in zip(s, i, d, k)]
                shapes["output_shape"] = tuple(max(1, f - int(rng.integers(0, 4))) for f in full)
        else:
            filt = ((g,) if grouped else ()) + (co, ci, *k)
            shapes = {"data": (n, g * ci, *i), "filters": filt}
        return fw, op, attrs, shapes
    op = pick(["Convolution", "ConvolutionBackwardData", "ConvolutionBackwardWeights"])
    fmt, wfmt = pick(["NXC", "NCX"]), pick(["XIO", "OIX"])
    attrs = {"strides": s, "pads_begin": pb, "pads_end": pe, "dilations": d, "groups": g, "data_format": fmt,
             "weights_format": wfmt, "auto_pad": pick(["None", "None", "SAME_UPPER", "SAME_LOWER", "VALID"])}
    src = (n, *i, g * ci) if fmt == "NXC" else (n, g * ci, *i)
    w = (*k, ci, g * co) if wfmt == "XIO" else (g * co, ci, *k)
    if op == "ConvolutionBackwardData":
        attrs["dst_shape"] = list(src)
        shapes = {"weights": w}
    elif op == "ConvolutionBackwardWeights":
        shapes = {"src": src}
        if rng.random() < 0.5:
            attrs["weights_shape"] = list(w)
        else:
            shapes["weights"] = w
    else:
        shapes = {"src": src, "weights": w}
    return fw, op, attrs, shapes


def _sweep(n_cases: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    stats: dict = {}
    done = 0
    while done < n_cases:
        fw, op, attrs, shapes = _draw_case(rng)
        try:
            read(fw, op, attrs, shapes)
        except ConvError:
            continue  # an invalid draw (window larger than the padded input, ...): draw again
        done += 1
        for to in ("tensorflow", "openvino", "onednn"):
            key = (fw, to)
            st = stats.setdefault(key, {"cases": 0, "refused": 0, "worst": 0.0})
            try:
                t = translate(fw, op, attrs, shapes, to)
            except TranslationRefused:
                st["refused"] += 1
                continue
            err = _check_convgrad_both_sides(t, rng)
            assert err <= 1e-12, (fw, op, attrs, shapes, to, t.target.op, t.target.attrs, err)
            st["cases"] += 1
            st["worst"] = max(st["worst"], err)
    return stats


def test_translate_sweep_convgrad_both_sides():
    stats = _sweep(120, seed=2024)
    for (fw, to), st in stats.items():
        _record(f"translate {fw} -> {to}: convgrad both sides (float64), {st['cases']} cases, "
                f"{st['refused']} refused", st["worst"])
        assert st["cases"] >= 5, ((fw, to), st)


@pytest.mark.slow
def test_translate_sweep_convgrad_both_sides_slow():
    stats = _sweep(1500, seed=7)
    for (fw, to), st in stats.items():
        assert st["cases"] >= 50, ((fw, to), st)


def test_translate_every_remainder_and_direction():
    """TF EXPLICIT with asymmetric pads, every (i + pb + pe - ek) % s, each direction -> the two others."""
    rng = np.random.default_rng(11)
    count = 0
    for op in ("Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput"):
        for rem in range(3):
            # axis H: k 3, d 2 (ek 5), s 3, pads 2/0: i = 5 - 2 + 3*q + rem
            i_h = 3 + 3 * 2 + rem
            attrs = {"strides": [1, 3, 2, 1], "padding": "EXPLICIT", "explicit_paddings": [0, 0, 2, 0, 1, 2, 0, 0],
                     "dilations": [1, 2, 1, 1]}
            shapes = {"input": (2, i_h, 8, 3), "filter": (3, 2, 3, 5)}
            for to in ("openvino", "onednn"):
                t = translate("tensorflow", op, attrs, shapes, to)
                err = _check_convgrad_both_sides(t, rng)
                assert err <= 1e-12, (op, rem, to, err)
                count += 1
                if t.target.inputs[1].role == "diff_dst" and to == "openvino":
                    continue  # the weights gradient lowered to a forward Convolution reads as a forward op
                # and back again: the target op read as a source, translated to TF, computed both ways
                back = translate(to, t.target.op, t.target.attrs, {u.name: u.shape for u in t.target.inputs},
                                 "tensorflow")
                assert back.direction == t.direction and back.spec.pads_begin == t.spec.pads_begin
                assert _check_convgrad_both_sides(back, rng) <= 1e-12
    assert count == 18


# ---------------------------------------------------------------------------------------------
# ... and by the real frameworks (float32)


def _tf_run(call, arrays: dict) -> np.ndarray:
    import tensorflow as tf
    op = {"Conv2DBackpropFilterV2": "Conv2DBackpropFilter", "Conv2DBackpropInputV2": "Conv2DBackpropInput"}.get(
        call.op, call.op)  # the V2 ops have no CPU kernel; the V1 ops are the same math (PEERS.md)
    kw = dict(call.attrs)
    kw.update(arrays)
    for name, shape in call.constants.items():
        kw[{"filter": "filter_sizes", "input": "input_sizes"}.get(name, name)] = np.array(shape, np.int32)
    return getattr(tf.raw_ops, op)(**kw).numpy()


def _ov_run(call, arrays: dict) -> np.ndarray:
    import openvino as ov
    import openvino.opset1 as ops
    from openvino.utils.node_factory import NodeFactory
    params = [ops.parameter(list(arrays[t.name].shape), ov.Type.f32) for t in call.inputs]
    ins = [p.output(0) for p in params]
    if "output_shape" in call.constants:
        ins.append(ops.constant(np.array(call.constants["output_shape"], np.int64)).output(0))
    attrs = {k: v for k, v in call.attrs.items()}
    if "Backprop" in call.op:
        attrs.setdefault("output_padding", [0] * (len(call.inputs[0].shape) - 2))
    node = NodeFactory("opset1").create(call.op, ins, attrs)
    model = ov.Model([node.output(0)], params)
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return compiled([arrays[t.name] for t in call.inputs])[0]


def _onednn_call(call, arrays: dict):
    """(oracle function name, args, kwargs) for tests/oracles/onednn_graph.py."""
    a = call.attrs
    common = dict(strides=list(a["strides"]), pads_begin=list(a["pads_begin"]), pads_end=list(a["pads_end"]),
                  dilations=list(a["dilations"]), auto_pad=a.get("auto_pad", "None"), groups=a.get("groups", 1),
                  data_format=a.get("data_format", "NXC"), weights_format=a.get("weights_format", "XIO"))
    if call.op == "Convolution":
        return "convolution", (arrays["src"], arrays["weights"]), common
    if call.op == "ConvolutionBackwardWeights":
        ws = a.get("weights_shape") or list(call.constants["weights_shape"])
        return "conv_bwd_weights", (arrays["src"], arrays["diff_dst"], list(ws)), common
    ds = a.get("dst_shape") or list(call.constants["dst_shape"])
    return "conv_bwd_data", (arrays["diff_dst"], arrays["weights"], list(ds)), dict(common, emulate_groups=True)


REAL_CASES = [
    # The acceptance case: TF SAME, stride 2, odd sizes -> OpenVINO and -> oneDNN Graph, each direction.
    ("tensorflow", "Conv2D", {"strides": [1, 2, 2, 1], "padding": "SAME"}, {"input": (2, 7, 9, 3), "filter": (3, 2, 3, 5)}),
    ("tensorflow", "Conv2DBackpropFilterV2", {"strides": [1, 2, 2, 1], "padding": "SAME", "data_format": "NHWC"},
     {"input": (2, 7, 9, 3), "filter": (3, 2, 3, 5)}),
    ("tensorflow", "Conv2DBackpropInputV2", {"strides": [1, 2, 2, 1], "padding": "SAME"},
     {"input": (2, 7, 9, 3), "filter": (3, 2, 3, 5)}),
    ("tensorflow", "Conv2DBackpropFilter", {"strides": [1, 3, 2, 1], "padding": "SAME"},
     {"input": (1, 11, 5, 2), "filter": (2, 3, 2, 3)}),
    ("tensorflow", "Conv2D", {"strides": [1, 2, 1, 1], "padding": "VALID", "dilations": [1, 2, 3, 1]},
     {"input": (2, 11, 9, 4), "filter": (2, 3, 2, 6)}),
    ("tensorflow", "Conv3DBackpropInputV2", {"strides": [1, 2, 2, 2, 1], "padding": "SAME"},
     {"input": (1, 5, 7, 6, 2), "filter": (3, 2, 3, 2, 4)}),
    ("tensorflow", "Conv3DBackpropFilterV2", {"strides": [1, 2, 1, 2, 1], "padding": "VALID"},
     {"input": (2, 7, 5, 6, 2), "filter": (3, 2, 2, 2, 3)}),
    ("tensorflow", "Conv2DBackpropInput", {"strides": [1, 3, 2, 1], "padding": "EXPLICIT",
                                           "explicit_paddings": [0, 0, 2, 0, 0, 1, 0, 0]},
     {"input": (2, 10, 8, 3), "filter": (3, 2, 3, 4)}),
    ("tensorflow", "DepthwiseConv2dNative", {"strides": [1, 2, 2, 1], "padding": "SAME"},
     {"input": (1, 9, 7, 3), "filter": (3, 2, 3, 2)}),
    ("tensorflow", "DepthwiseConv2dNativeBackpropFilter", {"strides": [1, 2, 2, 1], "padding": "VALID"},
     {"input": (2, 9, 8, 3), "filter": (3, 2, 3, 2)}),
    # OpenVINO backprop rules (same_upper with output_shape: larger half at the begin) -> TF and oneDNN
    ("openvino", "ConvolutionBackpropData", {"strides": [2, 2], "pads_begin": [0, 0], "pads_end": [0, 0],
                                             "dilations": [1, 1], "auto_pad": "same_upper"},
     {"data": (1, 4, 5, 4), "filters": (4, 3, 3, 2), "output_shape": (8, 7)}),
    ("openvino", "ConvolutionBackpropData", {"strides": [3, 2], "pads_begin": [1, 0], "pads_end": [0, 2],
                                             "dilations": [1, 2], "output_padding": [2, 1]},
     {"data": (2, 3, 4, 5), "filters": (3, 2, 3, 2)}),
    ("openvino", "GroupConvolution", {"strides": [2, 1], "pads_begin": [1, 0], "pads_end": [0, 1],
                                      "dilations": [1, 2], "auto_pad": "same_lower"},
     {"data": (2, 4, 9, 8), "filters": (2, 3, 2, 3, 2)}),
    ("openvino", "GroupConvolutionBackpropData", {"strides": [2, 2], "pads_begin": [1, 0], "pads_end": [1, 1],
                                                  "dilations": [1, 1]},
     {"data": (1, 4, 5, 4), "filters": (2, 2, 3, 3, 2)}),
    # oneDNN Graph -> TF and OpenVINO
    ("onednn", "ConvolutionBackwardWeights", {"strides": [2, 2], "pads_begin": [0, 0], "pads_end": [0, 0],
                                              "dilations": [1, 1], "auto_pad": "SAME_UPPER", "data_format": "NCX",
                                              "weights_format": "OIX", "weights_shape": [4, 3, 3, 2]},
     {"src": (2, 3, 9, 7)}),
    ("onednn", "ConvolutionBackwardData", {"strides": [2, 3], "pads_begin": [1, 0], "pads_end": [0, 2],
                                           "dilations": [2, 1], "dst_shape": [1, 10, 9, 3]},
     {"weights": (2, 3, 3, 5)}),
    ("onednn", "Convolution", {"strides": [2, 2], "pads_begin": [2, 0], "pads_end": [0, 1], "dilations": [2, 1]},
     {"src": (2, 9, 8, 3), "weights": (3, 2, 3, 4)}),
    ("onednn", "ConvolutionBackwardData", {"strides": [2, 2], "pads_begin": [0, 0], "pads_end": [0, 0],
                                           "dilations": [1, 1], "auto_pad": "SAME_LOWER", "data_format": "NCX",
                                           "weights_format": "OIX", "dst_shape": [2, 3, 7, 8]},
     {"weights": (4, 3, 3, 2)}),
    ("openvino", "Convolution", {"strides": [1, 3], "pads_begin": [1, 2], "pads_end": [0, 0], "dilations": [1, 1]},
     {"data": (1, 3, 6, 11), "filters": (4, 3, 2, 3)}),
    ("openvino", "ConvolutionBackpropData", {"strides": [2, 1, 2], "pads_begin": [1, 1, 1], "pads_end": [1, 1, 1],
                                             "dilations": [1, 1, 1], "auto_pad": "same_lower"},
     {"data": (1, 3, 3, 4, 3), "filters": (3, 2, 3, 2, 2)}),
    ("onednn", "Convolution", {"strides": [1, 2, 2], "pads_begin": [0, 1, 0], "pads_end": [1, 0, 1],
                               "dilations": [1, 1, 1], "groups": 2, "data_format": "NCX", "weights_format": "OIX"},
     {"src": (1, 4, 5, 6, 7), "weights": (6, 2, 2, 3, 2)}),
]


def _real_run(call, arrays: dict, dnnl_calls: list):
    if call.framework == "tensorflow":
        return _tf_run(call, arrays)
    if call.framework == "openvino":
        return _ov_run(call, arrays)
    dnnl_calls.append(_onednn_call(call, arrays))
    return len(dnnl_calls) - 1   # resolved after the batch ran


def test_translate_against_real_frameworks():
    """Source op in its real framework vs the translated op in the target's real framework."""
    from .oracles import onednn_graph as og
    rng = np.random.default_rng(99)
    pending, dnnl_calls = [], []
    for fw, op, attrs, shapes in REAL_CASES:
        for to in ("tensorflow", "openvino", "onednn"):
            if to == fw:
                continue
            try:
                t = translate(fw, op, attrs, shapes, to)
            except TranslationRefused:
                continue
            if any("CPU kernels" in n for n in t.target.notes):
                continue  # valid, but TF's CPU kernels do not run it (grouped or dilated gradients): noted

            x = _random_inputs(t.source, rng, np.float32)
            tx = {t._pair(n)[1].name: t.convert_input(n, a) for n, a in x.items()}
            pending.append((t, _real_run(t.source, x, dnnl_calls), _real_run(t.target, tx, dnnl_calls)))
    results = og.run_batch(dnnl_calls) if dnnl_calls else []
    def value(v):
        if isinstance(v, int):
            status, out = results[v]
            assert status == "ok", out
            return out
        return v
    worst: dict = {}
    for t, src_res, tgt_res in pending:
        want = np.asarray(value(src_res), np.float64)
        got = t.convert_output(np.asarray(value(tgt_res)))
        err = rel_err(got, want)
        key = (t.source.framework, t.target.framework)
        worst[key] = (worst.get(key, (0, 0.0))[0] + 1, max(worst.get(key, (0, 0.0))[1], err))
        assert err <= 1e-5, (t.source.op, t.source.attrs, t.target.op, t.target.attrs, err)
    for (fw, to), (n, w) in sorted(worst.items()):
        _record(f"translate {fw} -> {to}: real frameworks (float32), {n} cases", w)
    assert len(pending) >= 38, len(pending)
    # the acceptance case ran in both directions it names
    names = {(t.source.op, t.target.framework) for t, _, _ in pending}
    for op in ("Conv2D", "Conv2DBackpropFilterV2", "Conv2DBackpropInputV2"):
        assert (op, "openvino") in names and (op, "onednn") in names


# ---------------------------------------------------------------------------------------------
# Measured figures (printed with -s; the report quotes them)

_FIGURES: dict = {}


def _record(what: str, err: float) -> None:
    _FIGURES[what] = max(err, _FIGURES.get(what, 0.0))
    print(f"[figure] {what}: worst rel err {err:.3g}")
