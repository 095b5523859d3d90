"""Fuzzing the canonical functions: every call returns the reference result or raises a
clean ConvError (a few hundred examples by default, 10,000 per function in the slow tier).

Floating results are compared with the float64 reference relative to the same sums taken
of the terms' magnitudes (``_sum_error``), the scale of a sum's rounding error: a result
that cancels to a small number (a weight gradient of -0.0066 from terms of order 1) has a
float32 rounding error near 1e-5 of itself, which a tolerance relative to the result alone
flagged. A wrong index or flip still errs by the size of the terms."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import convgrad as cg
from convgrad.kernels import reference as ref
from convgrad.spec import make_spec

from .fuzzing import BAD_DTYPES, GOOD_DTYPES, INT_DTYPES, array, attr_values, expect_clean_error, odd_scalars

FUNCS = ("conv_forward", "conv_backward_weights", "conv_backward_data")


@st.composite
def problems(draw):
    """A valid problem most of the time, then (about half the time) one or two mutations:
    a wrong rank, a bad attribute value or type, mismatched channels, a bad dtype, a
    diff_dst of the wrong shape, zero-sized dimensions."""
    nsp = draw(st.integers(1, 3))
    g = draw(st.integers(1, 3))
    cin, cout = g * draw(st.integers(1, 3)), g * draw(st.integers(1, 3))
    mb = draw(st.integers(0, 2))
    kernel = [draw(st.integers(1, 3)) for _ in range(nsp)]
    dil = [draw(st.integers(1, 2)) for _ in range(nsp)]
    strides = [draw(st.integers(1, 3)) for _ in range(nsp)]
    pb = [draw(st.integers(0, 2)) for _ in range(nsp)]
    pe = [draw(st.integers(0, 2)) for _ in range(nsp)]
    src = [max(draw(st.integers(1, 7)), d * (k - 1) + 1 - b - e) for k, d, b, e in zip(kernel, dil, pb, pe)]
    attrs = dict(strides=strides, dilations=dil, pads_begin=pb, pads_end=pe, groups=g)
    dt = dt2 = draw(st.sampled_from(GOOD_DTYPES * 3 + INT_DTYPES))
    x_shape, w_shape = [mb, cin, *src], [cout, cin // g, *kernel]
    spec = make_spec("probe", mb=mb, ic=cin, oc=cout, groups=g, src=src, kernel=kernel, strides=strides,
                     dilations=dil, pads_begin=pb, pads_end=pe)
    dy_shape = list(spec.dst_shape)
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):
        what = draw(st.sampled_from(["attr", "attr", "rank", "dim", "dtype", "dtype2", "groups", "dy"]))
        if what == "attr":
            attrs[draw(st.sampled_from(["strides", "dilations", "pads_begin", "pads_end"]))] = draw(attr_values(nsp))
        elif what == "groups":
            attrs["groups"] = draw(odd_scalars)
        elif what == "rank":
            target = draw(st.sampled_from(["x", "w", "dy"]))
            shape = {"x": x_shape, "w": w_shape, "dy": dy_shape}[target]
            if draw(st.booleans()) and shape:
                shape.pop()
            else:
                shape.append(draw(st.integers(1, 3)))
        elif what == "dim":
            shape = draw(st.sampled_from([x_shape, w_shape, dy_shape]))
            shape[draw(st.integers(0, len(shape) - 1))] = draw(st.integers(0, 8))
        elif what == "dtype":
            dt = dt2 = draw(st.sampled_from(BAD_DTYPES))
        elif what == "dtype2":
            dt2 = draw(st.sampled_from(GOOD_DTYPES + BAD_DTYPES + INT_DTYPES))
        else:
            dy_shape[draw(st.integers(0, len(dy_shape) - 1))] += draw(st.sampled_from([-1, 1]))
    fn = draw(st.sampled_from(FUNCS))
    x = array(draw, tuple(max(v, 0) for v in x_shape), dt)
    w = array(draw, tuple(max(v, 0) for v in w_shape), dt2)
    dy = array(draw, tuple(max(v, 0) for v in dy_shape), dt2)
    return fn, x, w, dy, src, kernel, attrs


def _call(fn, x, w, dy, src, kernel, attrs):
    if fn == "conv_forward":
        return cg.conv_forward(x, w, **attrs)
    if fn == "conv_backward_weights":
        return cg.conv_backward_weights(x, dy, kernel, **attrs)
    return cg.conv_backward_data(dy, w, src, **attrs)


def _oracle(fn, x, w, dy, src, kernel, attrs):
    nsp = len(src)
    spec = make_spec("oracle", mb=x.shape[0] if fn != "conv_backward_data" else dy.shape[0],
                     ic=(x.shape[1] if fn != "conv_backward_data" else w.shape[1] * attrs["groups"]),
                     oc=(w.shape[0] if fn != "conv_backward_weights" else dy.shape[1]),
                     groups=attrs["groups"], src=src if fn == "conv_backward_data" else x.shape[2:],
                     kernel=kernel if fn == "conv_backward_weights" else w.shape[2:],
                     **{k: v for k, v in attrs.items() if k != "groups"})
    assert spec.nsp == nsp or fn == "conv_forward"
    primary = dy if fn == "conv_backward_data" else x
    acc = np.int64 if primary.dtype.kind in "iu" else np.float64
    if fn == "conv_forward":
        return ref.conv_forward(spec, x.astype(acc), w.astype(acc))
    if fn == "conv_backward_weights":
        return ref.conv_backward_weights(spec, x.astype(acc), dy.astype(acc))
    return ref.conv_backward_data(spec, dy.astype(acc), w.astype(acc))


def _check(case):
    fn, x, w, dy, src, kernel, attrs = case
    before = [a.copy() for a in (x, w, dy)]
    try:
        got = _call(*case)
    except Exception as e:  # noqa: BLE001 - the contract is checked here
        expect_clean_error(fn, e)
        return "error"
    finally:
        for a, b in zip((x, w, dy), before):
            np.testing.assert_array_equal(a, b)
    want = _oracle(*case)
    assert got.shape == want.shape and got.dtype == (x if fn != "conv_backward_data" else dy).dtype
    assert got.flags.c_contiguous
    if got.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want.astype(got.dtype))
    else:
        tol = {2: 2e-2, 4: 1e-5, 8: 1e-12}[got.dtype.itemsize]
        assert _sum_error(case, got, want) <= tol
    return "ok"


def _sum_error(case, got, want) -> float:
    """||got - want|| / ||the same sums of the terms' magnitudes|| (module doc). That norm is
    never below ||want||, so this is looser than a tolerance relative to the result, by
    exactly the cancellation in it."""
    fn, x, w, dy, src, kernel, attrs = case
    scale = _oracle(fn, np.abs(x), np.abs(w), np.abs(dy), src, kernel, attrs)
    num = float(np.linalg.norm((got.astype(np.float64) - want).ravel()))
    den = float(np.linalg.norm(scale.astype(np.float64).ravel()))
    return num / den if den else num


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(problems())
def test_fuzz_canonical(case):
    _check(case)


@pytest.mark.slow
@settings(max_examples=30000, deadline=None, suppress_health_check=list(HealthCheck))
@given(problems())
def test_fuzz_canonical_slow(case):
    """30,000 examples over the three functions (about 10,000 each)."""
    _check(case)
