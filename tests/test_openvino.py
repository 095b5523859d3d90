"""OpenVINO front-end (convgrad.openvino) against the real OpenVINO runtime and independent
references.

The oracle is the openvino 2026.4 CPU plugin: one-op models built with NodeFactory("opset1")
(the opset* Python helper drops the pads of GroupConvolutionBackpropData when output_shape is
given), compiled with INFERENCE_PRECISION_HINT=f32 on one shared Core. GroupConvolutionBackpropData
with one group does not compile, so it is compared with ConvolutionBackpropData on filters[0].
A second oracle is an independent float64 / int64 scatter loop written here from the window
rule of PEERS.md. Import errors are failures, never skips: CI installs openvino.

Run with ``-s`` to see how many cases were compared with the runtime and the worst error.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import openvino as ov
import openvino.opset1 as ov_opset1
import pytest
from openvino.utils.node_factory import NodeFactory

import convgrad
from convgrad import openvino as cov
from convgrad.opdoc import REGISTRY

from .helpers import Tally, rel_err

MODES = ("explicit", "valid", "same_upper", "same_lower")

# ---------------------------------------------------------------------------------------------
# The real runtime

_CORE = ov.Core()
_NF = NodeFactory("opset1")
_CONFIG = {"INFERENCE_PRECISION_HINT": "f32"}
TALLY = Tally("convgrad.openvino vs the openvino runtime (op)")


def ov_run(op_type, data, filters, attrs, output_shape=None):
    """Build, compile and run one OpenVINO node on the CPU plugin."""
    et = ov.Type(data.dtype)
    p_data = ov_opset1.parameter(list(data.shape), et, name="data")
    p_filters = ov_opset1.parameter(list(filters.shape), et, name="filters")
    inputs = [p_data.output(0), p_filters.output(0)]
    if output_shape is not None:
        inputs.append(ov_opset1.constant(np.asarray(output_shape, dtype=np.int64)).output(0))
    attrs = {k: (list(v) if isinstance(v, (tuple, list)) else v) for k, v in attrs.items()}
    node = _NF.create(op_type, inputs, attrs)
    compiled = _CORE.compile_model(ov.Model([node], [p_data, p_filters]), "CPU", _CONFIG)
    return compiled([data, filters])[0]


def _record(op_type, err):
    TALLY.record(op_type, err)


@pytest.fixture(scope="module", autouse=True)
def _report_stats(request):
    yield
    TALLY.report(request)


def compare(op_name, data, filters, attrs, output_shape=None, tol=1e-5):
    """convgrad.openvino.<op_name> vs the runtime on the same inputs; returns our result."""
    ours = getattr(cov, op_name)(**attrs)(data, filters, *(() if output_shape is None else (output_shape,)))
    op_type, f = op_name, filters
    if op_name == "GroupConvolutionBackpropData" and filters.shape[0] == 1:
        op_type, f = "ConvolutionBackpropData", filters[0]   # one group does not compile
    want = ov_run(op_type, data, f, attrs, output_shape)
    assert ours.shape == want.shape, (op_name, attrs, output_shape, ours.shape, want.shape)
    assert ours.dtype == want.dtype == data.dtype
    if data.dtype.kind in "iu":
        err = 0.0 if np.array_equal(ours, want) else np.inf
    else:
        err = rel_err(ours, want) if ours.size else 0.0
    _record(op_name, err)
    assert err <= tol, (op_name, attrs, output_shape, err)
    return ours


# ---------------------------------------------------------------------------------------------
# Independent references (written from PEERS.md, nothing from convgrad)


def full_size(i, k, s, d):
    return s * (i - 1) + d * (k - 1) + 1


def expected_window(mode, i, k, s, d, pb, pe, op, output_shape):
    """(offset P, size O) per axis of OpenVINO's backprop-data output in the full result."""
    P, O = [], []
    for ax in range(len(i)):
        L = full_size(i[ax], k[ax], s[ax], d[ax])
        if output_shape is None:
            O.append(L - pb[ax] - pe[ax] + op[ax] if mode == "explicit" else L + op[ax])
            P.append(pb[ax] if mode == "explicit" else 0)
        else:
            o = output_shape[ax]
            tot = max(L + op[ax] - o, 0)
            O.append(o)
            P.append({"explicit": pb[ax], "valid": 0, "same_upper": (tot + 1) // 2, "same_lower": tot // 2}[mode])
    return P, O


def ref_transposed(data, filters, s, d, P, O):
    """Scatter loop: out[n, g*Co + co, q - P] += data[n, g*Ci + ci, j] * filters[g, ci, co, t],
    q = s*j + d*t, kept where 0 <= q - P < O; float64 (int64 for integer inputs)."""
    acc = np.int64 if data.dtype.kind in "iu" else np.float64
    x, w = data.astype(acc), filters.astype(acc)
    n, g, ci, co = x.shape[0], w.shape[0], w.shape[1], w.shape[2]
    xs = x.reshape((n, g, ci) + x.shape[2:])
    out = np.zeros((n, g, co) + tuple(O), dtype=acc)
    for j in np.ndindex(*x.shape[2:]):
        for t in np.ndindex(*w.shape[3:]):
            q = [s[a] * j[a] + d[a] * t[a] - P[a] for a in range(len(j))]
            if all(0 <= q[a] < O[a] for a in range(len(j))):
                out[(slice(None),) * 3 + tuple(q)] += np.einsum("ngc,gco->ngo", xs[(slice(None),) * 3 + j],
                                                                w[(slice(None),) * 3 + t])
    return out.reshape((n, g * co) + tuple(O))


def cpu_1x1_shortcut(k, s, i, O, P):
    """The CPU plugin drops the pads of a backprop op with a 1x1 kernel, stride 1 and an output
    as large as the input (see test_cpu_plugin_1x1_shortcut_drops_pads)."""
    return all(v == 1 for v in k) and all(v == 1 for v in s) and list(O) == list(i) and any(P)


def bwd_case(rng, *, nsp, groups, c_in, c_out, i, k, dtype=np.float32):
    data = rng.standard_normal((2, groups * c_in) + tuple(i)).astype(dtype)
    filters = rng.standard_normal((groups, c_in, c_out) + tuple(k)).astype(dtype)
    return data, filters


def attrs_of(s, pb, pe, d, mode, op=None):
    a = dict(strides=list(s), pads_begin=list(pb), pads_end=list(pe), dilations=list(d), auto_pad=mode)
    if op is not None:
        a["output_padding"] = list(op)
    return a


# ---------------------------------------------------------------------------------------------
# GroupConvolutionBackpropData (the seed op)

# One problem per rank: non-square kernels, C_IN != C_OUT, strides, dilations, asymmetric pads,
# output_padding below, at and past the stride and negative.
SEED_PROBLEMS = {
    1: dict(groups=2, c_in=3, c_out=2, i=(7,), k=(3,), s=(3,), d=(2,), pb=(2,), pe=(1,), op=(1,)),
    2: dict(groups=3, c_in=2, c_out=4, i=(5, 4), k=(3, 2), s=(2, 3), d=(1, 2), pb=(1, 0), pe=(0, 2), op=(2, 1)),
    3: dict(groups=2, c_in=1, c_out=3, i=(3, 4, 2), k=(2, 3, 2), s=(2, 1, 3), d=(1, 2, 1), pb=(0, 1, 1),
            pe=(1, 0, 2), op=(1, -1, 4)),
}
SIZE_KINDS = ("none", "smaller", "equal", "larger")


@pytest.mark.parametrize("nsp", [1, 2, 3])
@pytest.mark.parametrize("size_kind", SIZE_KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_group_backprop_auto_pad_x_output_shape(mode, size_kind, nsp):
    """Every auto_pad x (no output_shape | smaller | equal | larger than natural) matches the runtime."""
    p = SEED_PROBLEMS[nsp]
    rng = np.random.default_rng(100 * MODES.index(mode) + 10 * SIZE_KINDS.index(size_kind) + nsp)
    data, filters = bwd_case(rng, nsp=nsp, **{k: p[k] for k in ("groups", "c_in", "c_out", "i", "k")})
    attrs = attrs_of(p["s"], p["pb"], p["pe"], p["d"], mode, p["op"])
    _, natural = expected_window(mode, p["i"], p["k"], p["s"], p["d"], p["pb"], p["pe"], p["op"], None)
    delta = {"none": None, "smaller": (-1, -2, -3), "equal": (0, 0, 0), "larger": (2, 1, 3)}[size_kind]
    out_shape = None if delta is None else [max(n + dd, 0) for n, dd in zip(natural, delta)]
    ours = compare("GroupConvolutionBackpropData", data, filters, attrs, out_shape)
    P, O = expected_window(mode, p["i"], p["k"], p["s"], p["d"], p["pb"], p["pe"], p["op"], out_shape)
    assert list(ours.shape[2:]) == O
    assert rel_err(ours, ref_transposed(data, filters, p["s"], p["d"], P, O)) <= 1e-5


@pytest.mark.parametrize("s", [2, 3])
@pytest.mark.parametrize("mode", MODES)
def test_group_backprop_every_remainder(mode, s):
    """(O + pb + pe - d*(k-1) - 1) % s takes every value: through output_padding (negative, every
    remainder, >= stride) without output_shape, and through every output_shape around the
    natural size with it. Axis 1 stays a fixed non-trivial problem."""
    rng = np.random.default_rng(50 + 10 * s + MODES.index(mode))
    i, k, d, pb, pe = (4, 3), (3, 2), (2, 1), (2, 1), (1, 2)
    strides = (s, 2)
    data, filters = bwd_case(rng, nsp=2, groups=2, c_in=3, c_out=2, i=i, k=k)
    for op0 in range(-1, s + 2):
        compare("GroupConvolutionBackpropData", data, filters, attrs_of(strides, pb, pe, d, mode, (op0, 1)))
    L0 = full_size(i[0], k[0], s, d[0])
    for o0 in range(L0 - pb[0] - pe[0] - s, L0 + s + 2):
        compare("GroupConvolutionBackpropData", data, filters, attrs_of(strides, pb, pe, d, mode, (1, 0)), [o0, 6])


def _random_backprop(rng, grouped):
    """A random feasible backprop problem (C_IN != C_OUT) away from the CPU plugin's 1x1 shortcut."""
    while True:
        nsp = int(rng.integers(1, 4))
        groups = int(rng.integers(1, 4)) if grouped else 1
        c_in = int(rng.integers(1, 4))
        c_out = c_in + int(rng.integers(1, 3))
        if rng.random() < 0.5:
            c_in, c_out = c_out, c_in
        i = tuple(int(v) for v in rng.integers(1, 6, nsp))
        k = tuple(int(v) for v in rng.integers(1, 4, nsp))
        s = tuple(int(v) for v in rng.integers(1, 4, nsp))
        d = tuple(int(v) for v in rng.integers(1, 3, nsp))
        pb = tuple(int(v) for v in rng.integers(0, 3, nsp))
        pe = tuple(int(v) for v in rng.integers(0, 3, nsp))
        op = tuple(int(rng.integers(-1, sv + 2)) for sv in s)
        mode = MODES[int(rng.integers(4))]
        out_shape = None
        if rng.random() < 0.5:
            out_shape = [max(full_size(*a) + int(rng.integers(-3, 4)), 0) for a in zip(i, k, s, d)]
        P, O = expected_window(mode, i, k, s, d, pb, pe, op, out_shape)
        if min(O) < 0 or cpu_1x1_shortcut(k, s, i, O, P):
            continue
        return dict(nsp=nsp, groups=groups, c_in=c_in, c_out=c_out, i=i, k=k), attrs_of(s, pb, pe, d, mode, op), \
            out_shape, (P, O)


def _random_backprop_sweep(seed, count, grouped):
    rng = np.random.default_rng(seed)
    name = "GroupConvolutionBackpropData" if grouped else "ConvolutionBackpropData"
    for _ in range(count):
        shapes, attrs, out_shape, (P, O) = _random_backprop(rng, grouped)
        data, filters = bwd_case(rng, **shapes)
        if not grouped:
            filters = filters[0]
        ours = compare(name, data, filters, attrs, out_shape)
        want = ref_transposed(data, filters if grouped else filters[None], attrs["strides"], attrs["dilations"], P, O)
        assert rel_err(ours, want) <= 1e-5, (shapes, attrs, out_shape)


def test_group_backprop_random():
    """1-D/2-D/3-D, groups 1-3, strides, dilations, pads, output_padding, output_shape, all modes."""
    _random_backprop_sweep(101, 40, grouped=True)


@pytest.mark.slow
def test_group_backprop_random_slow():
    _random_backprop_sweep(102, 500, grouped=True)


def test_group_backprop_float64_vs_reference():
    """float64 is computed in float64: 1e-12 against the independent float64 scatter loop."""
    rng = np.random.default_rng(7)
    for _ in range(30):
        shapes, attrs, out_shape, (P, O) = _random_backprop(rng, grouped=True)
        data, filters = bwd_case(rng, dtype=np.float64, **shapes)
        ours = cov.GroupConvolutionBackpropData(**attrs)(data, filters, out_shape)
        assert ours.dtype == np.float64
        assert rel_err(ours, ref_transposed(data, filters, attrs["strides"], attrs["dilations"], P, O)) <= 1e-12


def test_group_backprop_one_group_matches_convolution_backprop_data():
    rng = np.random.default_rng(8)
    data, filters = bwd_case(rng, nsp=2, groups=1, c_in=3, c_out=5, i=(4, 5), k=(3, 2))
    attrs = attrs_of((2, 3), (1, 0), (0, 2), (1, 2), "explicit", (1, 2))
    ours = compare("GroupConvolutionBackpropData", data, filters, attrs, [9, 12])   # runtime: CBD on filters[0]
    same = cov.ConvolutionBackpropData(**attrs)(data, filters[0], [9, 12])
    assert np.array_equal(ours, same)


INT_TYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]


@pytest.mark.parametrize("dtype", INT_TYPES, ids=lambda t: np.dtype(t).name)
def test_group_backprop_integers_exact(dtype):
    """Integer element types are exact: equal to the runtime and to the int64 scatter loop."""
    rng = np.random.default_rng(9)
    lo = 0 if np.dtype(dtype).kind == "u" else -3
    data = rng.integers(lo, 4, (2, 6, 5, 4)).astype(dtype)
    filters = rng.integers(lo, 4, (2, 3, 2, 3, 2)).astype(dtype)
    for mode, out_shape in [("explicit", None), ("same_upper", [8, 6]), ("same_lower", [9, 7]), ("valid", None)]:
        attrs = attrs_of((2, 1), (1, 0), (0, 1), (1, 2), mode, (1, 0))
        ours = compare("GroupConvolutionBackpropData", data, filters, attrs, out_shape, tol=0.0)
        P, O = expected_window(mode, (5, 4), (3, 2), (2, 1), (1, 2), (1, 0), (0, 1), (1, 0), out_shape)
        assert np.array_equal(ours, ref_transposed(data, filters, (2, 1), (1, 2), P, O).astype(dtype))


def test_integers_wrap_like_c():
    """Results outside the element type wrap modulo 2**bits (exact int64 accumulation, then a C cast)."""
    data = np.full((1, 2, 3), 100, np.int8)
    filters = np.full((1, 2, 3, 2), 3, np.int8)
    attrs = attrs_of((1,), (0,), (0,), (1,), "explicit")
    ours = cov.GroupConvolutionBackpropData(**attrs)(data, filters)
    want = ref_transposed(data, filters, (1,), (1,), (0,), (4,))   # int64: 600 / 1200
    assert want.max() > 127
    assert np.array_equal(ours, want.astype(np.int8))
    a, b = 2**40 + 3, 2**30 + 5
    out = cov.ConvolutionBackpropData(**attrs)(np.array([[[a]]], np.int64), np.array([[[b]]], np.int64))
    assert out.dtype == np.int64 and int(out.ravel()[0]) == (a * b + 2**63) % 2**64 - 2**63


@pytest.mark.parametrize("dtype,tol", [(np.float16, 2e-3), (ml_dtypes.bfloat16, 1.6e-2), (np.float64, 1e-12)],
                         ids=["f16", "bf16", "f64"])
def test_group_backprop_float_types(dtype, tol):
    """Half types accumulate in float32 and round once; the output keeps the element type."""
    rng = np.random.default_rng(10)
    data, filters = bwd_case(rng, nsp=2, groups=2, c_in=3, c_out=2, i=(4, 3), k=(2, 3), dtype=dtype)
    attrs = attrs_of((2, 2), (1, 0), (0, 1), (1, 1), "same_lower", (1, 0))
    ours = cov.GroupConvolutionBackpropData(**attrs)(data, filters, [7, 6])
    assert ours.dtype == np.dtype(dtype)
    P, O = expected_window("same_lower", (4, 3), (2, 3), (2, 2), (1, 1), (1, 0), (0, 1), (1, 0), [7, 6])
    assert rel_err(ours, ref_transposed(data, filters, (2, 2), (1, 1), P, O)) <= tol
    if dtype == np.float16:
        compare("GroupConvolutionBackpropData", data, filters, attrs, [7, 6], tol=tol)


def test_seed_ir_examples():
    """The seed spec's IR examples give their declared output shapes (1-D, 2-D computed fully
    and compared with the runtime; 3-D 224^3 through infer_shape only)."""
    rng = np.random.default_rng(11)
    for nsp in (1, 2):
        op = cov.GroupConvolutionBackpropData(strides=[2] * nsp, pads_begin=[1] * nsp, pads_end=[1] * nsp,
                                              dilations=[1] * nsp)
        data = rng.standard_normal((1, 20) + (224,) * nsp).astype(np.float32)
        filters = rng.standard_normal((4, 5, 2) + (3,) * nsp).astype(np.float32)
        out = compare("GroupConvolutionBackpropData", data, filters,
                      attrs_of([2] * nsp, [1] * nsp, [1] * nsp, [1] * nsp, "explicit"))
        assert out.shape == (1, 8) + (447,) * nsp == op.infer_shape(data.shape, filters.shape)
    op3 = cov.GroupConvolutionBackpropData(strides=[2, 2, 2], pads_begin=[1, 1, 1], pads_end=[1, 1, 1],
                                           dilations=[1, 1, 1])
    assert op3.infer_shape((1, 20, 224, 224, 224), (4, 5, 2, 3, 3, 3)) == (1, 8, 447, 447, 447)


def test_zero_sized_outputs():
    """output_shape 0 and batch 0 give empty results, as in the runtime."""
    rng = np.random.default_rng(12)
    data, filters = bwd_case(rng, nsp=2, groups=2, c_in=2, c_out=3, i=(3, 4), k=(3, 2))
    attrs = attrs_of((2, 1), (1, 1), (1, 0), (1, 1), "explicit")
    compare("GroupConvolutionBackpropData", data, filters, attrs, [0, 5])
    compare("GroupConvolutionBackpropData", data[:0], filters, attrs)
    empty = compare("GroupConvolutionBackpropData", data, filters, attrs_of((2, 1), (3, 1), (4, 0), (1, 1), "explicit"))
    assert empty.shape == (2, 6, 0, 4)
    # a window entirely past the full result: all zeros
    out = compare("GroupConvolutionBackpropData", data, filters, attrs_of((2, 1), (9, 0), (0, 0), (1, 1), "explicit"),
                  [3, 5])
    assert not out.any()


# ---------------------------------------------------------------------------------------------
# ConvolutionBackpropData, Convolution, GroupConvolution


def test_convolution_backprop_data_random():
    _random_backprop_sweep(201, 30, grouped=False)


@pytest.mark.slow
def test_convolution_backprop_data_random_slow():
    _random_backprop_sweep(202, 300, grouped=False)


def _random_forward_sweep(seed, count, grouped):
    rng = np.random.default_rng(seed)
    name = "GroupConvolution" if grouped else "Convolution"
    done = 0
    while done < count:
        nsp = int(rng.integers(1, 4))
        groups = int(rng.integers(1, 4)) if grouped else 1
        c_in = int(rng.integers(1, 4))
        c_out = c_in + int(rng.integers(1, 3))   # C_IN != C_OUT (also avoids a 1->1 channel plugin bug)
        i = tuple(int(v) for v in rng.integers(1, 8, nsp))
        k = tuple(int(v) for v in rng.integers(1, 4, nsp))
        s = tuple(int(v) for v in rng.integers(1, 4, nsp))
        d = tuple(int(v) for v in rng.integers(1, 3, nsp))
        pb = tuple(int(v) for v in rng.integers(0, 3, nsp))
        pe = tuple(int(v) for v in rng.integers(0, 3, nsp))
        mode = MODES[done % 4]
        if mode == "explicit" and any(a + b + e < dd * (kk - 1) + 1 for a, b, e, kk, dd in zip(i, pb, pe, k, d)):
            continue
        if mode == "valid" and any(a < dd * (kk - 1) + 1 for a, kk, dd in zip(i, k, d)):
            continue
        data = rng.standard_normal((2, groups * c_in) + i).astype(np.float32)
        fshape = ((groups, c_out, c_in) if grouped else (c_out, c_in)) + k
        filters = rng.standard_normal(fshape).astype(np.float32)
        out = compare(name, data, filters, attrs_of(s, pb, pe, d, mode))
        if mode.startswith("same"):
            assert out.shape[2:] == tuple(-(-a // b) for a, b in zip(i, s))
        done += 1


@pytest.mark.parametrize("grouped", [False, True], ids=["Convolution", "GroupConvolution"])
def test_forward_random(grouped):
    _random_forward_sweep(301 + grouped, 40, grouped)


@pytest.mark.slow
@pytest.mark.parametrize("grouped", [False, True], ids=["Convolution", "GroupConvolution"])
def test_forward_random_slow(grouped):
    _random_forward_sweep(311 + grouped, 300, grouped)


@pytest.mark.parametrize("s", [1, 2, 3])
def test_forward_every_remainder(s):
    """(i + pb + pe - d*(k-1) - 1) % s over every value, explicit pads, floor output size."""
    rng = np.random.default_rng(400 + s)
    k, d, pb, pe = (3, 2), (2, 1), (1, 0), (0, 2)
    for extra in range(s):
        i0 = 5 * s + (extra - (pb[0] + pe[0] - (d[0] * (k[0] - 1) + 1))) % s
        assert (i0 + pb[0] + pe[0] - d[0] * (k[0] - 1) - 1) % s == extra
        data = rng.standard_normal((2, 6, i0, 5)).astype(np.float32)
        filters = rng.standard_normal((3, 4, 2) + k).astype(np.float32)   # GROUPS 3, C_OUT 4, C_IN 2
        compare("GroupConvolution", data, filters, attrs_of((s, 2), pb, pe, d, "explicit"))
        filters = rng.standard_normal((5, 6) + k).astype(np.float32)
        compare("Convolution", data, filters, attrs_of((s, 2), pb, pe, d, "explicit"))


# ---------------------------------------------------------------------------------------------
# Gradient consistency through the public ops (float64)


def _dot(a, b):
    return float(np.vdot(a.astype(np.float64).ravel(), b.astype(np.float64).ravel()))


# forward auto_pad -> the backprop auto_pad whose window is its adjoint (with output_shape = input
# size): OpenVINO's backprop same_upper starts at ceil(tot/2), the forward same_lower pad.
ADJOINT_MODE = {"explicit": "explicit", "valid": "valid", "same_upper": "same_lower", "same_lower": "same_upper"}


def _forward_pads(mode, i, k, s, d, pb, pe):
    if mode == "explicit":
        return list(pb), list(pe)
    if mode == "valid":
        return [0] * len(i), [0] * len(i)
    tot = [max((-(-a // b) - 1) * b + dd * (kk - 1) + 1 - a, 0) for a, kk, b, dd in zip(i, k, s, d)]
    small = [t // 2 for t in tot]
    big = [t - t // 2 for t in tot]
    return (small, big) if mode == "same_upper" else (big, small)


@pytest.mark.parametrize("grouped", [False, True], ids=["Convolution", "GroupConvolution"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("nsp", [1, 2, 3])
def test_adjoint_identities(nsp, mode, grouped):
    """<F(x; W), dy> = <x, B(dy; W)> = <W, dW> with F = (Group)Convolution, B =
    (Group)ConvolutionBackpropData on the same filters array (OpenVINO's layouts make it one),
    dW = convgrad.conv_backward_weights."""
    rng = np.random.default_rng(500 + 10 * nsp + MODES.index(mode) + 100 * grouped)
    i = (7, 6, 5)[:nsp]
    k = (3, 2, 3)[:nsp]
    s = (2, 3, 1)[:nsp]
    d = (1, 2, 2)[:nsp]
    pb, pe = (2, 0, 1)[:nsp], (1, 2, 0)[:nsp]
    g, c_in, c_out = (3 if grouped else 1), 2, 5
    fwd_cls = cov.GroupConvolution if grouped else cov.Convolution
    bwd_cls = cov.GroupConvolutionBackpropData if grouped else cov.ConvolutionBackpropData
    x = rng.standard_normal((2, g * c_in) + i)
    w = rng.standard_normal(((g,) if grouped else ()) + (c_out, c_in) + k)
    y = fwd_cls(**attrs_of(s, pb, pe, d, mode))(x, w)
    dy = rng.standard_normal(y.shape)
    dx = bwd_cls(**attrs_of(s, pb, pe, d, ADJOINT_MODE[mode]))(dy, w, list(i))
    fpb, fpe = _forward_pads(mode, i, k, s, d, pb, pe)
    dw = convgrad.conv_backward_weights(x, dy, k, strides=s, pads_begin=fpb, pads_end=fpe, dilations=d,
                                        groups=g).reshape(w.shape)
    scale = np.linalg.norm(y) * np.linalg.norm(dy)
    assert abs(_dot(y, dy) - _dot(x, dx)) <= 1e-12 * scale
    assert abs(_dot(y, dy) - _dot(w, dw)) <= 1e-12 * scale
    if mode == "explicit":
        # without output_shape: output_padding = the floor remainder restores the input size
        rem = [(a + b + e - dd * (kk - 1) - 1) % ss for a, b, e, dd, kk, ss in zip(i, pb, pe, d, k, s)]
        dx2 = bwd_cls(**attrs_of(s, pb, pe, d, "explicit", rem))(dy, w)
        assert np.array_equal(dx2, dx)


# ---------------------------------------------------------------------------------------------
# CPU plugin quirks (documented differences; these fail if the plugin changes)


def test_cpu_plugin_1x1_shortcut_drops_pads():
    """With a 1x1 kernel, stride 1 and an output as large as the input, the CPU plugin ignores
    pads_begin; convgrad keeps the window rule that the plugin follows everywhere else."""
    data = np.arange(1, 7, dtype=np.float32).reshape(1, 2, 3)
    filters = np.array([[[[1.0]], [[10.0]]]], np.float32).reshape(1, 2, 1, 1)
    attrs = attrs_of((1,), (1,), (0,), (1,), "explicit")
    plugin = ov_run("ConvolutionBackpropData", data, filters[0], attrs, [3])
    ours = cov.GroupConvolutionBackpropData(**attrs)(data, filters, [3])
    assert np.array_equal(plugin, ref_transposed(data, filters, (1,), (1,), (0,), (3,)))   # pads dropped
    assert np.array_equal(ours, ref_transposed(data, filters, (1,), (1,), (1,), (3,)))     # shifted by 1
    # one output row more and the plugin shifts too
    assert np.array_equal(ov_run("ConvolutionBackpropData", data, filters[0], attrs, [4]),
                          cov.ConvolutionBackpropData(**attrs)(data, filters[0], [4]))


def test_cpu_plugin_saturates_int8():
    """The CPU plugin saturates i8/u8 results (it wraps i16/u16); convgrad wraps every integer type."""
    data = np.full((1, 2, 3), 100, np.int8)
    filters = np.full((2, 3, 2), 3, np.int8)
    attrs = attrs_of((1,), (0,), (0,), (1,), "explicit")
    assert ov_run("ConvolutionBackpropData", data, filters, attrs).max() == 127
    assert cov.ConvolutionBackpropData(**attrs)(data, filters).max() != 127


def test_cpu_plugin_3d_single_channel_dilation_bug():
    """3-D Convolution with C_IN = C_OUT = 1 and a dilated depth axis beside an undilated one
    was wrong in the CPU plugin on the AMD (AVX2) development VM and is right on the Intel
    (AVX-512) one, where the plugin takes another kernel; convgrad agrees with the float64
    canonical forward either way."""
    rng = np.random.default_rng(13)
    data = rng.standard_normal((2, 1, 6, 2, 4)).astype(np.float32)
    filters = rng.standard_normal((1, 1, 3, 1, 3)).astype(np.float32)
    attrs = attrs_of((1, 1, 1), (0, 0, 0), (0, 0, 0), (2, 1, 1), "explicit")
    want = convgrad.conv_forward(data.astype(np.float64), filters.astype(np.float64), dilations=(2, 1, 1))
    assert rel_err(cov.Convolution(**attrs)(data, filters), want) <= 1e-6
    ov_err = rel_err(ov_run("Convolution", data, filters, attrs), want)
    assert ov_err <= 1e-5 or ov_err > 1e-2, ov_err         # right, or the known bug


# ---------------------------------------------------------------------------------------------
# The op objects: attributes, inputs, shapes


def test_attribute_forms():
    """[] means the default, scalars broadcast, auto_pad is case-insensitive, output_shape may be a
    list, tuple or any 1-D integer array; pads are ignored (not range-checked) unless explicit."""
    rng = np.random.default_rng(14)
    data, filters = bwd_case(rng, nsp=2, groups=2, c_in=2, c_out=3, i=(3, 4), k=(3, 2), dtype=np.float64)
    base = cov.GroupConvolutionBackpropData(strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0],
                                            dilations=[1, 1], output_padding=[0, 0])(data, filters)
    empty = cov.GroupConvolutionBackpropData(strides=[], pads_begin=[], pads_end=[], dilations=[])(data, filters)
    assert np.array_equal(base, empty)
    a = cov.GroupConvolutionBackpropData(strides=2, pads_begin=1, pads_end=0, dilations=1, auto_pad="EXPLICIT",
                                         output_padding=1)
    b = cov.GroupConvolutionBackpropData(strides=(2, 2), pads_begin=(1, 1), pads_end=(0, 0), dilations=(1, 1),
                                         output_padding=np.array([1, 1]))
    assert np.array_equal(a(data, filters), b(data, filters))
    for shape in ([6, 7], (6, 7), np.array([6, 7], np.int32), np.array([6, 7], np.uint8)):
        assert a(data, filters, shape).shape == (2, 6, 6, 7)
    upper = cov.GroupConvolutionBackpropData(strides=[2, 1], pads_begin=[-5, 9], pads_end=[7, -1],
                                             dilations=[1, 1], auto_pad="Same_Upper")
    ref = cov.GroupConvolutionBackpropData(strides=[2, 1], pads_begin=[0, 0], pads_end=[0, 0],
                                           dilations=[1, 1], auto_pad="same_upper")
    assert np.array_equal(upper(data, filters, [5, 4]), ref(data, filters, [5, 4]))
    assert "GroupConvolutionBackpropData" in repr(upper)


def test_forward_attribute_forms_vs_runtime():
    """Forward ops: [] means the defaults and pads are ignored (even negative) under same_*/valid."""
    rng = np.random.default_rng(16)
    data = rng.standard_normal((2, 6, 5, 7)).astype(np.float32)
    filters = rng.standard_normal((4, 6, 2, 3)).astype(np.float32)
    compare("Convolution", data, filters, dict(strides=[], pads_begin=[], pads_end=[], dilations=[]))
    for mode in ("same_upper", "same_lower", "valid"):
        compare("Convolution", data, filters, attrs_of((2, 3), (-3, 5), (4, -1), (2, 1), mode))
        compare("GroupConvolution", data, filters.reshape(2, 2, 6, 2, 3)[:, :, :3].copy(),
                attrs_of((3, 2), (-1, 0), (0, -2), (1, 2), mode.upper()))


def test_inputs_untouched_outputs_fresh():
    rng = np.random.default_rng(15)
    data, filters = bwd_case(rng, nsp=2, groups=2, c_in=2, c_out=3, i=(4, 5), k=(3, 2), dtype=np.float64)
    data_f = np.asfortranarray(data)
    view = np.asarray(np.swapaxes(np.swapaxes(filters, 3, 4).copy(), 3, 4))   # non-contiguous view
    keep = data.copy(), filters.copy()
    data_f.flags.writeable = False
    op = cov.GroupConvolutionBackpropData(strides=[2, 1], pads_begin=[1, 0], pads_end=[0, 1], dilations=[1, 2],
                                          output_padding=[1, 0])
    out = op(data_f, view)
    assert np.array_equal(data, keep[0]) and np.array_equal(filters, keep[1])
    assert out.flags.c_contiguous and out.dtype == np.float64
    assert np.array_equal(out, op(data.tolist(), filters))
    assert out.shape == op.infer_shape(data.shape, list(filters.shape))
    fwd = cov.GroupConvolution(strides=[2, 1], pads_begin=[1, 0], pads_end=[0, 1], dilations=[1, 2])
    y = fwd(out, view)   # the same filters array is (GROUPS, C_OUT, C_IN, *k) for the forward op
    assert y.flags.c_contiguous and y.shape == fwd.infer_shape(out.shape, filters.shape) == data.shape


def test_opdocs_registered():
    names = {d.name for d in REGISTRY if d.framework == "OpenVINO"}
    assert names == {"Convolution", "GroupConvolution", "ConvolutionBackpropData", "GroupConvolutionBackpropData"}


# ---------------------------------------------------------------------------------------------
# Validation: one row per rule (op, how to call it, error class, message fragment)

GCBD = cov.GroupConvolutionBackpropData
CBD = cov.ConvolutionBackpropData
ATTRS2 = dict(strides=[2, 1], pads_begin=[1, 0], pads_end=[0, 1], dilations=[1, 1])
D = np.zeros((1, 8, 3, 4), np.float32)           # GROUPS * C_IN = 2 * 4
F = np.zeros((2, 4, 3, 3, 2), np.float32)        # (GROUPS, C_IN, C_OUT, *k)


def _gcbd(**kw):
    return GCBD(**{**ATTRS2, **kw})


VALIDATION = [
    ("auto_pad unknown", lambda: _gcbd(auto_pad="notset"), ValueError, "auto_pad must be one of"),
    ("auto_pad type", lambda: _gcbd(auto_pad=1), TypeError, "auto_pad must be a string"),
    ("strides zero", lambda: _gcbd(strides=[2, 0]), ValueError, "strides must be positive"),
    ("dilations zero", lambda: _gcbd(dilations=[0, 1]), ValueError, "dilations must be positive"),
    ("strides float", lambda: _gcbd(strides=[2.0, 1]), TypeError, "strides must be integers"),
    ("strides bool", lambda: _gcbd(strides=True), TypeError, "strides must be a sequence of integers"),
    ("strides None", lambda: _gcbd(strides=None), TypeError, "strides must be a sequence of integers"),
    ("pads negative explicit", lambda: _gcbd(pads_begin=[-1, 0]), ValueError, "pads_begin must be non-negative"),
    ("pads_end negative explicit", lambda: _gcbd(pads_end=[0, -2]), ValueError, "pads_end must be non-negative"),
    ("output_padding type", lambda: _gcbd(output_padding=["1", 0]), TypeError, "output_padding must be integers"),
    ("output_padding huge", lambda: _gcbd(output_padding=[2**41, 0]), ValueError, "output_padding must be integers"),
    ("strides length", lambda: _gcbd(strides=[1, 1, 1])(D, F), ValueError,
     "strides must have one entry per spatial axis (2), but got 3"),
    ("dilations length", lambda: _gcbd(dilations=[1])(D, F), ValueError, "dilations must have one entry per spatial"),
    ("pads length under same_upper", lambda: _gcbd(auto_pad="same_upper", pads_end=[0])(D, F), ValueError,
     "pads_end must have one entry per spatial axis"),
    ("output_padding length", lambda: _gcbd(output_padding=[1, 1, 1])(D, F), ValueError,
     "output_padding must have one entry per spatial axis"),
    ("data rank low", lambda: _gcbd().infer_shape((1, 8), (2, 4, 3)), ValueError, "data must have rank 3, 4 or 5"),
    ("data rank high", lambda: _gcbd().infer_shape((1, 8, 2, 2, 2, 2), (2, 4, 3, 1, 1, 1, 1)), ValueError,
     "data must have rank 3, 4 or 5"),
    ("filters rank", lambda: _gcbd()(D, F[0]), ValueError, "filters must have rank 5 (GROUPS, C_IN, C_OUT, *kernel)"),
    ("channels grouped", lambda: _gcbd()(np.zeros((1, 16, 3, 4), np.float32), F), ValueError,
     "GroupConvolutionBackpropData: data channels (16) must equal groups * C_IN (2 * 4 = 8)"),
    ("channels plain", lambda: CBD(**ATTRS2)(D, F[0]), ValueError,
     "ConvolutionBackpropData: data channels (8) must equal filters C_IN (4)"),
    ("zero groups", lambda: _gcbd().infer_shape((1, 0, 3, 4), (0, 4, 3, 3, 2)), ValueError,
     "filters must have at least one group and one input channel"),
    ("zero kernel", lambda: _gcbd().infer_shape((1, 8, 3, 4), (2, 4, 3, 0, 2)), ValueError,
     "filters kernel sizes must be positive"),
    ("data spatial zero", lambda: _gcbd().infer_shape((1, 8, 0, 4), (2, 4, 3, 3, 2)), ValueError,
     "data spatial sizes must be positive"),
    ("shape negative", lambda: _gcbd().infer_shape((1, 8, -3, 4), (2, 4, 3, 3, 2)), ValueError,
     "data shape must have non-negative dimensions"),
    ("output_shape length", lambda: _gcbd()(D, F, [5]), ValueError,
     "output_shape must have one entry per spatial axis (2), but got 1"),
    ("output_shape negative", lambda: _gcbd()(D, F, [5, -1]), ValueError, "output_shape must be non-negative"),
    ("output_shape float", lambda: _gcbd()(D, F, np.array([5.0, 4.0])), TypeError, "output_shape must be integers"),
    ("output_shape 2-D", lambda: _gcbd()(D, F, np.array([[5, 4]])), ValueError, "output_shape must be 1-D"),
    ("output_shape scalar", lambda: _gcbd()(D, F, 5), ValueError, "output_shape must be 1-D"),
    ("output size negative", lambda: _gcbd(pads_begin=[4, 0], pads_end=[4, 0])(D, F), ValueError,
     "output spatial sizes must be non-negative, but got [-1, 5]: axis 0: strides 2 * (data 3 - 1)"),
    ("output too large", lambda: _gcbd()(D, F, [2**39, 2**39]), ValueError, "must fit in memory"),
    ("dtype mismatch", lambda: _gcbd()(D, F.astype(np.float64)), TypeError,
     "inputs must share one element type, but got data float32, filters float64"),
    ("dtype bool", lambda: _gcbd()(D.astype(bool), F.astype(bool)), TypeError, "data must have element type"),
    ("dtype complex", lambda: _gcbd()(D.astype(complex), F.astype(complex)), TypeError, "data must have element type"),
    ("ragged data", lambda: _gcbd()([[[1, 2], [3]]], F), ValueError, "data must be convertible to a numeric array"),
    ("data None", lambda: _gcbd()(None, F), TypeError, "data must be an array, but got None"),
    ("forward kernel too large", lambda: cov.Convolution(strides=[1], pads_begin=[0], pads_end=[1], dilations=[2])(
        np.zeros((1, 2, 3)), np.zeros((4, 2, 3))), ValueError, "Convolution: spatial axis 0: the padded input must be"),
    ("forward valid kernel too large", lambda: cov.Convolution(strides=[1], pads_begin=[5], pads_end=[5],
                                                               dilations=[1], auto_pad="valid")(
        np.zeros((1, 2, 2)), np.zeros((4, 2, 3))), ValueError, "the padded input must be at least the dilated kernel"),
    ("forward filters rank", lambda: cov.Convolution(**ATTRS2)(D, F), ValueError,
     "Convolution: filters must have rank 4 (C_OUT, C_IN, *kernel)"),
    ("forward channels", lambda: cov.GroupConvolution(**ATTRS2)(D, np.zeros((2, 3, 3, 3, 2), np.float32)), ValueError,
     "GroupConvolution: data channels (8) must equal groups * C_IN (2 * 3 = 6)"),
    ("forward pads negative", lambda: cov.Convolution(strides=[1], pads_begin=[-1], pads_end=[0], dilations=[1]),
     ValueError, "Convolution: pads_begin must be non-negative"),
]


@pytest.mark.parametrize("name,call,kind,fragment", VALIDATION, ids=[v[0] for v in VALIDATION])
def test_validation(name, call, kind, fragment):
    with pytest.raises(convgrad.ConvError) as info:
        call()
    assert isinstance(info.value, kind), (name, type(info.value))
    assert fragment in str(info.value), (name, str(info.value))


def test_runtime_rejects_what_we_reject():
    """The rules that OpenVINO's shape inference also has are rejected there too (spot checks),
    so the table above is not stricter than the framework where it claims to follow it."""
    rejected = [
        ("GroupConvolutionBackpropData", D, F, dict(ATTRS2, strides=[2, 0]), None),
        ("GroupConvolutionBackpropData", D, F, dict(ATTRS2, strides=[1, 1, 1]), None),
        ("GroupConvolutionBackpropData", D, F, dict(ATTRS2, pads_end=[0], auto_pad="same_upper"), None),
        ("GroupConvolutionBackpropData", D, F, dict(ATTRS2, output_padding=[1, 1, 1]), None),
        ("GroupConvolutionBackpropData", np.zeros((1, 16, 3, 4), np.float32), F, ATTRS2, None),
        ("GroupConvolutionBackpropData", D, F, ATTRS2, [5]),
        ("GroupConvolutionBackpropData", D, F, dict(ATTRS2, pads_begin=[-1, 0]), None),   # compile fails
        ("Convolution", np.zeros((1, 2, 3), np.float32), np.zeros((4, 2, 3), np.float32),
         dict(strides=[1], pads_begin=[0], pads_end=[1], dilations=[2]), None),
    ]
    for op_type, data, filters, attrs, out_shape in rejected:
        with pytest.raises(Exception):
            ov_run(op_type, data, filters, attrs, out_shape)
