"""The benchmark harness: descriptor rules, the problem lists, scaling, each peer's
benchmark adapter against the float64 reference (so a timed peer computes the same thing
as convgrad), and one small end-to-end run with worker processes. No timed assertions."""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import convgrad as cg
from convgrad import bench
from convgrad.kernels import reference as ref

from .helpers import rel_err

LISTS = Path(__file__).resolve().parents[1] / "benchmarks" / "problems"


# ---------------------------------------------------------------------------------------
# Descriptors (expected values worked out by hand from the rules in benchmarks/README.md)
# ---------------------------------------------------------------------------------------

def test_descriptor_2d_lower_axis_copies_higher():
    p = bench.parse_descriptor('mb8ic64ih56oc64oh56kh3ph1n"resnet:x*3"')
    s = p.spec
    assert (s.mb, s.groups, s.ic, s.oc) == (8, 1, 64, 64)
    assert s.src == (56, 56) and s.kernel == (3, 3) and s.dst == (56, 56)
    assert s.pads_begin == (1, 1) and s.pads_end == (1, 1) and s.strides == (1, 1) and s.dilations == (1, 1)
    assert p.name == "resnet:x*3" and p.repeats == 3


def test_descriptor_front_pad_from_output_and_asymmetric_back_pad():
    # oh given, ph missing: ph = ((112-1)*2 - 224 + 7) // 2 = 2; back = 222 - 224 + 7 - 2 = 3
    s = bench.parse_descriptor("ic3ih224oc64oh112kh7sh2").spec
    assert s.mb == 2 and s.pads_begin == (2, 2) and s.pads_end == (3, 3) and s.dst == (112, 112)


def test_descriptor_negative_back_pad_means_unread_rows():
    # back = (3-1)*3 - 11 + 3 - 0 = -2: floor((11 + 0 + 0 - 3) / 3) + 1 = 3 still
    s = bench.parse_descriptor("mb1ic4iw11oc4ow3kw3sw3pw0").spec
    assert s.nsp == 1 and s.pads_end == (0,) and s.dst == (3,)


def test_descriptor_dilation_counts_from_zero_and_3d_copies():
    s = bench.parse_descriptor("ic2ih9oc2kh3dh1").spec
    assert s.dilations == (2, 2) and s.dst == (5, 5)                     # ek = 5, (9 - 5) + 1
    s = bench.parse_descriptor("ic2id8ih6oc3kd3kh2").spec
    assert s.src == (8, 6, 6) and s.kernel == (3, 2, 2) and s.dst == (6, 5, 5)
    s = bench.parse_descriptor("--dir=BWD_W mb2_g2ic4_oc6_iw5kw3").spec
    assert s.groups == 2 and s.nsp == 1 and s.dst == (3,)


@pytest.mark.parametrize("text,fragment", [
    ("mb2ic4oc6kh3", "input size"),
    ("mb2ic4ih5oc6kh3xx1", "benchdnn entries"),
    ("ic1ih10oc1oh3kh3", "front padding must be non-negative"),
    ("ic1iw10oc1ow3kw3sw2pw0", "output size"),
    ("mb2ih5oc6kh3", "ic must be given"),
    ("mb2mb3ic1ih5oc6kh3", "must appear once"),
    ("ic2ih9oc2oh9kh3ph1peh2", "back padding peh2"),
    ("ic2iw9oc2ow8kw2pw0pew2", "back padding pew2"),
    ("ic2iw9oc2kw2pw0pew-1", "back padding must be non-negative"),
])
def test_descriptor_errors(text, fragment):
    with pytest.raises(cg.ConvValueError, match=fragment):
        bench.parse_descriptor(text)


@pytest.mark.parametrize("name", bench.DEFAULT_LISTS)
def test_lists_parse_with_provenance(name):
    path = LISTS / name
    text = path.read_text()
    assert text.startswith("# Provenance:")
    problems = bench.read_problems(path)
    lines = [ln.split("#", 1)[0].strip() for ln in text.splitlines()]
    assert len(problems) == sum(1 for ln in lines if ln) > 0
    for p in problems:
        assert p.spec.flops > 0 and p.list_name == name


def test_a_results_descriptor_runs_the_same_problem_again():
    # the harness writes str(spec), back pads (pe*) included, in its results' descriptor
    # column; reading that back must give the very same problem, asymmetric pads included
    for name in bench.DEFAULT_LISTS:
        for p in bench.read_problems(LISTS / name):
            assert bench.parse_descriptor(str(p.spec)).spec == p.spec
    s = bench.parse_descriptor("mb1ic2ih10iw9oc3kh3kw4sh2sw3ph1pw2peh0pew1").spec
    # (10 + 1 + 0 - 3) // 2 + 1 = 5 and (9 + 2 + 1 - 4) // 3 + 1 = 3, worked by hand
    assert (s.pads_begin, s.pads_end, s.dst) == ((1, 2), (0, 1), (5, 3))


def test_scaling_keeps_the_layer_and_fits_the_budget():
    for name in bench.DEFAULT_LISTS:
        for p in bench.read_problems(LISTS / name):
            q = bench.scale_problem(p, 2.0)
            s, t = p.spec, q.spec
            assert (t.ic, t.oc, t.groups, t.kernel, t.strides, t.dilations) == \
                   (s.ic, s.oc, s.groups, s.kernel, s.strides, s.dilations)
            assert t.flops <= 2e9 or (t.mb == 1 and t.flops <= 2.5e9)
            assert (q.scaled == "") == (s.flops <= 2e9)


# ---------------------------------------------------------------------------------------
# Each library's benchmark adapter computes the same thing (float64 reference, float32)
# ---------------------------------------------------------------------------------------

ADAPTER_CASES = [
    'g1mb2ic3ih9iw7oc5kh3kw2sh2sw1ph1pw0dh1n"strided_dilated"',
    'g1mb2ic3ih9iw8oc5kh3kw2sh2sw1ph2pw0n"asymmetric_pads"',
    'g2mb2ic4ih8iw7oc6kh3kw2ph1n"grouped"',
    'g4mb1ic4ih8iw9oc8kh3kw2sh2sw2ph1pw1n"depthwise_x2"',
    'mb2ic3iw20oc4kw3sw2pw1n"1d"',
    'mb1ic2id5ih6iw4oc3kd2kh3kw2pd1ph0pw1n"3d"',
    'mb1ic1iw600oc9ow8kw128sw64pw0n"istft_like"',
]
# Kernels the peers may lack on CPU: every other combination must run. TensorFlow refused
# these on the AMD (AVX2) development VM and runs them on the Intel (AVX-512) one, where
# its oneDNN kernels take them; either way what runs must match the reference.
UNSUPPORTED = {
    ("tensorflow", "strided_dilated", "bwd_weights"), ("tensorflow", "strided_dilated", "bwd_data"),
    ("tensorflow", "grouped", "bwd_weights"), ("tensorflow", "grouped", "bwd_data"),
}


@pytest.fixture(scope="module")
def adapter_results():
    """{(library, case, direction): relative error or 'unsupported'}."""
    want, out = {}, {}
    for text in ADAPTER_CASES:
        p = bench.parse_descriptor(text)
        x, w, dy = bench.make_inputs(p.spec, 0)
        f = lambda a: a.astype(np.float64)
        want[p.name] = (p, (x, w, dy), {
            "bwd_weights": ref.conv_backward_weights(p.spec, f(x), f(dy)),
            "bwd_data": ref.conv_backward_data(p.spec, f(dy), f(w)),
            "fwd": ref.conv_forward(p.spec, f(x), f(w))})
    for lib in bench.LIBRARIES:
        adapter = bench.ADAPTERS[lib](1)          # a missing framework fails here, never skips
        for name, (p, inputs, wants) in want.items():
            for d in bench.DIRECTIONS:
                if lib == "openvino" and d == "bwd_weights":
                    with pytest.raises(bench.Unsupported):
                        adapter.prepare(p.spec, d, *inputs)
                    continue
                try:
                    call, conv = adapter.prepare(p.spec, d, *inputs)
                    got = conv(call())
                except Exception:  # noqa: BLE001
                    out[(lib, name, d)] = "unsupported"
                    continue
                out[(lib, name, d)] = rel_err(got, wants[d])
    return out


@pytest.mark.parametrize("lib", bench.LIBRARIES)
def test_adapter_matches_reference(adapter_results, lib):
    mine = {k: v for k, v in adapter_results.items() if k[0] == lib}
    assert mine
    unsupported = {k for k, v in mine.items() if v == "unsupported"}
    assert unsupported <= {k for k in UNSUPPORTED if k[0] == lib}
    worst = max(v for v in mine.values() if v != "unsupported")
    assert worst <= 1e-5, (lib, worst)


# ---------------------------------------------------------------------------------------
# End to end: worker processes, alternating turns, reports
# ---------------------------------------------------------------------------------------

def test_end_to_end_run(tmp_path):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--lists", "--problem", 'mb2ic4ih10oc6kh3ph1n"tiny"', "--problem",
                              'g3mb1ic6iw30oc6kw3sw2pw1n"tiny_dw"', "--libraries", "convgrad,torch",
                              "--rounds", "2", "--reps", "2", "--threads", "1", "--pause", "0",
                              "--out", str(tmp_path), "--quiet"])
    assert bench.run(args) == 0
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert {r["library"] for r in rows} == {"convgrad", "torch"}
    assert len(rows) == 2 * 3 * 2
    for r in rows:
        assert int(r["samples"]) == 4                       # 2 rounds x 2 timed calls
        assert float(r["median_ms"]) > 0
        if r["library"] == "torch":
            assert float(r["check_rel_diff"]) < 1e-4
        else:
            assert int(r["peak_bytes"]) > 0 and float(r["ratio_to_best_peer"]) > 0
    assert (tmp_path / "chart.png").stat().st_size > 0
    assert "tiny_dw" in (tmp_path / "results.md").read_text()


def test_deep_layer_summary_puts_the_peers_beside_convgrad():
    """The deep ResNet-50 line: convgrad's mean GFLOP/s over the res4*/res5* gradient
    measurements against the SGEMM rate, each peer's mean over the measurements it ran
    (OpenVINO has no weight gradient), and the best peer's of each measurement; other
    layers and the forward do not count. Expected values worked out by hand (2 GFLOP
    per measurement: rate = 2 / seconds)."""
    deep = bench.parse_descriptor('mb10ic1000ih10oc1000oh10kh1n"res4x"', list_name="resnet_50")
    shallow = bench.parse_descriptor('mb10ic1000ih10oc1000oh10kh1n"res2x"', list_name="resnet_50")
    assert deep.spec.flops == 2 * 10 ** 9
    rows = [bench.Row(deep, "bwd_weights", times={"convgrad": [0.02], "torch": [0.04], "tensorflow": [0.025]}),
            bench.Row(deep, "bwd_data", times={"convgrad": [0.025], "torch": [0.02], "openvino": [0.05]}),
            bench.Row(deep, "fwd", times={"convgrad": [1.0], "torch": [0.001]}),
            bench.Row(shallow, "bwd_data", times={"convgrad": [1.0], "torch": [0.001]})]
    got = bench.deep_resnet_rate(rows, 200.0)
    assert got["cases"] == 2 and got["mean_gflops"] == pytest.approx(90.0) and got["percent"] == pytest.approx(45.0)
    assert got["min_gflops"] == pytest.approx(80.0)
    assert got["peers"] == {"torch": (pytest.approx(75.0), 2), "tensorflow": (pytest.approx(80.0), 1),
                            "openvino": (pytest.approx(40.0), 1)}
    assert got["best_peer"] == (pytest.approx(90.0), 2)                    # tensorflow 80, torch 100
    text = bench.render_summary(rows, {"sgemm_gflops": 200.0})
    assert "convgrad 90.0 GFLOP/s on average (min 80.0) = 45 % of the measured SGEMM rate 200.0" in text
    assert ("torch 75.0 (38 %); tensorflow 80.0 (40 %, 1 measurements); openvino 40.0 (20 %, 1 measurements); "
            "the best peer of each measurement 90.0 (45 %)") in text
    assert bench.deep_resnet_rate(rows[2:], 200.0) is None and bench.deep_resnet_rate(rows, None) is None
    text = bench.render_summary(rows, {"sgemm_gflops": 200.0, "sgemm_readings": [180.0, 200.0]})
    assert ("45 % of the measured SGEMM rate 200.0 GFLOP/s (the higher of two readings: 180.0 before the first "
            "problem, 200.0 after the last) (2 measurements)") in text


@pytest.mark.parametrize("form", ["this python", "3.10 form"])
def test_a_worker_ignores_modules_in_the_current_directory(tmp_path, monkeypatch, form):
    """A worker started from a directory holding files named like modules it imports
    (here ``grp``, which the standard library loads, and ``torch``) must not import them:
    with ``python -m`` the directory came first on the path, and a stray ``grp.py`` made
    every peer's turn fail."""
    for name in ("grp", "torch", "numpy"):
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('shadowed {name} imported')\n")
    monkeypatch.chdir(tmp_path)
    cmd = bench.worker_command("convgrad", 1)
    if form == "3.10 form":
        cmd = [sys.executable, "-c", bench._SAFE_PATH_ENTRY] + cmd[cmd.index("--worker"):]
    done = subprocess.run(cmd, input=json.dumps({"op": "quit"}) + "\n", capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[0])["ok"] is True
    assert "shadowed" not in done.stderr
    peer = subprocess.run(cmd[:cmd.index("--worker")] + ["--worker", "torch", "--threads", "1"],
                          input=json.dumps({"op": "quit"}) + "\n", capture_output=True, text=True, timeout=300)
    info = json.loads(peer.stdout.splitlines()[0])
    assert info["ok"] is True, info


def test_a_turn_times_every_direction_before_its_checks():
    """The cross-library check and the peak-memory call of round 0 run after every
    direction of the turn is timed: between two directions they slowed the next one
    (OpenBLAS threads left spinning, scratch buffers dropped), and only for the libraries
    timed there. A failing check still drops that direction's times."""
    events = []

    class Fake:
        name = "convgrad"

        def prepare(self, spec, direction, src, w, dy):
            def call():
                events.append(("call", direction))
                return np.ones(4, dtype=np.float32)

            def canonical(a):
                events.append(("check", direction))
                if direction == "fwd":
                    raise RuntimeError("bad result")
                return a
            return call, canonical

    spec = bench.parse_descriptor('mb1ic2ih5oc3kh3n"t"').spec
    req = {"op": "run", "spec": bench.spec_to_json(spec), "directions": list(bench.DIRECTIONS), "seed": 0,
           "reps": 2, "warmup": 1, "max_seconds": 10.0, "check": True, "memory": True}
    out = bench._serve(Fake(), req, {}, 1)
    first_check = events.index(("check", "bwd_weights"))
    assert events[:first_check].count(("call", "fwd")) == 3, events       # warm-up + 2 timed
    assert all(kind == "call" for kind, _ in events[:first_check])
    assert set(out["times"]) == {"bwd_weights", "bwd_data"} and "fwd" in out["unsupported"]
    assert set(out["check"]) == {"bwd_weights", "bwd_data"} and out["peak"]["bwd_data"] > 0


def test_problems_alone_run_without_the_default_lists():
    """``--problem`` alone runs only the problems given (it had added them to every default
    list, 64 problems); with ``--lists`` they are added to the lists named; neither: the
    default lists."""
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    one = 'mb2ic4ih10oc6kh3ph1n"tiny"'
    alone = bench._load_problems(parser.parse_args(["--problem", one]))
    assert [p.name for p in alone] == ["tiny"]
    added = bench._load_problems(parser.parse_args(["--lists", "pathological", "--problem", one]))
    assert [p.name for p in added][-1] == "tiny" and len(added) == 1 + len(
        bench.read_problems(bench.problems_dir() / "pathological"))
    assert [p.name for p in bench._load_problems(parser.parse_args(["--lists", "--problem", one]))] == ["tiny"]
    default = bench._load_problems(parser.parse_args([]))
    assert {p.list_name for p in default} == set(bench.DEFAULT_LISTS)


def test_bad_arguments_are_clear_errors(tmp_path):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    with pytest.raises(cg.ConvValueError, match="--libraries"):
        bench.run(parser.parse_args(["--libraries", "numpy", "--out", str(tmp_path)]))
    with pytest.raises(cg.ConvValueError, match="--lists"):
        bench.run(parser.parse_args(["--lists", "no_such_list", "--out", str(tmp_path)]))
