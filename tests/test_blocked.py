"""The channels-last register-blocked kernel (``algorithm="blocked"``, kernels/blocked.py and
the llvmlite micro-kernels of kernels/_ukernel.py): against the float64 reference and
PyTorch, on every remainder of its register tile, with chunked reductions, both vector
widths, bitwise across threads, and its dispatch rule and errors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import convgrad as cg
from convgrad import dispatch
from convgrad.kernels import _ukernel, blocked
from convgrad.kernels import reference as ref
from convgrad.spec import make_spec

from .helpers import Tally, feasible, rel_err
from .helpers import spec_inputs as _inputs
from .helpers import spec_kwargs as _kw

needs_blocked = pytest.mark.skipif(not blocked.available(), reason=f"blocked: {blocked.unavailable_reason()}")
TALLY = Tally("blocked kernel vs float64 reference")


@pytest.fixture(scope="module", autouse=True)
def _report(request):
    yield
    TALLY.report(request)


@pytest.fixture
def rules_of_a_512_bit_host(monkeypatch):
    """The automatic choice as on the Intel AVX-512 host (where the rules were measured), on
    any host that builds the kernel: the rules are tested, the kernels run at this host's width."""
    monkeypatch.setattr(blocked, "vector_bits", lambda: 512)
    monkeypatch.setattr(blocked, "host_cpu", lambda: "skylake-avx512")
    dispatch._blocked_pays.cache_clear()
    yield
    dispatch._blocked_pays.cache_clear()


def _spec(n, ic, oc, g, src, k, s, d, pb, pe):
    return make_spec("test", mb=n, ic=ic, oc=oc, groups=g, src=src, kernel=k, strides=s, dilations=d,
                     pads_begin=pb, pads_end=pe)


def _run(spec, x, w, dy, **extra):
    """fwd, bwd_weights and (where the kernel runs it: stride 1) bwd_data."""
    out = {"fwd": cg.conv_forward(x, w, **_kw(spec), **extra),
           "bwd_weights": cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec), **extra)}
    if blocked.eligible(spec, "bwd_data"):
        out["bwd_data"] = cg.conv_backward_data(dy, w, spec.src, **_kw(spec), **extra)
    return out


def _check(spec, rng, dtype=np.float32, tag=""):
    x, w, dy = _inputs(spec, rng, dtype)
    got = _run(spec, x, w, dy, algorithm="blocked")
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    want = {"fwd": ref.conv_forward(spec, x64, w64), "bwd_weights": ref.conv_backward_weights(spec, x64, dy64),
            "bwd_data": ref.conv_backward_data(spec, dy64, w64)}
    t = int(np.prod(spec.kernel))
    reduction = {"fwd": spec.icg * t, "bwd_weights": spec.mb * int(np.prod(spec.dst)), "bwd_data": spec.ocg * t}
    for name, a in got.items():
        assert a.dtype == dtype and a.shape == want[name].shape, (name, str(spec))
        err = rel_err(a, want[name])
        # float32: rounding grows with the reduction length; half types: one rounding of
        # each input and of the result
        tol = 2e-6 * np.sqrt(reduction[name]) if dtype == np.float32 else 1e-2
        TALLY.record((name, np.dtype(dtype).name, f"{spec.nsp}-D", tag), err)
        assert err <= tol, (name, str(spec), err)
    return got


def _same_bits_on_one_and_two_threads(spec):
    inputs = _inputs(spec, np.random.default_rng(1), np.float32)
    cg.set_num_threads(1)
    try:
        one = _run(spec, *inputs, algorithm="blocked")
    finally:
        cg.set_num_threads(None)
    two = _run(spec, *inputs, algorithm="blocked")
    for name in one:
        assert np.array_equal(one[name], two[name]), name


def _one_direction(spec, direction, rng, tag, tol=1e-6):
    """``direction`` on ``blocked`` against the reference and ``taps``, the inputs not
    modified, the same bits on one thread; returns the result and a call by algorithm."""
    x, w, dy = _inputs(spec, rng, np.float32)
    kept = [a.copy() for a in (x, w, dy)]
    calls = {"bwd_weights": lambda alg: cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec), algorithm=alg),
             "bwd_data": lambda alg: cg.conv_backward_data(dy, w, spec.src, **_kw(spec), algorithm=alg)}
    call = calls[direction]
    got = call("blocked")
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    want = (ref.conv_backward_weights(spec, x64, dy64) if direction == "bwd_weights"
            else ref.conv_backward_data(spec, dy64, w64))
    assert got.shape == want.shape and rel_err(got, want) <= tol, str(spec)
    TALLY.record((direction, "float32", f"{spec.nsp}-D", tag), rel_err(got, want))
    assert rel_err(call("taps"), want) <= tol, str(spec)
    assert all(np.array_equal(a, b) for a, b in zip(kept, (x, w, dy)))
    cg.set_num_threads(1)
    try:
        one = call("blocked")
    finally:
        cg.set_num_threads(None)
    assert np.array_equal(one, got), str(spec)
    return got, call


def _random_spec(rng, nsp, wide=False):
    while True:
        src = tuple(int(v) for v in rng.integers(1, 12, nsp))
        k = tuple(int(v) for v in rng.integers(1, 5, nsp))
        s = tuple(int(v) for v in rng.integers(1, 4, nsp))
        d = tuple(int(v) for v in rng.integers(1, 3, nsp))
        pb = tuple(int(v) for v in rng.integers(0, 3, nsp))
        pe = tuple(int(v) for v in rng.integers(0, 3, nsp))
        if nsp > 1 and len(set(k)) == 1:                     # non-square kernels only
            continue
        g = int(rng.integers(1, 4))
        icg = int(rng.integers(1, 9))
        # output channels around the vector lanes (16) and the 64-channel register tile
        ocg = int(rng.choice([1, 3, 15, 16, 17, 33, 64, 65, 70] if wide else [1, 2, 5, 7, 9]))
        if icg == ocg:                                       # C_in != C_out
            continue
        if rng.random() < 0.4:                               # the data gradient: stride 1
            s = (1,) * nsp
        if feasible(src, k, d, pb, pe):
            return _spec(int(rng.choice([1, 2, 3])), icg * g, ocg * g, g, src, k, s, d, pb, pe)


# The weight gradient's schedules (``blocked._weight_parts``): "whole" copies both arrays
# channels-last once and splits the tiles between threads; "streamed" cuts the rows into
# parts with their own partial sums, copying chunk by chunk (rows cut into segments:
# test_blocked_weight_gradient_segments); "two parts" is the streamed schedule of larger
# weights.
WEIGHT_SCHEDULES = {"default": {}, "whole": {"WEIGHT_PARTS_BYTES": 0, "WEIGHT_TWO_PARTS_BYTES": 0},
                    "streamed": {"WEIGHT_PARTS": 2}, "two parts": {"WEIGHT_PARTS_BYTES": 0}}


@needs_blocked
@pytest.mark.parametrize("nsp", [1, 2, 3])
@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("schedule", list(WEIGHT_SCHEDULES))
def test_blocked_matches_reference_random(nsp, wide, schedule, monkeypatch):
    """Random problems: strides, dilations, asymmetric pads, groups, non-square kernels,
    channel counts on both sides of the lanes and of the register tile; the weight
    gradient on each of its schedules."""
    for name, value in WEIGHT_SCHEDULES[schedule].items():
        monkeypatch.setattr(blocked, name, value)
    if schedule != "default":      # 1-D rows of few channels too (else ``line_weights``), and 1x1
        monkeypatch.setattr(blocked, "POINTWISE_WEIGHTS_MAX_CHANNELS", 0)
        monkeypatch.setattr(blocked, "INPLACE_WEIGHTS", False)
    rng = np.random.default_rng(700 + 10 * nsp + wide)
    streamed = 0
    for _ in range(10):
        spec = _random_spec(rng, nsp, wide)
        streamed += blocked._weight_parts(spec)[0] > 0
        _check(spec, rng, tag="random")
    if schedule == "whole":
        assert streamed == 0
    elif schedule != "default":
        assert streamed >= 3, streamed


@needs_blocked
def test_blocked_wide_pointwise_weight_gradient(monkeypatch):
    """1x1 weight gradients with many channels take the streamed channels-last path (the
    lanes of the NCX rows for few channels) where the one product does not run them (AVX2
    hosts); both against the reference."""
    monkeypatch.setattr(blocked, "INPLACE_WEIGHTS", False)
    rng = np.random.default_rng(17)
    wide = _spec(2, 100, 110, 1, (12, 11), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))
    narrow = _spec(2, 40, 50, 2, (12, 11), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))
    assert not blocked.pointwise_weights(wide) and blocked.streamed_weights(wide)
    assert blocked.pointwise_weights(narrow)
    for spec in (wide, narrow):
        _check(spec, rng, tag="1x1 weights")


@needs_blocked
def test_blocked_weight_gradient_segments(monkeypatch):
    """Rows cut into segments (of one vector of positions here): the input cells of each
    segment, the padding at both ends, strides and dilations along the cut axis, the last
    segment shorter, on 1-3 axes."""
    monkeypatch.setattr(blocked, "WEIGHT_PARTS", 3)
    monkeypatch.setattr(blocked, "ROW_CHUNK_BYTES", {256: 1, 512: 1})
    monkeypatch.setattr(blocked, "POINTWISE_WEIGHTS_MAX_CHANNELS", 0)    # the 1-D rows too
    rng = np.random.default_rng(16)
    for spec in (_spec(2, 5, 20, 1, (103,), (4,), (1,), (2,), (3,), (1,)),
                 _spec(1, 6, 9, 3, (4, 75), (2, 3), (1, 2), (1, 1), (1, 2), (0, 1)),
                 _spec(1, 4, 34, 1, (3, 4, 130), (2, 1, 5), (1, 1, 3), (1, 1, 1), (0, 1, 2), (1, 0, 0))):
        parts, rows, nseg, seg = blocked._weight_parts(spec)
        assert parts == 3 and rows == 1 and nseg >= 3 and spec.dst[-1] % seg, (spec, nseg, seg)
        _check(spec, rng, tag="segments")


@needs_blocked
def test_streamed_weight_gradient_reads_the_input_in_place(monkeypatch):
    """The streamed weight gradient reads the NCX input in place (``ncx_weights``): each
    tap sums over the positions whose cell is real, the same range in every row (pads at
    both ends, strides and dilations along the last axis, taps with no real cell at all,
    rows cut into segments); groups, 1-3 axes, C_in != C_out. Against the reference, the
    channels-last copies it replaced (NCX_WEIGHTS off), and the same bits on 1 and 2
    threads; the inputs are not modified."""
    monkeypatch.setattr(blocked, "WEIGHT_PARTS", 3)
    monkeypatch.setattr(blocked, "POINTWISE_WEIGHTS_MAX_CHANNELS", 0)    # 1x1 and 1-D rows too
    monkeypatch.setattr(blocked, "INPLACE_WEIGHTS", False)
    rng = np.random.default_rng(29)
    specs = [_spec(4, 6, 20, 1, (9, 13), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
             _spec(3, 12, 20, 2, (9, 14), (3, 5), (2, 3), (1, 2), (1, 4), (0, 2)),
             _spec(4, 8, 18, 1, (5, 4), (2, 3), (1, 1), (1, 1), (0, 6), (0, 6)),     # taps wholly in the pads
             _spec(4, 5, 33, 1, (61,), (4,), (2,), (3,), (5,), (2,)),
             _spec(2, 6, 18, 1, (5, 6, 9), (3, 2, 3), (1, 2, 2), (1, 1, 1), (1, 1, 1), (1, 0, 2)),
             _spec(5, 24, 10, 1, (11, 12), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))]    # strided 1x1
    for chunk in (None, 1):                                  # whole rows, then segments
        if chunk:
            monkeypatch.setattr(blocked, "ROW_CHUNK_BYTES", {256: chunk, 512: chunk})
        for spec in specs:
            assert blocked.ncx_weights(spec), str(spec)
            if chunk:
                assert blocked._weight_parts(spec)[2] > 1 or spec.dst[-1] <= blocked._lanes()[0], str(spec)
            x, _, dy = _inputs(spec, rng, np.float32)
            kept = (x.copy(), dy.copy())
            got = cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec), algorithm="blocked")
            want = ref.conv_backward_weights(spec, x.astype(np.float64), dy.astype(np.float64))
            assert rel_err(got, want) <= 1e-6, str(spec)
            TALLY.record(("bwd_weights", "float32", f"{spec.nsp}-D", "in place"), rel_err(got, want))
            monkeypatch.setattr(blocked, "NCX_WEIGHTS", False)
            copied = cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec), algorithm="blocked")
            monkeypatch.setattr(blocked, "NCX_WEIGHTS", True)
            assert rel_err(got, copied) <= 1e-6, str(spec)
            assert np.array_equal(kept[0], x) and np.array_equal(kept[1], dy)
            cg.set_num_threads(1)
            try:
                one = cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec), algorithm="blocked")
            finally:
                cg.set_num_threads(None)
            assert np.array_equal(one, got), str(spec)


@pytest.mark.skipif(not blocked.available() or blocked._lanes()[0] != 16, reason="512-bit micro-kernels only")
def test_one_product_weight_gradient(monkeypatch):
    """Unpadded 1x1 weight gradients as one product (``inplace_weights``): the input read in
    place (more input channels, or strided: rows of outputs whose cells are ``s`` apart on
    1-3 axes, every remainder of the size formula) or ``diff_dst`` (stride 1, at least as
    many output channels); groups, one image, channel counts off the lanes and the tile,
    the other operand in several blocks of positions. Against the reference and the paths
    it replaced, and the same bits on 1 and 2 threads and for any block size (each element
    is one chain of FMAs over the positions in order); the inputs are not modified."""
    rng = np.random.default_rng(31)
    specs = [(_spec(3, 40, 23, 1, (9, 11), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)), "src"),
             (_spec(2, 23, 40, 1, (9, 11), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)), "diff_dst"),
             (_spec(1, 17, 17, 1, (70, 30), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)), "diff_dst"),
             (_spec(2, 24, 70, 1, (29, 35), (1, 1), (2, 3), (1, 1), (0, 0), (0, 0)), "src"),
             (_spec(3, 70, 24, 1, (30, 36), (1, 1), (3, 2), (1, 1), (0, 0), (0, 0)), "src"),
             (_spec(2, 12, 18, 3, (7, 6, 9), (1, 1, 1), (2, 1, 3), (1, 1, 1), (0, 0, 0), (0, 0, 0)), "src"),
             (_spec(1, 12, 30, 2, (5, 6, 7), (1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0)), "diff_dst"),
             (_spec(3, 130, 70, 1, (101,), (1,), (3,), (1,), (0,), (0,)), "src"),
             (_spec(4, 66, 130, 1, (300,), (1,), (1,), (1,), (0,), (0,)), "diff_dst"),
             (_spec(2, 3, 5, 1, (1, 1), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)), "diff_dst")]
    for spec, side in specs:
        assert blocked.inplace_weights(spec) == side, str(spec)
        got, call = _one_direction(spec, "bwd_weights", rng, "one product")
        with monkeypatch.context() as m:          # blocks of a few positions or rows: the same bits
            m.setattr(blocked, "INPLACE_BLOCK_BYTES", 4 * 7 * max(spec.icg, spec.ocg))
            assert np.array_equal(call("blocked"), got), str(spec)
        with monkeypatch.context() as m:          # the paths it replaced
            m.setattr(blocked, "INPLACE_WEIGHTS", False)
            assert rel_err(call("blocked"), got) <= 2e-6, str(spec)
    big = _spec(5, 70, 150, 1, (40, 40), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))        # two threads, blocks
    assert blocked._inplace_geometry(big, 16)[2] < 1600 and blocked._workers(big) == cg.get_num_threads()
    _one_direction(big, "bwd_weights", rng, "one product", tol=2e-6)
    padded = _spec(2, 8, 8, 1, (9, 9), (1, 1), (1, 1), (1, 1), (1, 0), (0, 0))
    assert blocked.inplace_weights(padded) is None
    assert blocked.inplace_weights(_spec(2, 8, 8, 1, (9, 9), (3, 1), (1, 1), (1, 1), (0, 0), (0, 0))) is None


@pytest.mark.skipif(not blocked.available() or blocked._lanes()[0] != 16, reason="512-bit micro-kernels only")
def test_framed_weight_gradient_in_place():
    """Framed 1-D weight gradients (a kernel of m whole strides: an ISTFT's) as one product
    per input channel with the input row read as an overlapping matrix (row step s): m = 1
    and m > 1, input cells past the last frame, groups, several images and channels, output
    channels off the tile, a kernel not a multiple of 64. Against the reference and the
    framed GEMM products, the same bits on 1 and 2 threads; the inputs are not modified."""
    rng = np.random.default_rng(37)
    for spec in (_spec(1, 1, 70, 1, (3000,), (512,), (128,), (1,), (0,), (0,)),
                 _spec(3, 4, 26, 2, (1500,), (192,), (64,), (1,), (0,), (0,)),
                 _spec(2, 3, 13, 1, (1000,), (64,), (64,), (1,), (0,), (0,)),
                 _spec(1, 2, 200, 1, (20000,), (1024,), (256,), (1,), (0,), (0,))):
        assert blocked.framed_weights(spec) and dispatch.blocked_pays(spec, "bwd_weights", 512, "znver4"), str(spec)
        _one_direction(spec, "bwd_weights", rng, "framed")
    unframed = _spec(1, 1, 8, 1, (3000,), (500,), (128,), (1,), (0,), (0,))
    assert not blocked.framed_weights(unframed) and not dispatch.blocked_pays(unframed, "bwd_weights", 512, "znver4")


@pytest.mark.skipif(not blocked.available() or blocked._lanes()[0] != 16, reason="512-bit micro-kernels only")
def test_framed_data_gradient_in_place(monkeypatch):
    """Framed 1-D data gradients (the ISTFT itself): frames with every tap real in tiles,
    the m - 1 at each end one by one (fewer outputs than taps: no tile at all), cells past
    the last frame zero, strides not a multiple of the vectors, groups, several images and
    channels, the output channels in several steps. Against the reference and the framed
    GEMM products, the same bits on 1 and 2 threads; the inputs are not modified."""
    monkeypatch.setattr(blocked, "FRAME_DATA_CHANNELS", 16)
    rng = np.random.default_rng(41)
    for spec in (_spec(1, 1, 70, 1, (3000,), (512,), (128,), (1,), (0,), (0,)),
                 _spec(3, 4, 26, 2, (1500,), (192,), (64,), (1,), (0,), (0,)),
                 _spec(2, 3, 13, 1, (1000,), (64,), (64,), (1,), (0,), (0,)),
                 _spec(1, 2, 40, 1, (700,), (192,), (96,), (1,), (0,), (0,)),
                 _spec(2, 1, 9, 1, (600,), (512,), (64,), (1,), (0,), (0,))):             # 2 outputs, 8 taps
        assert blocked.framed_data(spec) and blocked.eligible(spec, "bwd_data"), str(spec)
        assert dispatch.blocked_pays(spec, "bwd_data", 512, "znver4") and not dispatch.blocked_pays(
            spec, "fwd", 512, "znver4"), str(spec)
        got, _ = _one_direction(spec, "bwd_data", rng, "framed")
        frames = spec.dst[0] + spec.kernel[0] // spec.strides[0] - 1
        assert not got[..., frames * spec.strides[0]:].any()


def test_weight_gradient_schedule_is_pure_and_sized():
    """The streamed schedule for small weights over many rows (first layers), with long
    rows cut into segments that fit the chunk; whole copies for large weights and for
    fewer chunks than parts. Sizes depend on the problem only."""
    first = _spec(4, 3, 64, 1, (224, 224), (7, 7), (2, 2), (1, 1), (3, 3), (2, 2))
    parts, rows, nseg, seg = blocked._weight_parts(first)
    assert (parts, nseg, seg) == (blocked.WEIGHT_PARTS, 1, 112) and 1 <= rows <= 4 * 112 // parts
    assert blocked._weight_parts(first) == (parts, rows, nseg, seg)
    wavenet = _spec(1, 32, 32, 1, (84350,), (2,), (1,), (1,), (0,), (0,))
    parts, rows, nseg, seg = blocked._weight_parts(wavenet)
    assert parts == blocked.WEIGHT_PARTS and rows == 1 and nseg == -(-84349 // seg) and seg % 16 == 0
    assert seg * 4 * (32 + 32) <= blocked._row_chunk_bytes()
    deep = _spec(4, 512, 512, 1, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    assert blocked._weight_parts(deep) == (0, 0, 0, 0)
    few = _spec(1, 8, 16, 1, (5, 6), (3, 3), (1, 1), (1, 1), (0, 0), (0, 0))      # 3 rows of 4
    assert blocked._weight_parts(few) == (0, 0, 0, 0)


def _runnable_widths() -> list[int]:
    """The vector widths this host can run: its own and, on AVX-512 hosts, the AVX2 build."""
    host = _ukernel._features()          # no build at collection time
    return [] if host is None else sorted({host[2], _ukernel.LANES_AVX2}, reverse=True)


@needs_blocked
def test_avx512_build_compiles_on_any_host():
    """The 512-bit module compiles for an AVX-512 CPU on any x86-64 host (it runs only on
    one: ``test_transpose_kernel`` and the rest run at this host's widths)."""
    wide = _ukernel.Compiled("skylake-avx512", "+avx512f,+avx512vl,+avx512bw,+avx512dq,+avx2,+fma,+avx",
                             _ukernel.LANES_AVX512)
    assert (wide.lanes, wide.r_max, wide.ob_max) == (16, 6, 4)
    assert 0 not in (wide.address, wide.dot_address, wide.transpose_address)


@needs_blocked
@pytest.mark.parametrize("lanes", _runnable_widths())
def test_transpose_kernel(lanes):
    """The compiled block transpose: every count of rows, columns and zero-filled lanes;
    nothing outside the block is read or written (the guard values stay)."""
    import ctypes
    host = _ukernel._features()
    built = _ukernel.compiled() if host[2] == lanes else _ukernel.Compiled(host[0], host[1], lanes)
    call = ctypes.CFUNCTYPE(None, *([ctypes.c_int64] * 7))(built.transpose_address)
    pairs = ctypes.CFUNCTYPE(None, *([ctypes.c_int64] * 7))(built.transpose_pairs_address)
    rng = np.random.default_rng(15)
    for nr in range(lanes + 1):
        for nc in range(lanes + 1):
            for sl in sorted({nr, lanes, max(nr, 3)}):
                src = rng.standard_normal((lanes + 2, 41)).astype(np.float32)
                dst = np.full((lanes + 2, 29), 7.0, np.float32)
                call(src.ctypes.data + 4 * 3, 41, dst.ctypes.data + 4 * 2, 29, nr, nc, sl)
                want = np.full_like(dst, 7.0)
                want[:nc, 2:2 + sl] = 0.0
                want[:nc, 2:2 + nr] = src[:nr, 3:3 + nc].T
                assert np.array_equal(dst, want), (nr, nc, sl)
                # every other column (a stride-2 gather), in place of the same block
                dst[:] = 7.0
                pairs(src.ctypes.data + 4 * 3, 41, dst.ctypes.data + 4 * 2, 29, nr, nc, sl)
                want[:nc, 2:2 + nr] = src[:nr, 3:3 + 2 * nc:2].T
                assert np.array_equal(dst, want), ("pairs", nr, nc, sl)


@needs_blocked
def test_transpose_pairs_reads_only_the_cells_it_gathers():
    """The stride-2 transpose reads source elements up to ``2*nc - 2`` of a row, never the
    one after: a row that ends right before an unreadable page gives no fault."""
    import ctypes
    import mmap
    lanes = _ukernel.compiled().lanes
    call = ctypes.CFUNCTYPE(None, *([ctypes.c_int64] * 7))(_ukernel.compiled().transpose_pairs_address)
    page = mmap.PAGESIZE
    region = mmap.mmap(-1, 2 * page, flags=mmap.MAP_PRIVATE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(base + page), page, 0) == 0    # PROT_NONE
    try:
        for nc in (1, 5, lanes):
            cells = 2 * nc - 1
            row = np.frombuffer(region, np.float32, count=cells, offset=page - 4 * cells)
            row[:] = np.arange(cells)
            dst = np.zeros((lanes, lanes), np.float32)
            call(base + page - 4 * cells, 0, dst.ctypes.data, lanes, 1, nc, 1)
            assert np.array_equal(dst[:nc, 0], np.arange(0, cells, 2)), nc
            del row
    finally:
        ctypes.CDLL(None).mprotect(ctypes.c_void_p(base + page), page, 3)       # PROT_READ | WRITE


@pytest.mark.parametrize("lanes", [8, 16])
def test_transpose_never_addresses_the_rows_it_skips(lanes):
    """Rows past ``nr`` (loads) and past ``nc`` (stores) get an all-false mask, and their
    masked loads and stores take the block's first row as address, not one past the
    array's end: a masked access still translates its address, and on AMD Zen 5 an
    address on a page not mapped or not present cost a microcode assist per access (a
    3-channel copy ran 4.3 or 13-19 ms depending on what followed the array in memory).
    No fault shows it (masked lanes never fault), so the IR is checked: every masked
    access's pointer is chosen by a ``select`` whose other choice is the block start
    (pure: no host needed)."""
    import re
    for ir in (_ukernel.transpose_ir("t", lanes), _ukernel.transpose_pairs_ir("p", lanes)):
        defs = dict(re.findall(r"^\s*(%[\w.]+) = (.*)$", ir, re.M))
        calls = re.findall(r"@llvm\.masked\.(load|store)\.[^(]*\((.*)\)$", ir, re.M)
        assert calls
        for kind, args in calls:
            ptr = re.search(r"ptr (%[\w.]+)", args).group(1)
            row0 = "%src" if kind == "load" else "%dst"
            if ptr == row0:
                continue
            d = defs[ptr]
            assert d.startswith("select i1 "), (kind, ptr, d)
            if not d.endswith(f"ptr {row0}"):                  # the pairs' second load: its row's start
                assert kind == "load" and re.search(r"ptr (%lp\d+)$", d), d


@needs_blocked
@pytest.mark.parametrize("extra", [0, 1, 2, 3, 4, 5])
def test_blocked_every_tile_remainder(extra):
    """Output rows of every length around the register tile (R_MAX positions; rows are cut
    into near-equal tiles), and every remainder of the forward size formula with stride 3."""
    rng = np.random.default_rng(40 + extra)
    for base in (1, 6, 12, 13):
        w_in = base + extra
        _check(_spec(2, 5, 20, 1, (3, w_in), (2, 3), (1, 1), (1, 1), (1, 0), (0, 2)), rng, tag="remainders")
    for w_in in range(7 + extra, 10 + extra):               # (w_in + pads - 3) % 3 takes every value
        _check(_spec(2, 4, 18, 1, (w_in,), (3,), (3,), (1,), (1,), (1,)), rng, tag="remainders")


POINTWISE_CASES = ((2, 6, 20, 1, (13, 11)), (3, 12, 21, 3, (130,)), (1, 70, 9, 1, (4, 8, 5)),
                   (2, 5, 7, 1, (1, 1)), (2, 40, 128, 1, (9, 23)))


@needs_blocked
@pytest.mark.parametrize("order", ["strips", "rows"])
def test_blocked_pointwise_on_the_ncx_arrays(order, monkeypatch):
    """1x1 layers run on the NCX arrays, positions in the lanes (forward and data gradient:
    weights broadcast; weight gradient: sums along the lanes): image sizes around the
    64-position tile and the lanes (masked last vector), groups, tiles of fewer channels than
    the register tile, blocks of positions that end inside an image, 1 or 2 threads with
    the same bits; the data gradient in both orders (``pointwise_strips``: strip by strip,
    prefetching the strips ahead, up to 256 output channels; else row tile by row tile),
    each output the same sum in the same order either way."""
    rng = np.random.default_rng(10)
    monkeypatch.setattr(blocked, "POINTWISE_BLOCK_BYTES", 4 * 70 * 64)      # 64-position blocks
    monkeypatch.setattr(blocked, "PARALLEL_MACS", 0)
    most = blocked.POINTWISE_STRIP_MAX_CHANNELS
    if order == "rows":
        monkeypatch.setattr(blocked, "POINTWISE_STRIP_MAX_CHANNELS", 0)
    for n, ic, oc, g, src in POINTWISE_CASES:
        nsp = len(src)
        spec = _spec(n, ic, oc, g, src, (1,) * nsp, (1,) * nsp, (1,) * nsp, (0,) * nsp, (0,) * nsp)
        assert blocked.pointwise_strips(spec) == (order == "strips")
        _check(spec, rng, tag="pointwise")
        _same_bits_on_one_and_two_threads(spec)
        monkeypatch.setattr(blocked, "POINTWISE_STRIP_MAX_CHANNELS", most if order == "rows" else 0)
        x, w, dy = _inputs(spec, np.random.default_rng(3), np.float32)
        other = cg.conv_backward_data(dy, w, spec.src, algorithm="blocked", **_kw(spec))
        monkeypatch.setattr(blocked, "POINTWISE_STRIP_MAX_CHANNELS", 0 if order == "rows" else most)
        this = cg.conv_backward_data(dy, w, spec.src, algorithm="blocked", **_kw(spec))
        assert np.array_equal(this, other), str(spec)
    wide = _spec(2, 40, 257, 1, (9, 23), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))
    assert not blocked.pointwise_strips(wide)
    _check(wide, rng, tag="pointwise")


@needs_blocked
def test_blocked_lines(monkeypatch, rules_of_a_512_bit_host):
    """1-D stride-1 forwards and data gradients on the NCX rows: blocks inside the row and
    at both ends (the outputs whose taps reach the padding from zero-padded windows, the
    others in place, also in rows shorter than a block), dilations and pads wider than a block, groups,
    flipped weights; the weight gradients as lane sums on the rows (``line_weights``: each
    tap over the outputs whose cell is in the row), in parts; bitwise across threads; too
    many weights take the channels-last path."""
    monkeypatch.setattr(blocked, "POINTWISE_BLOCK_BYTES", 4 * 12 * 64)      # 64-position blocks
    monkeypatch.setattr(blocked, "PARALLEL_MACS", 0)
    rng = np.random.default_rng(8)
    cases = (_spec(2, 6, 20, 1, (300,), (3,), (1,), (2,), (1,), (3,)),
             _spec(3, 12, 18, 3, (200,), (2,), (1,), (70,), (70,), (60,)),      # halo longer than a block
             _spec(1, 5, 34, 1, (129,), (4,), (1,), (1,), (0,), (0,)),
             _spec(2, 7, 9, 1, (10,), (5,), (1,), (1,), (4,), (4,)),
             _spec(5, 8, 16, 1, (45,), (3,), (1,), (2,), (3,), (2,)),       # rows shorter than a block
             _spec(4, 32, 24, 1, (37,), (2,), (1,), (1,), (0,), (0,)))      # the wavenet data gradient's pads
    for spec in cases:
        assert blocked.line_spec(spec) and blocked.line_weights(spec)
        _check(spec, rng, tag="lines")
        _same_bits_on_one_and_two_threads(spec)
    big = _spec(2, 512, 512, 1, (40,), (3,), (1,), (1,), (1,), (1,))
    assert not blocked.line_spec(big)
    wavenet = _spec(8, 32, 32, 1, (10543,), (2,), (1,), (1,), (0,), (0,))
    assert cg.choose_algorithm(wavenet, "fwd") == cg.choose_algorithm(wavenet, "bwd_data") == "blocked"
    assert cg.choose_algorithm(wavenet, "bwd_weights") == "blocked" and blocked.line_weights(wavenet)
    # many channels: the weight gradient streams channels-last chunks
    assert not blocked.line_weights(big)


@needs_blocked
def test_blocked_strided_pointwise(rules_of_a_512_bit_host, monkeypatch):
    """Strided 1x1 layers without padding: the 1x1 problem on the read input cells (every
    remainder of the size formula: input cells past the last read one), zero data
    gradient on the other cells; the weight gradient streams only the rows it reads (the
    path of hosts without the one product: ``test_one_product_weight_gradient`` has it)."""
    monkeypatch.setattr(blocked, "INPLACE_WEIGHTS", False)
    rng = np.random.default_rng(9)
    for spec in (_spec(2, 6, 20, 1, (29, 35), (1, 1), (2, 3), (1, 1), (0, 0), (0, 0)),
                 _spec(2, 6, 20, 1, (30, 36), (1, 1), (3, 2), (1, 1), (0, 0), (0, 0)),
                 _spec(3, 12, 33, 3, (17, 15, 13), (1, 1, 1), (2, 1, 2), (1, 1, 1), (0, 0, 0), (0, 0, 0)),
                 _spec(1, 8, 70, 2, (390,), (1,), (3,), (1,), (0,), (0,))):
        assert blocked.strided_pointwise(spec) is not None
        got = _check(spec, rng, tag="strided 1x1")
        assert set(got) == {"fwd", "bwd_data", "bwd_weights"}
        unread = np.ones(spec.src_shape, dtype=bool)
        unread[blocked._sampled_cells(spec)] = False
        assert not got["bwd_data"][unread].any()
    # stride 2 along the last axis: the weight gradient's copies gather the cells read
    # (``compressed_spec``): both parities of the width, 1-3 axes, a kernel taller than 1,
    # groups, and weights too large to stream (whole copies, no gather)
    for spec in (_spec(2, 6, 20, 1, (29, 35), (1, 1), (1, 2), (1, 1), (0, 0), (0, 0)),
                 _spec(2, 6, 20, 1, (30, 36), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0)),
                 _spec(3, 12, 33, 3, (9, 7, 45), (1, 1, 1), (2, 1, 2), (1, 1, 1), (0, 0, 0), (0, 0, 0)),
                 _spec(9, 8, 70, 2, (391,), (1,), (2,), (1,), (0,), (0,)),
                 _spec(2, 16, 24, 1, (19, 40), (3, 1), (2, 2), (1, 1), (1, 0), (1, 0)),
                 _spec(1, 40, 24, 1, (23, 23), (2, 1), (1, 2), (2, 1), (0, 0), (0, 0))):
        cspec = blocked.compressed_spec(spec)
        assert cspec is not None and cspec.dst == spec.dst and cspec.src[-1] == spec.dst[-1]
        assert cspec.src[:-1] == spec.src[:-1] and cspec.strides[-1] == 1
        assert blocked._weight_parts(cspec)[0], spec
        _check(spec, rng, tag="strided 1x1")
        _same_bits_on_one_and_two_threads(spec)
    big = _spec(1, 1024, 1024, 1, (6, 6), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))
    assert not blocked._weight_parts(blocked.compressed_spec(big))[0]
    _check(big, rng, tag="strided 1x1")
    r3a = _spec(4, 256, 128, 1, (56, 56), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))
    r4a = _spec(4, 512, 1024, 1, (28, 28), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))
    assert cg.choose_algorithm(r3a, "bwd_data") == "blocked"
    assert not dispatch.blocked_pays(r3a, "fwd")
    # the weight gradient: the general streamed path (only the rows a tap reads are
    # copied), where the weights are small enough to stream
    assert dispatch.blocked_pays(r3a, "bwd_weights") and blocked.streamed_weights(r3a)
    assert not dispatch.blocked_pays(r4a, "bwd_data") and not dispatch.blocked_pays(r4a, "bwd_weights")
    padded = _spec(1, 4, 20, 1, (9, 9), (1, 1), (2, 2), (1, 1), (1, 1), (0, 0))
    assert blocked.strided_pointwise(padded) is None and not blocked.eligible(padded, "bwd_data")


@needs_blocked
def test_weight_gradient_bits_do_not_depend_on_the_row_chunk(monkeypatch):
    """The chunk of whole rows the tiles walk (ROW_CHUNK_BYTES, by vector width) only decides
    when a tile's sums are put down and picked up again: the same bits for one row a chunk,
    two rows and every row, streamed (small weights) and on whole copies (large ones)."""
    rng = np.random.default_rng(23)
    for spec in (_spec(2, 24, 40, 1, (13, 11), (3, 2), (1, 1), (1, 1), (1, 0), (1, 1)),      # streamed
                 _spec(1, 16, 48, 1, (6, 7, 5), (3, 3, 2), (1, 1, 1), (1, 1, 1), (1, 1, 0), (1, 0, 1)),
                 _spec(2, 320, 288, 1, (6, 5), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))):   # whole copies
        x, _, dy = _inputs(spec, rng, np.float32)
        row = 4 * (spec.dst[-1] + spec.kernel[-1]) * (spec.ic + spec.oc + blocked._lanes()[0])  # >= a row
        got = []
        for chunk in (row, 2 * row, 1 << 30):
            monkeypatch.setattr(blocked, "ROW_CHUNK_BYTES", {256: chunk, 512: chunk})
            assert blocked._weight_parts(spec)[2] in (0, 1)                  # whole rows
            got.append(cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec), algorithm="blocked"))
        assert np.array_equal(got[0], got[1]) and np.array_equal(got[0], got[2]), str(spec)
    assert blocked._weight_parts(spec) == (0, 0, 0, 0)                  # the last one: whole copies


@needs_blocked
def test_blocked_chunked_reductions(monkeypatch):
    """Input channels cut into chunks (weight blocks bigger than WEIGHT_BLOCK_BYTES) and the
    weight gradient's rows cut into chunks (ROW_CHUNK_BYTES): the sums run on through the
    chunks."""
    monkeypatch.setattr(blocked, "WEIGHT_BLOCK_BYTES", 4 * 9 * 64 * 3)     # 3 input channels a chunk
    monkeypatch.setattr(blocked, "ROW_CHUNK_BYTES", {256: 1, 512: 1})                     # one row a chunk
    rng = np.random.default_rng(11)
    for spec in (_spec(2, 10, 40, 1, (7, 9), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
                 _spec(1, 12, 36, 2, (5, 4, 6), (2, 3, 2), (1, 1, 1), (1, 2, 1), (1, 0, 1), (0, 1, 1))):
        _check(spec, rng, tag="chunked")


@needs_blocked
def test_blocked_256_bit_build(monkeypatch):
    """The AVX2 build (8 lanes, 4 x 3 register tile) computes the same results; compiled here
    for this CPU's AVX2 subset."""
    host = _ukernel._features()
    narrow = _ukernel.Compiled(host[0], host[1], _ukernel.LANES_AVX2)
    assert (narrow.lanes, narrow.r_max, narrow.ob_max) == (8, 4, 3)
    monkeypatch.setattr(_ukernel, "compiled", lambda: narrow)
    assert blocked.vector_bits() == 256
    rng = np.random.default_rng(12)
    for spec in (_spec(2, 6, 30, 1, (6, 11), (3, 2), (1, 1), (1, 2), (1, 0), (2, 1)),
                 _spec(1, 8, 12, 2, (4, 5, 7), (2, 2, 3), (1, 2, 1), (1, 1, 1), (0, 1, 1), (1, 0, 0)),
                 _spec(2, 10, 14, 2, (13, 11), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))):       # 1x1: lanes of positions
        _check(spec, rng, tag="256-bit")
    dispatch._blocked_pays.cache_clear()
    try:
        resnet = _spec(4, 128, 128, 1, (28, 28), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))    # res3a_branch2b
        assert dispatch.blocked_pays(resnet, "bwd_data") and not dispatch.blocked_pays(resnet, "bwd_weights")
    finally:
        dispatch._blocked_pays.cache_clear()


def test_micro_kernel_ir_is_pure_and_complete():
    """One entry point, one variant per (R, OB) of the tile, for both widths."""
    for lanes, (r_max, ob_max) in _ukernel.TILES.items():
        text = _ukernel.module_ir(lanes)
        assert text == _ukernel.module_ir(lanes)
        limits = _ukernel.r_limits(lanes)
        assert len(limits) == ob_max and min(limits) >= r_max and limits[0] == _ukernel.R_TALL
        # a dispatcher, a masked and an unmasked copy of each variant (both widths)
        assert text.count("define internal void @uk_") == 3 * sum(limits)
        unmasked = _ukernel._variant_ir("v", 4, 3, lanes, masked=False)
        assert "masked" not in unmasked and "%tail" not in unmasked.split("entry:")[1]
        assert "masked.load" in _ukernel._variant_ir("v", 4, 3, lanes) and f"icmp eq i64 %x12, {lanes}" in text
        regs = _ukernel.REGISTERS[lanes]
        assert all(r * ob + ob + 1 <= regs for ob, r in enumerate(limits, 1))
        assert f"<{lanes} x float>" in text and "define void @ukernel(" in text
        dr, dj = _ukernel.DOT_TILES[lanes]
        assert text.count("define internal void @dk_") == dr * dj and "define void @dotkernel(" in text


@needs_blocked
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_blocked_half_types(dtype):
    """Half types are converted to float32, computed, and rounded once."""
    rng = np.random.default_rng(13)
    _check(_spec(2, 6, 34, 2, (5, 9), (3, 2), (1, 1), (1, 2), (1, 1), (1, 0)), rng, dtype, tag="half")


@needs_blocked
def test_blocked_bitwise_across_threads_and_layouts(monkeypatch):
    """Same bits with 1 or 2 threads (rows and weight tiles are split, never a sum), for
    Fortran-ordered and strided inputs, and the inputs are left as they were."""
    monkeypatch.setattr(blocked, "PARALLEL_MACS", 0)
    rng = np.random.default_rng(14)
    spec = _spec(3, 24, 40, 2, (13, 17), (3, 2), (1, 1), (1, 2), (1, 0), (2, 1))
    x, w, dy = _inputs(spec, rng, np.float32)
    before = [a.copy() for a in (x, w, dy)]
    try:
        cg.set_num_threads(1)
        one = _run(spec, x, w, dy, algorithm="blocked")
        cg.set_num_threads(2)
        two = _run(spec, x, w, dy, algorithm="blocked")
        odd = _run(spec, np.asfortranarray(x), np.repeat(w, 2, axis=0)[::2], np.asfortranarray(dy),
                   algorithm="blocked")
    finally:
        cg.set_num_threads(None)
    for name in one:
        assert np.array_equal(one[name], two[name]), name
        assert np.array_equal(one[name], odd[name]), name
    for a, b in zip((x, w, dy), before):
        assert np.array_equal(a, b)


@needs_blocked
def test_blocked_rows_in_guided_chunks(monkeypatch):
    """The forward loop's rows (forwards and flipped data gradients) go to the threads in
    guided chunks, large first and single rows last, covering every row once in order, so
    a slower thread takes fewer of them; the result equals the reference."""
    from convgrad.kernels import gemm
    monkeypatch.setattr(blocked, "PARALLEL_MACS", 0)
    seen = []
    real = blocked.run_each

    def spy(work, items, workers):
        seen.append((list(items), workers))
        return real(work, items, workers)
    monkeypatch.setattr(blocked, "run_each", spy)
    spec = _spec(2, 24, 40, 1, (11, 13), (3, 2), (1, 1), (1, 1), (1, 1), (1, 0))
    rng = np.random.default_rng(16)
    x, w, dy = _inputs(spec, rng, np.float32)
    rows = spec.mb * spec.dst[0]
    try:
        cg.set_num_threads(2)
        got = cg.conv_forward(x, w, algorithm="blocked", **_kw(spec))
    finally:
        cg.set_num_threads(None)
    chunks = [items for items, workers in seen
              if items and all(isinstance(c, tuple) for c in items) and items[0][0] == 0 and items[-1][1] == rows]
    assert chunks, seen
    cuts = chunks[-1]
    assert cuts == gemm.guided_chunks(rows, 2) and len(cuts) > 2
    assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:])) and cuts[-1][1] - cuts[-1][0] == 1
    assert rel_err(got, ref.conv_forward(spec, x.astype(np.float64), w.astype(np.float64))) <= 1e-5


@needs_blocked
def test_blocked_block_order(monkeypatch):
    """Weight-heavy forwards and flipped data gradients run block by block of output
    channels (``block_order``): every block once, each result equal bit for bit to the row
    order and to one thread, within float32 rounding of the reference, on a last block
    narrower than the others, a non-square kernel, padding and a strided input; the rule
    is pure and takes only weight-heavy single-group problems with enough blocks."""
    lanes, _, obw = blocked._lanes()
    big = 8 * obw + lanes                       # 9 blocks, the last one lane wide
    spec = _spec(2, 12, big, 1, (6, 7), (3, 2), (1, 1), (1, 1), (1, 0), (1, 1))
    dspec = _spec(2, big, 12, 1, (6, 7), (3, 2), (1, 1), (1, 1), (1, 0), (0, 1))
    assert blocked.block_order(spec, 2) and blocked.block_order(blocked.flipped_spec(dspec), 2)
    assert not blocked.block_order(spec, 1) and not blocked.block_order(dspec, 2)
    assert not blocked.block_order(_spec(2, 12, big - 2 * obw, 1, (6, 7), (3, 2), (1, 1), (1, 1), (1, 0), (1, 1)), 2)
    assert not blocked.block_order(_spec(2, 24, 2 * big, 2, (6, 7), (3, 2), (1, 1), (1, 1), (1, 0), (1, 1)), 2)
    assert not blocked.block_order(_spec(64, 12, big, 1, (30, 31), (3, 2), (1, 1), (1, 1), (1, 0), (1, 1)), 2)
    with monkeypatch.context() as m:
        m.setattr(blocked, "WEIGHT_BLOCK_BYTES", 4 * 6 * 12 * obw - 4)      # one block's weights too large
        assert not blocked.block_order(spec, 2)
    monkeypatch.setattr(blocked, "PARALLEL_MACS", 0)
    ranges = []
    module = blocked._jit()

    class Spy:                                  # the loop's output-channel ranges, as called
        def __getattr__(self, name):
            return getattr(module, name)

        @staticmethod
        def forward_rows(*args):
            ranges.append(args[-2:])
            return module.forward_rows(*args)
    monkeypatch.setattr(blocked, "_jit", Spy)
    rng = np.random.default_rng(21)
    x, w, _ = _inputs(spec, rng, np.float32)
    dy = rng.standard_normal((2, 12, 5, 14)).astype(np.float32)[:, :, :, ::-2]      # strided diff_dst
    w_data = rng.standard_normal((12, big, 3, 2)).astype(np.float32)
    before = [a.copy() for a in (x, w, dy, w_data)]

    def both():
        return (cg.conv_forward(x, w, algorithm="blocked", **_kw(spec)),
                cg.conv_backward_data(dy, w_data, (6, 7), algorithm="blocked", **_kw(dspec)))
    try:
        cg.set_num_threads(2)
        fwd, data = both()
        assert sorted(ranges) == sorted([(b * obw, (b + 1) * obw) for b in range(9)] * 2)
        cg.set_num_threads(1)
        one = both()
        cg.set_num_threads(2)
        monkeypatch.setattr(blocked, "block_order", lambda fspec, workers: False)
        ranges.clear()
        rows = both()
        assert ranges and set(ranges) == {(0, blocked._padded(big, lanes))}
    finally:
        cg.set_num_threads(None)
    for got in (one, rows):
        assert np.array_equal(fwd, got[0]) and np.array_equal(data, got[1])
    for a, b in zip((x, w, dy, w_data), before):
        assert np.array_equal(a, b)
    assert rel_err(fwd, ref.conv_forward(spec, x.astype(np.float64), w.astype(np.float64))) <= 2e-6 * np.sqrt(72)
    want = ref.conv_backward_data(dspec, dy.astype(np.float64), w_data.astype(np.float64))
    assert rel_err(data, want) <= 2e-6 * np.sqrt(72)


@needs_blocked
def test_blocked_against_pytorch(rules_of_a_512_bit_host):
    """PyTorch's CPU convolution (an independent implementation) on layers where the
    automatic choice is ``blocked``: ResNet 3x3, a strided 3x3, a 5x5, a 3-D layer."""
    import torch
    rng = np.random.default_rng(15)
    cases = (_spec(2, 64, 48, 1, (14, 12), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
             _spec(2, 96, 64, 1, (15, 16), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),
             _spec(2, 40, 96, 1, (13, 11), (5, 3), (1, 1), (1, 2), (2, 2), (2, 2)),
             _spec(1, 32, 64, 1, (9, 8, 10), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0)),
             _spec(2, 64, 80, 1, (50, 45), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)))
    for spec in cases:
        for d in dispatch.DIRECTIONS:
            if dispatch.blocked_pays(spec, d) or (blocked.eligible(spec, d) and max(spec.kernel) > 1):
                assert cg.choose_algorithm(spec, d) == "blocked", (str(spec), d)
        x, w, dy = _inputs(spec, rng, np.float32)
        got = _run(spec, x, w, dy)
        xt, wt, dyt = (torch.from_numpy(a.astype(np.float64)) for a in (x, w, dy))
        pads = [p for p in spec.pads_begin]
        assert spec.pads_begin == spec.pads_end
        gi, gw, _ = torch.ops.aten.convolution_backward(
            dyt, xt, wt, None, list(spec.strides), pads, list(spec.dilations), False, [0] * spec.nsp, spec.groups,
            [True, True, False])
        fwd = torch.ops.aten.convolution(xt, wt, None, list(spec.strides), pads, list(spec.dilations), False,
                                         [0] * spec.nsp, spec.groups)
        want = {"fwd": fwd.numpy(), "bwd_weights": gw.numpy(), "bwd_data": gi.numpy()}
        for name, a in got.items():
            err = rel_err(a, want[name])
            TALLY.record((name, "float32", f"{spec.nsp}-D", "vs torch f64"), err)
            assert err <= 2e-6 * np.sqrt(spec.icg * np.prod(spec.kernel) * np.prod(spec.dst)), (name, str(spec), err)


@needs_blocked
def test_blocked_dispatch_rule(rules_of_a_512_bit_host):
    """``blocked`` is chosen for float32 multi-tap layers with at least 32 lane channels
    (16 for the weight gradient), enough work per copied element and weights not much
    larger than the activations (measured, dispatch.py); the other kernels keep the rest."""
    resnet = _spec(4, 64, 64, 1, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    unet = _spec(1, 32, 64, 1, (19, 22, 22), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))
    strided = _spec(4, 128, 128, 1, (56, 56), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1))
    for d in dispatch.DIRECTIONS:
        assert cg.choose_algorithm(resnet, d) == cg.choose_algorithm(unet, d) == "blocked", d
        assert cg.choose_algorithm(resnet, d, np.float16) == "blocked"        # computed in float32
        assert cg.choose_algorithm(resnet, d, np.float64) != "blocked"
        assert cg.choose_algorithm(resnet, d, direct=False) in ("taps", "im2col")
    assert cg.choose_algorithm(strided, "fwd") == cg.choose_algorithm(strided, "bwd_weights") == "blocked"
    assert cg.choose_algorithm(strided, "bwd_data") != "blocked"                # stride 2: not eligible
    pointwise = _spec(8, 64, 64, 1, (56, 56), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))
    assert cg.choose_algorithm(pointwise, "fwd") == cg.choose_algorithm(pointwise, "bwd_data") == "blocked"
    small_pointwise = _spec(8, 512, 512, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))   # weights per image
    few_rows = _spec(8, 32, 64, 1, (112, 112), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))       # 32 broadcast rows
    assert dispatch.blocked_pays(few_rows, "fwd") and not dispatch.blocked_pays(few_rows, "bwd_data")
    narrow = _spec(4, 16, 16, 1, (64, 64), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))          # 16 lanes
    vgg = _spec(2, 3, 64, 1, (224, 224), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))            # 26 macs per element
    heavy = _spec(1, 256, 512, 1, (6, 7, 7), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))   # weights 28x
    for d in dispatch.DIRECTIONS:
        assert not dispatch.blocked_pays(small_pointwise, d), d
    assert not dispatch.blocked_pays(heavy, "fwd") and not dispatch.blocked_pays(heavy, "bwd_weights")
    assert dispatch.blocked_pays(heavy, "bwd_data")                        # the data gradient's limit is 30x
    # the weight gradient streams its copies: 16 lanes and 16 macs per element suffice
    for spec in (narrow, vgg):
        assert dispatch.blocked_pays(spec, "bwd_weights"), str(spec)
        assert not dispatch.blocked_pays(spec, "fwd") and not dispatch.blocked_pays(spec, "bwd_data"), str(spec)
    eight = _spec(8, 3, 8, 1, (128, 128), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))            # half a vector
    thin_1d = _spec(16, 3, 16, 1, (4000,), (3,), (1,), (1,), (1,), (1,))                    # 7.6 macs per element
    assert not dispatch.blocked_pays(eight, "bwd_weights") and not dispatch.blocked_pays(thin_1d, "bwd_weights")
    assert dispatch.blocked_pays(pointwise, "bwd_weights")
    wide_pointwise = _spec(8, 128, 128, 1, (56, 56), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))
    assert dispatch.blocked_pays(wide_pointwise, "bwd_weights") and dispatch.blocked_pays(wide_pointwise, "fwd")
    assert not blocked.pointwise_weights(wide_pointwise)                    # the streamed path
    deep_pointwise = _spec(8, 2048, 512, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))  # 4 MiB of weights
    assert not dispatch.blocked_pays(deep_pointwise, "bwd_weights")
    vgg2 = _spec(2, 64, 64, 1, (224, 224), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))       # 288 per element
    assert dispatch.blocked_pays(vgg2, "fwd")
    with pytest.raises(cg.ConvValueError, match="direction must be one of"):
        dispatch.blocked_pays(resnet, "bwd")


def test_blocked_dispatch_rule_256_bit():
    """On AVX2 hosts (256-bit vectors) only what was measured to win there: data gradients
    and forwards of multi-tap kernels with weights at most 12x the activations (forwards
    with at least 16 input channels), narrow 1x1 weight gradients on the NCX rows, 3-D multi-tap weight
    gradients with at least 8 inputs and 16 outputs and at most 256 channels, and 2-D
    ones with at least 8 inputs and 48 outputs and at most 128 channels, on images of any
    size (pure: no host needed)."""
    def pays(spec):
        return [d for d in dispatch.DIRECTIONS if dispatch.blocked_pays(spec, d, 256)]

    resnet = _spec(4, 64, 64, 1, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    unet = _spec(1, 32, 64, 1, (19, 22, 22), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))
    res5 = _spec(4, 512, 512, 1, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))           # weights 11.8x
    heavy = _spec(1, 256, 512, 1, (6, 7, 7), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))   # 28x
    mobile = _spec(8, 32, 64, 1, (112, 112), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))
    wide_pointwise = _spec(8, 64, 128, 1, (56, 56), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))    # 192 channels
    strided = _spec(4, 256, 128, 1, (56, 56), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))
    wavenet = _spec(8, 32, 32, 1, (10543,), (2,), (1,), (1,), (0,), (0,))
    narrow = _spec(4, 16, 16, 1, (64, 64), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    conv1 = _spec(4, 3, 64, 1, (224, 224), (7, 7), (2, 2), (1, 1), (3, 3), (2, 2))
    unet3 = _spec(1, 64, 64, 1, (16, 18, 18), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))
    unet4 = _spec(1, 64, 128, 1, (12, 14, 14), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))
    thin3d = _spec(1, 32, 32, 1, (24, 24, 24), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1))
    assert pays(resnet) == list(dispatch.DIRECTIONS)                     # 64 -> 64 at 56^2: 2-D weights too
    big_image = _spec(1, 64, 64, 1, (112, 112), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    wide_2d = _spec(4, 64, 128, 1, (28, 28), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))       # 192 channels
    few_inputs = _spec(4, 4, 96, 1, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    few_outputs = _spec(8, 32, 32, 1, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    for spec in (wide_2d, few_inputs, few_outputs):
        assert "bwd_weights" not in pays(spec), str(spec)
    for ic, oc in ((8, 96), (8, 48), (48, 48), (64, 48)):                   # from 8 inputs and 48 outputs
        assert "bwd_weights" in pays(_spec(4, ic, oc, 1, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))), (ic, oc)
    assert "bwd_weights" in pays(big_image)                                # one 112^2 image
    assert "bwd_weights" in pays(_spec(4, 32, 96, 1, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)))
    assert pays(unet) == pays(unet3) == list(dispatch.DIRECTIONS)               # 32 -> 64, 64 -> 64 channels, 3-D
    assert pays(unet4) == list(dispatch.DIRECTIONS)                       # 192 channels, 3-D
    unet5 = _spec(1, 128, 128, 1, (11, 11, 11), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))
    unet6 = _spec(1, 128, 256, 1, (8, 9, 9), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))
    assert "bwd_weights" in pays(unet5) and "bwd_weights" not in pays(unet6)    # 256 and 384 channels
    assert "bwd_weights" in pays(thin3d)                                   # 3-D: from 16 outputs
    first3d = _spec(1, 3, 32, 1, (54, 61, 61), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))
    assert "bwd_weights" not in pays(first3d)                              # 3 inputs: below 8
    assert pays(res5) == ["fwd", "bwd_data"]                               # weights up to 12x, forwards too
    assert not dispatch.blocked_pays(res5, "fwd", 512)                     # (the 512-bit forward's limit is 4x)
    just_over = _spec(4, 512, 512, 1, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1), (0, 0))        # 13.6x: 6 x 6 outputs
    assert pays(just_over) == [], dispatch.blocked_pays(just_over, "bwd_data", 512)
    assert pays(conv1) == [] and dispatch.blocked_pays(conv1, "fwd", 512)
    assert pays(mobile) == ["bwd_weights"]
    for spec in (heavy, wide_pointwise, strided, wavenet, narrow):
        assert pays(spec) == [], str(spec)
    assert dispatch.blocked_pays(heavy, "bwd_data", 512)                   # the 512-bit limit is 30x
    assert dispatch.blocked_pays(resnet, "fwd", 512) and dispatch.blocked_pays(wavenet, "fwd", 512)
    with pytest.raises(cg.ConvValueError, match="vector_bits must be 256 or 512"):
        dispatch.blocked_pays(resnet, "fwd", 128)


def test_blocked_dispatch_rule_amd_zen_avx512():
    """On an AMD Zen with AVX-512 (LLVM ``znver*``) the 512-bit rules, less what lost there
    to OpenBLAS: 1x1 weight gradients on the streamed channels-last path (stride 1 below
    56^2 positions; strided ones that do not stream in WEIGHT_PARTS parts, or beyond 384
    channels where their copies cannot gather the cells read), 1x1 data gradients but the
    stride-1 ones run strip by strip (at most 256 output and at least 32 input channels,
    2048 positions, or 196 with at most 256 x 256 weights), multi-tap data gradients with weights above 16x the activations
    (pure: no host needed)."""
    def pays(spec, cpu="znver5"):
        return [d for d in dispatch.DIRECTIONS if dispatch.blocked_pays(spec, d, 512, cpu)]

    resnet = _spec(4, 64, 64, 1, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    unet7 = _spec(1, 256, 256, 1, (7, 8, 8), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))   # 11x
    heavy = _spec(1, 256, 512, 1, (6, 7, 7), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0))   # 28x
    narrow_1x1 = _spec(38, 64, 64, 1, (56, 56), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))          # dot kernel
    wide_1x1 = _spec(9, 64, 256, 1, (56, 56), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))            # streamed
    wide_28 = _spec(9, 128, 512, 1, (28, 28), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))            # streamed, 28^2
    r3a = _spec(19, 256, 128, 1, (56, 56), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))               # 384 channels
    r3a_b1 = _spec(4, 256, 512, 1, (56, 56), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))             # 768, 8 parts
    r4a_b1 = _spec(4, 512, 1024, 1, (28, 28), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))            # 2 parts
    s3 = _spec(4, 256, 512, 1, (56, 56), (1, 1), (3, 3), (1, 1), (0, 0), (0, 0))                 # no gather
    assert pays(resnet) == pays(resnet, "skylake-avx512") == list(dispatch.DIRECTIONS)
    assert pays(unet7) == pays(unet7, "") == ["bwd_data", "bwd_weights"]       # the forward's limit is 4x
    assert "bwd_data" in pays(heavy, "icelake-server") and "bwd_data" not in pays(heavy)
    assert pays(narrow_1x1, "") == list(dispatch.DIRECTIONS)
    assert pays(narrow_1x1) == list(dispatch.DIRECTIONS)                 # the data gradient strip by strip
    mobile2 = _spec(19, 32, 64, 1, (112, 112), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))
    assert "bwd_data" in pays(mobile2) and "bwd_data" not in pays(mobile2, "")   # 32 rows: Zen only
    for few in (_spec(19, 16, 64, 1, (112, 112), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),      # 16 rows
                _spec(9, 1024, 256, 1, (14, 14), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),      # 1 MB of weights
                _spec(9, 1024, 256, 1, (28, 28), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),
                _spec(19, 256, 256, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))):       # 49 positions
        assert "bwd_data" not in pays(few), str(few)
    for small in (_spec(19, 128, 256, 1, (28, 28), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),    # mobilenet conv5
                  _spec(19, 256, 256, 1, (14, 14), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))):   # 256 KiB of weights
        assert "bwd_data" in pays(small) and "bwd_data" not in pays(small, ""), str(small)
    assert "bwd_weights" in pays(wide_1x1, "") and "bwd_weights" in pays(wide_1x1)    # 56^2: streamed wins
    assert blocked.streamed_weights(wide_28) and "bwd_weights" not in pays(wide_28)
    assert pays(wide_1x1) == list(dispatch.DIRECTIONS)                   # 256 output channels: strips
    wider = _spec(9, 64, 257, 1, (56, 56), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))
    assert "bwd_data" not in pays(wider) and "bwd_data" in pays(wider, "")
    assert pays(r3a, "") == ["bwd_data", "bwd_weights"] and pays(r3a) == ["bwd_weights"]
    assert pays(r3a_b1) == ["bwd_weights"] and blocked.streamed_weights(blocked.compressed_spec(r3a_b1))
    assert pays(r4a_b1) == []
    assert blocked.compressed_spec(s3) is None and pays(s3) == [] and "bwd_weights" in pays(s3, "")
    assert pays(resnet, "znver3") == pays(resnet)                     # an AVX2 Zen runs 256-bit: its rules
    assert ([d for d in dispatch.DIRECTIONS if dispatch.blocked_pays(resnet, d, 256, "znver5")]
            == [d for d in dispatch.DIRECTIONS if dispatch.blocked_pays(resnet, d, 256)])   # 256-bit: those rules


def test_blocked_dispatch_rule_amd_zen4():
    """On a Zen 4 (``znver4``: AVX-512 on 256-bit units) the Zen rules less two that lost
    there: 1x1 data gradients with more than twice as many input channels (rows) as output
    channels (the reduction), and 1-D data gradients on the NCX rows; and every unpadded
    1x1 weight gradient of one group from 20 MFLOP runs as ``blocked``'s one product
    (``inplace_weights``), but strided ones with more outputs than inputs on small images
    (pure: no host needed)."""
    def pays(spec, cpu="znver4"):
        return [d for d in dispatch.DIRECTIONS if dispatch.blocked_pays(spec, d, 512, cpu)]

    resnet = _spec(4, 64, 64, 1, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    streamed = _spec(9, 64, 256, 1, (56, 56), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))     # res2a_branch1
    narrow_1x1 = _spec(38, 64, 64, 1, (56, 56), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))   # dot kernel
    tall = _spec(9, 256, 64, 1, (56, 56), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))         # res2b_branch2a
    tall_28 = _spec(9, 512, 128, 1, (28, 28), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))     # res3b_branch2a
    twice = _spec(9, 128, 64, 1, (56, 56), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))
    wavenet = _spec(8, 32, 32, 1, (10543,), (2,), (1,), (1,), (0,), (0,))
    square = _spec(9, 128, 128, 1, (56, 56), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))      # mobilenet conv4
    strided_wide = _spec(4, 512, 1024, 1, (28, 28), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))  # res4a_branch1
    strided_tall = _spec(19, 512, 256, 1, (28, 28), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))  # res4a_branch2a
    strided_big = _spec(4, 256, 512, 1, (56, 56), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0))    # res3a_branch1
    deep = _spec(9, 2048, 512, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))           # res5b_branch2a
    small = _spec(1, 128, 128, 1, (16, 16), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))         # 8 MFLOP
    grouped = _spec(9, 256, 256, 4, (28, 28), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0))
    assert pays(resnet) == pays(resnet, "znver5") == list(dispatch.DIRECTIONS)
    for spec in (streamed, square, tall, tall_28, narrow_1x1, strided_tall, strided_big, deep):
        assert "bwd_weights" in pays(spec), str(spec)
    assert "bwd_weights" not in pays(deep, "znver5")                     # the other Zens: unchanged
    for spec in (strided_wide, small):
        assert "bwd_weights" not in pays(spec), str(spec)
    assert dispatch._zen4_inplace_weights(deep, "bwd_weights") and not dispatch._zen4_inplace_weights(
        grouped, "bwd_weights") and not dispatch._zen4_inplace_weights(deep, "bwd_data")
    assert "bwd_data" in pays(streamed)                                  # 64 rows over 256
    assert pays(narrow_1x1) == pays(narrow_1x1, "znver5") == list(dispatch.DIRECTIONS)
    for spec in (tall, tall_28):
        assert "bwd_data" in pays(spec, "znver5") and "bwd_data" not in pays(spec), str(spec)
    assert "bwd_data" in pays(twice)
    assert "bwd_data" in pays(wavenet, "znver5") and pays(wavenet) == ["fwd", "bwd_weights"]
    assert dispatch.thin_pays(wavenet, "bwd_data")                       # the thin kernel's


@needs_blocked
def test_blocked_workspace_cap():
    """The automatic choice falls back to the GEMM lowerings when the copies do not fit the
    cap; an explicit ``blocked`` reports it."""
    rng = np.random.default_rng(16)
    spec = _spec(2, 64, 64, 1, (20, 20), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    x, w, dy = _inputs(spec, rng, np.float32)
    cap = 500_000
    assert not blocked.fits(spec, "fwd", np.float32, cap)
    small = cg.conv_forward(x, w, **_kw(spec), workspace_limit=cap)
    assert rel_err(small, ref.conv_forward(spec, x.astype(np.float64), w.astype(np.float64))) < 1e-5
    with pytest.raises(cg.WorkspaceError, match=r"fwd: the workspace limit \(500000 bytes\) is too small"):
        cg.conv_forward(x, w, **_kw(spec), algorithm="blocked", workspace_limit=cap)
    # 1x1 and 1-D paths read float32 inputs in place; half inputs are converted, in the cap
    for spec in (_spec(2, 64, 64, 1, (50, 50), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),
                 _spec(2, 64, 64, 1, (2000,), (3,), (1,), (1,), (1,), (1,))):
        x, w, dy = _inputs(spec, rng, np.float16)
        assert not blocked.fits(spec, "fwd", np.float32, cap)
        with pytest.raises(cg.WorkspaceError, match="converted inputs"):
            cg.conv_forward(x, w, **_kw(spec), algorithm="blocked", workspace_limit=cap)
        got = cg.conv_forward(x, w, **_kw(spec), workspace_limit=cap)                # falls back
        want = ref.conv_forward(spec, x.astype(np.float64), w.astype(np.float64))
        assert rel_err(got, want) < 1e-2


def test_blocked_errors(monkeypatch):
    """Explicit ``blocked`` where it cannot run: a strided data gradient, float64, no
    kernel on this host. Each error names the op and what was expected and given."""
    spec = _spec(1, 4, 32, 1, (9, 9), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1))
    rng = np.random.default_rng(17)
    x, w, dy = _inputs(spec, rng, np.float32)
    with pytest.raises(cg.ConvValueError, match=r"conv_backward_data: algorithm 'blocked' expects .* stride 1"):
        cg.conv_backward_data(dy, w, spec.src, **_kw(spec), algorithm="blocked")
    with pytest.raises(cg.ConvValueError, match=r"conv_forward: algorithm 'blocked' computes in float32 .* float64"):
        cg.conv_forward(x.astype(np.float64), w.astype(np.float64), **_kw(spec), algorithm="blocked")
    monkeypatch.setattr(blocked, "available", lambda: False)
    with pytest.raises(cg.ConvValueError, match=r"conv_backward_weights: algorithm 'blocked' expects numba"):
        cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec), algorithm="blocked")
    assert "blocked" in cg.ALGORITHMS


_CACHED_RUN = """
import hashlib, sys
import numpy as np
import convgrad as cg
from convgrad.kernels import _ukernel
c = _ukernel.compiled()
x = np.random.default_rng(0).standard_normal((2, 24, 13, 11), np.float32)
w = np.random.default_rng(1).standard_normal((40, 24, 3, 2), np.float32)
y = cg.conv_forward(x, w, algorithm="blocked", pads_begin=(1, 0), pads_end=(1, 1))
dx = cg.conv_backward_data(np.ones_like(y), w, x.shape[2:], algorithm="blocked", pads_begin=(1, 0), pads_end=(1, 1))
print(c.from_cache, hashlib.sha256(y.tobytes() + dx.tobytes()).hexdigest())
"""


@needs_blocked
def test_compiled_kernels_are_kept_on_disk(tmp_path, monkeypatch):
    """The compiled micro-kernels are written to the cache directory by the first process
    and loaded by the next (same results, bit for bit); a damaged file is ignored and
    written anew; ``CONVGRAD_KERNEL_CACHE=0`` keeps nothing."""
    import os
    import subprocess
    import sys

    def run(**env):
        out = subprocess.run([sys.executable, "-c", _CACHED_RUN], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "CONVGRAD_CACHE_DIR": str(tmp_path), **env})
        assert out.returncode == 0, out.stderr
        cached, digest = out.stdout.split()
        return cached == "True", digest

    first = run()
    files = list(tmp_path.glob("ukernel-*.bin"))
    assert first[0] is False and len(files) == 1
    assert run() == (True, first[1])
    data = bytearray(files[0].read_bytes())
    data[len(data) // 2] ^= 0xFF                         # a damaged copy: compiled again
    files[0].write_bytes(bytes(data))
    assert run() == (False, first[1])
    assert run() == (True, first[1])                     # ... and written anew
    files[0].write_bytes(files[0].read_bytes()[:100])    # truncated
    assert run() == (False, first[1])
    monkeypatch.setenv("CONVGRAD_KERNEL_CACHE", "0")
    assert _ukernel.cache_dir() is None and _ukernel._read_object("0" * 64) is None
    monkeypatch.setenv("CONVGRAD_KERNEL_CACHE", "1")
    monkeypatch.setenv("CONVGRAD_CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _ukernel.cache_dir() == str(tmp_path / "xdg" / "convgrad")
