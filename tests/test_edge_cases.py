"""Edge cases with defined answers, each through the front-end where its rule lives, against the
real frameworks (TensorFlow 2.21, OpenVINO 2026.4, oneDNN Graph 3.13.2; float32, rel <= 1e-5) and
the independent float64 models of ``test_fuzz_frontends`` (rel <= 1e-12):

* batch 0: exactly zero weight gradients, empty data gradients and outputs (every front-end);
* SAME with a stride larger than the kernel: the total pad clamps at 0, so the result is the
  unpadded one bit for bit (TensorFlow SAME, oneDNN same_upper / same_lower);
* OpenVINO ``output_shape`` smaller (a crop) and larger (zero rows past the full result) than
  the natural size, in every auto_pad mode;
* input rows the forward convolution never reads: exactly zero data gradient, and a weights
  gradient that never sees them (NaN or Inf there changes nothing);
* 1x1 kernels with stride 3 (data gradient zero off the stride grid), pads far larger than the
  input, and sizes whose element counts pass 2**31 (shape inference only: oneDNN and OpenVINO
  ``infer_shape``, the TensorFlow reader of ``convgrad.translate``, the command line);
* NaN and Inf propagate as IEEE arithmetic says (compared mask for mask with the reference).

Missing frameworks fail these tests (CI installs all of them). ``-s`` prints how many cases
were compared with each framework and the worst relative error.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import json
import multiprocessing
import os

import ml_dtypes
import numpy as np
import pytest

from convgrad import onednn as od
from convgrad import openvino as ov
from convgrad.tensorflow import raw_ops as R

from .helpers import Tally, rel_err
from .oracles import onednn_graph as og
from .test_fuzz_frontends import Call, onednn_model, openvino_model, tensorflow_model

F32 = np.float32
BF16 = ml_dtypes.bfloat16
TALLY = Tally("edge cases vs the real frameworks (framework)")


@pytest.fixture(scope="module", autouse=True)
def _print_stats(request):
    yield
    TALLY.report(request)


def record(framework: str, got, want, tol: float = 1e-5) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (framework, got.shape, want.shape)
    err = rel_err(got.astype(np.float64), want.astype(np.float64)) if got.size else 0.0
    TALLY.record(framework, err)
    assert err <= tol, (framework, err)


def model_check(call: Call, model, got, tol=1e-12) -> np.ndarray:
    want = model(call)
    assert got.shape == want.shape
    assert rel_err(got.astype(np.float64), want) <= tol
    return want


# ---------------------------------------------------------------------------------------------
# The real frameworks


def _tf_init():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow  # noqa: F401  (an ImportError here fails the tests that need TensorFlow)


def _tf_run(op: str, kwargs: dict) -> np.ndarray:
    """One tf.raw_ops call (in the worker process)."""
    import tensorflow as tf
    return getattr(tf.raw_ops, op)(**kwargs).numpy()


@pytest.fixture(scope="module")
def tf():
    """TensorFlow in a spawned worker process (its import and threads stay out of this one)."""
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=_tf_init)
    try:
        yield lambda op, **kw: pool.submit(_tf_run, op, kw).result(timeout=600)
    finally:
        pool.shutdown(cancel_futures=True)


@pytest.fixture(scope="module")
def ov_runtime():
    """Build, compile and run one opset1 node on the CPU plugin (f32 inference precision)."""
    import openvino as ovr
    import openvino.opset1 as ops
    from openvino.utils.node_factory import NodeFactory
    core, nf = ovr.Core(), NodeFactory("opset1")

    def run(op_type, data, filters, attrs, output_shape=None):
        p_data = ops.parameter(list(data.shape), ovr.Type(data.dtype), name="data")
        p_filters = ops.parameter(list(filters.shape), ovr.Type(filters.dtype), name="filters")
        inputs = [p_data.output(0), p_filters.output(0)]
        if output_shape is not None:
            inputs.append(ops.constant(np.asarray(output_shape, np.int64)).output(0))
        node = nf.create(op_type, inputs, {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in attrs.items()})
        model = ovr.Model([node], [p_data, p_filters])
        return core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})([data, filters])[0]
    return run


@pytest.fixture(scope="module")
def dnnl():
    """The real oneDNN Graph library, each batch of calls in a child process (bad inputs abort it)."""
    lib = os.path.join(og.DEFAULT_VENV_LIB, "libdnnl.so.3")
    if not os.path.exists(lib):
        pytest.fail(f"the real oneDNN Graph library is required: {lib} is missing (pip install onednn==2026.1.0)")

    def run(calls):
        out = og.run_batch(calls)
        if any(status != "ok" for status, _ in out):   # the SYCL CPU runtime may need the UR OpenCL adapter
            og.ensure_ur_opencl_dir()
            out = og.run_batch(calls)
        for status, val in out:
            assert status == "ok", val
        return [val for _, val in out]
    return run


# ---------------------------------------------------------------------------------------------
# Batch 0, and no channels


@pytest.mark.parametrize("algorithm", [None, "taps", "im2col", "reference"])
def test_zero_channels_give_empty_results(algorithm):
    """No input or no output channels: the empty results of the right shape, and exactly zero
    gradients where the result is not empty (the fuzz test found ``taps``'s data gradient and
    ``im2col``'s weight gradient reshaping an empty block instead)."""
    import convgrad as cg
    kw = dict(strides=(1,), pads_begin=(0,), pads_end=(0,), dilations=(1,), groups=1, algorithm=algorithm)
    for dt in (np.float16, F32, np.float64):
        x, dy = np.ones((1, 2, 1), dt), np.ones((1, 2, 1), dt)
        dw = cg.conv_backward_weights(x[:, :0], dy, (1,), **kw)          # no input channels
        assert dw.shape == (2, 0, 1) and dw.dtype == dt
        dx = cg.conv_backward_data(dy, np.ones((2, 0, 1), dt), (1,), **kw)
        assert dx.shape == (1, 0, 1) and dx.dtype == dt
        assert cg.conv_forward(x[:, :0], np.ones((2, 0, 1), dt), **kw).shape == (1, 2, 1)
        assert not np.any(cg.conv_forward(x[:, :0], np.ones((2, 0, 1), dt), **kw))
        assert cg.conv_backward_weights(x, dy[:, :0], (1,), **kw).shape == (0, 2, 1)   # no outputs
        got = cg.conv_backward_data(dy[:, :0], np.ones((0, 2, 1), dt), (1,), **kw)
        assert got.shape == (1, 2, 1) and not np.any(got)
        assert cg.conv_forward(x, np.ones((0, 2, 1), dt), **kw).shape == (1, 0, 1)



def test_batch_zero_onednn():
    """Zero weight gradients (not uninitialised memory) and empty data gradients / outputs."""
    kw = dict(strides=[2, 1], pads_begin=[1, 0], pads_end=[0, 1], dilations=[1, 2], groups=2)
    for dt in (F32, BF16, np.float64):
        x = np.zeros((0, 7, 6, 4), dt)                          # NXC, C = 4
        dy = np.zeros((0, 3, 5, 6), dt)                         # floor((7+1-3)/2)+1 = 3, (6+1-3)/1+1 = 5
        dw = od.ConvolutionBackwardWeights(**kw, weights_shape=[3, 2, 2, 6])(x, dy)
        assert dw.shape == (3, 2, 2, 6) and dw.dtype == dt and dw.flags.c_contiguous and dw.flags.writeable
        assert not np.any(dw)                                   # exactly zero
        w = np.ones((3, 2, 2, 6), dt)
        assert od.ConvolutionBackwardData(**kw, dst_shape=[0, 7, 6, 4])(dy, w).shape == (0, 7, 6, 4)
        assert od.Convolution(**kw)(x, w, np.ones(6, dt)).shape == (0, 3, 5, 6)
        # ConvTranspose family: src (0, 3, 5, 6) -> dst of 4 channels; weights XOI (3, 2, 2, 6)
        t_dw = od.ConvTransposeBackwardWeights(**kw, weights_shape=[3, 2, 2, 6])(dy, x)
        assert t_dw.shape == (3, 2, 2, 6) and not np.any(t_dw)
        assert od.ConvTransposeBackwardData(**kw)(x, w).shape == (0, 3, 5, 6)
        assert od.ConvTranspose(**kw)(dy, w, np.ones(4, dt)).shape[0] == 0


def test_batch_zero_openvino(ov_runtime):
    attrs = dict(strides=[2, 1], pads_begin=[1, 0], pads_end=[0, 1], dilations=[1, 2])
    data = np.zeros((0, 4, 7, 6), F32)
    cases = [("Convolution", np.ones((6, 4, 3, 2), F32)), ("GroupConvolution", np.ones((2, 3, 2, 3, 2), F32)),
             ("ConvolutionBackpropData", np.ones((4, 6, 3, 2), F32)),
             ("GroupConvolutionBackpropData", np.ones((2, 2, 3, 3, 2), F32))]
    for op, filters in cases:
        got = getattr(ov, op)(**attrs)(data, filters)
        assert got.shape[0] == 0 and got.shape == getattr(ov, op)(**attrs).infer_shape(data.shape, filters.shape)
        record("openvino", got, ov_runtime(op, data, filters, attrs))


def test_batch_zero_tensorflow(tf):
    x = np.zeros((0, 7, 6, 4), F32)
    dy = np.zeros((0, 4, 6, 6), F32)                            # SAME, strides (2, 1): ceil(7/2) = 4
    f = np.ones((3, 2, 4, 6), F32)
    st = dict(strides=[1, 2, 1, 1], padding="SAME")
    for got in (R.Conv2DBackpropFilter(input=x, filter_sizes=[3, 2, 4, 6], out_backprop=dy, **st),
                R.Conv2DBackpropFilterV2(input=x, filter=f, out_backprop=dy, **st)):
        assert got.shape == (3, 2, 4, 6) and got.dtype == F32 and not np.any(got)
    # TensorFlow 2.21's CPU kernel also gives zeros here (it is the GPU path the issue warns about)
    record("tensorflow", got, tf("Conv2DBackpropFilter", input=x, filter_sizes=[3, 2, 4, 6], out_backprop=dy, **st))
    assert R.Conv2DBackpropInput(input_sizes=[0, 7, 6, 4], filter=f, out_backprop=dy, **st).shape == (0, 7, 6, 4)
    assert R.Conv2DBackpropInputV2(input=x, filter=f, out_backprop=dy, **st).shape == (0, 7, 6, 4)
    assert R.Conv2D(input=x, filter=f, **st).shape == (0, 4, 6, 6)
    dwf = R.DepthwiseConv2dNativeBackpropFilter(input=x, filter_sizes=[3, 2, 4, 2], out_backprop=np.zeros((0, 4, 6, 8), F32),
                                                **st)
    assert dwf.shape == (3, 2, 4, 2) and not np.any(dwf)
    x3, dy3 = np.zeros((0, 5, 6, 4, 2), F32), np.zeros((0, 3, 6, 4, 3), F32)
    st3 = dict(strides=[1, 2, 1, 1, 1], padding="SAME")
    for got in (R.Conv3DBackpropFilterV2(input=x3, filter_sizes=[3, 2, 1, 2, 3], out_backprop=dy3, **st3),
                R.Conv3DBackpropFilter(input=x3, filter=np.ones((3, 2, 1, 2, 3), F32), out_backprop=dy3, **st3)):
        assert got.shape == (3, 2, 1, 2, 3) and not np.any(got)
    assert R.Conv3DBackpropInputV2(input_sizes=list(x3.shape), filter=np.ones((3, 2, 1, 2, 3), F32), out_backprop=dy3,
                                   **st3).shape == x3.shape


# ---------------------------------------------------------------------------------------------
# SAME with strides larger than the kernel: the total pad clamps at 0


def test_same_stride_larger_than_kernel_tensorflow(tf):
    """k = (2, 1), s = (3, 4), i = (8, 9): o = (3, 3), total pad max((3-1)*3 + 2 - 8, 0) = 0 and
    max((3-1)*4 + 1 - 9, 0) = 0: SAME is VALID here, bit for bit."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 8, 9, 3)).astype(F32)
    f = rng.standard_normal((2, 1, 3, 5)).astype(F32)
    dy = rng.standard_normal((2, 3, 3, 5)).astype(F32)
    st = [1, 3, 4, 1]
    for op, kw in (("Conv2D", dict(input=x, filter=f)),
                   ("Conv2DBackpropFilter", dict(input=x, filter_sizes=list(f.shape), out_backprop=dy)),
                   ("Conv2DBackpropInput", dict(input_sizes=list(x.shape), filter=f, out_backprop=dy))):
        same = getattr(R, op)(**kw, strides=st, padding="SAME")
        np.testing.assert_array_equal(same, getattr(R, op)(**kw, strides=st, padding="VALID"))
        record("tensorflow", same, tf(op, **kw, strides=st, padding="SAME"))
    # 3-D, NCDHW: one axis clamps (k 1, s 3, i 7 -> o 3, max(2*3 + 1 - 7, 0) = 0), two do not
    x3 = rng.standard_normal((1, 2, 7, 5, 4))
    dy3 = rng.standard_normal((1, 3, 3, 3, 2))
    kw3 = dict(input=x3, filter_sizes=[1, 3, 2, 2, 3], out_backprop=dy3, strides=[1, 1, 3, 2, 2], padding="SAME",
               data_format="NCDHW")
    got = R.Conv3DBackpropFilterV2(**kw3)
    model_check(Call("tensorflow", "Conv3DBackpropFilterV2", {k: v for k, v in kw3.items() if k not in (
        "input", "filter_sizes", "out_backprop")}, [x3, dy3], {"filter_sizes": [1, 3, 2, 2, 3]},
        ("input", "out_backprop")), tensorflow_model, got)


def test_same_stride_larger_than_kernel_onednn(dnnl):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 8, 9, 4)).astype(F32)       # NXC
    w = rng.standard_normal((2, 1, 2, 6)).astype(F32)       # XIO, groups 2
    dy = rng.standard_normal((2, 3, 3, 6)).astype(F32)
    base = dict(strides=[3, 4], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1], groups=2)
    ours, calls = [], []
    for mode in ("same_upper", "same_lower"):
        kw = dict(base, auto_pad=mode)
        dw = od.ConvolutionBackwardWeights(**kw, weights_shape=list(w.shape))(x, dy)
        dx = od.ConvolutionBackwardData(**kw, dst_shape=list(x.shape))(dy, w)
        y = od.Convolution(**kw)(x, w)
        for got, want in zip((dw, dx, y), (od.ConvolutionBackwardWeights(**base, weights_shape=list(w.shape))(x, dy),
                                           od.ConvolutionBackwardData(**base, dst_shape=list(x.shape))(dy, w),
                                           od.Convolution(**base)(x, w))):
            np.testing.assert_array_equal(got, want)
        ours += [dw, dx, y]
        calls += [("conv_bwd_weights", (x, dy, list(w.shape)), kw),
                  ("conv_bwd_data", (dy, w, list(x.shape)), dict(kw, emulate_groups=True)),
                  ("convolution", (x, w), kw)]
    for got, want in zip(ours, dnnl(calls)):
        record("onednn", got, want)


# ---------------------------------------------------------------------------------------------
# OpenVINO output_shape smaller and larger than the natural size


@pytest.mark.parametrize("mode", ["explicit", "valid", "same_upper", "same_lower"])
@pytest.mark.parametrize("op", ["GroupConvolutionBackpropData", "ConvolutionBackpropData"])
def test_openvino_output_shape_smaller_and_larger(ov_runtime, op, mode):
    rng = np.random.default_rng(3)
    grouped = op.startswith("Group")
    data = rng.standard_normal((2, 4 if grouped else 3, 4, 5)).astype(F32)
    filters = rng.standard_normal((2, 2, 3, 3, 2) if grouped else (3, 2, 3, 2)).astype(F32)
    attrs = dict(strides=[2, 3], pads_begin=[1, 0], pads_end=[0, 2], dilations=[1, 2], auto_pad=mode,
                 output_padding=[1, 0])
    full = [2 * 3 + 3, 3 * 4 + 3]                                 # L = s*(i-1) + d*(k-1) + 1
    for delta in (-2, 3):
        shape = [full[0] + delta, full[1] + delta]
        got = getattr(ov, op)(**attrs)(data, filters, shape)
        assert got.shape == (2, 6 if grouped else 2) + tuple(shape) == getattr(ov, op)(**attrs).infer_shape(
            data.shape, filters.shape, shape)
        model_check(Call("openvino", op, attrs, [data.astype(np.float64), filters.astype(np.float64)],
                         {"output_shape": shape}, ("data", "filters")), openvino_model, got, 1e-5)
        if delta > 0 and mode in ("explicit", "valid"):          # rows past the full result: zero
            start = attrs["pads_begin"] if mode == "explicit" else [0, 0]
            assert not got[:, :, full[0] - start[0]:].any() and not got[:, :, :, full[1] - start[1]:].any()
        record("openvino", got, ov_runtime(op, data, filters, attrs, shape))


# ---------------------------------------------------------------------------------------------
# Input rows the forward convolution never reads


def _unread_problem(seed):
    """NXC src (2, 10, 8, 3): axis H, k 3, s 3 -> o 3 reads rows 0..8 (row 9 never);
    axis W, k 2, d 2, s 3 -> o 2 reads columns 0..5 (6 and 7 never)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 10, 8, 3)).astype(F32)
    w = rng.standard_normal((3, 2, 3, 4)).astype(F32)
    dy = rng.standard_normal((2, 3, 2, 4)).astype(F32)
    return x, w, dy


def test_unread_rows_onednn(dnnl):
    x, w, dy = _unread_problem(4)
    kw = dict(strides=[3, 3], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 2])
    dx = od.ConvolutionBackwardData(**kw, dst_shape=list(x.shape))(dy, w)
    read_cols, unread_cols = [0, 2, 3, 5], [1, 4, 6, 7]      # windows at 0 and 3, taps at +0 and +2
    assert not dx[:, 9].any() and not dx[:, :, unread_cols].any()     # exactly zero
    assert dx[:, :9][:, :, read_cols].all()
    dw = od.ConvolutionBackwardWeights(**kw, weights_shape=list(w.shape))(x, dy)
    poisoned = x.copy()
    poisoned[:, 9] = np.nan
    poisoned[:, :, unread_cols] = np.inf
    np.testing.assert_array_equal(od.ConvolutionBackwardWeights(**kw, weights_shape=list(w.shape))(poisoned, dy), dw)
    want_dx, want_dw = dnnl([("conv_bwd_data", (dy, w, list(x.shape)), kw),
                             ("conv_bwd_weights", (x, dy, list(w.shape)), kw)])
    record("onednn", dx, want_dx)
    record("onednn", dw, want_dw)


def test_unread_rows_tensorflow(tf):
    """VALID, strides 3, kernel (3, 2): rows 0..8 of 10 and columns {0, 1, 3, 4, 6, 7} of 8 are read."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 10, 8, 3)).astype(F32)
    f = rng.standard_normal((3, 2, 3, 4)).astype(F32)
    dy = rng.standard_normal((2, 3, 3, 4)).astype(F32)
    st = dict(strides=[1, 3, 3, 1], padding="VALID")
    dx = R.Conv2DBackpropInput(input_sizes=list(x.shape), filter=f, out_backprop=dy, **st)
    assert not dx[:, 9].any() and not dx[:, :, [2, 5]].any() and dx[:, :9][:, :, [0, 1, 3, 4, 6, 7]].all()
    dw = R.Conv2DBackpropFilter(input=x, filter_sizes=list(f.shape), out_backprop=dy, **st)
    poisoned = x.copy()
    poisoned[:, 9] = np.nan
    poisoned[:, :, [2, 5]] = -np.inf
    np.testing.assert_array_equal(R.Conv2DBackpropFilter(input=poisoned, filter_sizes=list(f.shape), out_backprop=dy,
                                                         **st), dw)
    record("tensorflow", dx, tf("Conv2DBackpropInput", input_sizes=list(x.shape), filter=f, out_backprop=dy, **st))
    record("tensorflow", dw, tf("Conv2DBackpropFilter", input=x, filter_sizes=list(f.shape), out_backprop=dy, **st))


def test_conv_transpose_window_past_the_transposed_result(dnnl):
    """ConvTranspose with pads_begin beyond the full result (L = 3*(2-1) + 1 = 4 < 5) and
    output_padding 2: one output row, past the kernel's reach, so zero (+ bias), as the library."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 2, 3, 4)).astype(F32)          # NXC: i = (2, 3), C_in 4
    w = rng.standard_normal((1, 2, 3, 4)).astype(F32)          # XOI: k (1, 2), C_out 3
    b = rng.standard_normal(3).astype(F32)
    kw = dict(strides=[3, 2], pads_begin=[5, 1], pads_end=[0, 0], dilations=[1, 1], output_padding=[2, 1])
    got = od.ConvTranspose(**kw)(x, w, b)
    assert got.shape == (2, 1, 6, 3) == od.ConvTranspose(**kw).infer_shape(x.shape, w.shape)
    np.testing.assert_array_equal(got, np.broadcast_to(b, got.shape))
    [want] = dnnl([("conv_transpose", (x, w, b), kw)])
    record("onednn", got, want)


# ---------------------------------------------------------------------------------------------
# 1x1 kernels with stride 3


def test_1x1_stride_3_everywhere(tf, ov_runtime, dnnl):
    """i = (10, 8), k = 1x1, s = 3: o = (4, 3); the data gradient lives on rows 0, 3, 6, 9 and
    columns 0, 3, 6 only; everything else is exactly zero."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 10, 8, 5)).astype(F32)        # NHWC / NXC
    w = rng.standard_normal((1, 1, 5, 7)).astype(F32)         # HWIO / XIO
    dy = rng.standard_normal((2, 4, 3, 7)).astype(F32)
    off_grid = np.ones((10, 8), bool)
    off_grid[::3, ::3] = False

    # TensorFlow
    st = dict(strides=[1, 3, 3, 1], padding="VALID")
    dx = R.Conv2DBackpropInput(input_sizes=list(x.shape), filter=w, out_backprop=dy, **st)
    assert not dx[:, off_grid].any() and dx[:, ~off_grid].all()
    record("tensorflow", dx, tf("Conv2DBackpropInput", input_sizes=list(x.shape), filter=w, out_backprop=dy, **st))
    record("tensorflow", R.Conv2DBackpropFilter(input=x, filter_sizes=[1, 1, 5, 7], out_backprop=dy, **st),
           tf("Conv2DBackpropFilter", input=x, filter_sizes=[1, 1, 5, 7], out_backprop=dy, **st))
    record("tensorflow", R.Conv2D(input=x, filter=w, **st), tf("Conv2D", input=x, filter=w, **st))
    # SAME gives the same answer here: total pad max((4-1)*3 + 1 - 10, 0) = 0, max(2*3 + 1 - 8, 0) = 0
    np.testing.assert_array_equal(R.Conv2DBackpropInput(input_sizes=list(x.shape), filter=w, out_backprop=dy,
                                                        strides=[1, 3, 3, 1], padding="SAME"), dx)

    # oneDNN Graph (NXC / XIO)
    kw = dict(strides=[3, 3], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1])
    ddx = od.ConvolutionBackwardData(**kw, dst_shape=list(x.shape))(dy, w)
    np.testing.assert_array_equal(ddx, dx)
    lib = dnnl([("conv_bwd_data", (dy, w, list(x.shape)), kw), ("conv_bwd_weights", (x, dy, list(w.shape)), kw),
                ("convolution", (x, w), kw)])
    for got, want in zip((ddx, od.ConvolutionBackwardWeights(**kw, weights_shape=list(w.shape))(x, dy),
                          od.Convolution(**kw)(x, w)), lib):
        record("onednn", got, want)

    # OpenVINO (NCX; ConvolutionBackpropData filters (C_IN, C_OUT, 1, 1))
    xc, dyc = np.ascontiguousarray(x.transpose(0, 3, 1, 2)), np.ascontiguousarray(dy.transpose(0, 3, 1, 2))
    attrs = dict(strides=[3, 3], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1])
    f_fwd = np.ascontiguousarray(w.transpose(3, 2, 0, 1))      # (C_OUT, C_IN, 1, 1)
    f_bwd = np.ascontiguousarray(w.transpose(3, 2, 0, 1))      # data dy has 7 channels: (C_IN=7, C_OUT=5, 1, 1)
    y = ov.Convolution(**attrs)(xc, f_fwd)
    record("openvino", y, ov_runtime("Convolution", xc, f_fwd, attrs))
    odx = ov.ConvolutionBackpropData(**attrs, output_padding=[0, 1])(dyc, f_bwd)   # natural 10 x 7, +1 column
    assert odx.shape == (2, 5, 10, 8)
    np.testing.assert_allclose(odx.transpose(0, 2, 3, 1), dx, rtol=1e-6, atol=1e-6)
    record("openvino", odx, ov_runtime("ConvolutionBackpropData", dyc, f_bwd, dict(attrs, output_padding=[0, 1])))


# ---------------------------------------------------------------------------------------------
# Pads far larger than the input


def test_huge_pads(tf, ov_runtime, dnnl):
    """Pads of 40 and 37 around a 3 x 4 input: most windows read only zeros."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 3, 4, 2)).astype(F32)
    w = rng.standard_normal((2, 3, 2, 3)).astype(F32)
    # NXC / XIO, strides (2, 1): o = floor((3 + 80 - 2)/2) + 1 = 41, (4 + 74 - 3) + 1 = 76
    kw = dict(strides=[2, 1], pads_begin=[40, 37], pads_end=[40, 37], dilations=[1, 1])
    dy = rng.standard_normal((1, 41, 76, 3)).astype(F32)
    got = [od.ConvolutionBackwardWeights(**kw, weights_shape=list(w.shape))(x, dy),
           od.ConvolutionBackwardData(**kw, dst_shape=list(x.shape))(dy, w), od.Convolution(**kw)(x, w)]
    assert got[2].shape == (1, 41, 76, 3)
    lib = dnnl([("conv_bwd_weights", (x, dy, list(w.shape)), kw), ("conv_bwd_data", (dy, w, list(x.shape)), kw),
                ("convolution", (x, w), kw)])
    for a, b in zip(got, lib):
        record("onednn", a, b)
    names = (("src", "diff_dst"), ("diff_dst", "weights"), ("src", "weights"))
    for op, args, kwargs, g, n in zip(("ConvolutionBackwardWeights", "ConvolutionBackwardData", "Convolution"),
                                      ([x, dy], [dy, w], [x, w]), ({"weights_shape": list(w.shape)},
                                                                   {"dst_shape": list(x.shape)}, {}), got, names):
        model_check(Call("onednn", op, kw, [a.astype(np.float64) for a in args], kwargs, n), onednn_model, g, 1e-5)
    # TensorFlow EXPLICIT (NHWC): the same pads
    ep = [0, 0, 40, 40, 37, 37, 0, 0]
    st = dict(strides=[1, 2, 1, 1], padding="EXPLICIT", explicit_paddings=ep)
    for op, kwargs, ours in (("Conv2DBackpropFilter", dict(input=x, filter_sizes=list(w.shape), out_backprop=dy), got[0]),
                             ("Conv2DBackpropInput", dict(input_sizes=list(x.shape), filter=w, out_backprop=dy), got[1]),
                             ("Conv2D", dict(input=x, filter=w), got[2])):
        mine = getattr(R, op)(**kwargs, **st)
        np.testing.assert_allclose(mine, ours, rtol=1e-5, atol=1e-5)
        record("tensorflow", mine, tf(op, **kwargs, **st))
    # OpenVINO Convolution (NCX)
    attrs = dict(strides=[2, 1], pads_begin=[40, 37], pads_end=[40, 37], dilations=[1, 1])
    xc, fc = np.ascontiguousarray(x.transpose(0, 3, 1, 2)), np.ascontiguousarray(w.transpose(3, 2, 0, 1))
    y = ov.Convolution(**attrs)(xc, fc)
    record("openvino", y, ov_runtime("Convolution", xc, fc, attrs))
    # shape inference with pads of 2**39: exact Python integers
    big = 2 ** 39
    op = od.Convolution(strides=[3, 1], pads_begin=[big, 0], pads_end=[big, 1], dilations=[1, 1])
    assert op.infer_shape((1, 3, 4, 2), (2, 3, 2, 3)) == (1, (3 + 2 * big - 2) // 3 + 1, 4 + 1 - 3 + 1, 3)


# ---------------------------------------------------------------------------------------------
# Sizes past 2**31 elements: shape inference only


def test_shape_inference_beyond_int32():
    n, c, h, w = 64, 256, 3_000_000, 7_000
    dst_h, dst_w = (h + 4 - 9) // 3 + 1, (w + 3 - 3) // 2 + 1
    kw = dict(strides=[3, 2], pads_begin=[4, 1], pads_end=[0, 2], dilations=[2, 1])
    src, wts, dst = (n, h, w, c), (5, 3, c, 512), (n, dst_h, dst_w, 512)
    assert n * dst_h * dst_w * 512 > 2 ** 31 * 1000
    assert od.Convolution(**kw).infer_shape(src, wts) == dst
    assert od.ConvolutionBackwardWeights(**kw).infer_shape(src, dst, wts) == wts
    assert od.ConvolutionBackwardData(**kw).infer_shape(dst, wts, src) == src
    assert od.ConvTransposeBackwardData(**kw).infer_shape(src, (5, 3, c, 512)) == (n, dst_h, dst_w, 512)
    assert od.ConvTransposeBackwardWeights(**kw).infer_shape(dst, src, (5, 3, c, 512)) == (5, 3, c, 512)
    t = od.ConvTranspose(**kw, output_padding=[2, 1]).infer_shape((n, h, w, c), (5, 3, 512, c))
    assert t == (n, 3 * (h - 1) + 9 - 4 + 2, 2 * (w - 1) + 3 - 3 + 1, 512)
    attrs = dict(strides=[3, 2], pads_begin=[4, 1], pads_end=[0, 2], dilations=[2, 1])
    assert ov.Convolution(**attrs).infer_shape((n, c, h, w), (512, c, 5, 3)) == (n, 512, dst_h, dst_w)
    assert ov.GroupConvolution(**attrs).infer_shape((n, c, h, w), (4, 128, 64, 5, 3)) == (n, 512, dst_h, dst_w)
    full = (3 * (h - 1) + 9, 2 * (w - 1) + 3)
    assert ov.ConvolutionBackpropData(**attrs).infer_shape((n, c, h, w), (c, 512, 5, 3)) == (
        n, 512, full[0] - 4, full[1] - 3)
    assert ov.GroupConvolutionBackpropData(**attrs, auto_pad="same_upper").infer_shape(
        (n, c, h, w), (4, 64, 128, 5, 3), [3 * h, 2 * w]) == (n, 512, 3 * h, 2 * w)
    # TensorFlow's shape rules through the translate reader (the TF front-end computes arrays only)
    from convgrad.translate import read
    r = read("tensorflow", "Conv2DBackpropFilterV2", {"strides": [1, 3, 2, 1], "padding": "SAME",
                                                      "dilations": [1, 2, 1, 1]},
             {"input": (n, h, w, c), "filter": (5, 3, c, 512)})
    assert r.spec.dst == (-(-h // 3), -(-w // 2))
    assert r.spec.flops == 2 * n * 512 * c * 15 * (-(-h // 3)) * (-(-w // 2))   # exact, past 2**63


def test_command_line_shapes_beyond_int32(tmp_path):
    """`convgrad run` on a Graph JSON of 10**12-element tensors: shape inference only, exact sizes;
    `convgrad explain` (the file, and a TensorFlow op) prints the same output size."""
    from convgrad import cli
    dst = [64, (3_000_000 + 4 - 9) // 3 + 1, (7_000 + 3 - 3) // 2 + 1, 512]
    assert dst[1:3] == [999_999, 3_501]
    doc = {"version": "3.13.0", "engine_kind": "cpu", "fpmath_mode": "strict", "graph": [{
        "id": 0, "name": "big", "kind": "Convolution",
        "attrs": {"strides": {"type": "s64[]", "value": [3, 2]}, "pads_begin": {"type": "s64[]", "value": [4, 1]},
                  "pads_end": {"type": "s64[]", "value": [0, 2]}, "dilations": {"type": "s64[]", "value": [2, 1]},
                  "data_format": {"type": "string", "value": "NXC"}},
        "inputs": [{"id": 0, "dtype": "f32", "shape": [64, 3_000_000, 7_000, 256]},
                   {"id": 1, "dtype": "f32", "shape": [5, 3, 256, 512]}],
        "outputs": [{"id": 2, "dtype": "f32", "shape": dst}]}]}
    path = tmp_path / "big.json"
    path.write_text(json.dumps(doc))
    tf_attrs = json.dumps({"strides": [1, 3, 2, 1], "padding": "EXPLICIT", "dilations": [1, 2, 1, 1],
                           "explicit_paddings": [0, 0, 4, 0, 1, 2, 0, 0]})
    for argv, fragments in ((["run", str(path)], (str(tuple(dst)), "matches the declared", "shape inference only")),
                            (["explain", str(path)], ("999999", "3501")),
                            (["explain", "--framework", "tensorflow", "--op", "Conv2D", "--attrs", tf_attrs,
                              "--input-shape", "64,3000000,7000,256", "--filter-shape", "5,3,256,512"],
                             ("999999", "3501"))):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cli.main(argv) == 0
        for fragment in fragments:
            assert fragment in out.getvalue(), (fragment, out.getvalue())


# ---------------------------------------------------------------------------------------------
# NaN and Inf propagate as IEEE says


def ieee_match(got: np.ndarray, want: np.ndarray, tol: float) -> None:
    """Same NaN positions, same signed infinities, finite values within tol (relative)."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    fin = np.isfinite(want)
    assert fin.any() and rel_err(got[fin].astype(np.float64), want[fin]) <= tol


@pytest.mark.parametrize("dt", [np.float64, F32])
def test_nan_inf_propagate(dt):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 9, 7, 3)).astype(dt)          # NHWC / NXC
    x[0, 2, 3, 1] = np.nan
    x[1, 6, 1, 0] = np.inf
    x[1, 0, 6, 2] = -np.inf
    w = rng.uniform(0.5, 1.5, (3, 2, 3, 4)).astype(dt)         # positive: Inf * w keeps its sign
    dy = rng.standard_normal((2, 4, 6, 4)).astype(dt)          # (9 + 1 - 3)//2 + 1 = 4, (7 + 0 - 2) + 1 = 6
    dy[1, 2, 4, 3] = np.nan
    tol = 1e-12 if dt == np.float64 else 1e-5
    kw = dict(strides=[2, 1], pads_begin=[1, 0], pads_end=[0, 0], dilations=[1, 1])
    cases = [(od.Convolution(**kw)(x, w), Call("onednn", "Convolution", kw, [x, w], {}, ("src", "weights")),
              onednn_model),
             (od.ConvolutionBackwardData(**kw, dst_shape=list(x.shape))(dy, w),
              Call("onednn", "ConvolutionBackwardData", dict(kw, dst_shape=list(x.shape)), [dy, w], {},
                   ("diff_dst", "weights")), onednn_model),
             (od.ConvolutionBackwardWeights(**kw, weights_shape=list(w.shape))(x, dy),
              Call("onednn", "ConvolutionBackwardWeights", dict(kw, weights_shape=list(w.shape)), [x, dy], {},
                   ("src", "diff_dst")), onednn_model)]
    st = dict(strides=[1, 2, 1, 1], padding="EXPLICIT", explicit_paddings=[0, 0, 1, 0, 0, 0, 0, 0])
    cases += [(R.Conv2D(input=x, filter=w, **st), Call("tensorflow", "Conv2D", st, [x, w], {}, ("input", "filter")),
               tensorflow_model),
              (R.Conv2DBackpropInput(input_sizes=list(x.shape), filter=w, out_backprop=dy, **st),
               Call("tensorflow", "Conv2DBackpropInput", st, [w, dy], {"input_sizes": list(x.shape)},
                    ("filter", "out_backprop")), tensorflow_model)]
    xc, dyc = np.ascontiguousarray(x.transpose(0, 3, 1, 2)), np.ascontiguousarray(dy.transpose(0, 3, 1, 2))
    attrs = dict(strides=[2, 1], pads_begin=[1, 0], pads_end=[0, 0], dilations=[1, 1])
    fc = np.ascontiguousarray(w.transpose(3, 2, 0, 1))         # (C_OUT, C_IN, kh, kw); backprop: (C_IN=4, C_OUT=3)
    cases += [(ov.Convolution(**attrs)(xc, fc), Call("openvino", "Convolution", attrs, [xc, fc], {},
                                                     ("data", "filters")), openvino_model),
              (ov.ConvolutionBackpropData(**attrs)(dyc, fc),
               Call("openvino", "ConvolutionBackpropData", attrs, [dyc, fc], {}, ("data", "filters")), openvino_model)]
    for got, call, model in cases:
        assert got.dtype == dt
        ieee_match(got, model(call), tol)
    assert np.isnan(cases[0][0]).any() and np.isposinf(cases[0][0]).any() and np.isneginf(cases[0][0]).any()
