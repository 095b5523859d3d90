"""The result cache (``convgrad.kernels.results``): large results reuse the memory of
dropped ones, never while any view of them lives, within the cap; kernels writing into a
reused (dirty) buffer still give the reference result."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import convgrad as cg
from convgrad import make_spec
from convgrad.kernels import reference as ref
from convgrad.kernels import results

from .helpers import rel_err, spec_inputs, spec_kwargs


@pytest.fixture(autouse=True)
def _fresh_cache():
    results.release_result_cache()
    old = cg.get_result_cache_limit()
    yield
    cg.set_result_cache_limit(old)
    results.release_result_cache()


def _big_forward():
    """A forward whose result (2 x 7 x 160 x 136 float32, 1.2 MiB) is cached."""
    spec = make_spec("test", mb=2, ic=3, oc=7, groups=1, src=(162, 139), kernel=(3, 4))
    x, w, _ = spec_inputs(spec, np.random.default_rng(3), np.float32)
    assert np.prod(spec.dst_shape) * 4 >= results.MIN_BYTES
    cg.conv_forward(x, w)                     # compiles the loops
    results.release_result_cache()
    return spec, x, w


def test_a_dropped_result_is_reused_and_a_viewed_one_is_not():
    spec, x, w = _big_forward()
    want = ref.conv_forward(spec, x.astype(np.float64), w.astype(np.float64))
    first = cg.conv_forward(x, w)
    addr = first.ctypes.data
    assert rel_err(first, want) < 1e-6
    view = first[1, 2:4].T                    # a view outliving its array keeps the memory
    kept = view.copy()
    del first
    gc.collect()
    second = cg.conv_forward(x, w)
    assert not np.shares_memory(second, view)
    np.testing.assert_array_equal(view, kept)
    del view
    gc.collect()
    hits = results._stats["hits"]
    third = cg.conv_forward(x, w)
    assert results._stats["hits"] == hits + 1 and third.ctypes.data == addr
    np.testing.assert_array_equal(third, second)
    assert third.flags.c_contiguous and third.flags.writeable and third.dtype == np.float32


def test_the_cap_bounds_what_is_kept():
    spec, x, w = _big_forward()
    nbytes = results.take(spec.dst_shape, np.float32)[0].nbytes      # dropped at once: cached
    size = -(-nbytes // results.GRAIN) * results.GRAIN
    assert results.cached_bytes() == size
    a, b = cg.conv_forward(x, w), cg.conv_forward(x, w)              # one from the cache, one fresh
    assert results.cached_bytes() == 0
    cg.set_result_cache_limit(size)
    del a, b
    gc.collect()
    assert results.cached_bytes() == size                           # the second one over the cap went
    with cg.result_cache_limit(0):
        assert results.cached_bytes() == 0
        seen = dict(results._stats)
        c = cg.conv_forward(x, w)                                   # NumPy's own allocation
        assert results._stats == seen
        del c
        assert results.cached_bytes() == 0
    assert cg.get_result_cache_limit() == size
    cg.conv_forward(x, w)               # dropped at once (no pool thread keeps its task)
    assert results.cached_bytes() == size
    assert results.cached_bytes() == size
    cg.release_result_cache()
    assert results.cached_bytes() == 0


@pytest.mark.parametrize("bad, kind", [(-1, ValueError), (1.5, TypeError), ("1", TypeError), (True, TypeError)])
def test_bad_cache_limits(bad, kind):
    with pytest.raises(cg.ConvError, match="result_cache_limit") as err:
        cg.set_result_cache_limit(bad)
    assert isinstance(err.value, kind)


def _spec(n, ic, oc, g, src, k, s=None, pb=None, pe=None):
    nsp = len(src)
    return make_spec("test", mb=n, ic=ic, oc=oc, groups=g, src=src, kernel=k, strides=s or (1,) * nsp,
                     pads_begin=pb or (0,) * nsp, pads_end=pe or (0,) * nsp)


CASES = [
    ("taps", _spec(2, 3, 5, 1, (13, 11), (1, 1), (2, 3))),            # phases without taps
    ("taps", _spec(2, 4, 6, 2, (12, 9), (3, 2), (2, 2), (1, 0), (0, 1))),
    ("im2col", _spec(2, 4, 3, 1, (10, 8), (3, 2), (2, 1), (1, 1), (1, 0))),
    ("blocked", _spec(2, 16, 24, 1, (34, 29), (1, 1), (2, 2))),       # strided 1x1
    ("blocked", _spec(2, 8, 20, 1, (11, 9), (3, 2), None, (1, 0), (1, 1))),
    ("blocked", _spec(2, 8, 12, 1, (37,), (3,), None, (1,), (2,))),   # a line
    ("direct", _spec(2, 6, 6, 6, (15, 13), (3, 2), (2, 1), (1, 1), (0, 1))),   # depthwise
    ("direct", _spec(2, 3, 10, 1, (17, 15), (3, 3), (2, 2), (1, 1), (1, 1))),  # thin
    ("direct", _spec(2, 6, 6, 6, (31, 40), (1, 3), (2, 2), (0, 1), (0, 1))),   # up2, rows without taps
]


@pytest.mark.parametrize("alg, spec", CASES, ids=[f"{a}-{i}" for i, (a, _) in enumerate(CASES)])
def test_kernels_write_every_cell_of_a_reused_buffer(monkeypatch, alg, spec):
    """Every result goes through the cache (no size floor, exact sizes), and before each
    measured call every cached buffer is filled with NaN."""
    monkeypatch.setattr(results, "MIN_BYTES", 0)
    monkeypatch.setattr(results, "GRAIN", 4)
    x, w, dy = spec_inputs(spec, np.random.default_rng(11), np.float32)
    x64, w64, dy64 = x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64)
    kw = spec_kwargs(spec)
    calls = {
        "fwd": (lambda: cg.conv_forward(x, w, algorithm=alg, **kw), ref.conv_forward(spec, x64, w64)),
        "bwd_data": (lambda: cg.conv_backward_data(dy, w, spec.src, algorithm=alg, **kw),
                     ref.conv_backward_data(spec, dy64, w64)),
        "bwd_weights": (lambda: cg.conv_backward_weights(x, dy, spec.kernel, algorithm=alg, **kw),
                        ref.conv_backward_weights(spec, x64, dy64)),
    }
    for direction, (call, want) in calls.items():
        call()                                        # its result goes back to the cache
        for raw in results._free:
            raw.fill(0xFF)                            # float32 NaN
        hits = results._stats["hits"]
        got = call()
        assert rel_err(got, want) < 1e-5, direction
        if direction != "bwd_weights":
            assert results._stats["hits"] > hits, direction
