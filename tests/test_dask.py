"""convgrad.dask against the single-machine functions, the float64 reference and PyTorch,
on real Dask schedulers: a distributed.LocalCluster (2 worker processes on 127.0.0.1 with a
small memory limit), the threads, processes and synchronous schedulers.

Fast tier: the per-axis chunk geometry, random problems with random chunkings, a remainder
sweep, named cases on the cluster, bitwise-identical weight gradients across schedulers and
worker counts, element types, the validation table, PyTorch. Slow tier: a larger random
sweep, a worker killed mid-computation, and inputs larger than a worker's memory limit.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import Client, LocalCluster, get_task_stream

import convgrad as cg
import convgrad.dask as cgd
from convgrad.spec import effective_kernel, forward_size

from .helpers import rel_err

FUNCS = ("conv_forward", "conv_backward_weights", "conv_backward_data")


def _cluster(n_workers: int, memory_limit: str) -> LocalCluster:
    return LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                        dashboard_address=None, memory_limit=memory_limit, silence_logs=logging.ERROR)


@pytest.fixture(scope="module")
def client():
    """Two worker processes, loopback only, 400 MiB each; closed even when a test fails."""
    with _cluster(2, "400MiB") as cluster, Client(cluster) as c:
        workers = c.scheduler_info()["workers"]
        assert len(workers) == 2 and all(a.startswith("tcp://127.0.0.1:") for a in workers)
        yield c


# --------------------------------------------------------------------------------------
# Problems
# --------------------------------------------------------------------------------------

def rand_chunks(n: int, rng: np.random.Generator, small: bool = False) -> tuple[int, ...]:
    """A random chunking of n rows (chunks of 1 .. about n/2, so most axes are cut)."""
    out: list[int] = []
    top = 3 if small else max(2, n // 2 + 1)
    while sum(out) < n:
        out.append(int(min(rng.integers(1, top + 1), n - sum(out))))
    return tuple(out) or (0,)


def problem(rng, *, nsp, mb, g, icg, ocg, i, k, s=1, d=1, pb=0, pe=0, dtype=np.float64):
    """src, weights, diff_dst and the canonical keyword arguments of one problem."""
    per = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v,) * nsp  # noqa: E731
    kw = dict(strides=per(s), dilations=per(d), pads_begin=per(pb), pads_end=per(pe), groups=g)
    src = rng.standard_normal((mb, g * icg) + per(i))
    w = rng.standard_normal((g * ocg, icg) + per(k))
    dst = tuple(forward_size(*a) for a in zip(per(i), per(k), kw["strides"], kw["dilations"],
                                               kw["pads_begin"], kw["pads_end"]))
    dy = rng.standard_normal((mb, g * ocg) + dst)
    return src.astype(dtype), w.astype(dtype), dy.astype(dtype), kw


def random_problem(rng, max_i=11):
    while True:
        nsp = int(rng.integers(1, 4))
        top = max_i if nsp < 3 else 7
        i = tuple(int(v) for v in rng.integers(1, top + 1, nsp))
        k = tuple(int(v) for v in rng.integers(1, 4, nsp))
        s = tuple(int(v) for v in rng.integers(1, 4, nsp))
        d = tuple(int(v) for v in rng.integers(1, 3, nsp))
        pb = tuple(int(v) for v in rng.integers(0, 4, nsp))
        pe = tuple(int(v) for v in rng.integers(0, 4, nsp))
        if all(a + b + e >= effective_kernel(kk, dd) for a, kk, dd, b, e in zip(i, k, d, pb, pe)):
            g = int(rng.integers(1, 4))
            icg, ocg = int(rng.integers(1, 3)), int(rng.integers(1, 4))
            return problem(rng, nsp=nsp, mb=int(rng.integers(1, 4)), g=g, icg=icg, ocg=ocg,
                           i=i, k=k, s=s, d=d, pb=pb, pe=pe)


def reference(src, w, dy, kw, **extra):
    """The three single-machine results (float64 reference kernel unless told otherwise)."""
    extra = {"algorithm": "reference", **extra}
    return (cg.conv_forward(src, w, **kw, **extra),
            cg.conv_backward_weights(src, dy, w.shape[2:], **kw, **extra),
            cg.conv_backward_data(dy, w, src.shape[2:], **kw, **extra))


def lazy(src, w, dy, kw, src_chunks, dy_chunks, w_chunks=None):
    """The three convgrad.dask results (lazy) on the given chunkings."""
    x = da.from_array(src, chunks=src_chunks)
    y = da.from_array(dy, chunks=dy_chunks)
    wt = w if w_chunks is None else da.from_array(w, chunks=w_chunks)
    return (cgd.conv_forward(x, wt, **kw),
            cgd.conv_backward_weights(x, y, w.shape[2:], **kw),
            cgd.conv_backward_data(y, wt, src.shape[2:], **kw))


def check_all(got, want, tol, where):
    worst = 0.0
    for name, g_, w_ in zip(FUNCS, got, want):
        assert g_.shape == w_.shape and g_.dtype == w_.dtype, (name, g_.shape, w_.shape, g_.dtype, where)
        assert g_.flags.c_contiguous, (name, where)
        e = rel_err(g_, w_)
        assert e <= tol, f"{name}: rel err {e:.3g} > {tol:g} for {where}"
        worst = max(worst, e)
    return worst


# --------------------------------------------------------------------------------------
# Per-axis geometry (pure)
# --------------------------------------------------------------------------------------

def _geometries():
    for i in range(1, 10):
        for k, s, d, pb, pe in [(1, 1, 1, 0, 0), (3, 2, 1, 1, 2), (2, 3, 2, 0, 1), (3, 1, 2, 2, 0),
                                (1, 3, 1, 2, 2), (4, 2, 1, 3, 0), (2, 4, 3, 4, 1)]:
            if i + pb + pe >= effective_kernel(k, d):
                yield i, k, s, d, pb, pe


def _chunkings(n: int):
    yield (n,)
    yield (1,) * n
    for c in (2, 3):
        yield (c,) * (n // c) + ((n % c,) if n % c else ())


def test_forward_parts_partition_and_pads():
    """Output chunks tile [0, o); each reads exactly the union of its windows, clipped, with
    pads only where it reaches the global padding; each is its own canonical problem."""
    for i, k, s, d, pb, pe in _geometries():
        ek, o = effective_kernel(k, d), forward_size(i, k, s, d, pb, pe)
        for chunks in _chunkings(i):
            parts = cgd.forward_parts(i, k, s, d, pb, pe, cgd.forward_dst_ranges(i, k, s, d, pb, pe, chunks))
            assert len(parts) <= len(chunks)  # no extra chunk for rows of the padding
            assert [p.out[0] for p in parts][0] == 0 and parts[-1].out[1] == o
            assert all(a.out[1] == b.out[0] for a, b in zip(parts, parts[1:]))
            for p in parts:
                (a, b), (lo, hi), (pb_, pe_) = p.out, p.reads, p.pads
                taps = {j * s - pb + t * d for j in range(a, b) for t in range(k)} & set(range(i))
                extent = set(range(a * s - pb, (b - 1) * s - pb + ek)) & set(range(i))
                if p.empty:
                    assert not extent, (i, k, s, d, pb, pe, chunks, p)
                    continue
                assert (lo, hi) == (min(extent), max(extent) + 1)  # its windows' extent, no more
                assert taps <= extent
                assert 0 <= pb_ <= pb and 0 <= pe_ <= pe
                assert (pb_ == 0 or lo == 0) and (pe_ == 0 or hi == i)
                assert forward_size(hi - lo, k, s, d, pb_, pe_) == b - a


def test_data_parts_partition_alignment_and_pads():
    """diff_src chunks tile [0, i), start on a window start (stride-aligned), read exactly the
    diff_dst rows whose windows touch them, and are their own canonical problems."""
    for i, k, s, d, pb, pe in _geometries():
        o = forward_size(i, k, s, d, pb, pe)
        for chunks in _chunkings(o):
            parts = cgd.data_parts(i, k, s, d, pb, pe, chunks)
            assert len(parts) <= len(chunks) + 1  # + the stride-gap rows before the first window
            assert parts[0].out[0] == 0 and parts[-1].out[1] == i
            assert all(a.out[1] == b.out[0] for a, b in zip(parts, parts[1:]))
            for p in parts:
                (c, c1), (j0, j1) = p.out, p.reads
                ek = effective_kernel(k, d)
                overlapping = {j for j in range(o) if j * s - pb < c1 and c < j * s - pb + ek}
                taps = {j for j in range(o) for t in range(k) if c <= j * s - pb + t * d < c1}
                if p.empty:
                    assert not overlapping, (i, k, s, d, pb, pe, chunks, p)
                    continue
                # the windows whose extent overlaps the chunk, no more (so every tap that lands)
                assert overlapping == set(range(j0, j1)), (i, k, s, d, pb, pe, chunks, p)
                assert taps <= overlapping
                assert c == 0 or (c + pb) % s == 0
                assert min(p.pads) >= 0
                assert forward_size(c1 - c, k, s, d, *p.pads) == j1 - j0


# --------------------------------------------------------------------------------------
# Results equal the single-machine functions
# --------------------------------------------------------------------------------------

def _random_cases(seed: int, count: int, scheduler):
    rng = np.random.default_rng(seed)
    worst = 0.0
    for n in range(count):
        src, w, dy, kw = random_problem(rng)
        small = bool(n % 2)  # every other case: chunks of 1..3 rows, cut through every window
        sc = tuple(rand_chunks(v, rng, small) for v in src.shape)
        yc = tuple(rand_chunks(v, rng, small) for v in dy.shape)
        wc = None if n % 3 == 0 else tuple(rand_chunks(v, rng) for v in w.shape)
        got = dask.compute(*lazy(src, w, dy, kw, sc, yc, wc), scheduler=scheduler)
        worst = max(worst, check_all(got, reference(src, w, dy, kw), 1e-12, (src.shape, w.shape, kw, sc, yc)))
    return worst


def test_random_problems_and_chunkings():
    _random_cases(seed=20240601, count=40, scheduler="threads")


@pytest.mark.slow
def test_random_problems_and_chunkings_many():
    _random_cases(seed=7, count=400, scheduler="sync")


@pytest.mark.parametrize("nsp", [1, 2])
def test_remainder_sweep(nsp):
    """Every remainder of (i + pb + pe - ek) % s, chunks of 1, 2 and 4 rows (smaller than the
    dilated kernel, not multiples of the stride)."""
    rng = np.random.default_rng(100 + nsp)
    k, s, d, pb, pe = (3, 2)[:nsp], (3, 2)[:nsp], (2, 1)[:nsp], (2, 0)[:nsp], (1, 3)[:nsp]
    ek = [effective_kernel(a, b) for a, b in zip(k, d)]
    for extra in range(6):  # covers every remainder mod 3 (and mod 2) twice
        i = tuple(max(e - b - p, 1) + extra + ax for ax, (e, b, p) in enumerate(zip(ek, pb, pe)))
        src, w, dy, kw = problem(rng, nsp=nsp, mb=2, g=1, icg=2, ocg=3, i=i, k=k, s=s, d=d, pb=pb, pe=pe)
        for c in (1, 2, 4):
            sc = (1, 2) + (c,) * nsp
            yc = (2, 3) + (c,) * nsp
            got = dask.compute(*lazy(src, w, dy, kw, sc, yc), scheduler="sync")
            check_all(got, reference(src, w, dy, kw), 1e-12, (i, c))


CLUSTER_CASES = {
    # name: problem arguments, src chunks, diff_dst chunks
    "1d-stride3-dil2-asym": (dict(nsp=1, mb=3, g=1, icg=3, ocg=5, i=29, k=4, s=3, d=2, pb=2, pe=1),
                             (2, 3, (5, 7, 3, 9, 5)), (1, 5, (2, 1, 4, 2))),
    "2d-groups-stride-cuts": (dict(nsp=2, mb=4, g=2, icg=3, ocg=2, i=(17, 14), k=(3, 2), s=(2, 3),
                                   d=(1, 2), pb=(1, 0), pe=(2, 1)),
                              (3, (2, 4), (4, 5, 8), (3, 3, 3, 5)), (4, 4, (3, 2, 4), (1, 2, 2))),
    "2d-depthwise-dil": (dict(nsp=2, mb=2, g=4, icg=1, ocg=2, i=(13, 11), k=(2, 3), s=1, d=(3, 2),
                              pb=(0, 2), pe=(3, 0)),
                         (1, 4, 4, 3), (2, 8, 5, 2)),
    "3d-volume": (dict(nsp=3, mb=2, g=1, icg=2, ocg=3, i=(9, 8, 10), k=(3, 2, 3), s=(2, 1, 3),
                       d=(1, 2, 1), pb=(1, 0, 2), pe=(0, 2, 1)),
                  (1, 2, (4, 5), 3, (3, 4, 3)), (2, 3, 2, (3, 4, 1), 1)),
    "3d-groups-tiny-chunks": (dict(nsp=3, mb=3, g=3, icg=2, ocg=1, i=(6, 7, 5), k=(2, 3, 2), s=(1, 2, 2),
                                   d=(2, 1, 1), pb=(1, 1, 0), pe=(0, 1, 2)),
                              (2, 3, 2, 3, 2), (1, 1, 2, 2, 2)),
}


@pytest.mark.parametrize("name", sorted(CLUSTER_CASES))
def test_cluster_matches_single_machine(client, name):
    args, sc, yc = CLUSTER_CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    src, w, dy, kw = problem(rng, **args)
    got = dask.compute(*lazy(src, w, dy, kw, sc, yc, w_chunks=1), scheduler=client)
    check_all(got, reference(src, w, dy, kw), 1e-12, name)
    check_all(got, reference(src, w, dy, kw, algorithm=None), 1e-12, name)  # the fast kernels too


def test_numpy_inputs_and_zero_size_chunks():
    """NumPy inputs become one block; zero-size chunks and a zero batch are allowed."""
    rng = np.random.default_rng(3)
    src, w, dy, kw = problem(rng, nsp=2, mb=3, g=1, icg=2, ocg=3, i=(7, 6), k=(2, 3), s=2, pb=(1, 0))
    want = reference(src, w, dy, kw)
    got = dask.compute(cgd.conv_forward(src, w, **kw), cgd.conv_backward_weights(src, dy, (2, 3), **kw),
                       cgd.conv_backward_data(dy, w, (7, 6), **kw), scheduler="sync")
    check_all(got, want, 1e-12, "numpy")
    sc = ((1, 0, 2), (2,), (3, 0, 4), (6,))
    yc = ((0, 3), (3,), (2, 0, 2), (1, 1))
    got = dask.compute(*lazy(src, w, dy, kw, sc, yc, w_chunks=((3,), (1, 1), (2,), (3,))), scheduler="sync")
    check_all(got, want, 1e-12, "zero chunks")
    empty = [a[:0] for a in (src, dy)]
    got = dask.compute(*lazy(empty[0], w, empty[1], kw, 1, 1), scheduler="sync")
    check_all(got, reference(empty[0], w, empty[1], kw), 0.0, "mb=0")


def test_results_are_lazy_and_inputs_untouched():
    """Building the graph reads no data; computing leaves the inputs unchanged."""
    rng = np.random.default_rng(4)
    src, w, dy, kw = problem(rng, nsp=2, mb=2, g=1, icg=2, ocg=3, i=(6, 7), k=(3, 2), s=(1, 2))
    copies = [a.copy() for a in (src, w, dy)]

    def boom(block):
        raise RuntimeError("data was read")

    x = da.from_array(src, chunks=(1, 2, 3, 3)).map_blocks(boom, dtype=src.dtype)
    y = da.from_array(dy, chunks=(1, 3, 2, 2)).map_blocks(boom, dtype=dy.dtype)
    outs = (cgd.conv_forward(x, w, **kw), cgd.conv_backward_weights(x, y, (3, 2), **kw),
            cgd.conv_backward_data(y, w, (6, 7), **kw))
    assert all(isinstance(o, da.Array) for o in outs)
    with pytest.raises(RuntimeError, match="data was read"):
        outs[0].compute(scheduler="sync")
    dask.compute(*lazy(src, w, dy, kw, (1, 2, 3, 3), (1, 3, 2, 2), w_chunks=(2, 1, 1, 1)), scheduler="threads")
    for a, b in zip((src, w, dy), copies):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), ("float16", 2e-3), ("bfloat16", 1.6e-2), ("int32", 0)])
def test_element_types(dtype, tol):
    """Same element type out; against the single-machine result of the same type (halves:
    both accumulate in float32 and round once, so they differ by at most an ulp or so);
    integers exactly."""
    import ml_dtypes

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(5)
    src, w, dy, kw = problem(rng, nsp=2, mb=3, g=2, icg=2, ocg=3, i=(9, 8), k=(3, 2), s=(2, 1),
                             d=(1, 2), pb=(1, 0), pe=(0, 1))
    if dt.kind == "i":
        src, w, dy = (np.round(a * 4).astype(dt) for a in (src, w, dy))
    else:
        src, w, dy = (a.astype(dt) for a in (src, w, dy))
    got = dask.compute(*lazy(src, w, dy, kw, (2, 2, 4, 3), (1, 3, 2, 3)), scheduler="threads")
    want = reference(src, w, dy, kw, algorithm=None)
    if dt.kind == "i":
        for g_, w_ in zip(got, want):
            assert g_.dtype == dt and np.array_equal(g_, w_)
    else:
        check_all(got, want, tol, dtype)


# --------------------------------------------------------------------------------------
# Bitwise determinism of the weights gradient
# --------------------------------------------------------------------------------------

def _bitwise_problems():
    """A float32 2-D problem with a tree of several levels, and a float64 3-D one whose
    per-chunk GEMM reductions are long enough (thousands of rows) that OpenBLAS sums them
    differently on 2 threads than on 1: without one BLAS thread per task, the threads
    scheduler and the distributed workers differed in the last bit here."""
    rng = np.random.default_rng(11)
    src, w, dy, kw = problem(rng, nsp=2, mb=6, g=2, icg=3, ocg=2, i=(23, 19), k=(3, 2), s=(2, 1),
                             d=(1, 2), pb=(1, 2), pe=(0, 1), dtype=np.float32)
    x, y = da.from_array(src, chunks=(2, 6, 12, 10)), da.from_array(dy, chunks=(2, 4, 6, 10))
    first = (cgd.conv_backward_weights(x, y, (3, 2), **kw), (src, dy, kw))
    src, w, dy, kw = problem(rng, nsp=3, mb=2, g=2, icg=2, ocg=3, i=(48, 40, 40), k=(2, 3, 3), s=(1, 2, 1),
                             d=(2, 1, 1), pb=(1, 0, 1), pe=(0, 1, 1))
    x, y = da.from_array(src, chunks=(1, 4, 24, 40, 20)), da.from_array(dy, chunks=(1, 6, 12, 20, 20))
    return [first, (cgd.conv_backward_weights(x, y, (2, 3, 3), **kw), (src, dy, kw))]


def test_weights_gradient_bitwise_across_schedulers_and_workers(client):
    problems = _bitwise_problems()
    dws = [dw for dw, _ in problems]
    partials = [k for k in dws[0].__dask_graph__() if "-partial" in str(k)]
    assert len(partials) > cgd.SPLIT_EVERY  # a tree of at least two levels
    runs = {sch: dask.compute(*dws, scheduler=sch) for sch in ("sync", "threads", "processes")}
    workers = sorted(client.scheduler_info()["workers"])
    for n in (1, 2):
        with get_task_stream(client) as ts:
            runs[f"distributed-{n}"] = client.gather(client.compute(dws, workers=workers[:n], allow_other_workers=False))
        ran_on = {t["worker"] for t in ts.data if "convgrad-backward-weights" in str(t["key"])}
        assert len(ran_on) == n, ran_on
    runs["distributed-2-again"] = client.gather(client.compute(dws))
    base = runs.pop("sync")
    for got, (_, (src, dy, kw)) in zip(base, problems):
        want = cg.conv_backward_weights(src.astype(np.float64), dy.astype(np.float64), got.shape[2:], **kw)
        assert rel_err(got, want) < (1e-5 if got.dtype == np.float32 else 1e-12)
    for name, results in runs.items():
        for r, b in zip(results, base):
            assert r.dtype == b.dtype and r.tobytes() == b.tobytes(), name


def test_chunk_tasks_run_blas_on_one_thread(monkeypatch):
    """Inside every chunk task BLAS runs on one thread, in the threads scheduler too, even
    when another thread holds threadpoolctl's OpenBLAS control (a standalone limit in the
    main thread keeps it); the caller's setting is back afterwards."""
    import threadpoolctl

    def blas_threads():
        # NumPy's OpenBLAS, the one convgrad's GEMMs run in (SciPy, imported by distributed,
        # maps a second OpenBLAS that convgrad never calls)
        return [i["num_threads"] for i in threadpoolctl.threadpool_info()
                if i["user_api"] == "blas" and "numpy" in i["filepath"]]

    seen = []
    real = cg.ops.conv_backward_weights

    def spy(*args, **kwargs):
        seen.append(max(blas_threads(), default=1))
        return real(*args, **kwargs)

    monkeypatch.setattr(cg.ops, "conv_backward_weights", spy)
    rng = np.random.default_rng(12)
    src, w, dy, kw = problem(rng, nsp=2, mb=4, g=1, icg=2, ocg=3, i=(12, 10), k=(3, 2), s=2)
    dw = cgd.conv_backward_weights(da.from_array(src, chunks=(1, 2, 6, 5)), da.from_array(dy, chunks=(1, 3, 3, 3)),
                                   (3, 2), **kw)
    caller = threadpoolctl.threadpool_limits(limits=2, user_api="blas")  # standalone: main takes control
    try:
        dw.compute(scheduler="threads")
        dw.compute(scheduler="sync")
        assert len(seen) == 2 * 4 * 2 * 2 and set(seen) == {1}, seen
        assert set(blas_threads()) <= {2}
    finally:
        caller.restore_original_limits()
        threadpoolctl.OpenBLASController.clear_controlling_thread(force=True)


# --------------------------------------------------------------------------------------
# Validation: the canonical rules, raised when the graph is built
# --------------------------------------------------------------------------------------

def _bad_cases():
    rng = np.random.default_rng(0)
    src = da.from_array(rng.standard_normal((2, 4, 8, 7)), chunks=(1, 2, 4, 4))
    w = rng.standard_normal((6, 2, 3, 2))
    dy = da.from_array(rng.standard_normal((2, 6, 6, 6)), chunks=2)
    ok = dict(groups=2)
    unknown = src[src[:, 0, 0, 0] > -10]
    return [
        ("fwd strides", lambda: cgd.conv_forward(src, w, strides=(1, 0), **ok), ValueError, ["dask.conv_forward", "strides", "positive", "[1, 0]"]),
        ("fwd groups", lambda: cgd.conv_forward(src, w, groups=3), ValueError, ["dask.conv_forward", "divisible by groups (3)"]),
        ("fwd weights C", lambda: cgd.conv_forward(src, w[:, :1], **ok), ValueError, ["weights", "C // groups", "(6, 1, 3, 2)"]),
        ("fwd weights rank", lambda: cgd.conv_forward(src, w[0], **ok), ValueError, ["weights", "rank 4"]),
        ("fwd dtype mix", lambda: cgd.conv_forward(src, w.astype(np.float32), **ok), TypeError, ["share one element type", "float32"]),
        ("fwd bad dtype", lambda: cgd.conv_forward(src.astype(bool), w, **ok), TypeError, ["src", "element type", "bool"]),
        ("fwd unknown chunks", lambda: cgd.conv_forward(unknown, w, **ok), ValueError, ["src", "known chunk sizes", "nan"]),
        ("fwd src rank", lambda: cgd.conv_forward(src[0, 0], w, **ok), ValueError, ["src", "rank >= 3"]),
        ("fwd too small", lambda: cgd.conv_forward(src[:, :, :2], w, dilations=(3, 1), **ok), ValueError, ["padded input", "dilated kernel"]),
        ("fwd algorithm", lambda: cgd.conv_forward(src, w, algorithm="fft", **ok), ValueError, ["algorithm", "'fft'"]),
        ("fwd workspace", lambda: cgd.conv_forward(src, w, workspace_limit=0, **ok), ValueError, ["workspace_limit", "positive"]),
        ("bww diff_dst shape", lambda: cgd.conv_backward_weights(src, dy[:, :, :5], (3, 2), **ok), ValueError, ["dask.conv_backward_weights", "diff_dst shape", "(2, 6, 6, 6)", "(2, 6, 5, 6)"]),
        ("bww kernel len", lambda: cgd.conv_backward_weights(src, dy, (3,), **ok), ValueError, ["kernel", "one entry per spatial axis"]),
        ("bww kernel type", lambda: cgd.conv_backward_weights(src, dy, (3, 2.0), **ok), TypeError, ["kernel", "integers"]),
        ("bww pads", lambda: cgd.conv_backward_weights(src, dy, (3, 2), pads_begin=(-1, 0), **ok), ValueError, ["pads_begin", "non-negative"]),
        ("bww dtype mix", lambda: cgd.conv_backward_weights(src, dy.astype(np.float32), (3, 2), **ok), TypeError, ["share one element type"]),
        ("bwd src_spatial", lambda: cgd.conv_backward_data(dy, w, (8,), **ok), ValueError, ["dask.conv_backward_data", "src_spatial", "one entry"]),
        ("bwd negative", lambda: cgd.conv_backward_data(dy, w, (8, -7), **ok), ValueError, ["src_spatial", "non-negative"]),
        ("bwd diff_dst shape", lambda: cgd.conv_backward_data(dy, w, (9, 7), strides=2, **ok), ValueError, ["diff_dst shape", "floor("]),
        ("bwd groups type", lambda: cgd.conv_backward_data(dy, w, (8, 7), groups=2.0), TypeError, ["groups", "integer"]),
        ("bwd none", lambda: cgd.conv_backward_data(dy, None, (8, 7), **ok), TypeError, ["weights", "None"]),
    ]


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_validation_errors(case):
    _, call, kind, parts = case
    with pytest.raises(cg.ConvError) as info:
        call()
    assert isinstance(info.value, kind)
    for p in parts:
        assert p in str(info.value), (p, str(info.value))


# --------------------------------------------------------------------------------------
# A real framework: PyTorch autograd (float64), explicit zero padding for asymmetric pads
# --------------------------------------------------------------------------------------

def torch_results(src, w, dy, kw):
    import torch  # a missing torch fails this test: it is a declared test dependency
    import torch.nn.functional as F

    nsp = src.ndim - 2
    pad = []
    for ax in reversed(range(nsp)):  # F.pad lists the last axis first
        pad += [kw["pads_begin"][ax], kw["pads_end"][ax]]
    x = torch.tensor(src, requires_grad=True)
    wt = torch.tensor(w, requires_grad=True)
    conv = (F.conv1d, F.conv2d, F.conv3d)[nsp - 1]
    y = conv(F.pad(x, pad), wt, stride=kw["strides"], dilation=kw["dilations"], groups=kw["groups"])
    y.backward(torch.tensor(dy))
    return y.detach().numpy(), wt.grad.numpy(), x.grad.numpy()


def test_against_pytorch():
    """The named cluster cases (1-D to 3-D, groups, strides, dilations, asymmetric pads), each
    on two random chunkings, threads scheduler, float64."""
    rng = np.random.default_rng(2026)
    cases = [CLUSTER_CASES[n][0] for n in sorted(CLUSTER_CASES)]
    worst = 0.0
    for args in cases * 2:
        src, w, dy, kw = problem(rng, **args)
        sc = tuple(rand_chunks(v, rng) for v in src.shape)
        yc = tuple(rand_chunks(v, rng) for v in dy.shape)
        got = dask.compute(*lazy(src, w, dy, kw, sc, yc), scheduler="threads")
        worst = max(worst, check_all(got, torch_results(src, w, dy, kw), 1e-12, (args, sc, yc)))
    print(f"convgrad.dask vs PyTorch: {3 * 2 * len(cases)} comparisons, worst rel err {worst:.3g}")


# --------------------------------------------------------------------------------------
# Failure and scale (slow tier)
# --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_worker_killed_mid_computation():
    """SIGKILL one worker process while partials sit in its memory: the nanny restarts it,
    the scheduler reruns the lost tasks, and the result is bitwise the undisturbed one."""
    with _cluster(2, "400MiB") as cluster, Client(cluster) as c:
        rs = da.random.default_rng(12345)
        shape = (16, 4, 48, 40, 40)
        x = rs.standard_normal(shape, chunks=(1, 4, 24, 40, 20))
        kw = dict(strides=(1, 2, 1), dilations=(2, 1, 1), pads_begin=(1, 0, 1), pads_end=(0, 1, 1), groups=2)
        dst = tuple(forward_size(*a) for a in zip(shape[2:], (2, 3, 3), kw["strides"], kw["dilations"],
                                                   kw["pads_begin"], kw["pads_end"]))
        y = rs.standard_normal((16, 6) + dst, chunks=(1, 6, 12, 20, 20))
        dw = cgd.conv_backward_weights(x, y, (2, 3, 3), **kw)
        expected = dw.compute(scheduler="threads")
        victim = sorted(c.scheduler_info()["workers"])[0]
        pid = c.run(os.getpid, workers=[victim])[victim]
        fut = c.compute(dw)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            held = c.has_what().get(victim, ())
            if any("-partial" in str(k) for k in held):
                break
            time.sleep(0.02)
        assert not fut.done(), "the computation finished before the worker could be killed"
        os.kill(pid, signal.SIGKILL)
        result = fut.result(timeout=300)
        assert pid not in c.run(os.getpid).values()  # the killed process really is gone
        assert result.tobytes() == expected.tobytes()


@pytest.mark.slow
def test_inputs_larger_than_worker_memory():
    """Two workers with 300 MiB each; src and diff_dst (float64, about 650 MiB together) are
    generated lazily from random chunks, so no process ever holds them. The weights gradient
    must complete with no worker restarted (one over its limit is killed) and equal the
    float64 sum of single-machine gradients over 2-sample slabs."""
    import resource

    def peak_rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    with _cluster(2, "300MiB") as cluster, Client(cluster) as c:
        rs = da.random.default_rng(2024)
        shape, k = (26, 2, 40, 128, 128), (3, 3, 3)
        kw = dict(strides=(1, 1, 1), dilations=(1, 2, 1), pads_begin=(1, 2, 0), pads_end=(1, 2, 2), groups=1)
        dst = tuple(forward_size(*a) for a in zip(shape[2:], k, kw["strides"], kw["dilations"],
                                                   kw["pads_begin"], kw["pads_end"]))
        x = rs.standard_normal(shape, chunks=(1, 2, 20, 64, 128))
        y = rs.standard_normal((26, 3) + dst, chunks=(1, 3, 20, 64, 128))
        assert x.nbytes + y.nbytes > 2 * 300 * 2**20
        dw = cgd.conv_backward_weights(x, y, k, **kw)
        pids = c.run(os.getpid)
        t = time.perf_counter()
        got = c.compute(dw).result(timeout=300)   # a worker paused over its memory never finishes
        wall = time.perf_counter() - t
        slabs = [dask.delayed(cg.conv_backward_weights)(x[n:n + 2], y[n:n + 2], k, **kw) for n in range(0, 26, 2)]
        want = np.sum([f.result(timeout=300) for f in c.compute(slabs)], axis=0)
        assert rel_err(got, want) <= 1e-12
        assert c.run(os.getpid) == pids  # no worker was restarted (e.g. killed for memory)
        peaks = sorted(c.run(peak_rss).values())
        print(f"inputs {(x.nbytes + y.nbytes) / 2**20:.0f} MiB, 2 workers x 300 MiB, {wall:.1f} s, "
              f"peak RSS per worker {[f'{p / 2**20:.0f} MiB' for p in peaks]}, rel err {rel_err(got, want):.2g}")
