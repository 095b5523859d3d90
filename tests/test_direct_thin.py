"""The compiled thin-channel kernel (``algorithm="direct"`` on problems with more than one
input channel per group, kernels/thin.py): fwd, bwd_data and bwd_weights against the float64 reference
on random stride-1 problems (1-3-D, groups, C_in != C_out, non-square non-symmetric
kernels, dilations, padding, every remainder), determinism across threads, tiles and
workspace caps, inputs untouched, and the errors of the keyword where it cannot run."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import convgrad as cg
from convgrad import dispatch
from convgrad.kernels import reference as ref
from convgrad.kernels import gemm, thin
from convgrad.spec import make_spec

from .helpers import Tally, feasible, rel_err
from .helpers import spec_inputs as _inputs
from .helpers import spec_kwargs as _kw

needs_numba = pytest.mark.skipif(not thin.available(), reason="numba is not installed (or CONVGRAD_NUMBA=0)")
TALLY = Tally("direct thin-channel kernel vs float64 reference")


@pytest.fixture(scope="module", autouse=True)
def _report(request):
    yield
    TALLY.report(request)


def _spec(n, ic, oc, g, src, k, d, pb, pe):
    return make_spec("test", mb=n, ic=ic, oc=oc, groups=g, src=src, kernel=k, strides=1, dilations=d,
                     pads_begin=pb, pads_end=pe)


def _both(spec, x, w, dy, **extra):
    """fwd, bwd_weights and (where ``direct`` runs it) bwd_data."""
    out = [cg.conv_forward(x, w, **_kw(spec), **extra),
           cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec), **extra)]
    if thin.eligible(spec, "bwd_data"):
        out.append(cg.conv_backward_data(dy, w, spec.src, **_kw(spec), **extra))
    return out


def _check(spec, rng, dtype=np.float64):
    assert thin.eligible(spec, "fwd") and thin.eligible(spec, "bwd_weights")
    x, w, dy = _inputs(spec, rng, dtype)
    got = _both(spec, x, w, dy, algorithm="direct")
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    want = [ref.conv_forward(spec, x64, w64), ref.conv_backward_weights(spec, x64, dy64),
            ref.conv_backward_data(spec, dy64, w64)]
    t = int(np.prod(spec.kernel))
    reductions = (spec.icg * t, spec.mb * int(np.prod(spec.dst)), spec.ocg * t)
    for name, a, b, red in zip(("fwd", "bwd_weights", "bwd_data"), got, want, reductions):
        assert a.dtype == dtype and a.shape == b.shape, (name, str(spec))
        err = rel_err(a, b)
        # float64: rounding only; float32: rounding grows with the reduction length
        tol = 1e-12 if dtype == np.float64 else 2e-6 * np.sqrt(red)
        TALLY.record((name, np.dtype(dtype).name, f"{spec.nsp}-D"), err)
        assert err <= tol, (name, str(spec), err)


def _random_spec(rng, nsp):
    while True:
        src = tuple(int(v) for v in rng.integers(1, 12, nsp))
        k = tuple(int(v) for v in rng.integers(1, 5, nsp))
        d = tuple(int(v) for v in rng.integers(1, 3, nsp))
        pb = tuple(int(v) for v in rng.integers(0, 3, nsp))
        pe = tuple(int(v) for v in rng.integers(0, 3, nsp))
        if nsp > 1 and len(set(k)) == 1:                     # non-square kernels only
            continue
        g = int(rng.integers(1, 4))
        icg = int(rng.integers(2, 7))
        ocg = int(rng.choice([1, 2, 3, 4, 5, 7, 9]))
        if icg * g == ocg * g:                               # C_in != C_out
            continue
        if feasible(src, k, d, pb, pe):
            return _spec(int(rng.choice([1, 2, 3])), icg * g, ocg * g, g, src, k, d, pb, pe)


@needs_numba
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("nsp", [1, 2, 3])
def test_thin_matches_reference_random(nsp, dtype):
    rng = np.random.default_rng(300 + 10 * nsp + (dtype == np.float32))
    for _ in range(8):
        _check(_random_spec(rng, nsp), rng, dtype)


@needs_numba
@pytest.mark.parametrize("extra", [0, 1, 2, 3])
def test_thin_every_remainder_and_tile_edge(extra, monkeypatch):
    """Output sizes around the register tile (R positions) and a small tile (so tiles
    span images and rows), every ``(i + pb + pe - ek) % R`` value sampled, in 1-, 2- and
    3-D."""
    monkeypatch.setattr(thin, "MAX_TILE", 64)
    monkeypatch.setattr(thin, "MIN_TILE", 64)
    monkeypatch.setattr(thin, "CHUNK_BYTES", 64 * 4 * 3)       # chunks of a few input channels
    rng = np.random.default_rng(50 + extra)
    for base in (15, 16, 17, 31, 33, 64, 65):
        w_in = base + extra
        _check(_spec(3, 6, 10, 2, (w_in,), (3,), (2,), (1,), (2,)), rng, np.float32)
        _check(_spec(2, 5, 9, 1, (3, w_in), (2, 3), (1, 1), (0, 1), (1, 2)), rng)
        _check(_spec(2, 4, 7, 1, (3, 2, w_in), (2, 1, 3), (1, 1, 2), (1, 0, 1), (0, 1, 2)), rng)


@needs_numba
def test_thin_pads_larger_than_the_kernel_and_unit_shapes():
    """Forward pads beyond ``(K-1)*d`` (outputs of pure padding; the data gradient then is
    not a forward convolution and ``direct`` refuses it), unit axes, 1x1 kernels."""
    rng = np.random.default_rng(5)
    for spec in (_spec(2, 3, 5, 1, (4, 3), (2, 3), (1, 2), (3, 2), (2, 4)),
                 _spec(1, 2, 1, 1, (1,), (1,), (1,), (0,), (0,)),
                 _spec(3, 4, 6, 2, (9, 1, 5), (3, 1, 2), (2, 1, 3), (0, 0, 4), (4, 0, 0)),
                 _spec(2, 32, 48, 2, (7, 6), (1, 1), (1, 1), (0, 0), (0, 0))):
        for dt in (np.float64, np.float32):
            _check(spec, rng, dt)


@pytest.mark.parametrize("items, workers", [(328, 2), (176, 2), (41, 3), (7, 2), (2, 2), (1, 4), (0, 2), (50, 1)])
def test_guided_chunks_cover_the_items_in_order(items, workers):
    """Chunks tile ``range(items)`` contiguously and in order; one chunk for one worker;
    with more workers the sizes never grow, the first holds its guided share of the
    items and the last one item."""
    chunks = gemm.guided_chunks(items, workers)
    assert [i for a, b in chunks for i in range(a, b)] == list(range(items))
    assert all(b > a for a, b in chunks)
    if workers == 1 or items == 0:
        assert len(chunks) == (1 if items else 0)
        return
    sizes = [b - a for a, b in chunks]
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[0] == -(-items // (gemm.GUIDED_SHARE * workers)) and sizes[-1] == 1


@needs_numba
def test_thin_bitwise_across_threads_tiles_caps_and_layouts(monkeypatch):
    """Same bits with 1 or 2 threads, other tile sizes, a tight cap (one thread), and for
    strided / read-only / Fortran / half inputs (converted)."""
    rng = np.random.default_rng(7)
    spec = _spec(3, 24, 20, 2, (23, 29), (3, 2), (1, 2), (1, 0), (2, 1))
    x, w, dy = _inputs(spec, rng, np.float32)
    monkeypatch.setattr(thin, "PARALLEL_MACS", 0)              # small problem: still use the pool
    try:
        cg.set_num_threads(1)
        one = _both(spec, x, w, dy, algorithm="direct")
        cg.set_num_threads(2)
        two = _both(spec, x, w, dy, algorithm="direct")
        xs = np.asfortranarray(x)
        dys = np.repeat(dy, 2, axis=1)[:, ::2]                  # a strided view equal to dy
        ro = [a.copy() for a in (x, w, dy)]
        for a in ro:
            a.flags.writeable = False
        strided = _both(spec, xs, w, dys, algorithm="direct")
        readonly = _both(spec, *ro, algorithm="direct")
        cap = max(thin._scratch(thin._as_forward(spec, d), 4) + x.nbytes + dy.nbytes + w.nbytes
                  for d in ("fwd", "bwd_data"))
        partials = (len(thin._bw_cuts(spec)) - 1) * w.size * 8
        cap = max(cap, thin._bw_scratch(spec, 4) + x.nbytes + dy.nbytes + partials)
        tight = _both(spec, xs, w, dys, algorithm="direct", workspace_limit=cap)
        monkeypatch.setattr(thin, "BW_MIN_TILE", 8)
        # 64- and 4096-position forward tiles, in chunks of one input channel and of all;
        # 8-position and chunk-long weight-gradient tiles
        for buffer_bytes in (1 << 10, 1 << 20):
            monkeypatch.setattr(thin, "BUFFER_BYTES", buffer_bytes)
            monkeypatch.setattr(thin, "CHUNK_BYTES", 1 if buffer_bytes < 4096 else 1 << 30)
            monkeypatch.setattr(thin, "BW_BUFFER_BYTES", buffer_bytes)
            other = _both(spec, x, w, dy, algorithm="direct")
            for a, b in zip(other, one):
                np.testing.assert_array_equal(a, b)
    finally:
        cg.set_num_threads(None)
    for got in (two, strided, readonly, tight):
        for a, b in zip(got, one):
            np.testing.assert_array_equal(a, b)


@needs_numba
def test_thin_half_types_round_once_and_inputs_not_modified():
    rng = np.random.default_rng(9)
    spec = _spec(2, 6, 4, 2, (7, 6, 5), (2, 3, 1), (2, 1, 1), (1, 0, 1), (0, 1, 0))
    for dt in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16):
        x, w, dy = _inputs(spec, rng, dt)
        copies = [a.copy() for a in (x, w, dy)]
        got = _both(spec, x, w, dy, algorithm="direct")
        for a, b in zip((x, w, dy), copies):
            np.testing.assert_array_equal(a, b)
        if np.dtype(dt).itemsize == 2:
            want = _both(spec, x.astype(np.float32), w.astype(np.float32), dy.astype(np.float32), algorithm="direct")
            for a, b in zip(got, want):
                assert a.dtype == dt
                np.testing.assert_array_equal(a, b.astype(dt))


@needs_numba
def test_thin_cap_too_small_raises_and_automatic_choice_falls_back():
    spec = _spec(1, 8, 8, 1, (40, 40), (3, 3), (1, 1), (1, 1), (1, 1))
    rng = np.random.default_rng(8)
    x, w, dy = _inputs(spec, rng, np.float32)
    with pytest.raises(cg.WorkspaceError, match="workspace limit"):
        cg.conv_forward(x, w, **_kw(spec), algorithm="direct", workspace_limit=1000)
    y = cg.conv_forward(x, w, **_kw(spec), workspace_limit=20_000)
    assert rel_err(y, ref.conv_forward(spec, x.astype(np.float64), w.astype(np.float64))) <= 1e-5


@needs_numba
@pytest.mark.parametrize("ocg", [1, 2, 3, 4, 5])
def test_thin_weight_gradient_chunks_lanes_and_padding_rows(ocg, monkeypatch):
    """Many chunks (each group's positions cut at multiples of the lanes), short tiles,
    output channels and terms that do not fill the register tile (4 x 3), positions that
    do not fill the lanes, in float64 and float32; and the chunk partials' float64 sum."""
    monkeypatch.setattr(thin, "BW_CHUNK_POSITIONS", 40)
    monkeypatch.setattr(thin, "BW_MIN_TILE", 16)
    monkeypatch.setattr(thin, "BW_BUFFER_BYTES", 1 << 10)
    rng = np.random.default_rng(60 + ocg)
    for dt in (np.float64, np.float32):
        _check(_spec(2, 4, 2 * ocg, 2, (301,), (2,), (3,), (1,), (0,)), rng, dt)
        _check(_spec(3, 5, ocg, 1, (13, 11), (3, 2), (1, 2), (2, 1), (0, 1)), rng, dt)
        _check(_spec(1, 2, ocg, 1, (5, 6, 7), (2, 1, 3), (1, 1, 1), (1, 0, 0), (0, 0, 2)), rng, dt)
    assert len(thin._bw_cuts(_spec(2, 4, 2, 2, (301,), (2,), (3,), (1,), (0,)))) - 1 == thin.BW_CHUNKS


@needs_numba
def test_thin_weight_gradient_non_finite_inputs_same_for_every_tile(monkeypatch):
    """An inf or NaN in the input reaches the same weight-gradient entries whatever the
    tile length and chunk cuts, and every entry the term-exact reference makes non-finite
    is non-finite here too."""
    spec = _spec(2, 4, 5, 1, (61,), (3,), (1,), (1,), (1,))
    rng = np.random.default_rng(14)
    x, w, dy = _inputs(spec, rng, np.float32)
    x[0, 1, 10], x[1, 2, 60], x[1, 3, 33] = np.inf, np.nan, -np.inf
    x[:, 0, 5::7] = np.inf                                # in many tiles' last cells
    monkeypatch.setattr(thin, "BW_MIN_TILE", 8)
    monkeypatch.setattr(thin, "BW_CHUNK_POSITIONS", 20)  # chunks that end off the lanes
    runs = []
    for buffer_bytes in (1 << 9, 1 << 10, 1 << 20):
        monkeypatch.setattr(thin, "BW_BUFFER_BYTES", buffer_bytes)
        runs.append(cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec), algorithm="direct"))
    for got in runs[1:]:
        np.testing.assert_array_equal(got, runs[0])
    want = ref.conv_backward_weights(spec, x.astype(np.float64), dy.astype(np.float64))
    assert not np.isfinite(want).all()
    assert not np.isfinite(runs[0][~np.isfinite(want)]).any()


@needs_numba
def test_thin_weight_gradient_cap():
    """The weight gradient's partial sums and tile buffers count against the cap: too small
    a cap raises for ``direct`` and sends the automatic choice to the GEMM lowerings."""
    spec = _spec(1, 8, 8, 1, (300,), (3,), (1,), (1,), (1,))
    rng = np.random.default_rng(12)
    x, w, dy = _inputs(spec, rng, np.float32)
    assert cg.choose_algorithm(spec, "bwd_weights") == "direct"
    with pytest.raises(cg.WorkspaceError, match="bwd_weights: the workspace limit"):
        cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec), algorithm="direct", workspace_limit=2000)
    assert not thin.fits(spec, "bwd_weights", np.float32, 20_000)
    got = cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec), workspace_limit=20_000)
    assert rel_err(got, ref.conv_backward_weights(spec, x.astype(np.float64), dy.astype(np.float64))) <= 1e-5


def test_thin_keyword_errors(monkeypatch):
    """``direct`` refuses what neither of its kernels runs, naming the problem."""
    rng = np.random.default_rng(10)
    dilated = make_spec("t", mb=1, ic=4, oc=6, groups=2, src=(7, 5), kernel=(3, 2), strides=(2, 1), dilations=(1, 2))
    x, w, dy = _inputs(dilated, rng, np.float32)
    with pytest.raises(cg.ConvValueError, match=r"conv_forward: algorithm 'direct' expects a depthwise problem"
                                                r".*strides \[2, 1\]"):
        cg.conv_forward(x, w, strides=(2, 1), dilations=(1, 2), groups=2, algorithm="direct")
    with pytest.raises(cg.ConvValueError, match=r"conv_backward_weights: algorithm 'direct' expects a depthwise "
                                                r"problem .*strides \[2, 1\].* for bwd_weights"):
        cg.conv_backward_weights(x, dy, dilated.kernel, strides=(2, 1), dilations=(1, 2), groups=2,
                                 algorithm="direct")
    dense = _spec(1, 4, 6, 2, (6, 5), (3, 2), (1, 1), (0, 0), (0, 0))
    big_pad = _spec(1, 4, 6, 2, (6, 5), (3, 2), (1, 1), (3, 0), (0, 0))   # pad 3 > (K-1)*d = 2
    x, w, dy = _inputs(big_pad, rng, np.float32)
    with pytest.raises(cg.ConvValueError, match=r"conv_backward_data: algorithm 'direct' expects"):
        cg.conv_backward_data(dy, w, big_pad.src, **_kw(big_pad), algorithm="direct")
    monkeypatch.setenv("CONVGRAD_NUMBA", "0")
    assert not thin.available()
    with pytest.raises(cg.ConvValueError, match=r"conv_forward: algorithm 'direct' expects numba"):
        cg.conv_forward(*_inputs(dense, rng, np.float32)[:2], **_kw(dense), algorithm="direct")
    for direction in dispatch.DIRECTIONS:
        assert cg.choose_algorithm(dense, direction) in ("taps", "im2col")


@needs_numba
def test_thin_dispatch_rule(without_blocked):
    """``choose_algorithm`` picks the thin kernel where it was measured faster (float32,
    stride 1, fwd and bwd_data, kernels of several taps, at most THIN_MAX_CHANNELS channels
    per group, dense enough grids) and keeps the GEMM lowerings elsewhere."""
    wavenet = make_spec("t", mb=1, ic=32, oc=32, groups=1, src=(84350,), kernel=(2,), strides=1)
    grouped = make_spec("t", mb=1, ic=128, oc=128, groups=8, src=(165, 165), kernel=(3, 3), strides=1,
                        pads_begin=1, pads_end=1)
    for spec in (wavenet, grouped):
        for direction in dispatch.DIRECTIONS:
            assert cg.choose_algorithm(spec, direction) == "direct", direction
        assert cg.choose_algorithm(spec, "fwd", direct=False) in ("taps", "im2col")
        assert cg.choose_algorithm(spec, "fwd", np.float16) == "direct"       # computed in float32
        assert cg.choose_algorithm(spec, "fwd", np.float64) in ("taps", "im2col")   # the tile spills
    gemm_cases = (
        make_spec("t", mb=1, ic=32, oc=32, groups=1, src=(842,), kernel=(1,), strides=1),          # 1x1
        make_spec("t", mb=1, ic=256, oc=64, groups=1, src=(20, 20), kernel=(3, 3), strides=1),    # wide
        make_spec("t", mb=1, ic=16, oc=16, groups=1, src=(20, 20), kernel=(3, 3), strides=2),     # strided
        make_spec("t", mb=4, ic=16, oc=16, groups=1, src=(4, 4), kernel=(3, 3), strides=1,
                  pads_begin=1, pads_end=1),                                                       # sparse grid
    )
    for spec in gemm_cases:
        for direction in ("fwd", "bwd_data"):
            assert cg.choose_algorithm(spec, direction) in ("taps", "im2col"), (str(spec), direction)
    # a data gradient onto a tiny latent: its forward view is a huge grid with one output
    latent = make_spec("t", mb=2, ic=8, oc=16, groups=1, src=(1, 1, 1), kernel=(8, 8, 8), strides=1,
                       pads_begin=7, pads_end=7)
    assert cg.choose_algorithm(latent, "bwd_data") in ("taps", "im2col")
    assert dispatch.THIN_MAX_CHANNELS >= 32
    # 3-D: dense grids only, and thin channels for the data gradient (measured, dispatch.py)
    unet_in = make_spec("t", mb=1, ic=3, oc=32, groups=1, src=(54, 61, 61), kernel=(3, 3, 3))
    unet_mid = make_spec("t", mb=1, ic=32, oc=64, groups=1, src=(19, 22, 22), kernel=(3, 3, 3))
    unet_deep = make_spec("t", mb=1, ic=128, oc=128, groups=1, src=(11, 11, 11), kernel=(3, 3, 3))
    assert cg.choose_algorithm(unet_in, "fwd") == cg.choose_algorithm(unet_in, "bwd_data") == "direct"
    assert cg.choose_algorithm(unet_mid, "fwd") == "direct"
    assert cg.choose_algorithm(unet_mid, "bwd_data") in ("taps", "im2col")
    for direction in ("fwd", "bwd_data"):
        assert cg.choose_algorithm(unet_deep, direction) in ("taps", "im2col")
    # weight gradients: thin channels or few inputs on 1-D / 2-D problems only
    first = make_spec("t", mb=2, ic=3, oc=64, groups=1, src=(112, 112), kernel=(3, 3), pads_begin=1, pads_end=1)
    assert cg.choose_algorithm(first, "bwd_weights") == "direct"
    wide_out = make_spec("t", mb=2, ic=3, oc=256, groups=1, src=(64, 64), kernel=(3, 3), pads_begin=1, pads_end=1)
    resnet = make_spec("t", mb=2, ic=64, oc=64, groups=1, src=(56, 56), kernel=(3, 3), pads_begin=1, pads_end=1)
    for spec in (wide_out, resnet, unet_mid):
        assert cg.choose_algorithm(spec, "bwd_weights") in ("taps", "im2col"), str(spec)
    # 3-D weight gradients up to THIN_3D_BWD_WEIGHTS_MAX_CHANNELS on dense grids
    unet_32 = make_spec("t", mb=1, ic=32, oc=32, groups=1, src=(24, 24, 24), kernel=(3, 3, 3),
                        pads_begin=1, pads_end=1)
    assert cg.choose_algorithm(unet_in, "bwd_weights") == cg.choose_algorithm(unet_32, "bwd_weights") == "direct"
    assert cg.choose_algorithm(latent, "bwd_weights") in ("taps", "im2col")
    assert dispatch.THIN_BWD_WEIGHTS_MAX_CHANNELS <= dispatch.THIN_MAX_CHANNELS


@needs_numba
@pytest.mark.parametrize("bits", [256, 512])
def test_thin_rule_follows_the_blas_vector_width(monkeypatch, bits, without_blocked):
    """With a 512-bit BLAS the 2-D thin rule stops at THIN_WIDE_BLAS_2D_MAX_CHANNELS
    (first layers excepted); with a 256-bit one it keeps THIN_MAX_CHANNELS."""
    from convgrad import threads
    monkeypatch.setattr(threads, "blas_vector_bits", lambda: bits)
    dispatch._direct_pays.cache_clear()
    try:
        resnet = make_spec("t", mb=4, ic=64, oc=64, groups=1, src=(56, 56), kernel=(3, 3), pads_begin=1, pads_end=1)
        narrow = make_spec("t", mb=4, ic=48, oc=48, groups=1, src=(56, 56), kernel=(3, 3), pads_begin=1, pads_end=1)
        first = make_spec("t", mb=4, ic=3, oc=64, groups=1, src=(112, 112), kernel=(3, 3), pads_begin=1, pads_end=1)
        wave = make_spec("t", mb=2, ic=64, oc=64, groups=1, src=(3000,), kernel=(3,), pads_begin=1, pads_end=1)
        for direction in ("fwd", "bwd_data"):
            want = "direct" if bits == 256 else ("taps", "im2col")
            assert cg.choose_algorithm(resnet, direction) in want, direction
            for spec in (narrow, first, wave):
                assert cg.choose_algorithm(spec, direction) == "direct", (str(spec), direction)
    finally:
        dispatch._direct_pays.cache_clear()


@pytest.mark.parametrize("archs, bits", [(["SkylakeX"], 512), (["SapphireRapids"], 512), (["Haswell"], 256),
                                         (["Zen"], 256), (["SkylakeX", "Haswell"], 256), ([], 256), (None, 256)])
def test_blas_vector_bits_reads_the_blas_architecture(monkeypatch, archs, bits):
    """512 only when every BLAS loaded runs an AVX-512 OpenBLAS kernel family (threadpoolctl's
    ``architecture``); an unknown or failing BLAS counts as 256."""
    from convgrad import threads

    class Fake:
        def info(self):
            if archs is None:
                raise RuntimeError("no BLAS")
            return [{"architecture": a} for a in archs]
    monkeypatch.setattr(threads, "_blas", lambda: Fake())
    threads.blas_vector_bits.cache_clear()
    try:
        assert threads.blas_vector_bits() == bits
    finally:
        threads.blas_vector_bits.cache_clear()


# ---------------------------------------------------------------------------------------
# Strided gradients on stride-phase channels (thin.phase_spec)

def _strided_cases():
    """Strides 2-3 on 1-3 axes, every remainder of (i + pb + pe - k) / s, kernels shorter
    and longer than the stride, groups, C_in != C_out, non-square kernels."""
    rng = np.random.default_rng(41)
    out = []
    while len(out) < 24:
        nsp = 1 + len(out) % 3
        g = 1 + len(out) % 2
        k = tuple(int(v) for v in rng.integers(1, 6, nsp))
        s = tuple(int(v) for v in rng.integers(2, 4, nsp))
        i = tuple(int(v) for v in rng.integers(5, 12, nsp))
        pb = tuple(int(v) for v in rng.integers(0, 3, nsp))
        pe = tuple(int(v) for v in rng.integers(0, 3, nsp))
        if any(a + b + c < kk for a, b, c, kk in zip(i, pb, pe, k)):
            continue
        spec = make_spec("t", mb=2, ic=3 * g, oc=(2 + len(out) % 3) * g, groups=g, src=i, kernel=k, strides=s,
                         dilations=1, pads_begin=pb, pads_end=pe)
        out.append(spec)
    return out


@needs_numba
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_strided_problems_on_phases_match_reference(dtype):
    rng = np.random.default_rng(42)
    remainders = set()
    for spec in _strided_cases():
        assert thin.phase_spec(spec) is not None
        assert all(thin.eligible(spec, d) for d in ("fwd", "bwd_data", "bwd_weights"))
        remainders.update((a + b + c - k) % s for a, b, c, k, s in
                          zip(spec.src, spec.pads_begin, spec.pads_end, spec.kernel, spec.strides))
        x, w, dy = _inputs(spec, rng, dtype)
        snap = [a.copy() for a in (x, w, dy)]
        x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
        got_f = cg.conv_forward(x, w, **_kw(spec), algorithm="direct")
        got_d = cg.conv_backward_data(dy, w, spec.src, **_kw(spec), algorithm="direct")
        got_w = cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec), algorithm="direct")
        for name, got, want in (("fwd", got_f, ref.conv_forward(spec, x64, w64)),
                                ("bwd_data", got_d, ref.conv_backward_data(spec, dy64, w64)),
                                ("bwd_weights", got_w, ref.conv_backward_weights(spec, x64, dy64))):
            assert got.dtype == dtype and got.shape == want.shape, (name, str(spec))
            err = rel_err(got, want)
            TALLY.record((f"{name} strided", np.dtype(dtype).name, f"{spec.nsp}-D"), err)
            assert err <= (1e-12 if dtype == np.float64 else 1e-5), (name, str(spec), err)
        assert all(np.array_equal(a, b) for a, b in zip((x, w, dy), snap))
    assert remainders == {0, 1, 2}


def test_phase_weight_gradient_sums_only_the_live_terms():
    """The phased weight gradient sums only the terms whose tap lies in the kernel: they
    are exactly the nonzero taps of the phase kernel built from an all-ones kernel (an
    independent construction: reshapes and transposes of a padded array), 9 of 16 per
    channel for a 3x3 stride-2 kernel, 49 of 64 for 7x7."""
    for spec in _strided_cases() + [
            make_spec("t", mb=1, ic=3, oc=4, groups=1, src=(12, 12), kernel=(3, 3), strides=(2, 2), dilations=1,
                      pads_begin=(1, 1), pads_end=(0, 0)),
            make_spec("t", mb=1, ic=3, oc=4, groups=1, src=(20, 20), kernel=(7, 7), strides=(2, 2), dilations=1,
                      pads_begin=(3, 3), pads_end=(2, 2))]:
        pspec = thin.phase_spec(spec)
        ones = np.ones(spec.weights_shape)
        want = np.flatnonzero(thin._phase_weights(spec, pspec, ones, np.float64)[0].reshape(-1))
        got = thin._live_terms(spec, pspec)
        assert got.dtype == np.int64 and np.array_equal(got, want), str(spec)
        assert got.size == spec.icg * math.prod(spec.kernel)
    assert thin._live_terms(spec, pspec).size == 3 * 49


@needs_numba
def test_strided_problems_bitwise_across_threads_and_non_finite_fall_back():
    """Thread counts change no bit; an inf that only a zero tap of the phase kernel meets
    would make NaN there, so such inputs get im2col's result (same NaN pattern). The
    forward sums only the real taps, so its non-finite results fall where im2col's do."""
    spec = make_spec("t", mb=2, ic=3, oc=4, groups=1, src=(11, 9), kernel=(3, 2), strides=(2, 3),
                     dilations=1, pads_begin=(1, 0), pads_end=(0, 1))
    rng = np.random.default_rng(43)
    x, w, dy = _inputs(spec, rng, np.float32)
    runs = []
    for n in (1, 2):
        cg.set_num_threads(n)
        try:
            runs.append((cg.conv_backward_data(dy, w, spec.src, **_kw(spec), algorithm="direct"),
                         cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec), algorithm="direct"),
                         cg.conv_forward(x, w, **_kw(spec), algorithm="direct")))
        finally:
            cg.set_num_threads(None)
    assert all(np.array_equal(a, b) for a, b in zip(*runs))
    # forward: an inf in an input cell that outputs read (row 9, padded row 10: output
    # row 4's window only; column 3: output column 1's first tap) and a -inf in the next
    # column (the same output's second tap): inf, NaN and finite cells as im2col's
    xf = x.copy()
    xf[1, 0, 9, 3] = np.inf
    xf[1, 2, 9, 4] = -np.inf
    want = cg.conv_forward(xf, w, **_kw(spec), algorithm="im2col")
    got = cg.conv_forward(xf, w, **_kw(spec), algorithm="direct")
    assert not np.isfinite(want).all()
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))
    assert np.array_equal(np.isfinite(got), np.isfinite(want))
    # padded row 11 (input row 10) lies past every window (the last reads rows 8-10): an
    # input cell no output reads. The phase copy writes zero there (only a zero tap would
    # meet it), so an inf in it changes no bit of the weight gradient
    pspec = thin.phase_spec(spec)
    assert pspec.kernel == (2, 1) and spec.dst[0] == 5
    xb = x.copy()
    xb[0, 1, 10, 4] = np.inf
    clean = cg.conv_backward_weights(x, dy, spec.kernel, **_kw(spec), algorithm="direct")
    got = cg.conv_backward_weights(xb, dy, spec.kernel, **_kw(spec), algorithm="direct")
    assert np.array_equal(got, clean)
    # an inf in a cell that outputs read: the call falls back, so the result is im2col's
    xb[0, 1, 9, 4] = np.inf
    want = cg.conv_backward_weights(xb, dy, spec.kernel, **_kw(spec), algorithm="im2col")
    got = cg.conv_backward_weights(xb, dy, spec.kernel, **_kw(spec), algorithm="direct")
    assert not np.isfinite(want).all() and np.array_equal(got, want, equal_nan=True)
    # an inf in diff_dst row 0 meets the zero tap in phase cell 1 of phase 1 (input row 2,
    # which the direct sums reach only from diff_dst row 1): the call falls back
    dyb = dy.copy()
    dyb[1, 2, 0, 0] = np.inf
    want = cg.conv_backward_data(dyb, w, spec.src, **_kw(spec), algorithm="im2col")
    got = cg.conv_backward_data(dyb, w, spec.src, **_kw(spec), algorithm="direct")
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))


@needs_numba
def test_strided_first_layers_dispatch_to_phases(without_blocked):
    """Strided first layers (few inputs) run on phases in every direction; wider layers
    keep the GEMMs."""
    mobilenet = make_spec("t", mb=4, ic=3, oc=32, groups=1, src=(224, 224), kernel=(3, 3), strides=2,
                          pads_begin=1, pads_end=0)
    resnet = make_spec("t", mb=2, ic=3, oc=64, groups=1, src=(224, 224), kernel=(7, 7), strides=2,
                       pads_begin=3, pads_end=2)
    for spec in (mobilenet, resnet):
        for d in dispatch.DIRECTIONS:
            assert cg.choose_algorithm(spec, d) == "direct", (str(spec), d)
    wide = make_spec("t", mb=2, ic=64, oc=128, groups=1, src=(56, 56), kernel=(3, 3), strides=2,
                     pads_begin=1, pads_end=0)
    dilated = make_spec("t", mb=2, ic=3, oc=32, groups=1, src=(56, 56), kernel=(3, 3), strides=2,
                        dilations=2, pads_begin=2, pads_end=1)
    for spec in (wide, dilated):
        for d in dispatch.DIRECTIONS:
            assert cg.choose_algorithm(spec, d) in ("taps", "im2col"), (str(spec), d)
    assert thin.phase_spec(dilated) is None


@pytest.mark.parametrize("strides, pads", [((1, 1, 1), (1, 0, 2)), ((2, 2, 2), (1, 2, 0)), ((1, 3, 2), (0, 1, 1))])
def test_prefetch_ranges_name_the_cells_the_tiles_read(strides, pads):
    """``_plane_at`` (the prefetch streams' ranges, which change no result and so no other
    test sees): every flat cell of the padded (or phase) grids whose first and last input
    cells lie in the image maps to exactly their offsets in the channel's plane and to its
    image, and cells in the padding map to the nearest offset after them, never backwards
    within an image and never outside ``[0, plane]``."""
    jit = thin._jit()
    d_in, h_in, w_in = 5, 7, 9
    q = tuple(-(-(i + 2 * p) // s) + 1 for i, p, s in zip((d_in, h_in, w_in), pads, strides))
    st, pd = np.array(strides, dtype=np.int64), np.array(pads, dtype=np.int64)
    plane = d_in * h_in * w_in
    for n in range(2):
        last = 0
        for cell in np.ndindex(*q):
            f = ((n * q[0] + cell[0]) * q[1] + cell[1]) * q[2] + cell[2]
            for end in (False, True):
                off, img = jit._plane_at(f, q[0], q[1], q[2], pd, st, end, d_in, h_in, w_in)
                assert img == n and 0 <= off <= plane, (cell, end)
                idx = [s * j + (s - 1) * end - p for j, s, p in zip(cell, strides, pads)]
                if all(0 <= i < size for i, size in zip(idx, (d_in, h_in, w_in))):
                    assert off == (idx[0] * h_in + idx[1]) * w_in + idx[2], (cell, end)
                if not end:
                    assert off >= last, cell
                    last = off
