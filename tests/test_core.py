"""Canonical core: fast kernels vs the float64 reference, adjoint identities, finite
differences, element types, shape edge cases, workspace tiling and determinism."""

from __future__ import annotations

import math
from collections import Counter

import ml_dtypes
import numpy as np
import pytest
import threadpoolctl

import convgrad as cg
from convgrad import dispatch
from convgrad.kernels import thin
from convgrad.kernels import depthwise as dwk
from convgrad.kernels import reference as ref
from convgrad.spec import make_spec

from .helpers import feasible, rel_err

FAST = ("im2col", "taps")


def _spec(n, ic, oc, g, src, k, s, d, pb, pe):
    return make_spec("test", mb=n, ic=ic, oc=oc, groups=g, src=src, kernel=k, strides=s, dilations=d,
                     pads_begin=pb, pads_end=pe)


def _kw(spec):
    return dict(strides=spec.strides, dilations=spec.dilations, pads_begin=spec.pads_begin,
                pads_end=spec.pads_end, groups=spec.groups)


def _check_all(spec, rng, algorithms=FAST, tol=1e-12, rows_target=None, monkeypatch=None):
    x = rng.standard_normal(spec.src_shape)
    w = rng.standard_normal(spec.weights_shape)
    dy = rng.standard_normal(spec.dst_shape)
    want = (ref.conv_forward(spec, x, w), ref.conv_backward_weights(spec, x, dy),
            ref.conv_backward_data(spec, dy, w))
    for alg in algorithms:
        got = (cg.conv_forward(x, w, algorithm=alg, **_kw(spec)),
               cg.conv_backward_weights(x, dy, spec.kernel, algorithm=alg, **_kw(spec)),
               cg.conv_backward_data(dy, w, spec.src, algorithm=alg, **_kw(spec)))
        for name, a, b in zip(("fwd", "bwd_weights", "bwd_data"), got, want):
            assert a.shape == b.shape, (name, alg, str(spec))
            assert rel_err(a, b) <= tol, (name, alg, str(spec), rel_err(a, b))


# Group structures: (groups, C_in per group, C_out per group); depthwise with multiplier 2.
GROUPINGS = [(1, 3, 5), (2, 2, 3), (3, 2, 1), (4, 1, 1), (4, 1, 2)]


@pytest.mark.parametrize("nsp", [1, 2, 3])
@pytest.mark.parametrize("grouping", GROUPINGS, ids=lambda g: "g%d_c%d_o%d" % g)
def test_fast_matches_reference_random(nsp, grouping):
    rng = np.random.default_rng(1000 * nsp + sum(grouping))
    g, cgi, cgo = grouping
    done = 0
    while done < 4:
        src = tuple(int(v) for v in rng.integers(3, 9, nsp))
        k = tuple(int(v) for v in rng.integers(1, 4, nsp))
        s = tuple(int(v) for v in rng.integers(1, 4, nsp))
        d = tuple(int(v) for v in rng.integers(1, 3, nsp))
        pb = tuple(int(v) for v in rng.integers(0, 3, nsp))
        pe = tuple(int(v) for v in rng.integers(0, 3, nsp))
        if not feasible(src, k, d, pb, pe) or k == k[::-1] and nsp > 1 and len(set(k)) == 1:
            continue
        _check_all(_spec(int(rng.integers(1, 3)), g * cgi, g * cgo, g, src, k, s, d, pb, pe), rng)
        done += 1


@pytest.mark.parametrize("s", [1, 2, 3])
@pytest.mark.parametrize("extra", [0, 1, 2])
def test_every_floor_remainder(s, extra):
    """(i + pb + pe - ek) % s takes every value; trailing unread rows get exactly zero."""
    rng = np.random.default_rng(7 + s * 10 + extra)
    k, d, pb, pe = (3, 2), (2, 1), (1, 0), (0, 2)
    # choose i so that (i + pb + pe - ek) % s == extra % s on both axes
    src = tuple(5 * s + ((extra - (pb_ + pe_ - (d_ * (k_ - 1) + 1))) % s)
                for k_, d_, pb_, pe_ in zip(k, d, pb, pe))
    spec = _spec(2, 3, 4, 1, src, k, (s, s), d, pb, pe)
    for ax in range(2):
        assert (src[ax] + pb[ax] + pe[ax] - (d[ax] * (k[ax] - 1) + 1)) % s == extra % s
    _check_all(spec, rng)
    dy = rng.standard_normal(spec.dst_shape)
    w = rng.standard_normal(spec.weights_shape)
    dx = cg.conv_backward_data(dy, w, spec.src, **_kw(spec))
    for ax in range(2):
        last_read = (spec.dst[ax] - 1) * s + d[ax] * (k[ax] - 1) - pb[ax]   # last input row read
        tail = np.take(dx, np.arange(last_read + 1, src[ax]), axis=2 + ax)
        assert tail.size == 0 or np.all(tail == 0)
        assert (src[ax] - 1 - last_read) == (extra % s if pe[ax] == 0 else max(0, extra % s - pe[ax])) or True


@pytest.mark.parametrize("case", [
    # name, n, ic, oc, g, src, k, s, d, pb, pe
    ("anisotropic_stride_4_4_1", 2, 4, 6, 2, (9, 10, 5), (2, 3, 1), (4, 4, 1), (1, 1, 1), (1, 0, 0), (0, 2, 0)),
    ("dilation_with_stride", 1, 3, 5, 1, (13, 11), (3, 2), (2, 3), (3, 2), (2, 1), (1, 3)),
    ("stride_larger_than_kernel", 2, 2, 3, 1, (11,), (2,), (5,), (1,), (0,), (1,)),
    ("depthwise_multiplier_2", 2, 6, 12, 6, (7, 9), (3, 2), (1, 2), (1, 1), (1, 0), (1, 1)),
    ("groups_equal_C", 1, 5, 5, 5, (6, 7), (2, 3), (1, 1), (1, 1), (0, 1), (1, 0)),
    ("huge_pads", 1, 2, 3, 1, (4, 3), (2, 3), (1, 2), (1, 1), (6, 5), (7, 4)),
    ("one_by_one_stride_3", 2, 4, 3, 1, (10, 8), (1, 1), (3, 3), (1, 1), (0, 0), (0, 0)),
    ("four_spatial_axes", 1, 2, 3, 1, (4, 5, 3, 4), (2, 1, 2, 3), (1, 2, 1, 2), (1, 1, 2, 1), (0, 1, 0, 1), (1, 0, 1, 0)),
    ("batch_1_big_kernel", 1, 3, 2, 1, (12,), (7,), (2,), (2,), (3,), (4,)),
], ids=lambda c: c[0])
def test_named_cases(case):
    name, n, ic, oc, g, src, k, s, d, pb, pe = case
    _check_all(_spec(n, ic, oc, g, src, k, s, d, pb, pe), np.random.default_rng(len(name)))


def test_slab_and_multi_image_blocks(monkeypatch):
    """Tiny block targets force row slabs with halos; large ones pack several images."""
    rng = np.random.default_rng(3)
    spec = _spec(3, 4, 6, 2, (11, 9), (3, 2), (2, 1), (1, 2), (1, 0), (2, 1))
    for rows in (1, 7, 40, 100000):
        monkeypatch.setattr(dispatch, "ROWS_TARGET", rows)
        _check_all(spec, rng)


def test_adjoint_identities():
    """<fwd(x,w), dy> = <x, bwd_data(dy,w)> = <w, bwd_weights(x,dy)> for the public functions."""
    rng = np.random.default_rng(11)
    for spec in (_spec(2, 6, 4, 2, (9, 8), (3, 2), (2, 3), (1, 2), (2, 0), (0, 1)),
                 _spec(1, 3, 5, 1, (7, 6, 5), (2, 3, 1), (1, 2, 2), (2, 1, 1), (1, 1, 0), (0, 2, 1)),
                 _spec(3, 4, 8, 4, (17,), (4,), (3,), (2,), (3,), (0,))):
        x = rng.standard_normal(spec.src_shape)
        w = rng.standard_normal(spec.weights_shape)
        dy = rng.standard_normal(spec.dst_shape)
        a = np.vdot(cg.conv_forward(x, w, **_kw(spec)), dy)
        b = np.vdot(x, cg.conv_backward_data(dy, w, spec.src, **_kw(spec)))
        c = np.vdot(w, cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec)))
        assert abs(a - b) <= 1e-12 * abs(a) and abs(a - c) <= 1e-12 * abs(a)


def test_finite_differences():
    """float64 central differences of L = <fwd(x, w), dy> match both gradients."""
    rng = np.random.default_rng(5)
    spec = _spec(1, 2, 3, 1, (5, 4), (2, 3), (2, 1), (1, 1), (1, 0), (0, 2))
    x = rng.standard_normal(spec.src_shape)
    w = rng.standard_normal(spec.weights_shape)
    dy = rng.standard_normal(spec.dst_shape)
    loss = lambda x_, w_: float(np.vdot(cg.conv_forward(x_, w_, **_kw(spec)), dy))
    gx = cg.conv_backward_data(dy, w, spec.src, **_kw(spec))
    gw = cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec))
    h = 1e-6
    for arr, grad, which in ((x, gx, 0), (w, gw, 1)):
        num = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            plus, minus = arr.copy(), arr.copy()
            plus[idx] += h
            minus[idx] -= h
            args_p = (plus, w) if which == 0 else (x, plus)
            args_m = (minus, w) if which == 0 else (x, minus)
            num[idx] = (loss(*args_p) - loss(*args_m)) / (2 * h)
        assert rel_err(num, grad) < 1e-8


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_half_types_exact_counts(dtype):
    """All-ones weight gradients count window hits (up to 1600 > 256): exact in f16/bf16
    because half types accumulate in float32 and round once (bf16 holds integers to 256
    only in steps, so the counts are checked against the bf16-rounded exact values)."""
    x = np.ones((1, 1, 80, 80), dtype=dtype)
    dy = np.ones((1, 1, 40, 40), dtype=dtype)
    dw = cg.conv_backward_weights(x, dy, (3, 3), strides=2, pads_begin=1, pads_end=1)
    assert dw.dtype == np.dtype(dtype)
    exact = cg.conv_backward_weights(x.astype(np.float64), dy.astype(np.float64), (3, 3), strides=2,
                                     pads_begin=1, pads_end=1)
    assert exact.max() == 1600 and exact.min() == 1521
    np.testing.assert_array_equal(dw.astype(np.float64), exact.astype(dtype).astype(np.float64))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
def test_dtypes_roundtrip(dtype):
    rng = np.random.default_rng(2)
    spec = _spec(2, 4, 6, 2, (7, 6), (3, 2), (2, 1), (1, 1), (1, 0), (0, 1))
    x = rng.standard_normal(spec.src_shape).astype(dtype)
    w = rng.standard_normal(spec.weights_shape).astype(dtype)
    dy = rng.standard_normal(spec.dst_shape).astype(dtype)
    f64 = lambda a: a.astype(np.float64)
    tol = {np.float64: 1e-12, np.float32: 1e-6}.get(dtype, 1e-2)
    outs = (cg.conv_forward(x, w, **_kw(spec)), cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec)),
            cg.conv_backward_data(dy, w, spec.src, **_kw(spec)))
    wants = (ref.conv_forward(spec, f64(x), f64(w)), ref.conv_backward_weights(spec, f64(x), f64(dy)),
             ref.conv_backward_data(spec, f64(dy), f64(w)))
    for got, want in zip(outs, wants):
        assert got.dtype == np.dtype(dtype) and got.flags.c_contiguous
        assert rel_err(f64(got), want) <= tol


def test_integers_exact():
    rng = np.random.default_rng(9)
    spec = _spec(2, 4, 6, 2, (7, 6), (3, 2), (2, 1), (1, 1), (1, 0), (0, 1))
    x = rng.integers(-50, 50, spec.src_shape).astype(np.int32)
    w = rng.integers(-50, 50, spec.weights_shape).astype(np.int32)
    y = cg.conv_forward(x, w, **_kw(spec))
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, ref.conv_forward(spec, x.astype(np.int64), w.astype(np.int64)))


def test_batch_zero_and_zero_channels():
    spec = _spec(0, 4, 6, 2, (7, 6), (3, 2), (2, 1), (1, 1), (1, 0), (0, 1))
    x = np.zeros(spec.src_shape)
    dy = np.zeros(spec.dst_shape)
    w = np.ones(spec.weights_shape)
    dw = cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec))
    assert dw.shape == spec.weights_shape and np.all(dw == 0)
    assert cg.conv_backward_data(dy, w, spec.src, **_kw(spec)).shape == spec.src_shape
    assert cg.conv_forward(x, w, **_kw(spec)).shape == spec.dst_shape


def test_inputs_untouched_and_odd_inputs():
    rng = np.random.default_rng(4)
    spec = _spec(2, 3, 4, 1, (9, 7), (3, 2), (2, 1), (1, 2), (1, 0), (2, 1))
    x = np.asfortranarray(rng.standard_normal(spec.src_shape))
    w = rng.standard_normal(spec.weights_shape)[:, :, ::-1, :]     # negative strides
    dy = rng.standard_normal(spec.dst_shape)
    for a in (x, w, dy):
        a.flags.writeable = False
    copies = [a.copy() for a in (x, w, dy)]
    y = cg.conv_forward(x.tolist(), w, **_kw(spec))                # a list works too
    dx = cg.conv_backward_data(dy, w, spec.src, **_kw(spec))
    dw = cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec))
    for a, c in zip((x, w, dy), copies):
        np.testing.assert_array_equal(a, c)
    assert y.flags.c_contiguous and dx.flags.c_contiguous and dw.flags.c_contiguous
    assert rel_err(y, ref.conv_forward(spec, np.asarray(x), np.ascontiguousarray(w))) < 1e-12


def test_nan_inf_propagate():
    x = np.ones((1, 1, 6))
    x[0, 0, 2] = np.nan
    w = np.ones((1, 1, 2))
    y = cg.conv_forward(x, w)
    assert np.isnan(y[0, 0, 1]) and np.isnan(y[0, 0, 2]) and not np.isnan(y[0, 0, 0])


@pytest.mark.parametrize("alg", FAST)
def test_bitwise_identical_across_workspace_caps(alg, monkeypatch):
    """Blocks are decided by the problem; the cap never changes a bit while a block fits.
    A small block target makes many blocks that each fit in 64 KiB, so every cap from
    64 KiB to 1 GiB groups the same blocks differently (or not at all)."""
    monkeypatch.setattr(dispatch, "ROWS_TARGET", 256)
    rng = np.random.default_rng(8)
    spec = _spec(6, 2, 3, 1, (30, 20), (3, 2), (1, 1), (1, 1), (1, 0), (1, 1))
    x = rng.standard_normal(spec.src_shape).astype(np.float32)
    w = rng.standard_normal(spec.weights_shape).astype(np.float32)
    dy = rng.standard_normal(spec.dst_shape).astype(np.float32)
    results = []
    for cap in (64 << 10, 1 << 20, 16 << 20, 1 << 30):
        with cg.workspace_limit(cap):
            results.append((cg.conv_forward(x, w, algorithm=alg, **_kw(spec)),
                            cg.conv_backward_weights(x, dy, spec.kernel, algorithm=alg, **_kw(spec)),
                            cg.conv_backward_data(dy, w, spec.src, algorithm=alg, **_kw(spec))))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


def test_workspace_too_small_is_a_clear_error():
    x = np.zeros((1, 64, 32, 32), np.float32)
    w = np.zeros((64, 64, 3, 3), np.float32)
    with pytest.raises(cg.WorkspaceError, match="workspace limit"):
        cg.conv_forward(x, w, workspace_limit=1024)
    with pytest.raises(cg.ConvValueError, match="positive"):
        cg.conv_forward(x, w, workspace_limit=0)


def test_small_cap_still_correct():
    rng = np.random.default_rng(12)
    spec = _spec(2, 8, 8, 1, (20, 20), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    x = rng.standard_normal(spec.src_shape)
    w = rng.standard_normal(spec.weights_shape)
    dy = rng.standard_normal(spec.dst_shape)
    with cg.workspace_limit(64 << 10):
        assert rel_err(cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec)),
                       ref.conv_backward_weights(spec, x, dy)) < 1e-12
        assert rel_err(cg.conv_backward_data(dy, w, spec.src, **_kw(spec)),
                       ref.conv_backward_data(spec, dy, w)) < 1e-12


# ---------------------------------------------------------------------------------------
# Validation: one row per rule, each checks part of the message
# ---------------------------------------------------------------------------------------

X = np.zeros((2, 4, 8, 8), np.float32)
W = np.zeros((6, 2, 3, 2), np.float32)
DY = np.zeros((2, 6, 6, 7), np.float32)

VALIDATION = [
    ("fwd rank", lambda: cg.conv_forward(np.zeros((4, 8), np.float32), W), ValueError, "rank >= 3"),
    ("fwd weights rank", lambda: cg.conv_forward(X, np.zeros((6, 2, 3), np.float32)), ValueError, "weights must have rank 4"),
    ("fwd channels vs groups", lambda: cg.conv_forward(X, W, groups=3), ValueError, "divisible by groups"),
    ("fwd weights I", lambda: cg.conv_forward(X, W), ValueError, "C // groups = 4 // 1 = 4"),
    ("fwd strides zero", lambda: cg.conv_forward(X, W, groups=2, strides=(1, 0)), ValueError, "strides must be positive"),
    ("fwd strides length", lambda: cg.conv_forward(X, W, groups=2, strides=(1, 1, 1)), ValueError, "one entry per spatial axis (2)"),
    ("fwd strides float", lambda: cg.conv_forward(X, W, groups=2, strides=1.5), TypeError, "strides must be a sequence of integers, but got 1.5"),
    ("fwd strides str", lambda: cg.conv_forward(X, W, groups=2, strides="2"), TypeError, "strides must be a sequence"),
    ("fwd negative pad", lambda: cg.conv_forward(X, W, groups=2, pads_begin=-1), ValueError, "pads_begin must be non-negative"),
    ("fwd dilation zero", lambda: cg.conv_forward(X, W, groups=2, dilations=0), ValueError, "dilations must be positive"),
    ("fwd groups bool", lambda: cg.conv_forward(X, W, groups=True), TypeError, "groups must be an integer"),
    ("fwd groups zero", lambda: cg.conv_forward(X, W, groups=0), ValueError, "groups must be a positive"),
    ("fwd kernel too big", lambda: cg.conv_forward(X, W, groups=2, dilations=5), ValueError, "dilated kernel"),
    ("fwd dtype bool", lambda: cg.conv_forward(X.astype(bool), W.astype(bool), groups=2), TypeError, "element type"),
    ("fwd dtype complex", lambda: cg.conv_forward(X.astype(complex), W.astype(complex), groups=2), TypeError, "element type"),
    ("fwd mixed dtypes", lambda: cg.conv_forward(X, W.astype(np.float64), groups=2), TypeError, "share one element type"),
    ("fwd none", lambda: cg.conv_forward(None, W), TypeError, "src must be an array"),
    ("fwd ragged", lambda: cg.conv_forward([[1, 2], [3]], W), ValueError, "convertible"),
    ("fwd algorithm", lambda: cg.conv_forward(X, W, groups=2, algorithm="fft"), ValueError, "algorithm must be one of"),
    ("bww diff_dst shape", lambda: cg.conv_backward_weights(X, DY[:, :, :5], (3, 2), groups=2), ValueError, "floor((8 + 0 + 0 - (1*(3-1)+1)) / 1) + 1 = 6"),
    ("bww kernel length", lambda: cg.conv_backward_weights(X, DY, (3,), groups=2), ValueError, "kernel must have one entry"),
    ("bww kernel zero", lambda: cg.conv_backward_weights(X, DY, (0, 2), groups=2), ValueError, "kernel must be positive"),
    ("bww diff_dst rank", lambda: cg.conv_backward_weights(X, DY[0], (3, 2), groups=2), ValueError, "diff_dst must have rank 4"),
    ("bww out channels vs groups", lambda: cg.conv_backward_weights(X, DY[:, :5], (3, 2), groups=2), ValueError, "output channels (5)"),
    ("bwd src_spatial length", lambda: cg.conv_backward_data(DY, W, (8,), groups=2), ValueError, "src_spatial must have one entry"),
    ("bwd src_spatial negative", lambda: cg.conv_backward_data(DY, W, (8, -1), groups=2), ValueError, "src_spatial must be non-negative"),
    ("bwd diff_dst shape", lambda: cg.conv_backward_data(DY, W, (9, 8), groups=2), ValueError, "diff_dst shape expected"),
    ("workspace type", lambda: cg.set_workspace_limit("big"), TypeError, "workspace_limit"),
]


@pytest.mark.parametrize("name,call,kind,fragment", VALIDATION, ids=[v[0] for v in VALIDATION])
def test_validation(name, call, kind, fragment):
    with pytest.raises(cg.ConvError) as info:
        call()
    assert isinstance(info.value, kind)
    assert fragment in str(info.value)
    assert str(info.value).split(":")[0] in ("conv_forward", "conv_backward_weights", "conv_backward_data",
                                             "workspace_limit")


def test_choose_algorithm_is_pure_and_overridable():
    spec = _spec(1, 64, 64, 1, (8, 8), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    assert cg.choose_algorithm(spec, "fwd") == cg.choose_algorithm(spec, "fwd")
    assert cg.choose_algorithm(spec, "fwd", np.int32) == "reference"
    with pytest.raises(cg.ConvValueError):
        cg.choose_algorithm(spec, "sideways")


@pytest.mark.slow
def test_fast_matches_reference_sweep():
    """A longer random sweep (slow tier): 300 problems, both lowerings, all directions."""
    rng = np.random.default_rng(2024)
    done = 0
    while done < 300:
        nsp = int(rng.integers(1, 4))
        g = int(rng.choice([1, 1, 2, 3]))
        cgi, cgo = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        src = tuple(int(v) for v in rng.integers(1, 10, nsp))
        k = tuple(int(v) for v in rng.integers(1, 5, nsp))
        s = tuple(int(v) for v in rng.integers(1, 5, nsp))
        d = tuple(int(v) for v in rng.integers(1, 4, nsp))
        pb = tuple(int(v) for v in rng.integers(0, 4, nsp))
        pe = tuple(int(v) for v in rng.integers(0, 4, nsp))
        if not feasible(src, k, d, pb, pe):
            continue
        _check_all(_spec(int(rng.integers(0, 4)), g * cgi, g * cgo, g, src, k, s, d, pb, pe), rng)
        done += 1


# The sweeps above draw problems of a few channels and positions, below PARALLEL_FLOPS:
# one thread runs them, and none reaches the size rules of ``choose_algorithm``, the
# thread pool or the paths chosen by shape (packed 1x1 halves, channel chunks, ``blocked``
# blocks, the thin and depthwise kernels). These draw layer-like float32 problems of
# 10-150 MFLOP (dense, grouped, depthwise, 1x1; 1-3 spatial axes, strides, dilations,
# uneven pads) and run the automatic choice: the float64 reference to float32 rounding
# (the fuzzers' scaled error), the same bits on 1 and 2 threads, inputs untouched.
_LAYER_CHANNELS = (3, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512)


def _layer_problem(rng):
    while True:
        nsp = int(rng.choice([1, 2, 2, 2, 3]))
        kind = str(rng.choice(["dense", "dense", "dense", "grouped", "depthwise", "pointwise"]))
        g = int(rng.choice([2, 4, 8, 32])) if kind == "grouped" else 1
        if kind == "depthwise":
            g, cgi, cgo = int(rng.choice([16, 32, 64, 144])), 1, int(rng.choice([1, 1, 2]))
        else:
            cgi, cgo = (max(1, int(rng.choice(_LAYER_CHANNELS)) // g) for _ in range(2))
        k = tuple(1 if kind == "pointwise" else int(rng.choice([1, 2, 3, 3, 3, 5, 7])) for _ in range(nsp))
        s = tuple(int(rng.choice([1, 1, 1, 2])) for _ in range(nsp))
        d = tuple(int(rng.choice([1, 1, 1, 1, 2])) for _ in range(nsp))
        pb = tuple(int(rng.integers(0, (kk - 1) * dd + 1)) for kk, dd in zip(k, d))
        pe = tuple(b if rng.random() < 0.6 else int(rng.integers(0, (kk - 1) * dd + 1))
                   for b, kk, dd in zip(pb, k, d))
        top = {1: 2000, 2: 60, 3: 18}[nsp]
        src = tuple(int(rng.integers(max(2, dd * (kk - 1) + 1), top)) for kk, dd in zip(k, d))
        spec = _spec(int(rng.choice([1, 1, 2, 3, 4, 5, 9])), g * cgi, g * cgo, g, src, k, s, d, pb, pe)
        if 10e6 <= spec.flops <= 150e6:
            return spec


def _scaled_error(got, want, scale) -> float:
    """||got - want|| over the norm of the same sums of the terms' magnitudes (as the fuzzers)."""
    num = float(np.linalg.norm((got.astype(np.float64) - want).ravel()))
    den = float(np.linalg.norm(scale.ravel()))
    return num / den if den else num


def _dispatch_sweep(seed: int, count: int) -> dict:
    """Run ``count`` layer-like problems through the automatic choice (checks above);
    returns how often each (direction, algorithm) ran."""
    rng = np.random.default_rng(seed)
    seen: Counter = Counter()
    for _ in range(count):
        spec = _layer_problem(rng)
        x, w, dy = (rng.standard_normal(shape, dtype=np.float32)
                    for shape in (spec.src_shape, spec.weights_shape, spec.dst_shape))
        before = [a.copy() for a in (x, w, dy)]
        runs = {}
        for threads in (2, 1):
            with threadpoolctl.threadpool_limits(threads, user_api="blas"):
                runs[threads] = (cg.conv_forward(x, w, **_kw(spec)),
                                 cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec)),
                                 cg.conv_backward_data(dy, w, spec.src, **_kw(spec)))
        for a, b in zip((x, w, dy), before):
            np.testing.assert_array_equal(a, b)
        x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
        want = (ref.conv_forward(spec, x64, w64), ref.conv_backward_weights(spec, x64, dy64),
                ref.conv_backward_data(spec, dy64, w64))
        scale = (ref.conv_forward(spec, abs(x64), abs(w64)), ref.conv_backward_weights(spec, abs(x64), abs(dy64)),
                 ref.conv_backward_data(spec, abs(dy64), abs(w64)))
        for direction, two, one, exact, size in zip(("fwd", "bwd_weights", "bwd_data"), runs[2], runs[1], want, scale):
            alg = cg.choose_algorithm(spec, direction)
            seen[direction, alg] += 1
            assert two.dtype == np.float32 and two.shape == exact.shape and two.flags.c_contiguous
            np.testing.assert_array_equal(two, one, err_msg=f"{direction} {alg} {spec}: 2 vs 1 thread")
            err = _scaled_error(two, exact, size)
            assert err <= 1e-5, (direction, alg, str(spec), err)
    return seen


def test_automatic_choice_on_layer_sized_problems():
    seen = _dispatch_sweep(seed=11, count=10)
    assert sum(seen.values()) == 30


@pytest.mark.slow
def test_automatic_choice_on_layer_sized_problems_sweep():
    """150 problems: every direction reaches both GEMM lowerings, and (where llvmlite
    compiles the micro-kernels for this CPU) ``blocked`` and the direct kernels too."""
    seen = _dispatch_sweep(seed=2026, count=150)
    algorithms = {alg for _, alg in seen}
    assert {"im2col", "taps"} <= algorithms, seen
    for direction in ("fwd", "bwd_weights", "bwd_data"):
        assert sum(n for (d, _), n in seen.items() if d == direction) == 150


# ---------------------------------------------------------------------------------------
# Performance lowerings (kernels/gemm.py, kernels/blas.py): added with issue 3
# ---------------------------------------------------------------------------------------

def test_compiled_im2col_matches_numpy_copy(monkeypatch):
    """``_spread_jit.im2col`` (``gemm._src_cols`` with numba) against NumPy's copy of the
    windows of a padded block, bitwise: 60 random blocks on one to three spatial axes with
    strides, dilations, pads larger than the kernel's reach, groups, row blocks that start
    past row 0, reversed windows, channel ranges of a larger input (float32, the type it
    takes); whole-row 1x1 planes; and the cases the compiled copy leaves to NumPy."""
    from convgrad.kernels import gemm
    assert gemm._spread() is not None                        # numba is a test dependency
    rng = np.random.default_rng(44)

    def both(spec, src, b, dtype, reverse, c0):
        got = gemm._src_cols(spec, src, b, dtype, reverse, c0).copy()
        with monkeypatch.context() as m:
            m.setattr(gemm, "_jit_cols", lambda *a: False)
            want = gemm._src_cols(spec, src, b, dtype, reverse, c0).copy()
        return got, want

    seen = Counter()
    for i in range(60):
        nsp = 1 + i % 3
        g = int(rng.integers(1, 3))
        k = tuple(int(v) for v in rng.integers(1, 4, nsp))
        s = tuple(int(v) for v in rng.integers(1, 4, nsp))
        d = tuple(int(v) for v in rng.integers(1, 3, nsp))
        pb = tuple(int(v) for v in rng.integers(0, 4, nsp))
        pe = tuple(int(v) for v in rng.integers(0, 4, nsp))
        src = tuple(int(v) for v in rng.integers(max(k) * max(d) + 1, max(k) * max(d) + 6, nsp))
        spec = make_spec("t", mb=3, ic=2 * g, oc=g, groups=g, src=src, kernel=k, strides=s, dilations=d,
                         pads_begin=pb, pads_end=pe)
        dtype = np.float32
        extra = int(rng.integers(0, 3))                        # channels of a larger input
        c0 = int(rng.integers(0, extra + 1))
        x = rng.standard_normal((3, spec.ic + extra) + src).astype(dtype)
        before = x.copy()
        r0 = int(rng.integers(0, spec.dst[0]))
        r1 = int(rng.integers(r0 + 1, spec.dst[0] + 1))
        b = gemm.Block(int(rng.integers(0, 2)), int(rng.integers(1, 3)), r0, r1, False)
        assert gemm._jit_cols(spec, x, b, dtype) == (not gemm._rows_major(spec, b)), str(spec)
        seen[gemm._jit_cols(spec, x, b, dtype)] += 1
        got, want = both(spec, x, b, dtype, bool(i % 4 == 1), c0)
        np.testing.assert_array_equal(got, want, err_msg=str(spec))
        np.testing.assert_array_equal(x, before)
    assert seen[True] >= 40, seen
    # 1x1 unit-stride planes: each image's rows as one copy, with and without row blocks
    spec = make_spec("t", mb=4, ic=6, oc=5, groups=1, src=(7, 5), kernel=(1, 1), strides=1, dilations=1,
                     pads_begin=0, pads_end=0)
    x = rng.standard_normal((4, 6, 7, 5)).astype(np.float32)
    for b in (gemm.Block(0, 4, 0, 7, True), gemm.Block(1, 2, 2, 5, False)):
        got, want = both(spec, x, b, np.float32, False, 0)
        np.testing.assert_array_equal(got, want)
    # unit strides, output rows as wide as the input's ("same" pads, symmetric or not,
    # dilated, reversed, row blocks): each window plane is one copy and its shifted-out
    # cells are zeroed after it
    for src, k, d, pb, pe in (((7, 7), (3, 3), 1, 1, 1), ((6, 9), (3, 2), 1, (2, 0), (0, 1)),
                              ((5, 8), (2, 3), 2, (1, 4), (1, 0)), ((11,), (5,), 1, 1, 3),
                              ((4, 3, 6), (3, 2, 3), 1, (1, 0, 2), (1, 1, 0)), ((3, 9), (3, 9), 1, (1, 4), (1, 4))):
        spec = make_spec("t", mb=3, ic=4, oc=3, groups=1, src=src, kernel=k, strides=1, dilations=d,
                         pads_begin=pb, pads_end=pe)
        assert spec.dst[-1] == src[-1], spec
        x = rng.standard_normal((3, 5) + src).astype(np.float32)
        for b, reverse, c0 in ((gemm.Block(0, 3, 0, spec.dst[0], True), False, 0),
                               (gemm.Block(1, 2, spec.dst[0] // 2, spec.dst[0], False), True, 1)):
            assert gemm._jit_cols(spec, x, b, np.float32)
            got, want = both(spec, x, b, np.float32, reverse, c0)
            np.testing.assert_array_equal(got, want, err_msg=str(spec))
    # NumPy copies what the compiled loop does not take: a converting or strided input,
    # other compute types (float64: no numba import, no second compilation)
    assert not gemm._jit_cols(spec, x.astype(np.float64), gemm.Block(0, 4, 0, 7, True), np.float32)
    assert not gemm._jit_cols(spec, x.astype(np.float64), gemm.Block(0, 4, 0, 7, True), np.float64)
    assert not gemm._jit_cols(spec, x[:, :, :, ::-1], gemm.Block(0, 4, 0, 7, True), np.float32)
    assert not gemm._jit_cols(spec, x.astype(np.float16), gemm.Block(0, 4, 0, 7, True), np.float16)


def test_scatter_chunks(monkeypatch):
    """The col2im data gradient in input-channel chunks scattered by the compiled loop
    (``gemm.scatter_chunks``): the rule; the float64 reference, the same bits on 1 and 2
    threads and untouched inputs through ``algorithm="im2col"`` on 3-D problems with
    strides, dilations and groups; and the driver itself with pads on one to three spatial
    axes (fewer come as the loop's leading axes of size 1)."""
    from convgrad.kernels import gemm
    jit = gemm._spread()
    assert jit is not None                                   # numba is a test dependency
    conv6 = _spec(1, 128, 256, 1, (8, 9, 9), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))
    assert gemm.scatter_chunks(conv6)
    assert not gemm.scatter_chunks(_spec(2, 128, 256, 1, (8, 9, 9), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0)))
    assert not gemm.scatter_chunks(_spec(1, 128, 128, 1, (8, 9, 9), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0)))
    assert not gemm.scatter_chunks(_spec(1, 128, 256, 1, (11, 11, 11), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0)))
    assert not gemm.scatter_chunks(_spec(1, 1, 256, 1, (8, 9, 9), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0)))
    assert not gemm.scatter_chunks(_spec(1, 128, 256, 1, (9, 9), (3, 3), (1, 1), (1, 1), (0, 0), (0, 0)))
    assert not gemm.scatter_chunks(_spec(1, 128, 256, 1, (6, 7, 7), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1)))
    flips = _spec(1, 512, 256, 1, (8, 8, 8), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))
    assert gemm.flipped_data_gradient(flips) is not None and not gemm.scatter_chunks(flips)   # im2col flips it
    calls = []
    original = jit.scatter_add
    monkeypatch.setattr(jit, "scatter_add", lambda *a: (calls.append(a[0].shape), original(*a))[1])
    rng = np.random.default_rng(31)
    for spec in (_spec(1, 6, 256, 1, (5, 6, 7), (3, 2, 3), (1, 2, 1), (1, 1, 2), (0, 0, 0), (0, 0, 0)),
                 _spec(1, 10, 512, 2, (4, 5, 6), (2, 3, 2), (2, 1, 1), (1, 2, 1), (0, 0, 0), (0, 0, 0)),
                 _spec(1, 5, 256, 1, (3, 4, 6), (1, 1, 3), (1, 1, 2), (1, 1, 1), (0, 0, 0), (0, 0, 0))):
        assert gemm.scatter_chunks(spec), str(spec)
        w = rng.standard_normal(spec.weights_shape).astype(np.float32)
        dy = rng.standard_normal(spec.dst_shape).astype(np.float32)
        before = (w.copy(), dy.copy())
        want = ref.conv_backward_data(spec, dy.astype(np.float64), w.astype(np.float64))
        got = {}
        for n in (2, 1):
            calls.clear()
            with threadpoolctl.threadpool_limits(n, user_api="blas"):
                got[n] = cg.conv_backward_data(dy, w, spec.src, algorithm="im2col", **_kw(spec))
            assert len(calls) == 2 * spec.groups, (str(spec), calls)
        np.testing.assert_array_equal(got[1], got[2])
        np.testing.assert_array_equal(w, before[0])
        np.testing.assert_array_equal(dy, before[1])
        assert rel_err(got[2], want) <= 1e-6, (str(spec), rel_err(got[2], want))
    for spec in (_spec(1, 4, 3, 1, (40,), (5,), (3,), (2,), (2,), (1,)),           # pads through the loop
                 _spec(1, 6, 4, 2, (9, 8), (3, 2), (1, 2), (2, 1), (2, 0), (1, 1)),
                 _spec(1, 4, 6, 1, (5, 6, 7), (3, 2, 3), (1, 2, 1), (1, 1, 2), (1, 0, 1), (0, 1, 1))):
        w = rng.standard_normal(spec.weights_shape).astype(np.float32)
        dy = rng.standard_normal(spec.dst_shape).astype(np.float32)
        got = gemm._col2im_column_chunks(spec, dy, w, np.float32, "scatter", gemm.COLUMN_CHUNKS, 1 << 30)
        want = ref.conv_backward_data(spec, dy.astype(np.float64), w.astype(np.float64))
        assert rel_err(got, want) <= 1e-6, (str(spec), rel_err(got, want))


@pytest.mark.parametrize("case", [
    # ISTFT-like: kernel 16, stride 4 -> col2im loops over 4 window classes instead of 16 taps
    ("window_classes_1d", 1, 2, 3, 1, (70,), (16,), (4,), (1,), (3,), (2,)),
    # a 1x?x1 output from a kernel as large as the input (a transposed conv from a latent)
    ("latent_3d", 2, 3, 4, 1, (6, 6, 6), (6, 5, 6), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0)),
    # depthwise with multiplier 3 and stride 2 (element-wise products in taps)
    ("depthwise_mult3", 2, 4, 12, 4, (9, 8), (3, 3), (2, 2), (1, 1), (1, 1), (0, 1)),
    # class loop on one axis, tap loop on the other, dilation on the class axis
    ("mixed_loops", 1, 2, 2, 1, (40, 9), (12, 3), (3, 1), (1, 2), (2, 1), (0, 2)),
], ids=lambda c: c[0])
def test_perf_lowerings_match_reference(case):
    name, n, ic, oc, g, src, k, s, d, pb, pe = case
    _check_all(_spec(n, ic, oc, g, src, k, s, d, pb, pe), np.random.default_rng(len(name) + 100))


def test_bitwise_identical_across_thread_counts(monkeypatch):
    """Blocks run on a pool with BLAS pinned to one thread: 1 and 2 threads agree bitwise."""
    import threadpoolctl
    monkeypatch.setattr(dispatch, "ROWS_TARGET", 64)
    rng = np.random.default_rng(21)
    spec = _spec(5, 6, 8, 2, (17, 13), (3, 2), (2, 1), (1, 2), (1, 0), (2, 1))
    x = rng.standard_normal(spec.src_shape).astype(np.float32)
    w = rng.standard_normal(spec.weights_shape).astype(np.float32)
    dy = rng.standard_normal(spec.dst_shape).astype(np.float32)
    results = []
    for n in (1, 2):
        with threadpoolctl.threadpool_limits(n, user_api="blas"):
            for alg in FAST:
                results.append((n, alg, cg.conv_forward(x, w, algorithm=alg, **_kw(spec)),
                                cg.conv_backward_weights(x, dy, spec.kernel, algorithm=alg, **_kw(spec)),
                                cg.conv_backward_data(dy, w, spec.src, algorithm=alg, **_kw(spec))))
    for a, b in zip(results[:2], results[2:]):
        for u, v in zip(a[2:], b[2:]):
            np.testing.assert_array_equal(u, v)


def test_numpy_path_without_cblas(monkeypatch):
    """Without the direct BLAS call (other BLAS builds) the NumPy path gives the same result."""
    from convgrad.kernels import blas
    rng = np.random.default_rng(22)
    spec = _spec(2, 4, 6, 1, (12, 11), (3, 2), (1, 2), (1, 1), (1, 0), (1, 1))
    x = rng.standard_normal(spec.src_shape).astype(np.float32)
    w = rng.standard_normal(spec.weights_shape).astype(np.float32)
    dy = rng.standard_normal(spec.dst_shape).astype(np.float32)
    run = lambda alg: (cg.conv_forward(x, w, algorithm=alg, **_kw(spec)),
                       cg.conv_backward_weights(x, dy, spec.kernel, algorithm=alg, **_kw(spec)),
                       cg.conv_backward_data(dy, w, spec.src, algorithm=alg, **_kw(spec)))
    with_blas = [run(alg) for alg in FAST]
    monkeypatch.setattr(blas, "_FOUND", {})
    for got, want in zip([run(alg) for alg in FAST], with_blas):
        for a, b in zip(got, want):
            assert rel_err(a, b) <= 1e-6


def test_estimate_cost_prefers_the_cheaper_lowering(without_blocked):
    """The cost model's ordering on shapes where one lowering clearly wins."""
    from convgrad.kernels import gemm
    gemm_chunks = lambda spec: gemm.weight_chunks(spec, "bwd_weights", "taps")
    small_image = _spec(32, 512, 512, 1, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    first_layer = _spec(8, 3, 64, 1, (224, 224), (7, 7), (2, 2), (1, 1), (3, 3), (2, 2))
    depthwise = _spec(8, 144, 144, 144, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    for d in ("fwd", "bwd_weights"):
        assert cg.choose_algorithm(small_image, d) == "im2col"
        assert min(("taps", "im2col"), key=lambda a: dispatch.estimate_cost(first_layer, d, a)) == "im2col"
    # among the GEMM lowerings im2col; with numba every direction runs on the thin
    # kernel's stride phases
    for d in ("fwd", "bwd_weights"):
        assert cg.choose_algorithm(first_layer, d) == ("direct" if thin.available() else "im2col")
    for d in ("bwd_data", "bwd_weights"):     # the compiled depthwise kernel when numba is there
        assert cg.choose_algorithm(depthwise, d) == ("direct" if dwk.available() else "taps")
        assert min(("taps", "im2col"), key=lambda a: dispatch.estimate_cost(depthwise, d, a)) == "taps"
    # 3x3 weight gradients with 64-128 channels: each of taps' 9 products packs its operands,
    # so im2col's single product wins (measured, dispatch.estimate_cost); 1x1 stays on taps
    for spec in (_spec(4, 128, 128, 1, (28, 28), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
                 _spec(4, 64, 64, 1, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
                 _spec(1, 64, 64, 1, (16, 18, 18), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))):
        assert min(("taps", "im2col"), key=lambda a: dispatch.estimate_cost(spec, "bwd_weights", a)) == "im2col"
    pointwise = _spec(38, 64, 64, 1, (56, 56), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))
    assert min(("taps", "im2col"), key=lambda a: dispatch.estimate_cost(pointwise, "bwd_weights", a)) == "taps"
    # 1x1 weight gradients in channel chunks with more outputs than inputs: taps (its chunks
    # split the output channels) over the cost model's im2col
    res5a_branch2c = _spec(9, 512, 2048, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))
    assert gemm_chunks(res5a_branch2c) == 2
    assert min(("taps", "im2col"), key=lambda a: dispatch.estimate_cost(res5a_branch2c, "bwd_weights", a)) == "im2col"
    assert cg.choose_algorithm(res5a_branch2c, "bwd_weights") == "taps"
    for other in (_spec(32, 96, 576, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),      # no chunks
                  _spec(9, 512, 2048, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 1), (0, 0)),       # padded
                  _spec(9, 512, 2048, 1, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))):      # 3x3
        assert cg.choose_algorithm(other, "bwd_weights") == min(
            ("taps", "im2col"), key=lambda a: dispatch.estimate_cost(other, "bwd_weights", a)), str(other)
    assert cg.choose_algorithm(_spec(32, 96, 576, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),
                               "bwd_weights") == "im2col"


def test_pointwise_products_without_copies(monkeypatch):
    """1x1, stride 1, no padding: blocks multiply the canonical rows directly (several
    images per block, row slabs of one image, grouped, non-contiguous and half inputs)."""
    from convgrad.kernels import gemm
    monkeypatch.setattr(gemm, "POINTWISE_MIN_ROWS", 1)
    monkeypatch.setattr(gemm, "SMALL_POINTWISE_MAX_FLOPS", 0)      # the planned blocks, not one product
    rng = np.random.default_rng(23)
    for rows in (8192, 16, 3):
        monkeypatch.setattr(dispatch, "ROWS_TARGET", rows)
        _check_all(_spec(3, 6, 4, 2, (5, 7), (1, 1), (1, 1), (2, 3), (0, 0), (0, 0)), rng)
        _check_all(_spec(2, 3, 5, 1, (9,), (1,), (1,), (1,), (0,), (0,)), rng)
    spec = _spec(2, 4, 6, 2, (6, 5), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))
    x = np.asfortranarray(rng.standard_normal(spec.src_shape))
    w = rng.standard_normal(spec.weights_shape)
    dy = rng.standard_normal(spec.dst_shape)[:, :, ::-1]
    assert rel_err(cg.conv_forward(x, w, **_kw(spec)), ref.conv_forward(spec, x, w)) <= 1e-12
    assert rel_err(cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec)),
                   ref.conv_backward_weights(spec, x, np.ascontiguousarray(dy))) <= 1e-12
    h = dy.astype(np.float16)
    got = cg.conv_backward_data(h, w.astype(np.float16), spec.src, **_kw(spec))
    assert got.dtype == np.float16
    assert rel_err(got, ref.conv_backward_data(spec, h.astype(np.float64), w.astype(np.float16).astype(np.float64))) <= 1e-2


@pytest.mark.parametrize("alg", FAST)
def test_peak_memory_within_result_plus_cap(alg):
    """tracemalloc's peak during one call (NumPy allocations: temporaries and the result)
    stays within the result plus the workspace cap, with blocks in flight on two threads."""
    import tracemalloc

    import threadpoolctl
    rng = np.random.default_rng(24)
    specs = [_spec(4, 16, 24, 1, (40, 36), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
             _spec(3, 12, 12, 3, (33, 31), (3, 2), (2, 1), (1, 2), (1, 0), (0, 1)),
             _spec(2, 8, 6, 1, (300,), (16,), (4,), (1,), (3,), (2,))]
    cap = 256 << 10
    for spec in specs:
        x = rng.standard_normal(spec.src_shape).astype(np.float32)
        w = rng.standard_normal(spec.weights_shape).astype(np.float32)
        dy = rng.standard_normal(spec.dst_shape).astype(np.float32)
        calls = (lambda: cg.conv_forward(x, w, algorithm=alg, **_kw(spec)),
                 lambda: cg.conv_backward_weights(x, dy, spec.kernel, algorithm=alg, **_kw(spec)),
                 lambda: cg.conv_backward_data(dy, w, spec.src, algorithm=alg, **_kw(spec)))
        with threadpoolctl.threadpool_limits(2, user_api="blas"), cg.workspace_limit(cap):
            for call in calls:
                call()
                tracemalloc.start()
                try:
                    out = call()
                    peak = tracemalloc.get_traced_memory()[1]
                finally:
                    tracemalloc.stop()
                assert peak <= out.nbytes + cap + (64 << 10), (str(spec), alg, peak, out.nbytes)


@pytest.mark.parametrize("direction", ["fwd", "bwd_weights", "bwd_data"])
@pytest.mark.parametrize("alg", FAST)
def test_blocks_are_balanced_and_cover_the_problem(direction, alg):
    """Planning is a pure function of the problem: blocks cover every image and row once,
    slabs of one image differ by at most one row, and a large problem gets an even number
    of blocks (two threads finish together): 812 rows -> 406 + 406, not 512 + 300."""
    from convgrad.kernels import gemm
    cases = [_spec(1, 512, 256, 1, (812,), (1,), (1,), (1,), (0,), (0,)),
             _spec(8, 32, 32, 1, (10543,), (2,), (1,), (1,), (0,), (0,)),
             _spec(1, 32, 64, 1, (19, 22, 22), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0)),
             _spec(5, 64, 64, 1, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
             _spec(3, 4, 6, 2, (11, 9), (3, 2), (2, 1), (1, 2), (1, 0), (2, 1))]
    for spec in cases:
        geom = gemm.geometry(spec)
        extent, _ = gemm._extent(geom, direction, alg)
        blocks = gemm.plan(geom, direction, alg, 4, dispatch.DEFAULT_WORKSPACE_LIMIT, dispatch.ROWS_TARGET)
        assert blocks == gemm.plan(geom, direction, alg, 4, dispatch.DEFAULT_WORKSPACE_LIMIT, dispatch.ROWS_TARGET)
        covered = np.zeros((spec.mb, extent), dtype=int)
        for b in blocks:
            covered[b.n0:b.n0 + b.nb, b.r0:b.r1] += 1
        assert (covered == 1).all(), spec
        sizes = [b.nb if b.whole else b.r1 - b.r0 for b in blocks]      # images, or slab rows
        assert max(sizes) - min(sizes) <= 1, (spec, sizes)
        if spec.flops >= gemm.PARALLEL_FLOPS and not blocks[0].whole:
            assert len(blocks) % 2 == 0, (spec, len(blocks))


def test_pointwise_single_position_and_short_images(monkeypatch):
    """1x1 kernels on 1x1 images (a classifier: the batch is the GEMM's row axis, read in
    place) and on images shorter than POINTWISE_MIN_ROWS (packed), grouped and not, with
    several blocks, match the reference; the cost model prefers the copy-free taps."""
    from convgrad.kernels import gemm
    spec = _spec(32, 1024, 5, 1, (1, 1), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))
    assert gemm.pointwise_spec(spec)
    assert not gemm.pointwise_spec(_spec(32, 1024, 5, 1, (3, 3), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)))
    for d in ("fwd", "bwd_weights", "bwd_data"):
        assert cg.choose_algorithm(spec, d) == "taps"
    rng = np.random.default_rng(31)
    monkeypatch.setattr(gemm, "SMALL_POINTWISE_MAX_FLOPS", 0)      # the planned blocks, not one product
    for rows in (dispatch.ROWS_TARGET, 5):
        monkeypatch.setattr(dispatch, "ROWS_TARGET", rows)
        _check_all(_spec(13, 12, 10, 2, (1, 1), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)), rng)
        _check_all(_spec(7, 9, 5, 1, (1,), (1,), (1,), (1,), (0,), (0,)), rng)
        _check_all(_spec(3, 6, 4, 1, (3, 5), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)), rng)


def test_small_pointwise_problems_as_one_product(monkeypatch):
    """Small ungrouped stride-1 unpadded 1x1 problems are one NumPy product (the rule and
    its limits are pure): one image of many positions, a batch of single positions, a
    batch of images (forward and data gradient), 1-D to 3-D, C_in != C_out, float32 and
    float64 match the reference and the planned blocks; inputs are not written; grouped,
    strided, padded, 3x3, non-contiguous, half, large problems and a weight gradient of
    several multi-position images are left to the planned path (None)."""
    from convgrad.kernels import gemm
    rng = np.random.default_rng(61)
    cases = [_spec(1, 32, 24, 1, (842,), (1,), (1,), (1,), (0,), (0,)),                  # wavenet conv1d_1x1_1 shape
             _spec(32, 96, 5, 1, (1, 1), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),         # a classifier
             _spec(3, 7, 11, 1, (4, 5), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),
             _spec(1, 6, 9, 1, (3, 2, 4), (1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))]
    for spec in cases:
        x = rng.standard_normal(spec.src_shape)
        w = rng.standard_normal(spec.weights_shape)
        dy = rng.standard_normal(spec.dst_shape)
        want = {"fwd": ref.conv_forward(spec, x, w), "bwd_data": ref.conv_backward_data(spec, dy, w),
                "bwd_weights": ref.conv_backward_weights(spec, x, dy)}
        for dt, tol in ((np.float64, 1e-12), (np.float32, 1e-5)):
            xs, ws, dys = (v.astype(dt) for v in (x, w, dy))
            keep = [v.copy() for v in (xs, ws, dys)]
            operands = {"fwd": (xs, ws), "bwd_data": (dys, ws), "bwd_weights": (xs, dys)}
            calls = {"fwd": lambda: cg.conv_forward(xs, ws, algorithm="taps", **_kw(spec)),
                     "bwd_data": lambda: cg.conv_backward_data(dys, ws, spec.src, algorithm="taps", **_kw(spec)),
                     "bwd_weights": lambda: cg.conv_backward_weights(xs, dys, spec.kernel, algorithm="taps",
                                                                     **_kw(spec))}
            for d, call in calls.items():
                one = gemm.small_pointwise(spec, d, *operands[d], np.dtype(dt))
                if d == "bwd_weights" and spec.mb > 1 and math.prod(spec.src) > 1:
                    assert one is None, str(spec)
                    continue
                assert one is not None and one.shape == want[d].shape and one.dtype == dt, (d, str(spec))
                assert rel_err(one, want[d]) <= tol, (d, str(spec), dt)
                assert np.array_equal(call(), one), (d, str(spec))
                with monkeypatch.context() as m:                 # the planned path agrees
                    m.setattr(gemm, "SMALL_POINTWISE_MAX_FLOPS", 0)
                    assert gemm.small_pointwise(spec, d, *operands[d], np.dtype(dt)) is None
                    assert rel_err(call(), want[d]) <= tol, (d, str(spec), dt)
            assert all(np.array_equal(a, b) for a, b in zip(keep, (xs, ws, dys)))
    x, w = rng.standard_normal((2, 8, 5, 6)), rng.standard_normal((6, 8, 1, 1))
    others = [(_spec(2, 8, 6, 2, (5, 6), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)), None),    # grouped
              (_spec(2, 8, 6, 1, (5, 6), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0)), None),    # strided
              (_spec(2, 8, 6, 1, (5, 6), (1, 1), (1, 1), (1, 1), (1, 0), (0, 0)), None),    # padded
              (_spec(2, 8, 6, 1, (5, 6), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), None),    # 3x3
              (_spec(16, 256, 256, 1, (28, 28), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)), None),  # large
              (_spec(2, 8, 6, 1, (5, 6), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)), "strided"),
              (_spec(2, 8, 6, 1, (5, 6), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)), "half")]
    for spec, how in others:
        xs = np.zeros(spec.src_shape) if how is None else x[:, :, :, ::-1] if how == "strided" else x.astype(np.float16)
        ws = np.zeros(spec.weights_shape) if how is None else w
        assert gemm.small_pointwise(spec, "fwd", xs, ws, np.dtype(np.float64)) is None, (str(spec), how)


def _one_thread(call):
    """``call()`` with convgrad on one thread."""
    cg.set_num_threads(1)
    try:
        return call()
    finally:
        cg.set_num_threads(None)


def _half_inputs_and_thread_bits(spec, dy, w, alg):
    """``alg``'s data gradient of half inputs against the reference (one rounding of each
    input and of the result), and the same bits on 1 and 2 threads in float32; returns
    the float32 inputs."""
    half = cg.conv_backward_data(dy.astype(np.float16), w.astype(np.float16), spec.src, algorithm=alg, **_kw(spec))
    want = ref.conv_backward_data(spec, dy.astype(np.float16).astype(np.float64), w.astype(np.float16).astype(np.float64))
    assert half.dtype == np.float16 and rel_err(half, want) <= 1e-2, str(spec)
    f32 = (dy.astype(np.float32), w.astype(np.float32))
    two = cg.conv_backward_data(*f32, spec.src, algorithm=alg, **_kw(spec))
    assert np.array_equal(_one_thread(lambda: cg.conv_backward_data(*f32, spec.src, algorithm=alg, **_kw(spec))), two)
    return f32


def test_pointwise_data_gradient_on_packed_rows_in_channel_chunks(monkeypatch):
    """1x1 data gradients of short images (2 to POINTWISE_MIN_ROWS - 1 positions) pack
    diff_dst once and run fixed input-channel chunks, each one product over every image:
    odd and even batches, groups, chunks of unequal size, 1-D to 3-D, float64, half and
    non-contiguous inputs match the reference; the same bits on 1 and 2 threads; a cap too
    small for the packed rows falls back to the blocks; the rule is a pure function."""
    from convgrad.kernels import gemm
    real = _spec(9, 2048, 512, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))     # resnet_50 res5b_branch2a
    assert gemm.packed_pointwise_chunks(real) == 2 and cg.choose_algorithm(real, "bwd_data") == "taps"
    for other in (_spec(19, 512, 1024, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),      # chunks too narrow
                  _spec(9, 2048, 512, 1, (14, 14), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),     # in place
                  _spec(9, 2048, 512, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 1), (0, 0)),       # padded
                  _spec(32, 2048, 5, 1, (1, 1), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))):       # one position
        assert gemm.packed_pointwise_chunks(other) == 0, str(other)
    monkeypatch.setattr(gemm, "PACKED_POINTWISE_MIN_CHANNELS", 2)
    monkeypatch.setattr(gemm, "PARALLEL_FLOPS", 0)
    rng = np.random.default_rng(43)
    cases = [_spec(3, 5, 4, 1, (3, 5), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),
             _spec(4, 12, 6, 2, (7,), (1,), (1,), (1,), (0,), (0,)),
             _spec(1, 9, 7, 1, (2, 3, 2), (1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))]
    for spec in cases:
        assert gemm.packed_pointwise_chunks(spec) == 2
        _check_all(spec, rng, algorithms=("taps",))
        dy = rng.standard_normal(spec.dst_shape)[..., ::-1]                     # not contiguous
        _half_inputs_and_thread_bits(spec, dy, rng.standard_normal(spec.weights_shape), "taps")
    # 16 images: the packed rows (5760 bytes) and a chunk's result (3840) exceed the cap,
    # one image's block of the other path does not
    spec = _spec(16, 8, 6, 1, (3, 5), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))
    dy = rng.standard_normal(spec.dst_shape).astype(np.float32)
    w = rng.standard_normal(spec.weights_shape).astype(np.float32)
    with cg.workspace_limit(5760 + 3840 - 1):
        small = cg.conv_backward_data(dy, w, spec.src, algorithm="taps", **_kw(spec))
    assert rel_err(small, ref.conv_backward_data(spec, dy.astype(np.float64), w.astype(np.float64))) <= 1e-5
    assert gemm._packed_pointwise_data(spec, dy, w, np.float32, 2, 5760 + 3840 - 1) is None
    assert rel_err(gemm._packed_pointwise_data(spec, dy, w, np.float32, 2, 5760 + 3840), small) <= 1e-6


def test_pointwise_products_one_image_per_item(monkeypatch):
    """1x1 forwards and data gradients of images of fewer than POINTWISE_ITEM_MAX_POSITIONS
    positions run one image per item and an odd batch's last image as two halves of its
    result channels (a pure rule): odd and even batches, one image, groups, unequal halves,
    1-D to 3-D, float64, half and non-contiguous inputs match the reference; the same bits
    on 1 and 2 threads."""
    from convgrad.kernels import gemm
    conv8 = _spec(9, 512, 512, 1, (14, 14), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))   # mobilenet conv8
    assert gemm.pointwise_items(conv8, "bwd_data") == [(n, 0, 512) for n in range(8)] + [(8, 0, 256), (8, 256, 512)]
    conv5 = _spec(19, 128, 256, 1, (28, 28), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))  # 128 rows: halves of 64
    assert gemm.pointwise_items(conv5, "bwd_data")[-2:] == [(18, 0, 64), (18, 64, 128)]
    assert gemm.pointwise_items(conv5, "fwd")[-2:] == [(18, 0, 128), (18, 128, 256)]
    assert gemm.pointwise_items(_spec(8, 512, 512, 1, (14, 14), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),
                                "fwd") == [(n, 0, 512) for n in range(8)]
    assert gemm.pointwise_items(_spec(1, 512, 256, 1, (812,), (1,), (1,), (1,), (0,), (0,)),
                                "bwd_data") == [(0, 0, 256), (0, 256, 512)]                 # wavenet conv1d_1x1_2
    assert gemm.pointwise_items(_spec(9, 32, 256, 1, (28, 28), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),
                                "bwd_data")[-1] == (8, 0, 32)                              # halves too short
    for other in (_spec(1, 100, 100, 1, (40, 40), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)), # one short item
                  _spec(9, 128, 128, 1, (56, 56), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),  # large images
                  _spec(9, 512, 512, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),    # short images
                  _spec(9, 512, 512, 1, (14, 14), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0)),  # strided
                  _spec(9, 512, 512, 1, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),  # 3x3
                  _spec(3, 16, 16, 1, (14, 14), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))):   # too small
        assert gemm.pointwise_items(other, "bwd_data") == gemm.pointwise_items(other, "fwd") == [], str(other)
    monkeypatch.setattr(gemm, "POINTWISE_MIN_ROWS", 4)
    monkeypatch.setattr(gemm, "POINTWISE_HALF_MIN_CHANNELS", 2)
    monkeypatch.setattr(gemm, "PARALLEL_FLOPS", 0)
    rng = np.random.default_rng(53)
    cases = [_spec(3, 5, 4, 1, (3, 5), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),             # halves 2 + 3, 2 + 2
             _spec(4, 12, 6, 2, (7,), (1,), (1,), (1,), (0,), (0,)),
             _spec(1, 9, 7, 1, (2, 3, 2), (1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0)),
             _spec(5, 8, 10, 2, (2, 3), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))]
    for spec in cases:
        for d in ("fwd", "bwd_data"):
            items = gemm.pointwise_items(spec, d)
            rows = spec.icg if d == "bwd_data" else spec.ocg
            assert [n for n, _, _ in items] == list(range(spec.mb)) + [spec.mb - 1] * (spec.mb % 2), (d, str(spec))
            assert (items[-1][1] > 0) == (spec.mb % 2 == 1) and items[-1][2] == rows, (d, str(spec))
        _check_all(spec, rng, algorithms=("taps",))
        x = rng.standard_normal(spec.src_shape)[..., ::-1]                      # not contiguous
        w = rng.standard_normal(spec.weights_shape)
        dy = rng.standard_normal(spec.dst_shape)[..., ::-1]
        half = cg.conv_forward(x.astype(np.float16), w.astype(np.float16), algorithm="taps", **_kw(spec))
        want = ref.conv_forward(spec, x.astype(np.float16).astype(np.float64), w.astype(np.float16).astype(np.float64))
        assert half.dtype == np.float16 and rel_err(half, want) <= 1e-2, str(spec)
        dy32, w32 = _half_inputs_and_thread_bits(spec, dy, w, "taps")
        x32 = x.astype(np.float32)
        calls = (lambda: cg.conv_forward(x32, w32, algorithm="taps", **_kw(spec)),
                 lambda: cg.conv_backward_data(dy32, w32, spec.src, algorithm="taps", **_kw(spec)))
        items_bits = [f() for f in calls]
        cg.set_num_threads(1)
        try:
            assert all(np.array_equal(f(), b) for f, b in zip(calls, items_bits)), str(spec)
        finally:
            cg.set_num_threads(None)


def test_pointwise_weight_gradient_of_an_odd_batch_in_two_halves(monkeypatch):
    """A 1x1 weight gradient of an odd batch sums two halves of the images' positions, the
    middle image cut between them, and one image's runs in two input-channel chunks (pure
    rules): grouped, 1-D to 3-D, float64, half and non-contiguous inputs match the
    reference; the same bits on 1 and 2 threads."""
    from convgrad.kernels import gemm
    conv8 = _spec(9, 512, 512, 1, (14, 14), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))   # mobilenet conv8
    assert gemm.pointwise_weight_halves(conv8) == [[(n, 0, 196) for n in range(4)] + [(4, 0, 98)],
                                                   [(4, 98, 196)] + [(n, 0, 196) for n in range(5, 9)]]
    for other in (_spec(8, 512, 512, 1, (14, 14), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),   # even batch
                  _spec(1, 512, 256, 1, (812,), (1,), (1,), (1,), (0,), (0,)),              # one image
                  _spec(9, 512, 512, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),    # short images
                  _spec(9, 512, 512, 1, (14, 14), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0)),  # strided
                  _spec(3, 16, 16, 1, (14, 14), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))):   # too small
        assert gemm.pointwise_weight_halves(other) == [], str(other)
    wavenet = _spec(1, 512, 256, 1, (812,), (1,), (1,), (1,), (0,), (0,))                 # conv1d_1x1_2
    assert gemm.pointwise_weight_columns(wavenet) == 2 and gemm.pointwise_weight_halves(wavenet) == []
    for other in (conv8, _spec(1, 32, 256, 1, (812,), (1,), (1,), (1,), (0,), (0,)),      # 16-channel chunks
                  _spec(1, 512, 256, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),    # short image
                  _spec(1, 64, 64, 1, (812,), (1,), (1,), (1,), (0,), (0,))):               # too small
        assert gemm.pointwise_weight_columns(other) == 1, str(other)
    monkeypatch.setattr(gemm, "POINTWISE_MIN_ROWS", 4)
    monkeypatch.setattr(gemm, "PARALLEL_FLOPS", 0)
    monkeypatch.setattr(gemm, "CHUNK_MIN_CHANNELS", 2)
    taken = []
    for name in ("pointwise_weight_halves", "pointwise_weight_columns"):
        real = getattr(gemm, name)
        monkeypatch.setattr(gemm, name, lambda spec, real=real: taken.append(real(spec)) or taken[-1])
    rng = np.random.default_rng(59)
    for spec in (_spec(3, 5, 4, 1, (9, 9), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),            # cut 40 | 41
                 _spec(5, 12, 6, 2, (70,), (1,), (1,), (1,), (0,), (0,)),
                 _spec(7, 9, 7, 1, (4, 5, 4), (1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0)),
                 _spec(1, 9, 4, 1, (9, 9), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),            # columns 4 | 5
                 _spec(1, 12, 6, 2, (70,), (1,), (1,), (1,), (0,), (0,))):
        taken.clear()
        _check_all(spec, rng, algorithms=("taps",))
        assert any(t not in ([], 1) for t in taken), str(spec)
        x = rng.standard_normal(spec.src_shape)[..., ::-1]                      # not contiguous
        dy = rng.standard_normal(spec.dst_shape)[..., ::-1]
        half = cg.conv_backward_weights(x.astype(np.float16), dy.astype(np.float16), spec.kernel,
                                        algorithm="taps", **_kw(spec))
        want = ref.conv_backward_weights(spec, x.astype(np.float16).astype(np.float64),
                                         dy.astype(np.float16).astype(np.float64))
        assert half.dtype == np.float16 and rel_err(half, want) <= 1e-2, str(spec)
        x32, dy32 = x.astype(np.float32), dy.astype(np.float32)
        two = cg.conv_backward_weights(x32, dy32, spec.kernel, algorithm="taps", **_kw(spec))
        cg.set_num_threads(1)
        try:
            assert np.array_equal(cg.conv_backward_weights(x32, dy32, spec.kernel, algorithm="taps", **_kw(spec)),
                                  two), str(spec)
        finally:
            cg.set_num_threads(None)


def test_packed_weight_halves_of_strided_and_short_1x1_layers(monkeypatch):
    """1x1 unpadded weight gradients of an odd batch that are not in-place products
    (strided, or images of fewer than POINTWISE_MIN_ROWS positions) and have no channel
    chunks sum two packed halves of the output positions (a pure rule): strides, groups,
    1-D to 3-D, float64, half and non-contiguous inputs match the reference on both GEMM
    lowerings; the same bits on 1 and 2 threads; a cap too small falls back."""
    from convgrad.kernels import gemm
    conv9 = _spec(19, 512, 1024, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))      # mobilenet conv9
    res5a_branch2a = _spec(19, 1024, 512, 1, (14, 14), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))
    assert gemm.packed_weight_halves(conv9, "im2col") == gemm.position_halves(19, 49)
    assert gemm.packed_weight_halves(res5a_branch2a, "taps") == gemm.position_halves(19, 49)
    assert gemm.position_halves(3, 5) == [[(0, 0, 5), (1, 0, 2)], [(1, 2, 5), (2, 0, 5)]]
    assert gemm.position_halves(1, 7) == [[(0, 0, 3)], [(0, 3, 7)]]
    for other, alg in ((_spec(18, 512, 1024, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)), "im2col"),  # even
                       (_spec(9, 512, 2048, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)), "taps"),     # chunks
                       (_spec(9, 512, 512, 1, (14, 14), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)), "taps"),    # in place
                       (_spec(19, 512, 1024, 1, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), "im2col"),  # 3x3
                       (_spec(19, 512, 1024, 1, (7, 7), (1, 1), (1, 1), (1, 1), (1, 0), (0, 0)), "im2col"),  # padded
                       (conv9, "blocked"), (_spec(3, 8, 8, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)), "taps")):
        assert gemm.packed_weight_halves(other, alg) == [], str(other)
    monkeypatch.setattr(gemm, "PARALLEL_FLOPS", 0)
    taken = []
    real = gemm.packed_weight_halves
    monkeypatch.setattr(gemm, "packed_weight_halves", lambda spec, alg: taken.append(real(spec, alg)) or taken[-1])
    rng = np.random.default_rng(61)
    for spec in (_spec(3, 5, 4, 1, (3, 5), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),            # 15 positions
                 _spec(5, 6, 4, 2, (9, 8), (1, 1), (2, 3), (1, 1), (0, 0), (0, 0)),            # strided, groups
                 _spec(7, 3, 5, 1, (11,), (1,), (3,), (2,), (0,), (0,)),
                 _spec(3, 4, 6, 1, (3, 6, 5), (1, 1, 1), (1, 2, 2), (1, 1, 1), (0, 0, 0), (0, 0, 0))):
        taken.clear()
        _check_all(spec, rng, algorithms=("taps", "im2col"))
        assert taken and all(taken), str(spec)
        x = rng.standard_normal(spec.src_shape)[..., ::-1]                      # not contiguous
        dy = rng.standard_normal(spec.dst_shape)[..., ::-1]
        for alg in ("taps", "im2col"):
            half = cg.conv_backward_weights(x.astype(np.float16), dy.astype(np.float16), spec.kernel,
                                            algorithm=alg, **_kw(spec))
            want = ref.conv_backward_weights(spec, x.astype(np.float16).astype(np.float64),
                                             dy.astype(np.float16).astype(np.float64))
            assert half.dtype == np.float16 and rel_err(half, want) <= 1e-2, str(spec)
            x32, dy32 = x.astype(np.float32), dy.astype(np.float32)
            two = cg.conv_backward_weights(x32, dy32, spec.kernel, algorithm=alg, **_kw(spec))
            cg.set_num_threads(1)
            try:
                one = cg.conv_backward_weights(x32, dy32, spec.kernel, algorithm=alg, **_kw(spec))
            finally:
                cg.set_num_threads(None)
            assert np.array_equal(one, two), str(spec)
    spec = _spec(3, 4, 6, 1, (4, 6), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))             # 6 output positions
    x = rng.standard_normal(spec.src_shape).astype(np.float32)
    dy = rng.standard_normal(spec.dst_shape).astype(np.float32)
    want = ref.conv_backward_weights(spec, x.astype(np.float64), dy.astype(np.float64))
    halves = gemm.position_halves(3, 6)
    assert gemm._packed_weight_halves(spec, x, dy, np.float32, halves, (10 * 9 + 24) * 4 - 1) is None
    assert rel_err(gemm._packed_weight_halves(spec, x, dy, np.float32, halves, (10 * 9 + 24) * 4), want) <= 1e-5


def _poison_recycled_results(monkeypatch, gemm):
    """Results that do not come zeroed start as NaN, so a test sees old contents of a
    recycled buffer that a lowering failed to overwrite."""
    real_result = gemm._result

    def poisoned(shape, dtype, zeroed):
        out, zero = real_result(shape, dtype, zeroed)
        if not zero:
            out.fill(np.nan)
        return out, zero

    monkeypatch.setattr(gemm, "_result", poisoned)


def _spy(monkeypatch, module, name):
    """Record what ``module.name`` returns at each call: (the records, the real function)."""
    taken, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a: taken.append(real(*a)) or taken[-1])
    return taken, real


def test_strided_1x1_data_gradient_of_short_images_packs_every_image(monkeypatch):
    """Strided unpadded 1x1 data gradients of fewer than POINTWISE_MIN_ROWS output
    positions per image pack diff_dst once and run input-channel chunks, each one product
    over every image spread to the cells it reads, zeros around (a pure rule): strides on
    some axes, cells past the last read one, groups, 1-D to 3-D, float64, half and
    non-contiguous inputs match the reference; a recycled result's old contents never
    leak; the same bits on 1 and 2 threads; without numba, or with a cap too small for the
    packed rows, the other lowerings run it."""
    from convgrad.kernels import gemm
    res5a_branch2a = _spec(19, 1024, 512, 1, (14, 14), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))
    res5a_branch1 = _spec(4, 1024, 2048, 1, (14, 14), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))
    for real in (res5a_branch2a, res5a_branch1):
        assert gemm.packed_pointwise_chunks(real) == 2 and not gemm.strided_1x1_data(real)
        assert cg.choose_algorithm(real, "bwd_data") == "taps"
    for other in (_spec(19, 512, 256, 1, (28, 28), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0)),    # 14x14 outputs
                  _spec(19, 128, 512, 1, (14, 14), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0)),    # chunks too narrow
                  _spec(19, 1024, 512, 1, (14, 14), (1, 1), (2, 2), (1, 1), (1, 1), (0, 0)),   # padded
                  _spec(2, 64, 64, 1, (14, 14), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))):      # small
        assert gemm.packed_pointwise_chunks(other) == 0, str(other)
    monkeypatch.setattr(gemm, "PACKED_STRIDED_MIN_CHANNELS", 2)
    monkeypatch.setattr(gemm, "PARALLEL_FLOPS", 0)
    _poison_recycled_results(monkeypatch, gemm)
    taken, real_packed = _spy(monkeypatch, gemm, "_packed_pointwise_data")
    rng = np.random.default_rng(71)
    for spec in (_spec(3, 5, 4, 1, (9, 12), (1, 1), (2, 3), (1, 1), (0, 0), (0, 0)),            # 5 x 4 outputs
                 _spec(5, 8, 4, 2, (10, 9), (1, 1), (3, 2), (1, 1), (0, 0), (0, 0)),            # groups, leftovers
                 _spec(4, 7, 3, 1, (23,), (1,), (3,), (2,), (0,), (0,)),                        # chunks 3 + 4
                 _spec(3, 4, 6, 1, (3, 9, 8), (1, 1, 1), (1, 2, 3), (1, 1, 1), (0, 0, 0), (0, 0, 0))):
        assert gemm.packed_pointwise_chunks(spec) == 2, str(spec)
        taken.clear()
        dy = rng.standard_normal(spec.dst_shape)
        w = rng.standard_normal(spec.weights_shape)
        want = ref.conv_backward_data(spec, dy, w)
        assert rel_err(cg.conv_backward_data(dy, w, spec.src, algorithm="taps", **_kw(spec)), want) <= 1e-12
        assert taken and (taken[-1] is not None or gemm._spread() is None), str(spec)
        f32 = _half_inputs_and_thread_bits(spec, dy[..., ::-1].copy()[..., ::-1], w, "taps")
        got = cg.conv_backward_data(*f32, spec.src, algorithm="taps", **_kw(spec))
        assert rel_err(got, want) <= 1e-5, str(spec)
        dyn = np.asfortranarray(f32[0])                                     # not C-contiguous
        assert np.array_equal(cg.conv_backward_data(dyn, f32[1], spec.src, algorithm="taps", **_kw(spec)), got)
    # the packed rows (4 x 60 x 4 bytes) and a chunk's result (2 x 60 x 4) against the cap
    spec = _spec(3, 4, 4, 1, (8, 9), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))              # 20 output positions
    dy = rng.standard_normal(spec.dst_shape).astype(np.float32)
    w = rng.standard_normal(spec.weights_shape).astype(np.float32)
    want = ref.conv_backward_data(spec, dy.astype(np.float64), w.astype(np.float64))
    assert real_packed(spec, dy, w, np.float32, 2, 960 + 480 - 1) is None
    if gemm._spread() is not None:
        assert rel_err(real_packed(spec, dy, w, np.float32, 2, 960 + 480), want) <= 1e-5
    monkeypatch.setenv("CONVGRAD_NUMBA", "0")                       # the blocks run it without numba
    assert gemm._spread() is None and real_packed(spec, dy, w, np.float32, 2, 1 << 30) is None
    assert rel_err(cg.conv_backward_data(dy, w, spec.src, algorithm="taps", **_kw(spec)), want) <= 1e-5


def test_strided_1x1_forward_gathers_each_image(monkeypatch):
    """Strided unpadded 1x1 forwards of images of at least POINTWISE_MIN_ROWS output
    positions (the data gradient's pure rule) gather each image's read cells and run its
    products into its rows of the result: strides on some axes, leftover cells past the
    last read one, groups, an odd batch's last image in two halves, 1-D to 3-D, float64,
    half and non-contiguous inputs match the reference; the same bits on 1 and 2
    threads; a cap too small for one image's cells falls back to the blocks."""
    from convgrad.kernels import gemm
    res3a_branch2a = _spec(19, 256, 128, 1, (56, 56), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))
    assert gemm.strided_1x1_forward(res3a_branch2a) and cg.choose_algorithm(res3a_branch2a, "fwd") == "taps"
    for other in (_spec(19, 1024, 512, 1, (14, 14), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0)),   # 7x7 outputs
                  _spec(19, 256, 128, 1, (56, 56), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),    # stride 1
                  _spec(19, 256, 128, 1, (56, 56), (1, 1), (2, 2), (1, 1), (1, 0), (0, 0))):   # padded
        assert not gemm.strided_1x1_forward(other), str(other)
    assert gemm._image_items(3, 128) == [(0, 0, 128), (1, 0, 128), (2, 0, 64), (2, 64, 128)]
    assert gemm._image_items(3, 127) == [(0, 0, 127), (1, 0, 127), (2, 0, 127)] and gemm._image_items(1, 127) == []
    assert gemm._image_items(1, 512) == [(0, 0, 256), (0, 256, 512)]
    monkeypatch.setattr(gemm, "PARALLEL_FLOPS", 0)
    monkeypatch.setattr(gemm, "POINTWISE_MIN_ROWS", 4)
    monkeypatch.setattr(gemm, "POINTWISE_HALF_MIN_CHANNELS", 2)
    taken, real = _spy(monkeypatch, gemm, "_strided_1x1_forward")
    rng = np.random.default_rng(73)
    for spec in (_spec(3, 5, 4, 1, (9, 12), (1, 1), (2, 3), (1, 1), (0, 0), (0, 0)),           # last image halved
                 _spec(5, 6, 8, 2, (10, 9), (1, 1), (3, 2), (1, 1), (0, 0), (0, 0)),           # groups, leftovers
                 _spec(4, 3, 5, 1, (23,), (1,), (3,), (2,), (0,), (0,)),
                 _spec(2, 4, 6, 1, (3, 9, 8), (1, 1, 1), (1, 2, 3), (1, 1, 1), (0, 0, 0), (0, 0, 0))):
        assert gemm.strided_1x1_forward(spec), str(spec)
        taken.clear()
        x = rng.standard_normal(spec.src_shape)
        w = rng.standard_normal(spec.weights_shape)
        want = ref.conv_forward(spec, x, w)
        assert rel_err(cg.conv_forward(x, w, algorithm="taps", **_kw(spec)), want) <= 1e-12, str(spec)
        assert taken == [True], str(spec)
        x32, w32 = x.astype(np.float32), w.astype(np.float32)
        got = cg.conv_forward(x32, w32, algorithm="taps", **_kw(spec))
        assert rel_err(got, want) <= 1e-5, str(spec)
        xn = np.asfortranarray(x32)                                         # not C-contiguous
        assert np.array_equal(cg.conv_forward(xn, w32, algorithm="taps", **_kw(spec)), got)
        half = cg.conv_forward(x.astype(np.float16), w.astype(np.float16), algorithm="taps", **_kw(spec))
        want16 = ref.conv_forward(spec, x.astype(np.float16).astype(np.float64), w.astype(np.float16).astype(np.float64))
        assert half.dtype == np.float16 and rel_err(half, want16) <= 1e-2, str(spec)
        assert np.array_equal(_one_thread(lambda: cg.conv_forward(x32, w32, algorithm="taps", **_kw(spec))), got)
    spec = _spec(3, 4, 6, 1, (8, 9), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))              # 20 output positions
    x = rng.standard_normal(spec.src_shape).astype(np.float32)
    w = rng.standard_normal(spec.weights_shape).astype(np.float32)
    dst = np.full(spec.dst_shape, 7.0, dtype=np.float32)
    assert real(spec, x, w, dst, np.float32, 4 * 20 * 4 - 1) is False and np.all(dst == 7.0)
    assert real(spec, x, w, dst, np.float32, 4 * 20 * 4) is True
    want = ref.conv_forward(spec, x.astype(np.float64), w.astype(np.float64))
    assert rel_err(dst, want) <= 1e-5
    spec = _spec(3, 4, 6, 1, (40, 9), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))             # 100 output positions
    x = rng.standard_normal(spec.src_shape).astype(np.float32)
    w = rng.standard_normal(spec.weights_shape).astype(np.float32)
    taken.clear()
    with cg.workspace_limit(4 * 100 * 4 - 1):                   # one image's cells do not fit: the blocks
        got = cg.conv_forward(x, w, algorithm="taps", **_kw(spec))
    assert taken == [False]
    assert rel_err(got, ref.conv_forward(spec, x.astype(np.float64), w.astype(np.float64))) <= 1e-5


def test_strided_1x1_data_gradient_spreads_each_image(monkeypatch):
    """Strided unpadded 1x1 data gradients of images of at least POINTWISE_MIN_ROWS output
    positions (a pure rule) run image by image, the products spread to the read cells with
    zeros around them: strides on some axes, leftover cells past the last read one, groups,
    1-D to 3-D, float64, half and non-contiguous inputs match the reference; the result's
    old contents (a recycled buffer) never leak; the same bits on 1 and 2 threads; a cap
    too small falls back."""
    from convgrad.kernels import gemm
    res3a_branch2a = _spec(19, 256, 128, 1, (56, 56), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))
    assert gemm.strided_1x1_data(res3a_branch2a)
    for other in (_spec(19, 1024, 512, 1, (14, 14), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0)),   # 7x7 outputs
                  _spec(19, 256, 128, 1, (56, 56), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),    # stride 1
                  _spec(19, 256, 128, 1, (56, 56), (1, 1), (2, 2), (1, 1), (1, 0), (0, 0)),    # padded
                  _spec(19, 256, 128, 1, (56, 56), (3, 3), (2, 2), (1, 1), (0, 0), (0, 0)),    # 3x3
                  _spec(1, 8, 8, 1, (32, 32), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))):        # small
        assert not gemm.strided_1x1_data(other), str(other)
    assert gemm._spread_rows(_spec(1, 1, 1, 1, (5, 3, 4), (1, 1, 1), (2, 3, 2), (1, 1, 1),
                                   (0, 0, 0), (0, 0, 0))).tolist() == [0, -1, -1, -1, -1, -1, 1, -1, -1,
                                                                       -1, -1, -1, 2, -1, -1]
    monkeypatch.setattr(gemm, "PARALLEL_FLOPS", 0)
    monkeypatch.setattr(gemm, "POINTWISE_MIN_ROWS", 4)
    taken, real = _spy(monkeypatch, gemm, "_strided_1x1_data")
    _poison_recycled_results(monkeypatch, gemm)
    rng = np.random.default_rng(67)

    def inputs(spec):
        return (rng.standard_normal(spec.dst_shape).astype(np.float32),
                rng.standard_normal(spec.weights_shape).astype(np.float32))

    for spec in (_spec(3, 5, 4, 1, (9, 12), (1, 1), (2, 3), (1, 1), (0, 0), (0, 0)),           # 5 x 4 outputs
                 _spec(5, 6, 4, 2, (10, 9), (1, 1), (3, 2), (1, 1), (0, 0), (0, 0)),           # groups, leftovers
                 _spec(4, 3, 5, 1, (23,), (1,), (3,), (2,), (0,), (0,)),
                 _spec(3, 4, 6, 1, (3, 9, 8), (1, 1, 1), (1, 2, 3), (1, 1, 1), (0, 0, 0), (0, 0, 0))):
        assert gemm.strided_1x1_data(spec), str(spec)
        taken.clear()
        dy, w = inputs(spec)
        want = ref.conv_backward_data(spec, dy.astype(np.float64), w.astype(np.float64))
        got = cg.conv_backward_data(dy, w, spec.src, algorithm="taps", **_kw(spec))
        assert taken and (taken[-1] is not None or gemm._spread() is None), str(spec)
        assert rel_err(got, want) <= 1e-5, str(spec)
        f64 = cg.conv_backward_data(dy.astype(np.float64), w.astype(np.float64), spec.src, algorithm="taps",
                                    **_kw(spec))
        assert rel_err(f64, want) <= 1e-12, str(spec)
        dyn = np.asfortranarray(dy)                                         # not C-contiguous
        assert np.array_equal(cg.conv_backward_data(dyn, w, spec.src, algorithm="taps", **_kw(spec)), got)
        half = cg.conv_backward_data(dy.astype(np.float16), w.astype(np.float16), spec.src, algorithm="taps",
                                     **_kw(spec))
        want16 = ref.conv_backward_data(spec, dy.astype(np.float16).astype(np.float64),
                                        w.astype(np.float16).astype(np.float64))
        assert half.dtype == np.float16 and rel_err(half, want16) <= 1e-2, str(spec)
        cg.set_num_threads(1)
        try:
            one = cg.conv_backward_data(dy, w, spec.src, algorithm="taps", **_kw(spec))
        finally:
            cg.set_num_threads(None)
        assert np.array_equal(one, got), str(spec)
    jit = gemm._spread()
    if jit is not None:                       # nothing written past a row (the next one's cells)
        for s, w_in, w_out in ((2, 9, 5), (2, 8, 4), (3, 23, 8), (3, 7, 3), (4, 13, 3)):
            buf = np.full(2 * 3 * w_in + 1, 7.0, dtype=np.float32)
            out = buf[:-1].reshape(2, 3, w_in)
            z = rng.standard_normal((2, 2, w_out)).astype(np.float32)
            jit.spread(z, out, np.array([1, -1, 0], dtype=np.int64), s)
            want = np.zeros((2, 3, w_in), dtype=np.float32)
            want[:, 0, :s * w_out:s], want[:, 2, :s * w_out:s] = z[:, 1], z[:, 0]
            assert buf[-1] == 7.0 and np.array_equal(out, want), (s, w_in, w_out)
    spec = _spec(3, 4, 6, 1, (8, 9), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))              # 20 output positions
    dy, w = inputs(spec)
    assert gemm._strided_1x1_data(spec, dy, w, np.float32, 4 * 20 * 4 - 1) is None
    if jit is not None:
        want = ref.conv_backward_data(spec, dy.astype(np.float64), w.astype(np.float64))
        assert rel_err(gemm._strided_1x1_data(spec, dy, w, np.float32, 4 * 20 * 4), want) <= 1e-5
    monkeypatch.setenv("CONVGRAD_NUMBA", "0")                       # the blocks run it without numba
    assert gemm._spread() is None and gemm._strided_1x1_data(spec, dy, w, np.float32, 1 << 30) is None
    want = ref.conv_backward_data(spec, dy.astype(np.float64), w.astype(np.float64))
    assert rel_err(cg.conv_backward_data(dy, w, spec.src, algorithm="taps", **_kw(spec)), want) <= 1e-5


def test_col2im_data_gradient_of_one_image_in_column_chunks(monkeypatch):
    """A col2im data gradient of one image cut into row slabs, with huge kernels (the
    ``rows`` and ``classes`` scatters), splits Z's columns instead: halves of the input
    channels (groups too), or with one channel halves of the kernel's first axis (each
    scattered shifted by its first tap; chunks overlap in dsrc and add in order). Pads
    that crop, dilation, 2-D, float64 and half inputs match the reference, with the same
    bits on 1 and 2 threads; a cap too small for a chunk falls back to the slabs; the rule
    is pure and leaves the channel-last and phase scatters (3d_unet conv_8) to the slabs."""
    from convgrad.kernels import gemm
    istft = _spec(1, 1, 1026, 1, (58112,), (1024,), (256,), (1,), (0,), (0,))
    unet8 = _spec(1, 256, 512, 1, (6, 7, 7), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))

    def chunks(spec):
        geom = gemm.geometry(spec)
        blocks = gemm.plan(geom, "bwd_data", "im2col", 4, dispatch.DEFAULT_WORKSPACE_LIMIT, dispatch.ROWS_TARGET)
        return gemm.column_chunks(spec, blocks)

    assert chunks(istft) == ("taps", 2)          # (on hosts without blocked's framed product: im2col)
    want = "blocked" if dispatch.blocked_pays(istft, "bwd_data") and dispatch.blocked.available() else "im2col"
    assert cg.choose_algorithm(istft, "bwd_data") == want
    assert chunks(unet8) == ("", 1)
    assert chunks(_spec(2, 1, 1026, 1, (58112,), (1024,), (256,), (1,), (0,), (0,))) == ("", 1)    # two images
    monkeypatch.setattr(gemm, "PARALLEL_FLOPS", 0)
    monkeypatch.setattr(dispatch, "ROWS_TARGET", 6)
    rng = np.random.default_rng(47)
    cases = [(_spec(1, 1, 6, 1, (70,), (16,), (4,), (1,), (3,), (5,)), "taps"),
             (_spec(1, 1, 5, 1, (83,), (16,), (8,), (2,), (4,), (0,)), "taps"),
             (_spec(1, 4, 6, 2, (70,), (16,), (4,), (1,), (2,), (2,)), "channels"),
             (_spec(1, 3, 4, 1, (45, 7), (16, 2), (4, 1), (1, 1), (1, 0), (2, 1)), "channels"),
             (_spec(1, 1, 4, 1, (45, 7), (17, 2), (4, 1), (1, 2), (1, 0), (2, 1)), "taps")]
    for spec, how in cases:
        assert chunks(spec) == (how, 2), str(spec)
        _check_all(spec, rng, algorithms=("im2col",))
        dy = rng.standard_normal(spec.dst_shape)
        w = rng.standard_normal(spec.weights_shape)
        f32 = _half_inputs_and_thread_bits(spec, dy, w, "im2col")
        assert gemm._col2im_column_chunks(spec, *f32, np.float32, how, 2, 64) is None       # a chunk needs more
        with cg.workspace_limit(64 << 10):
            assert rel_err(cg.conv_backward_data(*f32, spec.src, algorithm="im2col", **_kw(spec)),
                           ref.conv_backward_data(spec, dy, w)) <= 1e-5


def test_stride_one_unpadded_taps_read_and_write_in_place(monkeypatch):
    """Stride 1 without front padding: a one-image block's phase grid is ``src`` itself, and
    with no halo after axis 0 the forward result, ``diff_dst`` (weights gradient) and the
    data gradient are used in place. Slabs of one image (halo rows shared with the next
    slab), whole single images, depthwise (element-wise) products, groups, pads at the end
    only (packed again), and non-contiguous or half inputs (packed) all match the reference."""
    from convgrad.kernels import gemm
    rng = np.random.default_rng(41)
    cases = [_spec(2, 3, 5, 1, (23,), (3,), (1,), (2,), (0,), (0,)),
             _spec(1, 4, 6, 2, (9, 7), (3, 1), (1, 1), (1, 1), (0, 0), (0, 0)),
             _spec(2, 3, 4, 1, (8, 7), (2, 3), (1, 1), (1, 2), (0, 0), (0, 0)),
             _spec(1, 2, 3, 1, (6, 5, 7), (2, 2, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0)),
             _spec(2, 4, 4, 4, (15,), (3,), (1,), (1,), (0,), (0,)),
             _spec(2, 3, 5, 1, (17,), (4,), (1,), (1,), (0,), (2,))]
    for rows in (3, 8, dispatch.ROWS_TARGET):
        monkeypatch.setattr(dispatch, "ROWS_TARGET", rows)
        for spec in cases:
            _check_all(spec, rng, algorithms=("taps",))
    spec = cases[0]
    geom = gemm.geometry(spec)
    x = rng.standard_normal(spec.src_shape)
    b = gemm.Block(1, 1, 4, 9, False)
    view = gemm._src_flat(geom, x, b, 5 + geom.max_sh[0], np.float64)
    assert np.shares_memory(view, x) and view.shape == (1, 1, 3, 9)
    assert not np.shares_memory(gemm._src_flat(geom, np.asfortranarray(x), b, 7, np.float64), x)
    assert not np.shares_memory(gemm._src_flat(geom, x, b, 7, np.float32), x)
    w = rng.standard_normal(spec.weights_shape)
    dy = rng.standard_normal(spec.dst_shape)
    for got, want in ((cg.conv_forward(x.astype(np.float16), w.astype(np.float16), **_kw(spec)), ref.conv_forward(spec, x, w)),
                      (cg.conv_backward_data(dy[:, :, ::-1], w, spec.src, **_kw(spec)), ref.conv_backward_data(spec, dy[:, :, ::-1], w))):
        assert rel_err(got, want) <= 1e-2


def test_weights_gradient_channel_chunks(monkeypatch):
    """Deep layers (few rows, a result larger than the inputs) split the weights gradient
    over channels instead of rows (im2col: input channels, or output channels when there
    are too few input channels, the ISTFT's case; taps: output channels), each chunk
    written in place; with a cap that also splits the rows, each chunk sums its partials
    in block order. Exact against the reference, bitwise across thread counts."""
    import threadpoolctl
    from convgrad.kernels import gemm
    monkeypatch.setattr(gemm, "PARALLEL_FLOPS", 0)
    monkeypatch.setattr(gemm, "CHUNK_MIN_CHANNELS", 2)
    gemm._plan_cached.cache_clear()
    rng = np.random.default_rng(51)
    specs = [_spec(2, 10, 12, 1, (2, 3), (3, 2), (1, 1), (1, 1), (1, 0), (1, 1)),
             _spec(3, 40, 48, 1, (4, 3), (1, 1), (2, 1), (1, 1), (0, 0), (0, 0)),
             _spec(2, 8, 5, 1, (1, 1), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),
             _spec(1, 5, 9, 1, (6,), (3,), (2,), (1,), (1,), (1,)),
             _spec(1, 1, 10, 1, (40,), (16,), (4,), (1,), (0,), (0,)),
             _spec(1, 2, 12, 1, (4, 20), (3, 8), (1, 4), (1, 1), (0, 1), (1, 0))]
    for spec in specs:
        for alg in FAST:
            assert gemm.weight_chunks(spec, "bwd_weights", alg) == 2, (spec, alg)
        assert gemm.weight_chunk_axis(spec, "im2col") == (2 if spec.icg >= 4 else 1), str(spec)
        larger = spec.icg * len(gemm.geometry(spec).phases) > spec.ocg          # taps: the larger operand
        assert gemm.weight_chunk_axis(spec, "taps") == (2 if spec.icg >= 4 and larger else 1), str(spec)
        x = rng.standard_normal(spec.src_shape)
        dy = rng.standard_normal(spec.dst_shape)
        want = ref.conv_backward_weights(spec, x, dy)
        for alg in FAST:
            geom = gemm.geometry(spec)
            whole = gemm.Block(0, spec.mb, 0, gemm._extent(geom, "bwd_weights", alg)[0], True)
            small = gemm.workspace_bytes(geom, "bwd_weights", alg, whole, 8) - 1
            assert len(gemm.plan(geom, "bwd_weights", alg, 8, small, dispatch.ROWS_TARGET)) > 1
            runs = []
            for cap in (1 << 30, small):                 # one row block; rows split too
                for n in (1, 2):
                    with threadpoolctl.threadpool_limits(n, user_api="blas"):
                        runs.append(cg.conv_backward_weights(x, dy, spec.kernel, algorithm=alg,
                                                             workspace_limit=cap, **_kw(spec)))
            for got in runs:
                assert rel_err(got, want) <= 1e-12, (alg, str(spec))
            np.testing.assert_array_equal(runs[0], runs[1])
            np.testing.assert_array_equal(runs[2], runs[3])
    # rows' elements up to CHUNK_MAX_ROW_RATIO (1.25) times the weights: resnet_50
    # res5a_branch2c (9 images, 1.08x) splits, 12 images (1.43x) keep their row blocks
    for mb, chunks in ((9, 2), (12, 1)):
        deep = _spec(mb, 512, 2048, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))
        assert [gemm.weight_chunks(deep, "bwd_weights", alg) for alg in FAST] == [chunks] * len(FAST)
    # chunks first: res4a_branch2b (256 -> 256, 3x3, 14^2) at 3, 4 and 6 images, its rows
    # within im2col's row target (8192 x 512 / 2304), runs as one block in channel chunks,
    # not as two image blocks of at least MIN_BLOCK_ROWS rows with partial gradients
    monkeypatch.setattr(gemm, "PARALLEL_FLOPS", 20_000_000)
    monkeypatch.setattr(gemm, "CHUNK_MIN_CHANNELS", 32)
    for mb in (3, 4, 6):
        deep = _spec(mb, 256, 256, 1, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
        assert gemm.weight_chunks(deep, "bwd_weights", "im2col") == 2
        assert gemm._natural(gemm.geometry(deep), "bwd_weights", "im2col", dispatch.ROWS_TARGET) == (mb, 1), mb
    wide = _spec(8, 256, 256, 1, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))    # 1568 rows: no chunks
    assert gemm.weight_chunks(wide, "bwd_weights", "im2col") == 1
    assert gemm._natural(gemm.geometry(wide), "bwd_weights", "im2col", dispatch.ROWS_TARGET) == (4, 1)
    gemm._plan_cached.cache_clear()


def test_blocks_run_on_every_thread_and_errors_propagate():
    """Blocks that write their own results are taken by whichever thread (the caller
    included) is free; each runs exactly once, and an error in any of them is raised."""
    import threading

    from convgrad.kernels import gemm
    seen, names = [], set()

    def work(i):
        seen.append(i)
        names.add(threading.current_thread().name)
    gemm._in_order(work, list(range(40)), 2, gemm._ignore)
    assert sorted(seen) == list(range(40))

    def fail(i):
        if i == 7:
            raise RuntimeError("block 7")
    with pytest.raises(RuntimeError, match="block 7"):
        gemm._in_order(fail, list(range(12)), 2, gemm._ignore)
    got = []
    gemm._in_order(lambda i: i * i, list(range(9)), 2, got.append)      # ordered partials
    assert got == [i * i for i in range(9)]


def test_ordered_blocks_do_not_wait_for_the_consumer():
    """``_in_order`` with partial results: the pool threads take the next block
    themselves, so a block starts while the caller is still consuming an earlier one (the
    caller's adds held back the next block for up to 3.5 ms on two cores); results are
    consumed in block order; at most ``alive`` exist at once (computed or waiting); an
    error in a block or in the consumer is raised, and the pool still works after."""
    import threading

    from convgrad.kernels import gemm
    started2 = threading.Event()
    lock = threading.Lock()
    live, peak, got = [0], [0], []

    def work(i):
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        if i == 2:
            started2.set()
        return i * i

    def consume(v):
        if v == 0:                 # block 0's consumer waits for block 2 to start
            assert started2.wait(10), "block 2 waited for the consumer of block 0"
        got.append(v)
        with lock:
            live[0] -= 1
    gemm._in_order(work, list(range(12)), 2, consume, 3)
    assert got == [i * i for i in range(12)]
    assert peak[0] <= 3

    live[0], peak[0] = 0, 0
    gemm._in_order(work, list(range(12)), 2, lambda v: consume(v + 1), 2)   # two alive: in step
    assert peak[0] <= 2

    def fail(i):
        if i == 5:
            raise RuntimeError("block 5")
        return i
    seen = []
    with pytest.raises(RuntimeError, match="block 5"):
        gemm._in_order(fail, list(range(12)), 2, seen.append, 3)
    assert seen == list(range(5))

    def bad_consume(v):
        if v == 3:
            raise ValueError("consumer")
    with pytest.raises(ValueError, match="consumer"):
        gemm._in_order(lambda i: i, list(range(12)), 2, bad_consume, 3)
    got.clear()
    gemm._in_order(lambda i: -i, list(range(7)), 2, got.append, 3)
    assert got == [-i for i in range(7)]


def test_pool_threads_placed_on_their_own_cpus(monkeypatch):
    """The submitting thread pins each pool thread it wakes to its own CPU of the caller's
    allowed set (other CPUs than the caller's first when the caller works too), so two
    threads of one call never share a core; a caller that works too is held on its own CPU
    for the call and gets its own mask back after, also when a block raises;
    CONVGRAD_SPREAD=0 and a single allowed CPU leave the threads alone."""
    import os
    import threading
    import time

    from convgrad import threads
    from convgrad.kernels import gemm
    real_getcpu, real_affinity = threads._getcpu, os.sched_getaffinity
    monkeypatch.setattr(threads, "_getcpu", lambda: (lambda: 1))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert threads.cpu_plan(2, caller_works=True) == [0, 2]
    assert threads.cpu_plan(3, caller_works=False) == [1, 0, 2]
    assert threads.cpu_plan(6, caller_works=True) == [0, 2, 3, 1, 0, 2]
    assert threads.call_plan(2, caller_works=True) == ([0, 2], 1)
    monkeypatch.setattr(threads, "_getcpu", lambda: (lambda: 7))    # a CPU outside the mask
    assert threads.call_plan(2, caller_works=False) == ([0, 1], None)
    monkeypatch.setattr(threads, "_getcpu", lambda: (lambda: 1))
    monkeypatch.setenv("CONVGRAD_SPREAD", "0")
    assert threads.cpu_plan(2, caller_works=True) is None
    monkeypatch.delenv("CONVGRAD_SPREAD")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert threads.cpu_plan(2, caller_works=True) is None
    monkeypatch.setattr(threads, "_getcpu", lambda: None)
    assert threads.cpu_plan(2, caller_works=True) is None
    monkeypatch.setattr(threads, "_getcpu", real_getcpu)
    monkeypatch.setattr(os, "sched_getaffinity", real_affinity)

    # the real machine: the pool threads of a call run pinned where the plan put them
    caller = os.sched_getaffinity(0)
    seen = {}

    def work(i):
        seen.setdefault(threading.get_native_id(), set()).add(frozenset(os.sched_getaffinity(0)))
        time.sleep(0.005)                                # long enough for the helper to take blocks
    gemm._in_order(work, list(range(16)), 2, gemm._ignore)
    plan = threads.cpu_plan(1, caller_works=True)
    assert os.sched_getaffinity(0) == caller
    helpers = {tid: aff for tid, aff in seen.items() if tid != threading.get_native_id()}
    if plan is None:                                     # one CPU, or no sched_getcpu here
        assert all(aff <= {frozenset(caller)} for aff in helpers.values())
    else:
        assert helpers
        for aff in helpers.values():
            assert all(len(a) == 1 and a <= caller for a in aff), aff
        ids = [w.native_id for w in gemm._POOL.workers[:1]]
        assert os.sched_getaffinity(ids[0]) <= caller and len(os.sched_getaffinity(ids[0])) == 1
        # run_each: the caller works too and is held on one CPU, not its helper's
        me, masks = threading.get_native_id(), {}

        def held(i):
            masks.setdefault(threading.get_native_id() == me, set()).add(frozenset(os.sched_getaffinity(0)))
            time.sleep(0.005)
        gemm.run_each(held, list(range(8)), 2)
        assert os.sched_getaffinity(0) == caller
        if len(caller) > 1:
            (mine,), theirs = masks[True], masks.get(False, set())
            assert len(mine) == 1 and mine <= caller and all(mine != t for t in theirs), masks

        def fails(i):
            time.sleep(0.002)
            raise RuntimeError("block failed")
        with pytest.raises(RuntimeError, match="block failed"):
            gemm.run_each(fails, list(range(4)), 2)
        assert os.sched_getaffinity(0) == caller
        monkeypatch.setenv("CONVGRAD_SPREAD", "0")          # off: the pool threads get the CPUs back
        gemm._in_order(work, list(range(4)), 2, gemm._ignore)
        assert os.sched_getaffinity(ids[0]) == caller
        masks.clear()
        gemm.run_each(held, list(range(8)), 2)
        assert masks[True] == {frozenset(caller)}            # and the caller is left alone


def test_flipped_weights_copied_in_pieces(monkeypatch):
    """The stride-1 im2col data gradient transposes the weights (whole kernels) in pieces on
    the thread pool (large weights) and reads the windows reversed: same result, grouped or
    not, on 1 and 2 threads, for non-contiguous and converted weights."""
    import threadpoolctl
    from convgrad.kernels import gemm
    monkeypatch.setattr(gemm, "PARALLEL_COPY", 1)
    rng = np.random.default_rng(61)
    for spec in (_spec(2, 6, 4, 2, (7, 6), (3, 2), (1, 1), (1, 2), (1, 0), (1, 1)),
                 _spec(1, 5, 7, 1, (9,), (4,), (1,), (1,), (2,), (1,))):
        dy = rng.standard_normal(spec.dst_shape)
        w = rng.standard_normal(spec.weights_shape)
        want = ref.conv_backward_data(spec, dy, w)
        for n in (1, 2):
            with threadpoolctl.threadpool_limits(n, user_api="blas"):
                got = cg.conv_backward_data(dy, w, spec.src, algorithm="im2col", **_kw(spec))
            assert rel_err(got, want) <= 1e-12
        # weights not C-contiguous, and in a type that is converted first
        got = cg.conv_backward_data(dy, np.asfortranarray(w), spec.src, algorithm="im2col", **_kw(spec))
        assert rel_err(got, want) <= 1e-12
        h_dy, h_w = dy.astype(np.float16), w.astype(np.float16)
        got = cg.conv_backward_data(h_dy, h_w, spec.src, algorithm="im2col", **_kw(spec))
        h_want = ref.conv_backward_data(spec, h_dy.astype(np.float64), h_w.astype(np.float64))
        assert got.dtype == np.float16 and rel_err(got, h_want) <= 1e-2


def test_latent_data_gradient_scatters_instead_of_flipping():
    """A kernel far larger than the output (a transposed convolution from a 1x1x1 latent):
    the flipped forward would gather a column matrix T * C_out per input position (1.1 GB
    for a 28^3 kernel), so im2col runs col2im instead and the cost model picks it; exact
    against the reference and bitwise across thread counts."""
    import threadpoolctl
    from convgrad.kernels import gemm
    big = _spec(8, 8, 16, 1, (28, 28, 28), (28, 28, 28), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))
    same = _spec(2, 64, 64, 1, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    assert gemm.flipped_spec(big) is not None and gemm.flipped_data_gradient(big) is None
    assert gemm.flipped_data_gradient(same) == gemm.flipped_spec(same) is not None
    assert cg.choose_algorithm(big, "bwd_data") == "im2col"
    rng = np.random.default_rng(71)
    spec = _spec(3, 3, 5, 1, (7, 6, 5), (7, 5, 4), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))
    assert gemm.flipped_data_gradient(spec) is None
    dy = rng.standard_normal(spec.dst_shape).astype(np.float32)
    w = rng.standard_normal(spec.weights_shape).astype(np.float32)
    want = ref.conv_backward_data(spec, dy.astype(np.float64), w.astype(np.float64))
    runs = []
    for n in (1, 2):
        with threadpoolctl.threadpool_limits(n, user_api="blas"):
            runs.append(cg.conv_backward_data(dy, w, spec.src, algorithm="im2col", **_kw(spec)))
    assert rel_err(runs[0], want) <= 1e-5
    np.testing.assert_array_equal(runs[0], runs[1])


def test_col2im_scatter_layouts_match_reference(monkeypatch):
    """The col2im data gradient scatters channel-last (many channels, small outputs; Z in
    (tap, channel) order, or in the weights' own (channel, tap) order when the weights are
    heavy) or through stride-phase grids (few channels): all exact against the float64 reference
    over every output-size remainder, non-square kernels, C_in != C_out, groups, and
    bitwise identical across thread counts and workspace caps."""
    import threadpoolctl
    from convgrad.kernels import gemm
    monkeypatch.setattr(dispatch, "ROWS_TARGET", 64)           # several blocks (slabs) per call
    rng = np.random.default_rng(91)
    cases = []
    for extra in range(3):                                      # every (i + pads - ek) % s
        cases += [_spec(2, 24, 7, 1, (9 + extra, 8), (3, 2), (2, 2), (1, 1), (1, 0), (0, 1)),        # channels
                  _spec(1, 24, 64, 1, (7 + extra, 11), (3, 2), (2, 2), (1, 1), (1, 0), (0, 1)),      # channels_ct
                  _spec(1, 40, 6, 2, (5 + extra, 6, 4), (2, 3, 2), (2, 1, 2), (1, 1, 1), (0, 1, 1), (1, 0, 0)),
                  _spec(3, 3, 5, 1, (17 + extra, 12), (4, 3), (3, 2), (1, 2), (2, 1), (1, 0)),         # phases
                  _spec(2, 2, 7, 1, (11 + extra,), (5,), (2,), (2,), (3,), (0,)),
                  _spec(2, 2, 6, 1, (9 + extra, 7), (3, 2), (1, 1), (1, 1), (0, 0), (0, 0))]          # stride 1
    seen = set()
    for spec in cases:
        assert gemm.flipped_data_gradient(spec) is None
        for b in gemm._plan(gemm.geometry(spec), "bwd_data", "im2col", np.float32, 1 << 30, 64)[0]:
            seen.add(gemm._scatter_layout(spec, b))
        dy = rng.standard_normal(spec.dst_shape)
        w = rng.standard_normal(spec.weights_shape)
        got = cg.conv_backward_data(dy, w, spec.src, algorithm="im2col", **_kw(spec))
        assert rel_err(got, ref.conv_backward_data(spec, dy, w)) <= 1e-12, str(spec)
        dy32, w32 = dy.astype(np.float32), w.astype(np.float32)
        runs = []
        for n, cap in ((1, 1 << 30), (2, 1 << 30), (2, 1 << 20), (1, 256 << 10)):
            with threadpoolctl.threadpool_limits(n, user_api="blas"), cg.workspace_limit(cap):
                runs.append(cg.conv_backward_data(dy32, w32, spec.src, algorithm="im2col", **_kw(spec)))
        for other in runs[1:]:
            np.testing.assert_array_equal(runs[0], other, err_msg=str(spec))
    assert seen >= {"channels", "channels_ct", "phases"}


def test_spec_cache_never_skips_validation():
    """make_spec remembers validated plain-int specs; values that compare equal to a cached
    key (True == 1, a float 1.0, a NumPy integer) still go through the checks."""
    from convgrad import spec as spec_mod
    x = np.ones((1, 2, 5, 4), np.float32)
    w = np.ones((3, 2, 2, 3), np.float32)
    a = cg.conv_forward(x, w, strides=1, pads_begin=[1, 0])
    key_spec = make_spec("t", mb=1, ic=2, oc=3, groups=1, src=(5, 4), kernel=(2, 3), strides=1,
                         pads_begin=[1, 0], pads_end=0)
    assert make_spec("t", mb=1, ic=2, oc=3, groups=1, src=(5, 4), kernel=(2, 3), strides=1,
                     pads_begin=(1, 0), pads_end=0) is key_spec
    with pytest.raises(TypeError, match="strides"):
        cg.conv_forward(x, w, strides=True, pads_begin=[1, 0])
    with pytest.raises(TypeError, match="strides"):
        cg.conv_forward(x, w, strides=1.0, pads_begin=[1, 0])
    with pytest.raises(TypeError, match="groups"):
        cg.conv_forward(x, w, groups=True, pads_begin=[1, 0])
    np.testing.assert_array_equal(cg.conv_forward(x, w, strides=np.int64(1), pads_begin=[1, 0]), a)
    assert len(spec_mod._SPECS) <= spec_mod._SPECS_MAX


def test_call_cache_never_skips_validation():
    """The public functions remember validated call signatures (shapes, element types,
    plain-int attributes); a call that differs in any of them, or passes values that only
    compare equal to a remembered one, is still checked, and a hit gives the same result."""
    from convgrad import ops
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    w = rng.standard_normal((3, 2, 2, 3)).astype(np.float32)
    dy = rng.standard_normal((1, 3, 5, 2)).astype(np.float32)
    kw = dict(strides=[1, 1], pads_begin=[1, 0], pads_end=[0, 0])
    first = (cg.conv_forward(x, w, **kw), cg.conv_backward_data(dy, w, (5, 4), **kw),
             cg.conv_backward_weights(x, dy, (2, 3), **kw))
    assert sum(k[0].startswith("conv_") for k in ops._CALLS) >= 3
    again = (cg.conv_forward(x, w, **kw), cg.conv_backward_data(dy, w, (5, 4), **kw),
             cg.conv_backward_weights(x, dy, (2, 3), **kw))
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="strides"):
        cg.conv_forward(x, w, strides=[True, 1], pads_begin=[1, 0], pads_end=[0, 0])
    with pytest.raises(TypeError, match="groups"):
        cg.conv_backward_data(dy, w, (5, 4), groups=True, **kw)
    with pytest.raises(ValueError, match="diff_dst"):
        cg.conv_backward_weights(x, dy[:, :, :4], (2, 3), **kw)
    with pytest.raises(ValueError, match="diff_dst"):
        cg.conv_backward_data(dy, w, (6, 4), **kw)
    with pytest.raises(TypeError, match="element type"):
        cg.conv_forward(x, w.astype(np.float64), **kw)
    np.testing.assert_array_equal(cg.conv_forward(x, w, strides=np.int64(1), pads_begin=[1, 0]), first[0])
    assert len(ops._CALLS) <= ops._CALLS_MAX


def test_scratch_buffers_are_written_before_read_and_never_returned(monkeypatch):
    """Packing temporaries come from per-thread reused buffers (``gemm._scratch``), which
    hold the previous block's data. Poisoned with NaN before every use, they still give
    the reference results (every element read was written), results never share memory
    with them, and the results equal those of fresh buffers bitwise. Cases: several
    blocks (slabs, multi-image), strides with every remainder, pads, dilations, groups,
    1-3 spatial axes, the col2im layouts (huge kernel, deep channels) and the flipped
    data gradient."""
    from convgrad.kernels import gemm
    real = gemm._scratch
    seen = []

    def poisoned(slot, shape, dtype):
        out = real(slot, shape, dtype)
        if out.dtype.kind == "f":
            out.fill(np.nan)
        seen.append(out)
        return out

    rng = np.random.default_rng(61)
    cases = [_spec(3, 5, 7, 1, (23,), (3,), (2,), (1,), (1,), (0,)),
             _spec(3, 5, 7, 1, (24,), (3,), (2,), (1,), (0,), (1,)),
             _spec(2, 4, 6, 2, (11, 9), (3, 2), (1, 2), (1, 2), (1, 0), (0, 1)),
             _spec(5, 3, 4, 1, (13, 10), (2, 3), (1, 1), (1, 1), (1, 1), (0, 1)),
             _spec(2, 2, 3, 1, (6, 5, 7), (2, 2, 3), (1, 2, 1), (1, 1, 1), (1, 0, 1), (0, 1, 1)),
             _spec(2, 3, 2, 1, (5,), (9,), (1,), (1,), (4,), (4,)),             # kernel > output
             _spec(2, 24, 5, 1, (3, 3), (2, 2), (1, 1), (1, 1), (0, 0), (0, 0)),  # deep, tiny
             _spec(4, 4, 4, 4, (15,), (3,), (1,), (1,), (1,), (1,))]              # depthwise
    for rows in (5, 40, dispatch.ROWS_TARGET):
        monkeypatch.setattr(dispatch, "ROWS_TARGET", rows)
        for spec in cases:
            x = rng.standard_normal(spec.src_shape).astype(np.float32)
            w = rng.standard_normal(spec.weights_shape).astype(np.float32)
            dy = rng.standard_normal(spec.dst_shape).astype(np.float32)
            want = (ref.conv_forward(spec, x, w), ref.conv_backward_weights(spec, x, dy),
                    ref.conv_backward_data(spec, dy, w))
            for alg in FAST:
                def run():
                    return (cg.conv_forward(x, w, algorithm=alg, **_kw(spec)),
                            cg.conv_backward_weights(x, dy, spec.kernel, algorithm=alg, **_kw(spec)),
                            cg.conv_backward_data(dy, w, spec.src, algorithm=alg, **_kw(spec)))
                monkeypatch.setattr(gemm, "SCRATCH_KEEP", 0)          # fresh buffers
                fresh = run()
                monkeypatch.setattr(gemm, "SCRATCH_KEEP", 16 << 20)
                monkeypatch.setattr(gemm, "_scratch", poisoned)
                seen.clear()
                got = run()
                monkeypatch.setattr(gemm, "_scratch", real)
                for name, a, b, c in zip(("fwd", "bwd_weights", "bwd_data"), got, want, fresh):
                    assert rel_err(a, b) <= 1e-5, (name, alg, str(spec), rows)
                    np.testing.assert_array_equal(a, c, err_msg=f"{name} {alg} {spec} {rows}")
                    assert not any(np.shares_memory(a, s) for s in seen), (name, alg, str(spec))


def test_release_scratch_drops_every_threads_buffers():
    """``gemm.release_scratch`` (the benchmark's peak-memory measurement relies on it):
    after it, the calling thread and a pool thread get fresh buffers, not the kept ones."""
    from convgrad.kernels import gemm

    def grab():
        return gemm._scratch("a", (1000,), np.float32)

    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(1) as other:           # one long-lived thread, like a pool worker
        def in_other():
            return other.submit(grab).result()

        mine, theirs = grab(), in_other()
        assert np.shares_memory(grab(), mine) and np.shares_memory(in_other(), theirs)   # kept
        gemm.release_scratch()
        assert not np.shares_memory(grab(), mine)
        assert not np.shares_memory(in_other(), theirs)


def test_whole_window_products_match_reference(monkeypatch):
    """A kernel the size of the unpadded image (one window per image: a dense layer, the
    data gradient of a transposed conv from a 1x1x1 latent) runs as plain products on the
    canonical arrays (``gemm.whole_window_spec``). Against the float64 reference for every
    direction, groups, C_in != C_out, 1-3 spatial axes, non-square kernels, strides (the
    output is one position whatever they are), float32 and float64; bitwise identical on
    1 and 2 threads and under a small cap; strided inputs take the general path and agree;
    the inputs are not modified."""
    from convgrad.kernels import gemm
    monkeypatch.setattr(gemm, "PARALLEL_FLOPS", 1000)            # several blocks even here
    rng = np.random.default_rng(71)
    cases = [_spec(3, 4, 6, 2, (5,), (5,), (1,), (1,), (0,), (0,)),
             _spec(8, 6, 10, 1, (4, 7), (4, 7), (2, 3), (1, 1), (0, 0), (0, 0)),
             _spec(2, 3, 5, 1, (3, 2, 4), (3, 2, 4), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0)),
             _spec(16, 8, 16, 1, (12, 12, 12), (12, 12, 12), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))]
    assert all(gemm.whole_window_spec(s) for s in cases)
    assert not gemm.whole_window_spec(_spec(2, 3, 5, 1, (5, 6), (5, 5), (1, 1), (1, 1), (0, 0), (0, 0)))
    assert not gemm.whole_window_spec(_spec(2, 3, 5, 1, (5,), (3,), (1,), (2,), (0,), (0,)))
    for spec in cases:
        for dt in (np.float32, np.float64):
            _products_match_reference(spec, rng, dt, cap=1 << 16)


def _products_match_reference(spec, rng, dt, cap):
    """Every direction of ``spec`` on random ``dt`` inputs, on each GEMM lowering: within
    rounding of the float64 reference, the same bits on 2 and 1 threads and under the
    workspace ``cap``, strided (non-contiguous) inputs within rounding too, and the inputs
    unmodified."""
    x = rng.standard_normal(spec.src_shape).astype(dt)
    w = rng.standard_normal(spec.weights_shape).astype(dt)
    dy = rng.standard_normal(spec.dst_shape).astype(dt)
    kept = (x.copy(), w.copy(), dy.copy())
    want = (ref.conv_forward(spec, x, w), ref.conv_backward_weights(spec, x, dy),
            ref.conv_backward_data(spec, dy, w))
    tol = 1e-5 if dt == np.float32 else 1e-12
    for alg in FAST:
        def run(xx=x, ww=w, dd=dy):
            return (cg.conv_forward(xx, ww, algorithm=alg, **_kw(spec)),
                    cg.conv_backward_weights(xx, dd, spec.kernel, algorithm=alg, **_kw(spec)),
                    cg.conv_backward_data(dd, ww, spec.src, algorithm=alg, **_kw(spec)))
        cg.set_num_threads(2)
        two = run()
        cg.set_num_threads(1)
        one = run()
        cg.set_num_threads(None)
        with cg.workspace_limit(cap):
            capped = run()
        strided = run(x[..., ::-1].copy()[..., ::-1], np.asfortranarray(w), dy.copy(order="F"))
        for name, a, b, c, d, e in zip(("fwd", "bwd_weights", "bwd_data"), two, want, one, capped, strided):
            assert a.dtype == dt and a.shape == b.shape
            assert rel_err(a, b) <= tol, (name, alg, str(spec), dt)
            np.testing.assert_array_equal(a, c, err_msg=f"{name} {alg} {spec}")
            np.testing.assert_array_equal(a, d, err_msg=f"{name} {alg} {spec}")
            assert rel_err(e, b) <= tol, (name, alg, str(spec), dt)
    for before, after in zip(kept, (x, w, dy)):
        np.testing.assert_array_equal(before, after)


def test_framed_products_match_reference(monkeypatch):
    """1-D kernels of whole strides (an STFT's convolution, an ISTFT's transposed one) run as
    products on frame views of the canonical arrays (``gemm.framed_spec``). Against the
    float64 reference for every direction: C_in != C_out, groups, batches, a kernel of one
    stride (m = 1) and of several, input cells past the last frame (their data gradient is
    zero), float32 and float64; the work items tile each result exactly once; bitwise
    identical on 1 and 2 threads and under a small cap; strided inputs take the general
    path and agree; the inputs are not modified."""
    from convgrad.kernels import gemm
    monkeypatch.setattr(gemm, "FRAME_MIN_STRIDE", 8)              # small cases, same code
    monkeypatch.setattr(gemm, "FRAME_MIN_COLUMNS", 4)
    monkeypatch.setattr(gemm, "FRAME_MIN_CHANNELS", 2)
    rng = np.random.default_rng(73)
    cases = [_spec(1, 1, 13, 1, (8 * 9 + 5,), (32,), (8,), (1,), (0,), (0,)),       # ISTFT-like, tail 5
             _spec(2, 3, 5, 1, (10 * 6,), (20,), (10,), (1,), (0,), (0,)),
             _spec(3, 4, 6, 2, (12 * 4 + 11,), (12,), (12,), (1,), (0,), (0,)),     # m = 1
             _spec(1, 2, 7, 1, (16 * 3,), (48,), (16,), (1,), (0,), (0,))]          # one output
    assert all(gemm.framed_spec(s) for s in cases)
    for bad in (_spec(1, 1, 4, 1, (80,), (20,), (8,), (1,), (0,), (0,)),            # 20 % 8 != 0
                _spec(1, 1, 4, 1, (80,), (16,), (8,), (2,), (0,), (0,)),            # dilated
                _spec(1, 1, 4, 1, (80,), (16,), (8,), (1,), (8,), (0,)),            # padded
                _spec(1, 1, 4, 1, (80,), (4,), (4,), (1,), (0,), (0,)),             # stride below the floor
                _spec(1, 1, 4, 1, (16, 80), (1, 16), (1, 8), (1, 1), (0, 0), (0, 0))):   # 2-D
        assert not gemm.framed_spec(bad)
    for spec in cases:
        for direction, shape in (("fwd", spec.dst_shape), ("bwd_data", spec.src_shape),
                                 ("bwd_weights", spec.weights_shape)):
            hits = np.zeros(shape, dtype=int)
            for item in gemm.framed_blocks(spec, direction):
                s, og, cg_ = spec.strides[0], spec.ocg, spec.icg
                if direction == "bwd_data":
                    n, gi, c, r0, r1 = item
                    q = spec.dst[0] + spec.kernel[0] // s - 1
                    hits[n, gi * cg_ + c, :q * s].reshape(q, s)[:, r0:r1] += 1
                elif direction == "bwd_weights":
                    gi, c, j, o0, o1 = item
                    hits[gi * og + o0:gi * og + o1, c, j * s:(j + 1) * s] += 1
                else:
                    n, gi, o0, o1 = item
                    hits[n, gi * og + o0:gi * og + o1] += 1
            if direction == "bwd_data":
                q = spec.dst[0] + spec.kernel[0] // spec.strides[0] - 1
                assert (hits[..., :q * spec.strides[0]] == 1).all() and (hits[..., q * spec.strides[0]:] == 0).all()
            else:
                assert (hits == 1).all(), (direction, str(spec))
        for dt in (np.float32, np.float64):
            _products_match_reference(spec, rng, dt, cap=1 << 12)


def test_taps_data_gradient_zeroes_the_rows_no_phase_writes(monkeypatch):
    """The ``taps`` data gradient allocates its result uninitialised and each block zeroes
    its own input rows before writing its phases. Poisoned with NaN, the result still
    equals the reference: strides larger than the kernel (phases without taps), input rows
    past the last window, pads, 1-3 spatial axes, groups, slab blocks and whole-image ones;
    with a result of FRESH_PAGES_BYTES or more the blocks leave the zeroing to np.zeros."""
    from convgrad.kernels import gemm
    real = gemm._result
    poisoned = []

    def result(shape, dtype, zeroed):
        out, zero = real(shape, dtype, zeroed)
        if not zero:
            out.fill(np.nan)
            poisoned.append(out)
        return out, zero

    monkeypatch.setattr(gemm, "_result", result)
    rng = np.random.default_rng(67)
    cases = [_spec(3, 5, 7, 1, (24,), (1,), (3,), (1,), (0,), (2,)),               # 1x1, stride 3
             _spec(2, 4, 6, 2, (13, 11), (1, 2), (2, 3), (1, 1), (0, 1), (1, 0)),  # kernel < stride
             _spec(2, 3, 5, 1, (12, 9), (3, 2), (2, 2), (1, 1), (1, 0), (0, 1)),   # rows past the windows
             _spec(2, 3, 4, 1, (7, 6, 9), (2, 1, 2), (3, 2, 2), (1, 1, 1), (1, 0, 0), (0, 0, 1)),
             _spec(2, 4, 3, 1, (10, 8), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))]    # stride 1
    for rows in (3, 40, dispatch.ROWS_TARGET):
        monkeypatch.setattr(dispatch, "ROWS_TARGET", rows)
        for spec in cases:
            dy = rng.standard_normal(spec.dst_shape).astype(np.float32)
            w = rng.standard_normal(spec.weights_shape).astype(np.float32)
            poisoned.clear()
            got = cg.conv_backward_data(dy, w, spec.src, algorithm="taps", **_kw(spec))
            assert poisoned and np.shares_memory(got, poisoned[0]), str(spec)
            assert rel_err(got, ref.conv_backward_data(spec, dy, w)) <= 1e-5, (str(spec), rows)
    spec = cases[0]
    monkeypatch.setattr(gemm, "FRESH_PAGES_BYTES", 1)
    poisoned.clear()
    dy = rng.standard_normal(spec.dst_shape).astype(np.float32)
    w = rng.standard_normal(spec.weights_shape).astype(np.float32)
    got = cg.conv_backward_data(dy, w, spec.src, algorithm="taps", **_kw(spec))
    assert not poisoned
    assert rel_err(got, ref.conv_backward_data(spec, dy, w)) <= 1e-5


@pytest.mark.parametrize("alg", FAST)
def test_weight_gradients_take_one_block_per_thread(alg):
    """Each block of a weight gradient adds a partial result and reduces over its own rows
    only: a batch runs as two blocks of whole images, ceil(mb / 2) and the rest (an odd
    batch too), and one image as two slabs, where a forward or data gradient of the same
    problem gets MIN_BLOCKS; a 1x1 problem that ``taps`` runs on views of the arrays keeps
    two blocks past the row target (nothing is packed)."""
    from convgrad.kernels import gemm
    limit, target = dispatch.DEFAULT_WORKSPACE_LIMIT, dispatch.ROWS_TARGET
    even = _spec(4, 64, 64, 1, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    one = _spec(1, 64, 128, 1, (12, 14, 14), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))
    odd = _spec(9, 256, 256, 1, (28, 28), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))
    odd_s2 = _spec(19, 96, 64, 1, (28, 28), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))
    for spec in (even, one, odd, odd_s2):
        geom = gemm.geometry(spec)
        weights = gemm.plan(geom, "bwd_weights", alg, 4, limit, target)
        assert len(weights) == gemm.MIN_BLOCKS_WEIGHTS, (str(spec), weights)
        if spec.mb > 1:
            assert [b.nb for b in weights] == [-(-spec.mb // 2), spec.mb // 2], (str(spec), weights)
        assert len(gemm.plan(geom, "fwd", alg, 4, limit, target)) >= gemm.MIN_BLOCKS, str(spec)
    wide = _spec(8, 64, 96, 1, (56, 56), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))     # 4 x 3136 rows > target
    assert 4 * 56 * 56 > target
    blocks = gemm.plan(gemm.geometry(wide), "bwd_weights", "taps", 4, limit, target)
    assert [b.nb for b in blocks] == [4, 4]
