"""Reliability of the canonical core: determinism (run to run, BLAS threads, caps), memory
bounds, sizes beyond 2**31 in shape inference, huge logical inputs refused cleanly."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import convgrad as cg
from convgrad.spec import make_spec


def _problem(seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    spec = make_spec("t", mb=3, ic=24, oc=40, groups=2, src=(23, 19), kernel=(3, 2), strides=(2, 1),
                     dilations=(1, 2), pads_begin=(1, 0), pads_end=(0, 1))
    x = rng.standard_normal(spec.src_shape).astype(dtype)
    w = rng.standard_normal(spec.weights_shape).astype(dtype)
    dy = rng.standard_normal(spec.dst_shape).astype(dtype)
    kw = dict(strides=spec.strides, dilations=spec.dilations, pads_begin=spec.pads_begin,
              pads_end=spec.pads_end, groups=spec.groups)
    return spec, x, w, dy, kw


def _all(spec, x, w, dy, kw, **extra):
    return (cg.conv_forward(x, w, **kw, **extra),
            cg.conv_backward_weights(x, dy, spec.kernel, **kw, **extra),
            cg.conv_backward_data(dy, w, spec.src, **kw, **extra))


@pytest.mark.parametrize("alg", ["im2col", "taps"])
def test_bitwise_run_to_run_and_across_blas_threads(alg):
    spec, x, w, dy, kw = _problem()
    with threadpool_limits(limits=1, user_api="blas"):
        one = _all(spec, x, w, dy, kw, algorithm=alg)
        again = _all(spec, x, w, dy, kw, algorithm=alg)
    with threadpool_limits(limits=2, user_api="blas"):
        two = _all(spec, x, w, dy, kw, algorithm=alg)
    for a, b, c in zip(one, again, two):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("direction", ["fwd", "bwd_weights", "bwd_data"])
def test_peak_memory_within_inputs_outputs_and_cap(direction):
    """A 3-D problem with 24 MiB inputs: traced peak <= output + cap (+ 1 MiB of slack)."""
    cap = 4 << 20
    rng = np.random.default_rng(1)
    spec = make_spec("t", mb=2, ic=16, oc=24, groups=1, src=(40, 36, 32), kernel=(3, 3, 2),
                     strides=(1, 2, 1), dilations=1, pads_begin=1, pads_end=(1, 0, 1))
    x = rng.standard_normal(spec.src_shape, dtype=np.float32)
    w = rng.standard_normal(spec.weights_shape, dtype=np.float32)
    dy = rng.standard_normal(spec.dst_shape, dtype=np.float32)
    kw = dict(strides=spec.strides, dilations=spec.dilations, pads_begin=spec.pads_begin,
              pads_end=spec.pads_end, workspace_limit=cap)
    call = {"fwd": lambda: cg.conv_forward(x, w, **kw),
            "bwd_weights": lambda: cg.conv_backward_weights(x, dy, spec.kernel, **kw),
            "bwd_data": lambda: cg.conv_backward_data(dy, w, spec.src, **kw)}[direction]
    out_bytes = {"fwd": dy.nbytes, "bwd_weights": w.nbytes, "bwd_data": x.nbytes}[direction]
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = call()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert out.nbytes == out_bytes
    assert peak <= out_bytes + cap + (1 << 20), (peak, out_bytes, cap)


def test_shape_inference_beyond_int32():
    """Sizes whose element counts exceed 2**31 are inferred exactly (Python ints)."""
    spec = make_spec("t", mb=64, ic=256, oc=512, groups=1, src=(3_000_000, 7_000), kernel=(5, 3),
                     strides=(3, 2), dilations=(2, 1), pads_begin=(4, 1), pads_end=(0, 2))
    assert spec.dst == ((3_000_000 + 4 + 0 - 9) // 3 + 1, (7_000 + 3 - 3) // 2 + 1)
    assert spec.dst_shape[0] * spec.dst_shape[1] * spec.dst[0] * spec.dst[1] > 2 ** 31
    assert spec.flops == 2 * 64 * 512 * 256 * 15 * spec.dst[0] * spec.dst[1]


def test_huge_logical_input_is_refused_before_allocating():
    """A zero-stride view with 2**36 logical elements: the result would not fit in memory."""
    huge = np.broadcast_to(np.zeros((1,), np.float32), (1, 1, 2 ** 36))
    with pytest.raises(cg.ConvValueError, match="must fit in memory"):
        cg.conv_forward(huge, np.ones((1, 1, 1), np.float32))


def test_bitwise_from_another_thread_while_main_controls_blas():
    """threadpoolctl lets one 'controlling' thread set BLAS limits; a call from another
    thread must still pin BLAS (else its GEMMs round as 2-thread OpenBLAS does)."""
    import threading

    spec, x, w, dy, kw = _problem(3)
    with threadpool_limits(limits=1, user_api="blas"):      # main thread takes control
        want = _all(spec, x, w, dy, kw)
    got = {}
    with threadpool_limits(limits=2, user_api="blas"):
        t = threading.Thread(target=lambda: got.setdefault("r", _all(spec, x, w, dy, kw)))
        t.start()
        t.join()
    for a, b in zip(want, got["r"]):
        np.testing.assert_array_equal(a, b)


def test_numpy_blas_is_used_even_when_scipy_was_imported_first():
    """SciPy maps an OpenBLAS build of its own (found first in the process's map when SciPy
    is imported first); convgrad must keep calling and pinning NumPy's, or results would
    depend on import order and the thread pin would miss the library doing the work."""
    import subprocess
    import sys

    code = (
        "import os, numpy as np, scipy.linalg\n"
        "from convgrad.kernels import blas\n"
        "paths = blas._mapped_blas_paths()\n"
        "assert blas.available(), paths\n"
        "numpy_dir = os.path.dirname(os.path.dirname(np.__file__))\n"
        "assert 'numpy' in os.path.relpath(blas._FOUND['path'], numpy_dir), blas._FOUND['path']\n")
    subprocess.run([sys.executable, "-c", code], check=True)
