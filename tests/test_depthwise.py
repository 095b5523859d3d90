"""The compiled depthwise kernel (``algorithm="direct"``, kernels/depthwise.py): against the
float64 reference on random depthwise problems, determinism across threads and workspace
caps, inputs untouched, the NumPy fallback without numba, and the errors of the keyword."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import convgrad as cg
from convgrad import dispatch
from convgrad.kernels import depthwise as dwk
from convgrad.kernels import reference as ref
from convgrad.spec import make_spec

from .helpers import Tally, feasible, rel_err
from .helpers import spec_inputs as _inputs
from .helpers import spec_kwargs as _kw

needs_numba = pytest.mark.skipif(not dwk.available(), reason="numba is not installed (or CONVGRAD_NUMBA=0)")
TALLY = Tally("direct depthwise kernel vs float64 reference")


@pytest.fixture(scope="module", autouse=True)
def _report(request):
    yield
    TALLY.report(request)


@pytest.fixture(params=["phase", "channels_last"])
def variant(request, monkeypatch):
    """Both loop nests of the kernel: per-channel phase grids and channels-last blocks."""
    size = 1 << 40 if request.param == "channels_last" else -1
    monkeypatch.setattr(dwk, "SMALL_IMAGE", size)
    monkeypatch.setattr(dwk, "SMALL_IMAGE_BWD_WEIGHTS", size)
    if request.param == "channels_last":                 # not the row kernels' wide rows either
        monkeypatch.setattr(dwk, "ROW_MIN_WIDTH", 1 << 40)
        dwk._rows_take.cache_clear()
    yield request.param
    dwk._rows_take.cache_clear()


def _spec(n, c, mult, src, k, s, d, pb, pe):
    return make_spec("test", mb=n, ic=c, oc=c * mult, groups=c, src=src, kernel=k, strides=s, dilations=d,
                     pads_begin=pb, pads_end=pe)


def _all(spec, x, w, dy, **extra):
    return (cg.conv_forward(x, w, **_kw(spec), **extra),
            cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec), **extra),
            cg.conv_backward_data(dy, w, spec.src, **_kw(spec), **extra))


def _want(spec, x, w, dy):
    x, w, dy = (a.astype(np.float64) for a in (x, w, dy))
    return (ref.conv_forward(spec, x, w), ref.conv_backward_weights(spec, x, dy),
            ref.conv_backward_data(spec, dy, w))


def _check(spec, rng, dtype=np.float64):
    x, w, dy = _inputs(spec, rng, dtype)
    got = _all(spec, x, w, dy, algorithm="direct")
    # float64: rounding only; float32: rounding grows with the reduction length
    red = max(1, spec.mb * int(np.prod(spec.dst)), int(np.prod(spec.kernel)) * spec.ocg)
    tol = 1e-12 if dtype == np.float64 else 2e-6 * np.sqrt(red)
    for name, a, b in zip(("fwd", "bwd_weights", "bwd_data"), got, _want(spec, x, w, dy)):
        assert a.dtype == dtype and a.shape == b.shape, (name, str(spec))
        err = rel_err(a, b)
        nest = "channels_last" if dwk.SMALL_IMAGE > 0 else "phase"
        TALLY.record((name, np.dtype(dtype).name, f"{spec.nsp}-D", nest), err)
        assert err <= tol, (name, str(spec), err)


def _random_spec(rng, nsp, mult, huge_pads=False):
    while True:
        src = tuple(int(v) for v in rng.integers(1, 10, nsp))
        k = tuple(int(v) for v in rng.integers(1, 5, nsp))
        s = tuple(int(v) for v in rng.integers(1, 4, nsp))
        d = tuple(int(v) for v in rng.integers(1, 3, nsp))
        top = 12 if huge_pads else 3
        pb = tuple(int(v) for v in rng.integers(0, top, nsp))
        pe = tuple(int(v) for v in rng.integers(0, top, nsp))
        if nsp > 1 and len(set(k)) == 1:                     # non-square kernels only
            continue
        if feasible(src, k, d, pb, pe):
            return _spec(int(rng.choice([0, 1, 3])), int(rng.integers(1, 6)), mult, src, k, s, d, pb, pe)


@needs_numba
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mult", [1, 2, 3])
@pytest.mark.parametrize("nsp", [1, 2, 3])
def test_direct_matches_reference_random(nsp, mult, dtype, variant):
    rng = np.random.default_rng(100 * nsp + 10 * mult + (dtype == np.float32))
    for i in range(6):
        _check(_random_spec(rng, nsp, mult, huge_pads=(i % 3 == 2)), rng, dtype)


@needs_numba
@pytest.mark.parametrize("s", [1, 2, 3])
@pytest.mark.parametrize("extra", [0, 1, 2])
def test_direct_every_floor_remainder(s, extra, variant):
    """(i + pb + pe - ek) % s takes every value; unread trailing rows get exactly zero."""
    rng = np.random.default_rng(40 + 3 * s + extra)
    k, d, pb, pe = (3, 2), (2, 1), (1, 0), (0, 2)
    src = tuple(4 * s + ((extra - (b + e - (dd * (kk - 1) + 1))) % s) for kk, dd, b, e in zip(k, d, pb, pe))
    spec = _spec(2, 3, 2, src, k, (s, s), d, pb, pe)
    assert all((i + b + e - (dd * (kk - 1) + 1)) % s == extra % s for i, kk, dd, b, e in zip(src, k, d, pb, pe))
    _check(spec, rng)
    x, w, dy = _inputs(spec, rng)
    dx = cg.conv_backward_data(dy, w, spec.src, algorithm="direct", **_kw(spec))
    for ax in range(2):
        last = (spec.dst[ax] - 1) * s + d[ax] * (k[ax] - 1) - pb[ax]      # last input row read
        tail = [slice(None)] * 4
        tail[2 + ax] = slice(last + 1, None)
        assert not dx[tuple(tail)].any()


@needs_numba
@pytest.mark.parametrize("limits", [(4, 6), (3, 3), (1, 1)])
def test_weight_gradient_dot_plan_places_every_tap_once(limits):
    """The lane-sum calls of the phase-grid weight gradient (``_dot_plan``, pure): every tap
    in exactly one (call, row, column) slot, within the tile limits, at the grid offset the
    slot reads (``b_base + j*b_rs + r*a_step`` = its phase plane + its offset there), and a
    margin that covers the largest shift; a 3x3 stride-1 kernel is one 3 x 3 call and
    stride 2 one call per phase (4)."""
    r_max, j_max = limits
    rng = np.random.default_rng(11)
    specs = [_spec(1, 4, 1, (12, 13), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
             _spec(1, 4, 1, (12, 13), (3, 3), (2, 2), (1, 1), (1, 1), (0, 0))]
    for nsp in (1, 2, 3):
        specs += [_random_spec(rng, nsp, int(rng.integers(1, 3))) for _ in range(12)]
    for spec in specs:
        calls, taps, margin = dwk._dot_plan(spec, r_max, j_max)
        ins, outs, ks = (np.array(dwk._as3d(v, 0), dtype=np.int64) for v in (spec.src, spec.dst, spec.kernel))
        _, total, _, _, _, _, _, phase, off = dwk._jit()._setup(ins, outs, ks, dwk._geo(spec))
        seen = []
        for nr, nj, a_step, b_base, b_rs, first in calls:
            assert 1 <= nr <= r_max and 1 <= nj <= j_max and (nr - 1) * a_step <= margin
            for r in range(nr):
                for j in range(nj):
                    t = taps[first + r * nj + j]
                    assert b_base + j * b_rs + r * a_step == phase[t] * total + off[t], (str(spec), t)
                    seen.append(int(t))
        assert sorted(seen) == list(range(int(np.prod(spec.kernel)))), str(spec)
    assert [tuple(c[:2]) for c in dwk._dot_plan(specs[0], 4, 6)[0]] == [(3, 3)]
    assert len(dwk._dot_plan(specs[1], 4, 6)[0]) == 4


@needs_numba
@pytest.mark.parametrize("flip", [False, True])
def test_stencil_plan_places_every_tap_once(flip):
    """The compiled-stencil calls of the phase-grid forward / stride-1 data gradient
    (``_stencil_plan``, pure): every tap once, blocks within the kernel's limits, each tap
    at the offset its slot reads (``base + kh*q2 + kw*step`` = its phase plane + its
    offset, mirrored for the data gradient); a 3x3 stride-1 kernel is one 3 x 3 block."""
    from convgrad.kernels import _jit_common, _ukernel
    rng = np.random.default_rng(12)
    specs = [_spec(1, 4, 1, (12, 13), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))]
    for nsp in (1, 2, 3):
        specs += [_random_spec(rng, nsp, 1) for _ in range(12)]
    for spec in specs:
        if flip and any(s != 1 for s in spec.strides):
            spec = _spec(spec.mb, spec.ic, 1, spec.src, spec.kernel, (1,) * spec.nsp, spec.dilations,
                         spec.pads_begin, spec.pads_end)
        calls, taps = dwk._stencil_plan(spec, flip, 3, 3)
        ins, outs, ks = (np.array(dwk._as3d(v, 0), dtype=np.int64) for v in (spec.src, spec.dst, spec.kernel))
        q, total, _, max_off, _, _, _, phase, off = dwk._jit()._setup(ins, outs, ks, dwk._geo(spec))
        seen = []
        for kh, kw, base, step, first, _ in calls:
            assert 1 <= kh <= 3 and 1 <= kw <= 3
            for i in range(kh):
                for j in range(kw):
                    t = taps[first + i * kw + j]
                    want = phase[t] * total + (max_off - off[t] if flip else off[t])
                    assert base + i * q[2] + j * step == want, (str(spec), t)
                    seen.append(int(t))
        assert sorted(seen) == list(range(int(np.prod(spec.kernel)))), str(spec)
    assert [tuple(c[:2]) for c in dwk._stencil_plan(specs[0], flip, 3, 3)[0]] == [(3, 3)]
    for k in ((1, 1, 1, False), (3, 3, 4, True), (2, 3, 1, True)):
        assert _jit_common.stencil_key(*k) == _ukernel.stencil_key(*k)


@needs_numba
def test_phase_grids_without_the_micro_kernels(monkeypatch):
    """float32 problems on the phase grids where the compiled micro-kernels are missing keep
    the numba taps and register groups: the same problems match the reference in all three
    directions (stride-1 ones included, which otherwise run the compiled stencil)."""
    monkeypatch.setattr(dwk, "SMALL_IMAGE", -1)
    monkeypatch.setattr(dwk, "SMALL_IMAGE_BWD_WEIGHTS", -1)
    monkeypatch.setattr(dwk, "_micro_kernels", lambda: None)
    rng = np.random.default_rng(21)
    for nsp in (1, 2, 3):
        for _ in range(3):
            _check(_random_spec(rng, nsp, 2), rng, np.float32)
        _check(_spec(2, 3, 1, (9, 8, 7)[:nsp], (3, 2, 3)[:nsp], (1,) * nsp, (1,) * nsp, (1,) * nsp, (1,) * nsp),
               rng, np.float32)


@needs_numba
def test_direct_pads_larger_than_the_kernel_and_unit_shapes(variant):
    rng = np.random.default_rng(5)
    for spec in (_spec(2, 3, 2, (4, 3), (2, 3), (1, 2), (1, 1), (7, 5), (6, 9)),      # outputs of pure padding
                 _spec(1, 2, 1, (1,), (1,), (1,), (1,), (0,), (0,)),
                 _spec(3, 1, 4, (9, 1, 5), (3, 1, 2), (3, 1, 2), (2, 1, 3), (0, 0, 4), (4, 0, 0)),
                 _spec(1, 64, 1, (14, 15), (3, 3), (2, 2), (1, 1), (1, 1), (1, 0))):
        for dt in (np.float64, np.float32):
            _check(spec, rng, dt)


@needs_numba
def test_direct_stride_two_rows_every_width_and_pad(monkeypatch):
    """The stride-2 row copies into the phase grids (column pairs from column 0, the
    columns left over listed per call): every width, odd and even, with every front and
    back pad up to 3, so that a pair starts on either residue and the last column falls
    inside or outside the grid; 1-D rows, multiplier 2, on the phase-grid loop nest."""
    monkeypatch.setattr(dwk, "SMALL_IMAGE", -1)
    monkeypatch.setattr(dwk, "SMALL_IMAGE_BWD_WEIGHTS", -1)
    rng = np.random.default_rng(77)
    for w_in in range(1, 10):
        for k, d in ((2, 1), (3, 1), (3, 2), (4, 1)):
            for pb in range(4):
                for pe in range(3):
                    if not feasible((w_in,), (k,), (d,), (pb,), (pe,)):
                        continue
                    _check(_spec(2, 2, 2, (w_in,), (k,), (2,), (d,), (pb,), (pe,)), rng)


@needs_numba
def test_up2_micro_kernel_every_variant():
    """The compiled stride-2 data-gradient family (``_ukernel._up2_variant_ir``) against its
    formula: every (R, A, U) variant, masks cutting the first and last vectors, nothing
    stored outside ``[lo, hi)`` (the guard values stay)."""
    import ctypes
    from convgrad.kernels import _ukernel
    built = _ukernel.compiled()
    if built is None:
        pytest.skip("the micro-kernels need an x86-64 CPU with AVX2 and FMA")
    call = ctypes.CFUNCTYPE(None, *([ctypes.c_int64] * 9))(built.up2_address)
    V, rng = built.lanes, np.random.default_rng(8)
    for R in range(1, _ukernel.UP2_R + 1):
        for A in range(1, _ukernel.UP2_A + 1):
            for U in (1, _ukernel.UP2_U):
                for nvec, lo, hi in ((1, 0, V), (3, 1, 3 * V - 3), (2, 5, V + 2)):
                    x_rs, y_rs, x0 = 3 * V + 7, 4 * V + 3, 4 * (3 * V + 7) + 2
                    x = rng.standard_normal(10 * x_rs).astype(np.float32)
                    w = rng.standard_normal(2 * R * A).astype(np.float32)
                    y = np.full(U * y_rs + V, -9.0, np.float32)
                    call(_ukernel.up2_key(R, A, U), x.ctypes.data + 4 * x0, w.ctypes.data, y.ctypes.data, nvec, x_rs,
                         y_rs, lo, hi)
                    want = np.full_like(y, -9.0)
                    for u in range(U):
                        for i in range(lo, min(hi, nvec * V)):
                            want[u * y_rs + i] = sum(float(w[(r * A + a) * 2 + i % 2]) * float(x[x0 + (u - r) * x_rs
                                                     + i // 2 - a]) for r in range(R) for a in range(A))
                    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5, err_msg=str((R, A, U, nvec, lo, hi)))


def test_stride_two_data_gradient_plan_groups_rows_by_kernel_rows():
    """With stride 2 between rows, consecutive dx rows alternate between two sets of kernel
    rows; the ``up2`` plan groups each set's rows into calls of ``UP2_U`` rows (a call per
    row had cost mobilenet conv4_2/dw 28 calls per channel) and still stores every dx row
    that a tap reaches exactly once (pure: no micro-kernels needed)."""
    from convgrad.kernels._ukernel import UP2_A, UP2_R, UP2_U, up2_key
    for hw, k, p in ((28, 3, 1), (56, 3, 1), (57, 3, 0), (30, 4, 2)):
        out = (hw + 2 * p - k) // 2 + 1
        pe = (out - 1) * 2 + k - hw - p
        spec = _spec(1, 4, 1, (hw, hw), (k, k), (2, 2), (1, 1), (p, p), (pe, pe))
        calls, _, zero_rows, dims = dwk._up2_plan(spec, UP2_R, UP2_A, UP2_U, 8)
        W = int(dims[0])
        stored = []
        for key, _, _, y_off, y_rs in calls.tolist():
            u = key % 8
            first = (y_off + p) // W
            assert y_rs == 2 * W
            stored += [first + 2 * j for j in range(u)]
        assert sorted(stored + zero_rows.tolist()) == list(range(hw)), (hw, k, p)
        multi = sum(key % 8 for key, *_ in calls.tolist() if key % 8 == UP2_U)
        assert multi >= hw // 2, (hw, k, p, calls[:, 0].tolist())
        assert up2_key(1, 2, UP2_U) in calls[:, 0].tolist() or up2_key(2, 2, UP2_U) in calls[:, 0].tolist()


@needs_numba
def test_stride_two_data_gradient_straight_from_diff_dst(monkeypatch):
    """The float32 data gradient of layers with stride 2 along the rows and one output
    channel per input channel runs the compiled ``up2`` calls (``_up2_plan``) with no phase
    grids: every width and front pad (a pair starting on either parity), kernels 1-4 wide
    and 1-3 tall, stride 1 or 2 between rows (rows no tap reaches are zero), 1-D and 2-D,
    huge pads; the plans the kernel does not cover keep the phase grids."""
    monkeypatch.setattr(dwk, "SMALL_IMAGE", -1)
    monkeypatch.setattr(dwk, "SMALL_IMAGE_BWD_WEIGHTS", -1)
    if dwk._micro_kernels() is None:
        pytest.skip("the micro-kernels need an x86-64 CPU with AVX2 and FMA")
    rng = np.random.default_rng(78)
    covered = 0
    for w_in in range(5, 12):
        for kw in (1, 2, 3, 4):
            for pb in range(3):
                for kh, sh, ph in ((1, 1, 0), (3, 2, 1), (2, 1, 1), (3, 1, 0), (1, 2, 0)):
                    pe = (w_in + pb) % 2
                    spec = _spec(2, 3, 1, (7, w_in), (kh, kw), (sh, 2), (1, 1), (ph, pb), (0, pe))
                    if not feasible(spec.src, spec.kernel, (1, 1), spec.pads_begin, spec.pads_end):
                        continue
                    assert dwk._up2_args(spec, np.dtype(np.float32), False) is not None, str(spec)
                    covered += 1
                    _check(spec, rng, np.float32)
    assert covered > 300
    for spec in (_spec(1, 2, 1, (31,), (3,), (2,), (1,), (9,), (7,)),                 # huge pads, 1-D
                 _spec(1, 4, 1, (40, 45), (3, 3), (2, 2), (1, 1), (1, 1), (0, 1)),
                 _spec(2, 2, 1, (9, 30), (2, 4), (2, 2), (1, 1), (5, 6), (6, 2))):
        assert dwk._up2_args(spec, np.dtype(np.float32), False) is not None
        _check(spec, rng, np.float32)
    for spec in (_spec(1, 2, 2, (9, 30), (3, 3), (2, 2), (1, 1), (1, 1), (0, 0)),     # multiplier 2
                 _spec(1, 2, 1, (9, 30), (3, 3), (2, 2), (1, 2), (1, 1), (0, 0)),     # dilated rows
                 _spec(1, 2, 1, (9, 30), (3, 5), (2, 2), (1, 1), (1, 1), (0, 0)),     # 5 wide
                 _spec(1, 2, 1, (9, 30), (3, 3), (3, 2), (1, 1), (1, 1), (0, 0)),     # stride 3 between rows
                 _spec(1, 2, 1, (4, 9, 30), (2, 3, 3), (1, 2, 2), (1, 1, 1), (0, 1, 1), (0, 0, 0))):
        assert dwk._up2_args(spec, np.dtype(np.float32), False) is None
        _check(spec, rng, np.float32)


def test_stride_two_row_order_is_one_in_lane_shuffle():
    """The stride-2 row reads put output ``_s2_order(V)[p]`` in lane ``p``: a permutation of
    the outputs whose even (odd) cells each lane takes from the same 128-bit lane of the
    two loads (so one ``vshufps`` per pair of taps), the callers' dy and result shuffles
    built from the same order."""
    from convgrad.kernels import _ukernel
    assert _ukernel._s2_order(8) == [0, 1, 4, 5, 2, 3, 6, 7]
    for V in (8, 16):
        order = _ukernel._s2_order(V)
        assert sorted(order) == list(range(V))
        evens, odds = (list(map(int, m.replace("i32 ", "").split(", "))) for m in _ukernel._s2_shuffles(V))
        for p, (e, o) in enumerate(zip(evens, odds)):
            assert e == 2 * order[p] and o == e + 1
            assert (e % V) // 4 == p // 4 and (e >= V) == (p % 4 >= 2)      # same 128-bit lane, a then b


@needs_numba
def test_rowdot_micro_kernel_every_variant():
    """The compiled stride-2 weight-gradient family (``_ukernel._rowdot_variant_ir``) against
    its formula: every (R, KW) variant, rows of every length around the vector width,
    columns cut at both ends (``lo``, ``hi``), sums added to what ``acc`` held; an input
    cell outside ``[lo, hi)`` or past the row's outputs is never multiplied (inf there
    leaves the sums finite)."""
    import ctypes
    from convgrad.kernels import _ukernel
    built = _ukernel.compiled()
    if built is None:
        pytest.skip("the micro-kernels need an x86-64 CPU with AVX2 and FMA")
    call = ctypes.CFUNCTYPE(None, *([ctypes.c_int64] * 11))(built.rowdot_address)
    V, rng = built.lanes, np.random.default_rng(9)
    for R, KW, S in itertools.product(range(1, _ukernel.ROW_R + 1), range(1, _ukernel.ROW_KW + 1), (1, 2)):
            for npos, nrows, lo, hi in ((V, 1, 0, 2 * V + 3), (V + 5, 3, 1, 2 * V + 8), (3, 2, 2, 7), (2 * V, 2, 0, 9)):
                x_rs, dy_rs = 4 * V + 11, 2 * V + 9
                x_us, x0 = 2 * x_rs, 3 * x_rs + 2
                x = rng.standard_normal(12 * x_rs).astype(np.float32)
                for u in range(nrows):
                    for r in range(R):
                        row = x0 + u * x_us + r * x_rs
                        x[row - 2:row + lo] = np.inf                     # the padding: never read
                        x[row + hi:row + hi + 2] = np.inf
                        last = S * (npos - 1) + KW - 1
                        x[row + max(hi, last + 1):row + max(hi, last + 1) + 2] = np.inf   # past the outputs
                dy = rng.standard_normal(nrows * dy_rs).astype(np.float32)
                acc = rng.standard_normal(R * KW).astype(np.float32)
                want = acc.astype(np.float64)
                call(_ukernel.row_key(R, KW, S), x.ctypes.data + 4 * x0, dy.ctypes.data, acc.ctypes.data, npos, nrows,
                     x_rs, x_us, dy_rs, lo, hi)
                for r in range(R):
                    for k in range(KW):
                        want[r * KW + k] += sum(float(dy[u * dy_rs + o]) * float(x[x0 + u * x_us + r * x_rs + S * o + k])
                                                for u in range(nrows) for o in range(npos) if lo <= S * o + k < hi)
                np.testing.assert_allclose(acc, want, rtol=1e-4, atol=1e-4, err_msg=str((R, KW, S, npos, nrows, lo, hi)))


@needs_numba
def test_rowfwd_micro_kernel_every_variant():
    """The compiled stride-2 forward family (``_ukernel._rowfwd_variant_ir``) against its
    formula: every (R, KW) variant, rows of every length around the vector width, columns
    cut at both ends, nothing stored past a row's outputs (the guard values stay), the
    padding never multiplied (inf there leaves the outputs finite)."""
    import ctypes
    from convgrad.kernels import _ukernel
    built = _ukernel.compiled()
    if built is None:
        pytest.skip("the micro-kernels need an x86-64 CPU with AVX2 and FMA")
    call = ctypes.CFUNCTYPE(None, *([ctypes.c_int64] * 11))(built.rowfwd_address)
    V, rng = built.lanes, np.random.default_rng(10)
    for R, KW, S in itertools.product(range(1, _ukernel.ROW_R + 1), range(1, _ukernel.ROW_KW + 1), (1, 2)):
            for npos, nrows, lo, hi in ((V, 1, 0, 2 * V + 3), (V + 5, 3, 1, 2 * V + 8), (3, 2, 2, 7), (2 * V, 2, 0, 9)):
                x_rs, y_rs = 4 * V + 11, 2 * V + 9
                x_us, x0 = 2 * x_rs, 3 * x_rs + 2
                x = rng.standard_normal(12 * x_rs).astype(np.float32)
                for u in range(nrows):
                    for r in range(R):
                        row = x0 + u * x_us + r * x_rs
                        x[row - 2:row + lo] = np.inf
                        x[row + hi:row + hi + 2] = np.inf
                w = rng.standard_normal(R * KW).astype(np.float32)
                y = np.full(nrows * y_rs, -9.0, np.float32)
                call(_ukernel.row_key(R, KW, S), x.ctypes.data + 4 * x0, w.ctypes.data, y.ctypes.data, npos, nrows,
                     x_rs, x_us, y_rs, lo, hi)
                want = np.full_like(y, -9.0)
                for u in range(nrows):
                    for o in range(npos):
                        want[u * y_rs + o] = sum(float(w[r * KW + k]) * float(x[x0 + u * x_us + r * x_rs + S * o + k])
                                                 for r in range(R) for k in range(KW) if lo <= S * o + k < hi)
                np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4, err_msg=str((R, KW, S, npos, nrows, lo, hi)))


@needs_numba
def test_row_kernels_weight_gradient_forward_and_flipped_data_gradient(monkeypatch):
    """The float32 weight gradient and forward of layers with stride 1 or 2 along the rows
    and one output channel per input channel run the compiled ``rowdot`` / ``rowfwd`` calls
    (``_row_plan``, ``_rowfwd_plan``; stride-1 data gradients as the flipped forward, rows
    of at most ``ROW_FWD_MAX_WIDTH``) with no phase grids: every width and front pad,
    kernels 1-4 wide and 1-5 tall (more kernel rows than one call takes: the forward then
    keeps the phase grids), stride 1 or 2 between rows (edge rows with fewer kernel rows,
    output rows of padding only), 1-D and 2-D, several images, huge pads, rows longer
    than a chunk."""
    monkeypatch.setattr(dwk, "SMALL_IMAGE", -1)
    monkeypatch.setattr(dwk, "SMALL_IMAGE_BWD_WEIGHTS", -1)
    if dwk._micro_kernels() is None:
        pytest.skip("the micro-kernels need an x86-64 CPU with AVX2 and FMA")
    rng = np.random.default_rng(79)
    covered = 0
    for w_in in range(5, 12):
        for kw in (1, 2, 3, 4):
            for pb in range(3):
                for kh, sh, ph in ((1, 1, 0), (3, 2, 1), (2, 1, 1), (5, 1, 2), (4, 2, 0)):
                    for sw in (1, 2):
                        pe = (w_in + pb) % 2 if sw == 2 else min(kw - 1, 1)
                        spec = _spec(2, 3, 1, (9, w_in), (kh, kw), (sh, sw), (1, 1), (ph, min(pb, kw - 1)), (0, pe))
                        if not feasible(spec.src, spec.kernel, (1, 1), spec.pads_begin, spec.pads_end):
                            continue
                        assert dwk._row_plan(spec, 3, 4, dwk.DOT_CHUNK) is not None, str(spec)
                        assert (dwk._rowfwd_plan(spec, 3, 4) is not None) == (kh <= 3), str(spec)
                        covered += 1
                        _check(spec, rng, np.float32)
    assert covered > 600
    monkeypatch.setattr(dwk, "DOT_CHUNK", 40)             # calls of one or a few rows
    dwk._row_plan.cache_clear()
    for spec in (_spec(3, 2, 1, (301,), (3,), (2,), (1,), (9,), (7,)),
                 _spec(1, 4, 1, (40, 45), (3, 3), (2, 2), (1, 1), (1, 1), (0, 1)),
                 _spec(2, 2, 1, (9, 30), (2, 4), (2, 2), (1, 1), (5, 6), (6, 2))):     # rows of padding only
        assert dwk._row_plan(spec, 3, 4, dwk.DOT_CHUNK) is not None and dwk._rowfwd_plan(spec, 3, 4) is not None
        _check(spec, rng, np.float32)
    assert len(dwk._rowfwd_plan(_spec(2, 2, 1, (9, 30), (2, 4), (2, 2), (1, 1), (5, 6), (6, 2)), 3, 4)[1]) > 0
    dwk._row_plan.cache_clear()
    for spec in (_spec(1, 2, 2, (9, 30), (3, 3), (2, 2), (1, 1), (1, 1), (0, 0)),     # multiplier 2
                 _spec(1, 2, 1, (9, 30), (3, 3), (2, 2), (1, 2), (1, 1), (0, 0)),     # dilated rows
                 _spec(1, 2, 1, (9, 30), (3, 5), (2, 2), (1, 1), (1, 1), (0, 0)),     # 5 wide
                 _spec(1, 2, 1, (4, 9, 30), (2, 3, 3), (1, 2, 2), (1, 1, 1), (0, 1, 1), (0, 0, 0))):
        assert dwk._row_plan(spec, 3, 4, dwk.DOT_CHUNK) is None and dwk._rowfwd_plan(spec, 3, 4) is None
        _check(spec, rng, np.float32)


@needs_numba
def test_small_images_with_wide_rows_take_the_row_kernels():
    """Small images (the channels-last blocks' sizes) whose rows hold at least
    ROW_MIN_WIDTH outputs run the row kernels in float32 where those cover the direction
    (the stride-2 data gradient: ``up2``, from UP2_SMALL_MIN_OUTPUTS output positions),
    and stay in the blocks in float64 and on narrower rows; both match the reference."""
    if dwk._micro_kernels() is None:
        pytest.skip("the micro-kernels need an x86-64 CPU with AVX2 and FMA")
    rng = np.random.default_rng(24)
    s1 = _spec(2, 5, 1, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    s2 = _spec(2, 5, 1, (28, 28), (3, 3), (2, 2), (1, 1), (1, 1), (0, 0))
    s7 = _spec(2, 5, 1, (14, 14), (3, 3), (2, 2), (1, 1), (1, 1), (0, 0))            # 7-wide rows
    f32 = np.float32
    assert [dwk.channels_last(s1, d, f32) for d in ("fwd", "bwd_data", "bwd_weights")] == [False] * 3
    assert [dwk.channels_last(s2, d, f32) for d in ("fwd", "bwd_data", "bwd_weights")] == [False] * 3
    assert dwk._up2_args(s2, f32, False) is not None                          # 196 outputs: up2
    s2_small = _spec(2, 5, 1, (26, 26), (3, 3), (2, 2), (1, 1), (1, 1), (0, 0))     # 169 outputs
    assert dwk.channels_last(s2_small, "bwd_data", f32)
    assert all(dwk.channels_last(s7, d, f32) for d in ("fwd", "bwd_data", "bwd_weights"))
    assert all(dwk.channels_last(s1, d, np.float64) for d in ("fwd", "bwd_data", "bwd_weights"))
    for spec in (s1, s2, s2_small, s7):
        for dt in (np.float32, np.float64):
            _check(spec, rng, dt)


@needs_numba
def test_phase_grid_micro_kernels_where_the_row_kernels_do_not_run(monkeypatch):
    """With the row kernels off (no row stride of theirs, no forward width), the float32
    phase grids keep the compiled stencil (stride 1) and lane-sum weight gradients: random
    problems of 1-3 axes against the reference, and a row wider than ROW_FWD_MAX_WIDTH
    takes the stencil with the row kernels on."""
    monkeypatch.setattr(dwk, "SMALL_IMAGE", -1)
    monkeypatch.setattr(dwk, "SMALL_IMAGE_BWD_WEIGHTS", -1)
    rng = np.random.default_rng(23)
    wide = _spec(1, 3, 1, (6, dwk.ROW_FWD_MAX_WIDTH + 5), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    assert dwk._rowfwd_plan(wide, 3, 4) is None and dwk._flipped_rows(wide, np.dtype(np.float32), False) is None
    _check(wide, rng, np.float32)
    monkeypatch.setattr(dwk, "ROW_STRIDES", ())
    dwk._row_plan.cache_clear()
    dwk._rowfwd_plan.cache_clear()
    try:
        for nsp in (1, 2, 3):
            for _ in range(4):
                _check(_random_spec(rng, nsp, 1), rng, np.float32)
    finally:
        dwk._row_plan.cache_clear()
        dwk._rowfwd_plan.cache_clear()


@needs_numba
def test_direct_is_chosen_and_half_types_round_once():
    spec = _spec(2, 4, 2, (9, 8), (3, 2), (2, 1), (1, 2), (1, 0), (0, 1))
    for direction in dispatch.DIRECTIONS:
        assert cg.choose_algorithm(spec, direction) == "direct"
        assert cg.choose_algorithm(spec, direction, np.int32) == "reference"
        assert dispatch.estimate_cost(spec, direction, "direct") > 0
    rng = np.random.default_rng(6)
    for half in (np.float16, ml_dtypes.bfloat16):
        x, w, dy = _inputs(spec, rng, half)
        want = _all(spec, x.astype(np.float32), w.astype(np.float32), dy.astype(np.float32), algorithm="direct")
        for a, b in zip(_all(spec, x, w, dy), want):
            assert a.dtype == half
            np.testing.assert_array_equal(a, b.astype(half))


@needs_numba
def test_large_channel_multiplier_goes_to_a_gemm_lowering():
    """One input channel per group but many outputs per group is a real GEMM (M = multiplier,
    K = taps): the ISTFT shape (1 -> 1026 channels, 1024 taps, stride 256) must not go to
    ``direct`` (its weight gradient runs on ``blocked``'s framed product where that is
    chosen); a multiplier at the limit still does."""
    istft = make_spec("test", mb=1, ic=1, oc=1026, groups=1, src=(58112,), kernel=(1024,), strides=256)
    for direction in dispatch.DIRECTIONS:
        assert cg.choose_algorithm(istft, direction) in ("im2col", "taps", "blocked")
    m = dispatch.DIRECT_MAX_MULTIPLIER
    at_limit = _spec(1, 8, m, (12, 11), (3, 2), (1, 1), (1, 1), (1, 0), (0, 1))
    above = _spec(1, 8, m + 1, (12, 11), (3, 2), (1, 1), (1, 1), (1, 0), (0, 1))
    assert at_limit.ocg == m and above.ocg == m + 1
    for direction in dispatch.DIRECTIONS:
        assert cg.choose_algorithm(at_limit, direction) == "direct"
        assert cg.choose_algorithm(above, direction) in ("im2col", "taps")


@needs_numba
def test_direct_bitwise_across_threads_caps_and_layouts(variant):
    """Same bits with 1 or 2 threads, with a cap that forces one-channel chunks, and for
    strided / read-only / Fortran inputs (converted per chunk)."""
    rng = np.random.default_rng(7)
    spec = _spec(3, 24, 2, (31, 29), (3, 2), (2, 1), (1, 2), (1, 0), (2, 1))
    x, w, dy = _inputs(spec, rng, np.float32)
    assert all(cg.choose_algorithm(spec, d) == "direct" for d in dispatch.DIRECTIONS)
    old = dwk.PARALLEL_MACS
    try:
        dwk.PARALLEL_MACS = 0                                  # small problem: still use the pool
        cg.set_num_threads(1)
        one = _all(spec, x, w, dy)
        cg.set_num_threads(2)
        two = _all(spec, x, w, dy)
        xs = np.asfortranarray(x)
        dys = np.repeat(dy, 2, axis=1)[:, ::2]                  # a strided view equal to dy
        ro = [a.copy() for a in (x, w, dy)]
        for a in ro:
            a.flags.writeable = False
        strided = (cg.conv_forward(xs, w, **_kw(spec)), cg.conv_backward_weights(xs, dys, spec.kernel, **_kw(spec)),
                   cg.conv_backward_data(dys, w, spec.src, **_kw(spec)))
        readonly = _all(spec, *ro)
        # room for the scratch and about one converted channel of each input: one-channel chunks
        channel = spec.mb * (int(np.prod(spec.src)) + int(np.prod(spec.dst)) * spec.ocg) * 4
        cap = max(dwk._scratch(spec, d, 4) for d in dispatch.DIRECTIONS) + w.nbytes + channel + channel // 2
        tiny = _all(spec, xs, w, dys, workspace_limit=cap)
    finally:
        dwk.PARALLEL_MACS = old
        cg.set_num_threads(None)
    for got in (two, strided, readonly, tiny):
        for a, b in zip(got, one):
            np.testing.assert_array_equal(a, b)


def test_direct_pool_rule_is_remembered_per_threshold():
    """Small problems run on the calling thread, larger ones on the pool; the remembered
    plan is keyed on the thread count and the work threshold, so a test (or a user) that
    changes ``PARALLEL_MACS`` gets the plan of the new value."""
    spec = _spec(1, 256, 1, (28, 28), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))     # mobilenet conv4_1/dw
    assert dwk._macs_per_channel(spec) * spec.ic < dwk.PARALLEL_MACS
    limit = 1 << 30
    for direction in dispatch.DIRECTIONS:
        cells = dwk.PARALLEL_CELLS
        assert dwk._plan_cached(spec, 0, 1024, limit, direction, 1, 2, dwk.PARALLEL_MACS, cells)[1] == 1
        blocks, workers = dwk._plan_cached(spec, 0, 1024, limit, direction, 1, 2, 0, cells)
        assert workers == 2 and len(blocks) >= 2, direction
        assert dwk._plan_cached(spec, 0, 1024, limit, direction, 1, 1, 0, cells)[1] == 1
    old = dwk.PARALLEL_MACS
    try:
        cg.set_num_threads(2)
        assert dwk._plan(spec, 0, 1024, limit, "fwd")[1] == 1
        dwk.PARALLEL_MACS = 0
        assert dwk._plan(spec, 0, 1024, limit, "fwd")[1] == 2
    finally:
        dwk.PARALLEL_MACS = old
        cg.set_num_threads(None)


def test_direct_pool_for_weight_gradients_that_stream_large_images():
    """A weight gradient on the phase grids that reads and writes at least PARALLEL_CELLS
    cells of data runs on the pool below the work threshold (both threads stream the cold
    images); the forward and the data gradient of the same problem, a smaller image,
    channels-last blocks, the row kernels and a single thread stay on the calling thread."""
    big = _spec(1, 32, 1, (112, 112), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))     # mobilenet conv2_1/dw
    small = _spec(1, 256, 1, (28, 28), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))   # conv4_1/dw
    macs, limit = dwk.PARALLEL_MACS, 1 << 30
    for spec in (big, small):
        assert (dwk._macs_per_channel(spec) + dwk.CHANNEL_MACS) * spec.ic < macs
    cells = 32 * 112 * 112 * 2
    assert cells >= dwk.PARALLEL_CELLS > 256 * 28 * 28 * 2
    blocks, workers = dwk._plan_cached(big, 0, 1024, limit, "bwd_weights", 1, 2, macs, cells)
    assert workers == 2 and len(blocks) >= 2
    assert dwk._plan_cached(big, 0, 1024, limit, "bwd_weights", 1, 2, macs, cells + 1)[1] == 1
    assert dwk._plan_cached(big, 0, 1024, limit, "bwd_weights", 1, 1, macs, cells)[1] == 1
    assert dwk._plan_cached(big, 0, 1024, limit, "bwd_weights", dwk.CB_CHANNELS, 2, macs, cells)[1] == 1
    for direction in ("fwd", "bwd_data"):
        assert dwk._plan_cached(big, 0, 1024, limit, direction, 1, 2, macs, cells)[1] == 1
    try:
        cg.set_num_threads(2)
        assert dwk._plan(big, 0, 1024, limit, "bwd_weights")[1] == 2
        assert dwk._plan(big, 0, 1024, limit, "bwd_weights", cells_rule=False)[1] == 1     # the row kernels
        assert dwk._plan(small, 0, 1024, limit, "bwd_weights")[1] == 1
    finally:
        cg.set_num_threads(None)


@needs_numba
def test_direct_cap_too_small_raises():
    spec = _spec(1, 2, 1, (40, 40), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    rng = np.random.default_rng(8)
    x, w, dy = _inputs(spec, rng, np.float32)
    with pytest.raises(cg.WorkspaceError, match="workspace limit"):
        cg.conv_forward(x, w, **_kw(spec), workspace_limit=1000)


@needs_numba
def test_cap_below_the_direct_scratch_falls_back_to_numpy():
    """A huge 1-D image whose per-channel scratch exceeds the cap: the automatic choice
    runs the NumPy lowering (row slabs) instead; ``algorithm="direct"`` reports the cap."""
    spec = _spec(1, 2, 1, (20000,), (3,), (1,), (1,), (1,), (1,))
    rng = np.random.default_rng(12)
    x, w, dy = _inputs(spec, rng, np.float32)
    cap = 100_000                               # < one channel's phase grid and copies (~240 kB)
    assert not dwk.fits(spec, "fwd", np.float32, cap) and dwk.fits(spec, "fwd", np.float32, 1 << 20)
    got = _all(spec, x, w, dy, workspace_limit=cap)
    for a, b in zip(got, _want(spec, x, w, dy)):
        assert rel_err(a, b) <= 1e-5                # float32 sums of 20000 products
    with pytest.raises(cg.WorkspaceError, match="workspace limit"):
        cg.conv_forward(x, w, **_kw(spec), algorithm="direct", workspace_limit=cap)


@needs_numba
def test_direct_inputs_not_modified(variant):
    rng = np.random.default_rng(9)
    spec = _spec(2, 5, 3, (7, 6, 5), (2, 3, 1), (1, 2, 1), (2, 1, 1), (1, 0, 2), (0, 1, 0))
    for dt in (np.float32, np.float64, np.float16):
        x, w, dy = _inputs(spec, rng, dt)
        copies = [a.copy() for a in (x, w, dy)]
        _all(spec, x, w, dy, algorithm="direct")
        for a, b in zip((x, w, dy), copies):
            np.testing.assert_array_equal(a, b)


def test_direct_keyword_errors(monkeypatch):
    rng = np.random.default_rng(10)
    # dense, strided and dilated: neither the depthwise nor the thin-channel kernel (stride
    # 1, or stride phases without dilation) runs it, in any direction
    dilated = make_spec("t", mb=1, ic=4, oc=6, groups=2, src=(7, 5), kernel=(3, 2), strides=(2, 1),
                        dilations=(1, 2), pads_begin=0, pads_end=0)
    x, w, dy = _inputs(dilated, rng, np.float32)
    with pytest.raises(cg.ConvValueError, match=r"conv_forward: algorithm 'direct' expects a depthwise problem"):
        cg.conv_forward(x, w, **_kw(dilated), algorithm="direct")
    with pytest.raises(cg.ConvValueError, match=r"conv_backward_data: algorithm 'direct' expects a depthwise"):
        cg.conv_backward_data(dy, w, dilated.src, **_kw(dilated), algorithm="direct")
    spec = _spec(1, 3, 2, (6, 5), (3, 2), (1, 1), (1, 1), (0, 0), (0, 0))
    x, w, dy = _inputs(spec, rng, np.float32)
    monkeypatch.setenv("CONVGRAD_NUMBA", "0")
    assert not dwk.available()
    with pytest.raises(cg.ConvValueError, match=r"conv_backward_weights: algorithm 'direct' expects numba"):
        cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec), algorithm="direct")
    assert cg.choose_algorithm(spec, "fwd") in ("taps", "im2col")
    with pytest.raises(cg.ConvValueError, match="algorithm must be one of"):
        cg.conv_forward(x, w, **_kw(spec), algorithm="depthwise")


@needs_numba
def test_numpy_fallback_matches_direct(monkeypatch):
    """Without numba (``CONVGRAD_NUMBA=0``) the NumPy lowerings run depthwise problems and
    agree with the compiled kernel to rounding."""
    rng = np.random.default_rng(11)
    spec = _spec(2, 6, 2, (11, 10), (3, 2), (2, 1), (1, 2), (1, 0), (2, 1))
    x, w, dy = _inputs(spec, rng, np.float32)
    fast = _all(spec, x, w, dy)
    monkeypatch.setenv("CONVGRAD_NUMBA", "0")
    slow = _all(spec, x, w, dy)
    for a, b in zip(fast, slow):
        assert rel_err(a, b) <= 1e-6


def test_without_numba_in_a_subprocess():
    """A process where ``import numba`` fails: depthwise problems still run (NumPy path)."""
    code = """
import sys, numpy as np
sys.modules['numba'] = None                 # import numba -> ImportError
import convgrad as cg
from convgrad.kernels import depthwise
assert not depthwise.available()
x = np.arange(2 * 4 * 7 * 6, dtype=np.float32).reshape(2, 4, 7, 6) / 50
w = np.linspace(-1, 1, 4 * 2 * 3 * 2, dtype=np.float32).reshape(8, 1, 3, 2)
kw = dict(strides=(2, 1), pads_begin=(1, 0), pads_end=(0, 1), groups=4)
y = cg.conv_forward(x, w, **kw)
assert cg.choose_algorithm(cg.ConvSpec(mb=2, ic=4, oc=8, groups=4, src=(7, 6), kernel=(3, 2), strides=(2, 1),
                                       dilations=(1, 1), pads_begin=(1, 0), pads_end=(0, 1)), "fwd") != "direct"
np.save(sys.argv[1], y)
"""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "y.npy")
        env = dict(os.environ)
        env.pop("CONVGRAD_NUMBA", None)
        subprocess.run([sys.executable, "-c", code, out], check=True, env=env, timeout=300)
        y = np.load(out)
    x = np.arange(2 * 4 * 7 * 6, dtype=np.float32).reshape(2, 4, 7, 6) / 50
    w = np.linspace(-1, 1, 4 * 2 * 3 * 2, dtype=np.float32).reshape(8, 1, 3, 2)
    spec = make_spec("t", mb=2, ic=4, oc=8, groups=4, src=(7, 6), kernel=(3, 2), strides=(2, 1), dilations=1,
                     pads_begin=(1, 0), pads_end=(0, 1))
    assert rel_err(y, ref.conv_forward(spec, x.astype(np.float64), w.astype(np.float64))) <= 1e-6


@pytest.mark.parametrize("lanes", [8, 16])
def test_streaming_kernels_prefetch_rows_ahead(lanes):
    """The row, stencil and up2 families ask for the lines PREFETCH_ROWS rows ahead of
    what they read (the input rows) and write (the output rows): their masked accesses do
    not start the hardware prefetchers here, and a weight gradient on images that had
    left the cache ran 2-6x slower without (``_ukernel.PREFETCH_ROWS``). Checked on the IR
    (pure: no host needed): every variant prefetches for reading, every variant that
    stores for writing, at ``PREFETCH_ROWS`` times one of its row strides."""
    import re

    from convgrad.kernels import _ukernel
    ir = _ukernel.module_ir(lanes)
    bodies = dict(re.findall(r"^define internal void @(\w+)\((.*?)^\}", ir, re.M | re.S))
    families = {"rowdot_": (True, False), "rowfwd_": (True, True), "st_": (True, True), "up2_": (False, True)}
    seen = dict.fromkeys(families, 0)
    for name, body in bodies.items():
        fam = next((f for f in families if name.startswith(f)), None)
        if fam is None:
            continue
        seen[fam] += 1
        reads, writes = families[fam]
        flags = re.findall(r"@llvm\.prefetch\.p0\(ptr %[\w.]+, i32 (\d), i32 3, i32 1\)", body)
        assert ("0" in flags) == reads and ("1" in flags) == writes, (name, flags)
        assert re.search(rf"= mul i64 %\w+_[ru]s, {_ukernel.PREFETCH_ROWS}\n", body), name
    assert all(seen.values()), seen
