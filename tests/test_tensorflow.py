"""convgrad.tensorflow.raw_ops against TensorFlow 2.21 (CPU) and PyTorch 2.13.

* Real TensorFlow: every op on random problems (2-D and 3-D, NHWC/NCHW/NDHWC/NCDHW, SAME,
  VALID and EXPLICIT, anisotropic strides, dilations, groups, depthwise multipliers,
  non-square kernels, C_in != C_out, every floor remainder, f32/f64/f16/bf16/int32).
  TensorFlow runs in ONE spawned worker process for this module, with its oneDNN CPU kernels
  switched on (TF_ENABLE_ONEDNN_OPTS=1): they are what gives TensorFlow's CPU build NCHW,
  grouped and dilated float32 gradients, TensorFlow reads the switch once at import, and a
  fresh process keeps the oracle independent of whoever else imported TensorFlow here (and
  of inputs that abort TensorFlow: none is sent, but they could not take pytest down).
  Where TensorFlow 2.21 has no CPU kernel (the V2 gradient ops; the deprecated 3-D V1
  gradients; non-f32 NCHW / grouped / dilated gradients; grouped 3-D) the math is checked
  against the V1/V2 twin op (same math) or against PyTorch float64 (``tf_plan`` below).
  EXPLICIT padding has no grouped/dilated/NCHW gradient kernel: there the input is padded
  here and TensorFlow runs VALID.
* PyTorch float64 (``torch.ops.aten.convolution_backward``, asymmetric pads applied by hand)
  for every case: rel <= 1e-12 (f64), 1e-5 (f32), and the rounding error of one final
  rounding for the half types.
* Half types accumulate in float32 and round once: all-ones weight gradients whose counts pass
  256 come out as the exact count rounded once (TensorFlow's own half kernels do not).
* Adjoint identities through the public raw ops, signatures against tf.raw_ops, input/output
  contracts, empty outputs, and a validation table (one row per rule).

A missing framework (tensorflow, torch) makes these tests fail, never skip.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import multiprocessing
import os
from dataclasses import dataclass, replace

import ml_dtypes
import numpy as np
import pytest

import convgrad
from convgrad.opdoc import REGISTRY
from convgrad.tensorflow import raw_ops as R

from .helpers import Tally, rel_err

BF16 = np.dtype(ml_dtypes.bfloat16)
DT = {"f64": np.dtype(np.float64), "f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": BF16,
      "i32": np.dtype(np.int32)}
# ours vs float64 references (PyTorch f64, TensorFlow f64); for the half types this is one
# final rounding (unit roundoff 2**-11 and 2**-8) plus float32 accumulation
TOL = {"f64": 1e-12, "f32": 1e-5, "f16": 1e-3, "bf16": 5e-3}
# ours vs TensorFlow's own half kernels, which accumulate in the half type: their error scales
# with the sum of |terms|, so it is measured relative to the norm of the same op applied to
# |x|, |filter|, |out_backprop| (a float64 PyTorch result)
TOL_TF_HALF = {"f16": 2e-3, "bf16": 1.5e-2}

OPS = ("Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropFilterV2", "Conv2DBackpropInput", "Conv2DBackpropInputV2",
       "Conv3D", "Conv3DBackpropFilter", "Conv3DBackpropFilterV2", "Conv3DBackpropInput", "Conv3DBackpropInputV2",
       "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropFilter", "DepthwiseConv2dNativeBackpropInput")
OP_INPUTS = {
    "Conv2D": ("input", "filter"), "Conv3D": ("input", "filter"), "DepthwiseConv2dNative": ("input", "filter"),
    "Conv2DBackpropFilter": ("input", "filter_sizes", "out_backprop"),
    "Conv2DBackpropFilterV2": ("input", "filter", "out_backprop"),
    "Conv2DBackpropInput": ("input_sizes", "filter", "out_backprop"),
    "Conv2DBackpropInputV2": ("input", "filter", "out_backprop"),
    "Conv3DBackpropFilter": ("input", "filter", "out_backprop"),
    "Conv3DBackpropFilterV2": ("input", "filter_sizes", "out_backprop"),
    "Conv3DBackpropInput": ("input", "filter", "out_backprop"),
    "Conv3DBackpropInputV2": ("input_sizes", "filter", "out_backprop"),
    "DepthwiseConv2dNativeBackpropFilter": ("input", "filter_sizes", "out_backprop"),
    "DepthwiseConv2dNativeBackpropInput": ("input_sizes", "filter", "out_backprop"),
}
FAMILY = {  # family -> direction -> ops
    "conv2d": {"fwd": ("Conv2D",), "bwd_filter": ("Conv2DBackpropFilter", "Conv2DBackpropFilterV2"),
               "bwd_input": ("Conv2DBackpropInput", "Conv2DBackpropInputV2")},
    "conv3d": {"fwd": ("Conv3D",), "bwd_filter": ("Conv3DBackpropFilterV2", "Conv3DBackpropFilter"),
               "bwd_input": ("Conv3DBackpropInputV2", "Conv3DBackpropInput")},
    "depthwise": {"fwd": ("DepthwiseConv2dNative",), "bwd_filter": ("DepthwiseConv2dNativeBackpropFilter",),
                  "bwd_input": ("DepthwiseConv2dNativeBackpropInput",)},
}
# TensorFlow 2.21 runs neither the 2-D V2 gradients (no CPU kernel) nor the 3-D V1 ones
# (removed from GraphDef version 10): their twins compute the same math.
TF_TWIN = {"Conv2DBackpropFilterV2": "Conv2DBackpropFilter", "Conv2DBackpropInputV2": "Conv2DBackpropInput",
           "Conv3DBackpropFilter": "Conv3DBackpropFilterV2", "Conv3DBackpropInput": "Conv3DBackpropInputV2"}
V1_3D = ("Conv3DBackpropFilter", "Conv3DBackpropInput")   # NDHWC only, no data_format attribute

TALLY = Tally("convgrad.tensorflow comparisons (op, oracle, dtype)")


def _record(op: str, oracle: str, dt: str, err: float) -> None:
    TALLY.record((op, oracle, dt), err)


@pytest.fixture(scope="module", autouse=True)
def _report(request):
    yield
    TALLY.report(request)


# ---------------------------------------------------------------------------------------------
# The TensorFlow worker (runs in the spawned process; these functions must stay importable)

_TF = None


def _tf_init() -> None:
    global _TF
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1"
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    _TF = tf


def _tf_info() -> dict:
    from tensorflow.python.util import _pywrap_util_port

    sigs = {op: [(p.name, p.default is inspect.Parameter.empty, None if p.default is inspect.Parameter.empty
                  else p.default) for p in inspect.signature(getattr(_TF.raw_ops, op)).parameters.values()]
            for op in OPS}
    return {"version": _TF.__version__, "onednn": bool(_pywrap_util_port.IsMklEnabled()), "signatures": sigs}


def _tf_call(op: str, kwargs: dict) -> np.ndarray:
    return getattr(_TF.raw_ops, op)(**kwargs).numpy()


class TensorFlow:
    def __init__(self, pool: concurrent.futures.Executor, info: dict):
        self.pool, self.info = pool, info

    def __call__(self, op: str, **kwargs) -> np.ndarray:
        return self.pool.submit(_tf_call, op, kwargs).result(timeout=300)


@pytest.fixture(scope="module")
def tf():
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=_tf_init)
    try:
        info = pool.submit(_tf_info).result(timeout=600)   # ImportError in the worker fails the tests
        assert info["version"].startswith("2.21"), info["version"]
        assert info["onednn"], "TensorFlow's oneDNN CPU kernels did not switch on in the worker"
        yield TensorFlow(pool, info)
    finally:
        pool.shutdown(cancel_futures=True)


@pytest.fixture(scope="module")
def torch():
    import torch as t

    t.set_num_threads(2)
    return t


# ---------------------------------------------------------------------------------------------
# Problems in TensorFlow's terms, and independent float64 references


@dataclass(frozen=True)
class Case:
    family: str                      # conv2d, conv3d, depthwise
    fmt: str                         # data_format
    padding: str                     # SAME, VALID, EXPLICIT
    n: int
    c: int                           # input depth
    fin: int                         # filter in_channels (c / groups; c for depthwise)
    fout: int                        # filter out_channels (channel_multiplier for depthwise)
    src: tuple
    kernel: tuple
    strides: tuple
    dilations: tuple
    pads: tuple = ()                 # ((before, after), ...) for EXPLICIT
    dtype: str = "f32"
    seed: int = 0

    @property
    def nsp(self) -> int:
        return len(self.src)

    @property
    def depthwise(self) -> bool:
        return self.family == "depthwise"

    @property
    def groups(self) -> int:
        return self.c if self.depthwise else self.c // self.fin

    @property
    def oc(self) -> int:
        return self.c * self.fout if self.depthwise else self.fout

    @property
    def channels_last(self) -> bool:
        return self.fmt.endswith("C")

    def ek(self, ax: int) -> int:
        return self.dilations[ax] * (self.kernel[ax] - 1) + 1

    def explicit_pads(self) -> list:
        """(before, after) per axis. SAME restated from PEERS.md: o = ceil(i/s), total pad
        max((o-1)*s + ek - i, 0), the smaller half before."""
        if self.padding == "EXPLICIT":
            return list(self.pads)
        if self.padding == "VALID":
            return [(0, 0)] * self.nsp
        out = []
        for ax, i in enumerate(self.src):
            s = self.strides[ax]
            o = -(-i // s)
            tot = max((o - 1) * s + self.ek(ax) - i, 0)
            out.append((tot // 2, tot - tot // 2))
        return out

    def dst(self) -> tuple:
        return tuple((i + b + e - self.ek(ax)) // self.strides[ax] + 1
                     for ax, (i, (b, e)) in enumerate(zip(self.src, self.explicit_pads())))

    def data_shape(self, c: int, spatial) -> tuple:
        return (self.n, *spatial, c) if self.channels_last else (self.n, c, *spatial)

    def filter_shape(self) -> tuple:
        return (*self.kernel, self.fin, self.fout)

    def full(self, spatial) -> list:
        return [1, *spatial, 1] if self.channels_last else [1, 1, *spatial]

    def attrs(self, op: str) -> dict:
        a = {"strides": self.full(self.strides), "padding": self.padding, "dilations": self.full(self.dilations)}
        if self.nsp == 2:
            flat = []
            for b, e in ([(0, 0)] + list(self.pads) + [(0, 0)] if self.channels_last else [(0, 0)] * 2 + list(self.pads)):
                flat += [b, e]
            a["explicit_paddings"] = flat if self.padding == "EXPLICIT" else []
        if op not in V1_3D:
            a["data_format"] = self.fmt
        return a

    def arrays(self):
        rng = np.random.default_rng(self.seed)
        dt = DT[self.dtype]

        def draw(shape):
            if dt.kind == "i":
                return rng.integers(-4, 5, size=shape).astype(dt)
            return rng.standard_normal(shape).astype(dt)
        return (draw(self.data_shape(self.c, self.src)), draw(self.filter_shape()),
                draw(self.data_shape(self.oc, self.dst())))

    def __str__(self) -> str:
        p = "".join(f"p{b}_{e}" for b, e in self.pads) if self.padding == "EXPLICIT" else ""
        return (f"{self.family}_{self.fmt}_{self.padding}{p}_{self.dtype}_mb{self.n}ic{self.c}fi{self.fin}fo{self.fout}"
                f"i{'x'.join(map(str, self.src))}k{'x'.join(map(str, self.kernel))}"
                f"s{'x'.join(map(str, self.strides))}d{'x'.join(map(str, self.dilations))}_seed{self.seed}")


def kwargs_for(op: str, case: Case, x, f, dy) -> dict:
    pool = {"input": x, "filter": f, "out_backprop": dy, "input_sizes": list(x.shape), "filter_sizes": list(f.shape)}
    return {name: pool[name] for name in OP_INPUTS[op]} | case.attrs(op)


def ours(op: str, case: Case, x, f, dy) -> np.ndarray:
    return getattr(R, op)(**kwargs_for(op, case, x, f, dy))


def _to_ncx(a: np.ndarray, case: Case) -> np.ndarray:
    return np.moveaxis(a, -1, 1) if case.channels_last else a


def _from_ncx(a: np.ndarray, case: Case) -> np.ndarray:
    return np.moveaxis(a, 1, -1) if case.channels_last else a


def torch_reference(torch, case: Case, x, f, dy) -> dict:
    """float64 forward, filter and input gradients in TensorFlow's layouts, from PyTorch."""
    nsp, f64 = case.nsp, np.float64
    X = _to_ncx(x.astype(f64), case)
    fw = f.astype(f64)
    if case.depthwise:   # [*k, C, M] -> [*k, 1, C*M]: output channel c*M + m
        fw = fw.reshape(case.kernel + (1, case.c * case.fout))
    W = np.ascontiguousarray(fw.transpose(nsp + 1, nsp, *range(nsp)))
    DY = _to_ncx(dy.astype(f64), case)
    pads = case.explicit_pads()
    Xp = np.pad(X, [(0, 0), (0, 0)] + pads)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))
    zero = [0] * nsp
    args = (list(case.strides), zero, list(case.dilations), False, zero, case.groups)
    y = torch.ops.aten.convolution(t(Xp), t(W), None, *args).numpy()
    dxp, dw, _ = torch.ops.aten.convolution_backward(t(DY), t(Xp), t(W), None, *args, [True, True, False])
    dx = dxp.numpy()[(slice(None), slice(None)) + tuple(slice(b, b + i) for (b, _), i in zip(pads, case.src))]
    dw = dw.numpy().transpose(*range(2, 2 + nsp), 1, 0)       # (O, I, *k) -> (*k, I, O)
    return {"fwd": _from_ncx(y, case), "bwd_filter": dw.reshape(case.filter_shape()),
            "bwd_input": _from_ncx(dx, case)}


def tf_plan(case: Case, direction: str) -> str | None:
    """How TensorFlow 2.21's CPU build can compute this case (measured; see the module doc):
    "direct", "padded" (EXPLICIT pads applied here, VALID in TensorFlow) or None (no kernel)."""
    f32 = case.dtype == "f32"
    dilated = any(d > 1 for d in case.dilations)
    if case.dtype == "i32":
        return "direct" if case.channels_last and case.groups == 1 and not dilated else None
    if (direction == "fwd" and case.dtype in ("f16", "bf16") and case.padding == "EXPLICIT"
            and case.nsp == 2):
        # the worker process died inside the half-type forward kernels with EXPLICIT pads
        # wider than the input on the Intel AVX-512 FP16/BF16 machine (Conv2D f16, input 4x1,
        # pads (2, 0), (2, 2); DepthwiseConv2dNative bf16, input 2x1, pads (2, 3), (1, 3))
        return None
    if case.depthwise:
        if dilated and direction != "fwd":
            return None   # TensorFlow's depthwise gradients ignore dilations (measured; see raw_ops notes)
        native = case.channels_last and len(set(case.strides)) == 1 and not dilated
        if f32:           # oneDNN runs SAME/VALID; EXPLICIT goes to the native kernels
            return "direct" if case.padding != "EXPLICIT" or native else "padded"
        return "direct" if native else None
    if case.nsp == 3:
        if case.groups > 1:
            return None
        if f32:
            return "direct"
        if direction == "fwd" and case.dtype == "bf16":
            return None   # 0.36 off (|.|-norm) on the Intel AVX-512 BF16 machine, where convgrad met PyTorch f64
        if direction == "fwd" and case.padding == "SAME" and any(
                (-(-i // s) - 1) * s + case.ek(ax) - i <= -2 for ax, (i, s) in enumerate(zip(case.src, case.strides))):
            return None   # TensorFlow's native Conv3D kernel mis-pads this SAME case (test_tensorflow_quirks)
        return "direct" if case.channels_last and not dilated else None
    if direction == "fwd":
        return "direct" if f32 or case.channels_last else None
    simple = case.channels_last and case.groups == 1 and not dilated
    if f32:
        return "direct" if case.padding != "EXPLICIT" or simple else "padded"
    return "direct" if simple else None


def tf_reference(tf, op: str, case: Case, direction: str, x, f, dy) -> np.ndarray | None:
    plan = tf_plan(case, direction)
    if plan is None or (op in V1_3D and case.fmt != "NDHWC"):
        return None
    tf_op = TF_TWIN.get(op, op)
    if plan == "direct":
        return tf(tf_op, **kwargs_for(tf_op, case, x, f, dy))
    pads = case.explicit_pads()
    sp = range(1, 1 + case.nsp) if case.channels_last else range(2, 2 + case.nsp)
    widths = [(0, 0)] * x.ndim
    for ax, (b, e) in zip(sp, pads):
        widths[ax] = (b, e)
    valid = replace(case, padding="VALID", pads=(), src=tuple(i + b + e for i, (b, e) in zip(case.src, pads)))
    got = tf(tf_op, **kwargs_for(tf_op, valid, np.pad(x, widths), f, dy))
    if direction != "bwd_input":
        return got
    crop = [slice(None)] * x.ndim
    for ax, (b, _), i in zip(sp, pads, case.src):
        crop[ax] = slice(b, b + i)
    return got[tuple(crop)]


def check_case(tf, torch, case: Case, *, directions=("fwd", "bwd_filter", "bwd_input")) -> None:
    """Every op of the family on one case: ours vs TensorFlow (where it runs) and PyTorch f64."""
    x, f, dy = case.arrays()
    snapshot = [a.copy() for a in (x, f, dy)]
    ref = torch_reference(torch, case, x, f, dy) if case.dtype != "i32" else None
    half = case.dtype in ("f16", "bf16")
    absref = torch_reference(torch, case, *(np.abs(a.astype(np.float64)) for a in (x, f, dy))) if half else None
    for direction in directions:
        for op in FAMILY[case.family][direction]:
            if op in V1_3D and (case.fmt != "NDHWC" or case.dtype == "bf16"):
                continue
            got = ours(op, case, x, f, dy)
            assert got.dtype == DT[case.dtype] and got.flags.c_contiguous, (op, got.dtype)
            want_tf = tf_reference(tf, op, case, direction, x, f, dy)
            if want_tf is not None:
                assert got.shape == want_tf.shape, (op, str(case), got.shape, want_tf.shape)
                if case.dtype == "i32":
                    assert np.array_equal(got, want_tf), (op, str(case))
                    _record(op, "tf", case.dtype, 0.0)
                elif half:
                    diff = got.astype(np.float64) - want_tf.astype(np.float64)
                    err = float(np.linalg.norm(diff.ravel()) / (np.linalg.norm(absref[direction].ravel()) or 1.0))
                    _record(op, "tf|.|", case.dtype, err)
                    tol = TOL_TF_HALF[case.dtype]
                    assert err <= tol, f"{op} vs TensorFlow: error / |.|-norm {err:.3e} > {tol} for {case}"
                else:
                    err = rel_err(got, want_tf)
                    _record(op, "tf", case.dtype, err)
                    assert err <= TOL[case.dtype], f"{op} vs TensorFlow: rel err {err:.3e} > {TOL[case.dtype]} for {case}"
            if ref is not None:
                err = rel_err(got, ref[direction])
                _record(op, "torch", case.dtype, err)
                assert err <= TOL[case.dtype], f"{op} vs PyTorch f64: rel err {err:.3e} > {TOL[case.dtype]} for {case}"
    for a, b in zip((x, f, dy), snapshot):
        assert np.array_equal(a, b), "an input was modified"


# ---------------------------------------------------------------------------------------------
# Case generators


def _src_for(rng, case_kw: dict, ax: int, r: int) -> int:
    """An input size whose floor remainder (i + pb + pe - ek) % s is r (SAME: i % s == r)."""
    s, k, d = case_kw["strides"][ax], case_kw["kernel"][ax], case_kw["dilations"][ax]
    ek = d * (k - 1) + 1
    if case_kw["padding"] == "SAME":
        return s * int(rng.integers(1, 4)) + r
    b, e = case_kw["pads"][ax] if case_kw["padding"] == "EXPLICIT" else (0, 0)
    i = ek - b - e + r + s * int(rng.integers(0, 3))
    while i < 1:
        i += s
    return i


def random_case(seed: int, family: str, fmt: str, padding: str, dtype: str = "f32", *, groups: bool = True,
                dilations: bool = True) -> Case:
    rng = np.random.default_rng(seed)
    nsp = 3 if family == "conv3d" else 2
    k0 = int(rng.integers(2, 4))
    kernel = (k0, k0 - 1) if nsp == 2 else (k0, int(rng.integers(1, 3)), k0 - 1)   # never square
    strides = tuple(int(v) for v in rng.integers(1, 4, nsp))
    if family == "depthwise" and dtype != "f32" and rng.random() < 0.7:
        strides = (strides[0],) * nsp
    dil = tuple(int(v) for v in rng.integers(1, 3, nsp)) if dilations and rng.random() < 0.5 else (1,) * nsp
    pads = tuple((int(rng.integers(0, 3)), int(rng.integers(0, 4))) for _ in range(nsp))
    kw = dict(strides=strides, kernel=kernel, dilations=dil, padding=padding, pads=pads if padding == "EXPLICIT" else ())
    src = tuple(_src_for(rng, kw, ax, int(rng.integers(0, strides[ax]))) for ax in range(nsp))
    if family == "depthwise":
        c = int(rng.integers(2, 5))
        fin, fout = c, int(rng.integers(2, 4))
    else:
        g = int(rng.integers(1, 4)) if groups and rng.random() < 0.6 else 1
        fin = int(rng.integers(1, 4))
        fout = g * int(rng.integers(1, 4))
        if fout == g * fin:
            fout += g                                # C_in != C_out
        c = g * fin
    return Case(family=family, fmt=fmt, padding=padding, n=int(rng.integers(1, 3)), c=c, fin=fin, fout=fout,
                src=src, kernel=kernel, strides=strides, dilations=dil, pads=kw["pads"], dtype=dtype, seed=seed)


FMT = {"conv2d": ("NHWC", "NCHW"), "depthwise": ("NHWC", "NCHW"), "conv3d": ("NDHWC", "NCDHW")}
PADS = {"conv2d": ("SAME", "VALID", "EXPLICIT"), "depthwise": ("SAME", "VALID", "EXPLICIT"), "conv3d": ("SAME", "VALID")}


def random_cases(family: str, dtype: str, per_combo: int, seed0: int) -> list:
    return [random_case(seed0 + 1000 * j + i, family, fmt, pad, dtype)
            for j, (fmt, pad) in enumerate((fm, p) for fm in FMT[family] for p in PADS[family])
            for i in range(per_combo)]


def _ids(cases):
    return [str(c) for c in cases]


# ---------------------------------------------------------------------------------------------
# Comparisons with TensorFlow and PyTorch

FAST_F32 = random_cases("conv2d", "f32", 4, 10) + random_cases("depthwise", "f32", 2, 20) \
    + random_cases("conv3d", "f32", 2, 30)


@pytest.mark.parametrize("case", FAST_F32, ids=_ids(FAST_F32))
def test_f32_vs_tensorflow_and_torch(tf, torch, case):
    check_case(tf, torch, case)


FAST_OTHER = [random_case(40 + i, fam, FMT[fam][i % 2], PADS[fam][i % len(PADS[fam])], dt)
              for i, (fam, dt) in enumerate((fam, dt) for dt in ("f64", "f16", "bf16")
                                            for fam in ("conv2d", "conv2d", "depthwise", "conv3d"))]
# and the same problems channels-last without groups or dilations, where TensorFlow's
# f64/f16/bf16 CPU kernels run every direction
FAST_OTHER += [random_case(60 + i, c.family, FMT[c.family][0], c.padding, c.dtype, groups=False, dilations=False)
               for i, c in enumerate(FAST_OTHER)]


@pytest.mark.parametrize("case", FAST_OTHER, ids=_ids(FAST_OTHER))
def test_f64_and_half_types(tf, torch, case):
    check_case(tf, torch, case)


REMAINDERS = []
for _pad in ("VALID", "EXPLICIT", "SAME"):
    for _r0 in range(2):
        for _r1 in range(3):
            _kw = dict(strides=(2, 3), kernel=(3, 2), dilations=(1, 2) if _r0 else (2, 1), padding=_pad,
                       pads=((1, 0), (2, 1)) if _pad == "EXPLICIT" else ())
            _rng = np.random.default_rng(7 * _r0 + _r1)
            _src = (_src_for(_rng, _kw, 0, _r0), _src_for(_rng, _kw, 1, _r1))
            REMAINDERS.append(Case(family="conv2d", fmt=("NHWC", "NCHW")[_r1 % 2], padding=_pad, n=2, c=4, fin=2,
                                   fout=6, src=_src, kernel=(3, 2), strides=(2, 3), dilations=_kw["dilations"],
                                   pads=_kw["pads"], seed=100 + 7 * _r0 + _r1))


@pytest.mark.parametrize("case", REMAINDERS, ids=_ids(REMAINDERS))
def test_every_floor_remainder(tf, torch, case):
    """(i + pb + pe - d*(k-1) - 1) % s over every remainder of both axes (see the next test),
    grouped, dilated, NHWC and NCHW."""
    check_case(tf, torch, case)


def test_remainder_sweep_is_complete():
    for pad in ("VALID", "EXPLICIT", "SAME"):
        seen = set()
        for c in REMAINDERS:
            if c.padding != pad:
                continue
            pads = c.explicit_pads()
            seen.add(tuple(((i + b + e - c.ek(ax)) % s) if pad != "SAME" else i % s
                           for ax, (i, (b, e), s) in enumerate(zip(c.src, pads, c.strides))))
        assert seen == {(r0, r1) for r0 in range(2) for r1 in range(3)}, (pad, seen)


ODD_SAME = [Case(family=fam, fmt=fmt, padding="SAME", n=1, c=c, fin=fin, fout=fout, src=src, kernel=k,
                 strides=(2,) * len(src), dilations=(1,) * len(src), seed=200 + j)
            for j, (fam, fmt, c, fin, fout, src, k) in enumerate([
                ("conv2d", "NHWC", 3, 3, 5, (7, 9), (3, 2)), ("conv2d", "NCHW", 4, 2, 6, (9, 5), (2, 3)),
                ("conv2d", "NHWC", 2, 2, 3, (1, 3), (3, 2)), ("depthwise", "NHWC", 3, 3, 2, (7, 5), (3, 2)),
                ("conv3d", "NDHWC", 2, 2, 3, (5, 7, 3), (3, 2, 1)), ("conv3d", "NCDHW", 3, 3, 2, (3, 5, 7), (2, 3, 3))])]


@pytest.mark.parametrize("case", ODD_SAME, ids=_ids(ODD_SAME))
def test_odd_sizes_same_stride_2(tf, torch, case):
    """SAME with stride 2 on odd sizes: the odd pad unit goes after (input smaller than the kernel too)."""
    check_case(tf, torch, case)


INT32 = [random_case(300 + i, "conv2d", "NHWC", pad, "i32", groups=False, dilations=False)
         for i, pad in enumerate(("SAME", "VALID", "EXPLICIT") * 2)]


@pytest.mark.parametrize("case", INT32, ids=_ids(INT32))
def test_int32_exact_vs_tensorflow(tf, torch, case):
    """Conv2D and Conv2DBackpropInput(V2) allow int32 (TensorFlow's op defs): exact, vs TF's int32 kernels."""
    check_case(tf, torch, case, directions=("fwd", "bwd_input"))


@pytest.mark.slow
@pytest.mark.parametrize("family,dtype", [(fam, dt) for fam in ("conv2d", "depthwise", "conv3d")
                                          for dt in ("f32", "f64", "f16", "bf16")])
def test_random_sweep_slow(tf, torch, family, dtype):
    per = {"conv2d": 30, "depthwise": 15, "conv3d": 10}[family] // (1 if dtype == "f32" else 2)
    seed0 = 5000 + 100000 * ("conv2d", "depthwise", "conv3d").index(family) + 10000 * list(DT).index(dtype)
    cases = random_cases(family, dtype, per, seed0)
    if dtype != "f32":   # and problems where TensorFlow's non-f32 CPU kernels run every direction
        cases += [random_case(seed0 + 7000 + i, family, FMT[family][0], PADS[family][i % len(PADS[family])], dtype,
                              groups=False, dilations=False) for i in range(2 * per)]
    for case in cases:
        check_case(tf, torch, case)


def test_tensorflow_quirks(tf):
    """Two TensorFlow 2.21 CPU bugs that tf_plan routes around (measured; see the raw_ops notes).
    If an upgrade fixes them this test fails, and tf_plan can send those cases to TensorFlow."""
    # 1. The native Conv3D kernel (every type but f32, which oneDNN takes) mis-pads SAME when the
    #    unclamped total pad (o-1)*s + ek - i is <= -2 (here 6, k 1, s 3: -2); oneDNN and its own
    #    gradients clamp it at 0, as TensorFlow's padding rule says.
    c = Case(family="conv3d", fmt="NDHWC", padding="SAME", n=1, c=3, fin=3, fout=2, src=(6, 3, 2), kernel=(1, 1, 2),
             strides=(3, 1, 1), dilations=(1, 1, 1), dtype="f64", seed=3)
    x, f, dy = c.arrays()
    mine = ours("Conv3D", c, x, f, dy)
    assert rel_err(tf("Conv3D", **kwargs_for("Conv3D", c, x, f, dy)), mine) > 0.1
    c32 = replace(c, dtype="f32")
    x32, f32, dy32 = (a.astype(np.float32) for a in (x, f, dy))
    assert rel_err(tf("Conv3D", **kwargs_for("Conv3D", c32, x32, f32, dy32)), mine) < TOL["f32"]
    assert rel_err(tf("Conv3DBackpropInputV2", **kwargs_for("Conv3DBackpropInputV2", c, x, f, dy)),
                   ours("Conv3DBackpropInputV2", c, x, f, dy)) < TOL["f64"]
    # 2. The depthwise gradient kernels ignore dilations: with SAME (same out_backprop shape)
    #    they return the undilated gradient.
    c = Case(family="depthwise", fmt="NHWC", padding="SAME", n=1, c=3, fin=3, fout=2, src=(6, 7), kernel=(3, 2),
             strides=(1, 1), dilations=(2, 2), dtype="f64", seed=4)
    x, f, dy = c.arrays()
    for op in FAMILY["depthwise"]["bwd_filter"] + FAMILY["depthwise"]["bwd_input"]:
        got = tf(op, **kwargs_for(op, c, x, f, dy))
        assert rel_err(got, ours(op, replace(c, dilations=(1, 1)), x, f, dy)) < TOL["f64"], op
        assert rel_err(got, ours(op, c, x, f, dy)) > 0.1, op


# ---------------------------------------------------------------------------------------------
# Half types: float32 accumulation, one rounding


def _hits(i: int, k: int, s: int, pb: int, o: int) -> np.ndarray:
    """hits[y, tap] = 1 where output y reads an in-range input row y*s - pb + tap (one axis)."""
    return np.array([[1.0 if 0 <= y * s - pb + tap < i else 0.0 for tap in range(k)] for y in range(o)])


def _ones_count(i: int, k: int, s: int, pb: int, o: int) -> np.ndarray:
    """Per tap, how many outputs read an in-range input row (a weight gradient of all-ones data)."""
    return _hits(i, k, s, pb, o).sum(axis=0)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_weight_gradients_of_ones_are_exact(tf, dtype):
    """80x80 ones, 3x3, stride 2, pad 1: counts 1521/1560/1600 pass 256 (where half-type
    accumulation would stall); the result is each count rounded once to the type."""
    dt = DT[dtype]
    rows = _ones_count(80, 3, 2, 1, 40)
    want = np.outer(rows, rows).astype(dt)          # one rounding of the exact count
    assert float(want.astype(np.float64).max()) > 256
    x = np.ones((1, 80, 80, 1), dt)
    dy = np.ones((1, 40, 40, 1), dt)
    attrs = dict(strides=[1, 2, 2, 1], padding="EXPLICIT", explicit_paddings=[0, 0, 1, 1, 1, 1, 0, 0])
    f = np.zeros((3, 3, 1, 1), dt)
    got = {
        "Conv2DBackpropFilter": R.Conv2DBackpropFilter(input=x, filter_sizes=[3, 3, 1, 1], out_backprop=dy, **attrs),
        "Conv2DBackpropFilterV2": R.Conv2DBackpropFilterV2(input=x, filter=f, out_backprop=dy, **attrs),
        "DepthwiseConv2dNativeBackpropFilter": R.DepthwiseConv2dNativeBackpropFilter(
            input=x, filter_sizes=[3, 3, 1, 1], out_backprop=dy, **attrs),
        "Conv2DBackpropFilter NCHW": R.Conv2DBackpropFilter(
            input=x.reshape(1, 1, 80, 80), filter_sizes=[3, 3, 1, 1], out_backprop=dy.reshape(1, 1, 40, 40),
            strides=[1, 1, 2, 2], padding="EXPLICIT", explicit_paddings=[0, 0, 0, 0, 1, 1, 1, 1], data_format="NCHW"),
    }
    for op, g in got.items():
        assert g.dtype == dt and np.array_equal(g[:, :, 0, 0].astype(np.float64), want.astype(np.float64)), (op, g[:, :, 0, 0])
    # 3-D, SAME (pads 0 before, 1 after on the 80-axes), channels-first
    rows_same = _ones_count(80, 3, 2, 0, 40)
    g3 = R.Conv3DBackpropFilterV2(input=x.reshape(1, 1, 1, 80, 80), filter_sizes=[1, 3, 3, 1, 1],
                                  out_backprop=dy.reshape(1, 1, 1, 40, 40), strides=[1, 1, 1, 2, 2], padding="SAME",
                                  data_format="NCDHW")
    assert np.array_equal(g3[0, :, :, 0, 0].astype(np.float64),
                          np.outer(rows_same, rows_same).astype(dt).astype(np.float64))
    # TensorFlow's own kernel, for the record: its f16 result is exact here; its bf16 kernels
    # accumulate in bfloat16 (this test documents, it does not rely on, that difference)
    tf_got = tf("Conv2DBackpropFilter", input=x, filter_sizes=[3, 3, 1, 1], out_backprop=dy, **attrs)
    if dtype == "f16":
        assert np.array_equal(tf_got[:, :, 0, 0].astype(np.float64), want.astype(np.float64))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_forward_and_input_gradient_long_reductions(dtype):
    """Long channel reductions of ones in the other two directions: exact counts, rounded once."""
    dt = DT[dtype]
    c, o = 301, 2                                   # 6 * 301 = 1806 rounds in bfloat16
    x = np.ones((1, 5, 6, c), dt)
    f = np.ones((3, 2, c, o), dt)
    y = R.Conv2D(input=x, filter=f, strides=[1, 1, 1, 1], padding="SAME")
    rows, cols = _hits(5, 3, 1, 1, 5), _hits(6, 2, 1, 0, 6)         # SAME pads (1, 1) and (0, 1)
    want = np.outer(rows.sum(axis=1), cols.sum(axis=1)) * c          # taps in range per output, times c
    assert np.array_equal(y[0, :, :, 0].astype(np.float64), want.astype(dt).astype(np.float64))
    dy = np.ones((1, 5, 6, c), dt)
    fo = np.ones((3, 2, 1, c), dt)
    dx = R.Conv2DBackpropInput(input_sizes=[1, 5, 6, 1], filter=fo, out_backprop=dy, strides=[1, 1, 1, 1],
                               padding="SAME")
    # input row r is read by every (y, tap) with y - 1 + tap == r (stride 1): count per row, times c
    per_row = [sum(rows[yy, t] for yy in range(5) for t in range(3) if yy - 1 + t == r) for r in range(5)]
    per_col = [sum(cols[yy, t] for yy in range(6) for t in range(2) if yy + t == r) for r in range(6)]
    want = np.outer(per_row, per_col) * c
    assert np.array_equal(dx[0, :, :, 0].astype(np.float64), want.astype(dt).astype(np.float64))


# ---------------------------------------------------------------------------------------------
# Adjoint identities through the public raw ops (float64)

ADJOINT = (random_cases("conv2d", "f64", 2, 400) + random_cases("depthwise", "f64", 1, 450)
           + random_cases("conv3d", "f64", 1, 480))


@pytest.mark.parametrize("case", ADJOINT, ids=_ids(ADJOINT))
def test_adjoint_identities(case):
    """<conv(x, f), dy> == <x, backprop_input(f, dy)> == <f, backprop_filter(x, dy)>, every op."""
    x, f, dy = case.arrays()
    fwd = FAMILY[case.family]["fwd"][0]
    lhs = float(np.vdot(ours(fwd, case, x, f, dy), dy))
    scale = float(np.linalg.norm(x) * np.linalg.norm(f) * np.linalg.norm(dy)) or 1.0
    for op in FAMILY[case.family]["bwd_input"]:
        if op in V1_3D and case.fmt != "NDHWC":
            continue
        assert abs(float(np.vdot(x, ours(op, case, x, f, dy))) - lhs) <= 1e-12 * scale, op
    for op in FAMILY[case.family]["bwd_filter"]:
        if op in V1_3D and case.fmt != "NDHWC":
            continue
        assert abs(float(np.vdot(f, ours(op, case, x, f, dy))) - lhs) <= 1e-12 * scale, op


# ---------------------------------------------------------------------------------------------
# Interface: signatures, documentation, input/output contracts, empty outputs


def test_signatures_match_tensorflow(tf):
    """Same argument names, order and defaults as tf.raw_ops; ours are keyword-only."""
    for op in OPS:
        params = list(inspect.signature(getattr(R, op)).parameters.values())
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params), op
        mine = [(p.name, p.default is inspect.Parameter.empty,
                 None if p.default is inspect.Parameter.empty else p.default) for p in params]
        assert mine == [tuple(t) for t in tf.info["signatures"][op]], op


def test_every_op_registers_one_opdoc():
    docs = [d for d in REGISTRY if d.framework == "TensorFlow"]
    assert sorted(d.name for d in docs) == sorted(OPS)
    for d in docs:
        assert d.python.startswith(f"convgrad.tensorflow.raw_ops.{d.name}(") and d.checked_against
        assert tuple(d.inputs) == OP_INPUTS[d.name]


def test_seed_op_contract():
    """Conv2DBackpropFilterV2: filter used for its shape only; result has filter's shape, input's dtype."""
    case = random_case(7, "conv2d", "NHWC", "SAME")
    x, f, dy = case.arrays()
    a = R.Conv2DBackpropFilterV2(input=x, filter=f, out_backprop=dy, **case.attrs("Conv2DBackpropFilterV2"))
    b = R.Conv2DBackpropFilterV2(input=x, filter=np.full_like(f, np.nan), out_backprop=dy,
                                 **case.attrs("Conv2DBackpropFilterV2"))
    assert a.shape == f.shape and a.dtype == x.dtype and np.array_equal(a, b)
    # defaults: NHWC, explicit_paddings=[], dilations=[1, 1, 1, 1]
    plain = replace(case, dilations=(1, 1))
    x, f, dy = plain.arrays()
    c = R.Conv2DBackpropFilterV2(input=x, filter=f, out_backprop=dy, strides=plain.full(plain.strides), padding="SAME")
    assert np.array_equal(c, ours("Conv2DBackpropFilter", plain, x, f, dy))


def test_inputs_views_lists_and_outputs():
    """Non-contiguous read-only views and nested lists are accepted; outputs are new C-contiguous arrays."""
    case = random_case(11, "conv2d", "NCHW", "EXPLICIT", "f64")   # lists of Python floats are float64
    x, f, dy = case.arrays()
    big = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
    big[..., ::2] = x
    view = big[..., ::2]
    view.flags.writeable = False
    for op in ("Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInputV2"):
        want = ours(op, case, x, f, dy)
        kw = kwargs_for(op, case, view, f, dy)
        kw["filter" if "filter" in kw else "out_backprop"] = (f if "filter" in kw else dy).tolist()
        got = getattr(R, op)(**kw)
        assert got.flags.c_contiguous and got.flags.writeable and np.array_equal(got, want), op
        assert not np.shares_memory(got, big) and not np.shares_memory(got, dy)


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_empty_outputs(fmt):
    """Inputs with no full window: TensorFlow's kernels (measured, native CPU path) give an empty
    output for VALID when (i - ek + s) / s truncates to 0, zero gradients, and errors only below."""
    cl = fmt == "NHWC"
    shape = lambda n, h, w, c: (n, h, w, c) if cl else (n, c, h, w)
    st = lambda s: [1, s, 1, 1] if cl else [1, 1, s, 1]
    x = np.ones(shape(1, 1, 6, 4), np.float32)
    f = np.ones((4, 2, 4, 3), np.float32)              # ek = 4 > i = 1; (1 - 4 + 2) / 2 -> 0 in C++
    y = R.Conv2D(input=x, filter=f, strides=st(2), padding="VALID", data_format=fmt)
    assert y.shape == shape(1, 0, 5, 3)
    dy = np.ones(shape(1, 0, 5, 3), np.float32)
    dw = R.Conv2DBackpropFilter(input=x, filter_sizes=[4, 2, 4, 3], out_backprop=dy, strides=st(2), padding="VALID",
                                data_format=fmt)
    dx = R.Conv2DBackpropInput(input_sizes=list(x.shape), filter=f, out_backprop=dy, strides=st(2), padding="VALID",
                               data_format=fmt)
    assert dw.shape == f.shape and not dw.any() and dx.shape == x.shape and not dx.any()
    with pytest.raises(convgrad.ConvError, match="negative"):   # (1 - 4 + 1) / 1 = -2
        R.Conv2D(input=x, filter=f, strides=st(1), padding="VALID", data_format=fmt)
    # SAME on an empty axis, an empty batch, zero output channels: shapes only
    assert R.Conv2D(input=np.ones(shape(1, 0, 6, 4), np.float32), filter=f, strides=st(2), padding="SAME",
                    data_format=fmt).shape == shape(1, 0, 6, 3)
    assert R.Conv2D(input=np.ones(shape(0, 5, 6, 4), np.float32), filter=f, strides=st(1), padding="SAME",
                    data_format=fmt).shape == shape(0, 5, 6, 3)
    assert R.DepthwiseConv2dNative(input=np.ones(shape(1, 5, 6, 4), np.float32), filter=np.ones((3, 2, 4, 0), np.float32),
                                   strides=[1, 1, 1, 1], padding="SAME", data_format=fmt).shape == shape(1, 5, 6, 0)


def test_conv2d_backprop_input_two_sizes():
    """input_sizes with 2 entries: spatial sizes; batch from out_backprop, depth from filter in_channels."""
    case = random_case(17, "conv2d", "NCHW", "VALID", groups=False)
    x, f, dy = case.arrays()
    a = ours("Conv2DBackpropInput", case, x, f, dy)
    b = R.Conv2DBackpropInput(input_sizes=np.array(case.src, np.int64), filter=f, out_backprop=dy,
                              **case.attrs("Conv2DBackpropInput"))
    assert np.array_equal(a, b)


# ---------------------------------------------------------------------------------------------
# Validation: one row per rule; the message names the op, the argument at fault and what was given

_X = np.zeros((1, 5, 6, 4), np.float32)
_F = np.zeros((3, 2, 4, 6), np.float32)
_DY = np.zeros((1, 5, 6, 6), np.float32)
_BASE = dict(strides=[1, 1, 1, 1], padding="SAME")


def _bpf(**kw):
    args = dict(input=_X, filter=_F, out_backprop=_DY) | _BASE | kw
    return lambda: R.Conv2DBackpropFilterV2(**args)


def _op(name, **kw):
    return lambda: getattr(R, name)(**kw)


_X5 = np.zeros((1, 3, 5, 6, 4), np.float32)
_F5 = np.zeros((2, 3, 2, 4, 6), np.float32)
VALIDATION = [
    # (rule, call, error class, message fragments)
    ("padding value", _bpf(padding="same"), ValueError, ["padding", "'same'", "SAME"]),
    ("padding type", _bpf(padding=1), TypeError, ["padding", "string"]),
    ("padding EXPLICIT in 3-D", _op("Conv3D", input=_X5, filter=_F5, strides=[1] * 5, padding="EXPLICIT"),
     ValueError, ["Conv3D", "padding", "EXPLICIT"]),
    ("data_format value", _bpf(data_format="nhwc"), ValueError, ["data_format", "NCHW"]),
    ("data_format of the other rank", _bpf(data_format="NDHWC"), ValueError, ["data_format", "NDHWC"]),
    ("strides length", _bpf(strides=[1, 1, 1]), ValueError, ["strides", "4 entries", "3"]),
    ("strides 3-D length", _op("Conv3D", input=_X5, filter=_F5, strides=[1] * 4, padding="SAME"), ValueError,
     ["Conv3D", "strides", "5 entries"]),
    ("strides entry type", _bpf(strides=[1, 1.5, 1, 1]), TypeError, ["strides", "1.5"]),
    ("strides not a list", _bpf(strides=2), TypeError, ["strides", "sequence"]),
    ("strides batch/depth", _bpf(strides=[1, 1, 1, 2]), ValueError, ["strides", "batch", "depth", "[1, 1, 1, 2]"]),
    ("strides positive", _bpf(strides=[1, 0, 1, 1]), ValueError, ["strides", "positive", "[1, 0, 1, 1]"]),
    ("dilations length", _bpf(dilations=[1, 1, 1, 1, 1]), ValueError, ["dilations", "4 entries", "5"]),
    ("dilations batch/depth", _bpf(dilations=[2, 1, 1, 1]), ValueError, ["dilations", "batch"]),
    ("dilations positive", _bpf(dilations=[1, 1, -1, 1]), ValueError, ["dilations", "positive"]),
    ("explicit_paddings without EXPLICIT", _bpf(explicit_paddings=[0] * 8), ValueError,
     ["explicit_paddings", "empty", "SAME"]),
    ("explicit_paddings type", _bpf(explicit_paddings=None), TypeError, ["explicit_paddings", "None"]),
    ("explicit_paddings length", _bpf(padding="EXPLICIT", explicit_paddings=[0] * 6), ValueError,
     ["explicit_paddings", "8 entries", "6"]),
    ("explicit_paddings negative", _bpf(padding="EXPLICIT", explicit_paddings=[0, 0, 1, -1, 0, 0, 0, 0]), ValueError,
     ["explicit_paddings", "non-negative", "-1"]),
    ("explicit_paddings too large", _bpf(padding="EXPLICIT", explicit_paddings=[0, 0, 1, 2 ** 50, 0, 0, 0, 0]),
     ValueError, ["explicit_paddings", "2**40"]),
    ("explicit_paddings batch/depth", _bpf(padding="EXPLICIT", explicit_paddings=[0, 0, 1, 1, 0, 0, 0, 1]),
     ValueError, ["explicit_paddings", "batch", "depth"]),
    ("input rank", _bpf(input=_X[0]), ValueError, ["input", "4-dimensional", "(5, 6, 4)"]),
    ("filter rank", _bpf(filter=_F[0]), ValueError, ["filter", "4-dimensional"]),
    ("out_backprop rank", _bpf(out_backprop=_DY[None]), ValueError, ["out_backprop", "4-dimensional"]),
    ("input missing", _bpf(input=None), TypeError, ["input", "None"]),
    ("input ragged", _bpf(input=[[1.0, 2.0], [3.0]]), ValueError, ["input", "array"]),
    ("element type", _bpf(input=_X.astype(np.int64), filter=_F.astype(np.int64), out_backprop=_DY.astype(np.int64)),
     TypeError, ["input", "element type", "int64"]),
    ("int32 where T excludes it", _op("Conv2DBackpropFilter", input=_X.astype(np.int32), filter_sizes=[3, 2, 4, 6],
                                      out_backprop=_DY.astype(np.int32), **_BASE), TypeError, ["int32", "float32"]),
    ("bfloat16 in V1 3-D op", _op("Conv3DBackpropInput", input=_X5.astype(BF16), filter=_F5.astype(BF16),
                                  out_backprop=_X5.astype(BF16), strides=[1] * 5, padding="SAME"),
     TypeError, ["Conv3DBackpropInput", "bfloat16"]),
    ("shared element type", _bpf(filter=_F.astype(np.float64)), TypeError, ["share one element type", "float64"]),
    ("filter_sizes length", _op("Conv2DBackpropFilter", input=_X, filter_sizes=[3, 2, 4], out_backprop=_DY, **_BASE),
     ValueError, ["filter_sizes", "4 entries"]),
    ("filter_sizes negative", _op("Conv2DBackpropFilter", input=_X, filter_sizes=[3, -2, 4, 6], out_backprop=_DY,
                                  **_BASE), ValueError, ["filter_sizes", "non-negative"]),
    ("filter_sizes type", _op("Conv2DBackpropFilter", input=_X, filter_sizes=[3.0, 2, 4, 6], out_backprop=_DY,
                              **_BASE), TypeError, ["filter_sizes", "3.0"]),
    ("filter_sizes 1-D", _op("Conv2DBackpropFilter", input=_X, filter_sizes=np.array([[3, 2], [4, 6]]),
                             out_backprop=_DY, **_BASE), ValueError, ["filter_sizes", "1-D"]),
    ("input_sizes 4 or 2", _op("Conv2DBackpropInput", input_sizes=[1, 5, 6], filter=_F, out_backprop=_DY, **_BASE),
     ValueError, ["input_sizes", "4 or 2"]),
    ("depthwise input_sizes 4", _op("DepthwiseConv2dNativeBackpropInput", input_sizes=[5, 6], filter=_F[:, :, :, :1],
                                    out_backprop=_X, **_BASE), ValueError, ["input_sizes", "4 entries"]),
    ("3-D input_sizes 5", _op("Conv3DBackpropInputV2", input_sizes=[3, 5, 6], filter=_F5, out_backprop=_X5[..., :1]
                              .repeat(6, -1), strides=[1] * 5, padding="SAME"), ValueError, ["input_sizes", "5 entries"]),
    ("kernel sizes positive", _bpf(filter=np.zeros((0, 2, 4, 6), np.float32)), ValueError,
     ["filter", "positive spatial sizes"]),
    ("filter in_channels positive", _op("Conv2D", input=_X, filter=np.zeros((3, 2, 0, 6), np.float32), **_BASE),
     ValueError, ["in_channels", "positive"]),
    ("input depth multiple of in_channels", _op("Conv2D", input=_X, filter=np.zeros((3, 2, 3, 6), np.float32),
                                                 **_BASE), ValueError, ["input depth", "multiple", "3"]),
    ("input depth positive", _op("Conv2D", input=_X[..., :0], filter=np.zeros((3, 2, 2, 6), np.float32), **_BASE),
     ValueError, ["input depth", "positive", "0"]),
    ("out_channels multiple of groups", _op("Conv2D", input=_X, filter=np.zeros((3, 2, 2, 3), np.float32), **_BASE),
     ValueError, ["out_channels", "groups", "3"]),
    ("depthwise in_channels", _op("DepthwiseConv2dNative", input=_X, filter=np.zeros((3, 2, 2, 3), np.float32),
                                  **_BASE), ValueError, ["DepthwiseConv2dNative", "in_channels", "input depth (4)"]),
    ("out_backprop batch", _bpf(out_backprop=np.zeros((2, 5, 6, 6), np.float32)), ValueError,
     ["out_backprop", "batch size (1)", "2"]),
    ("out_backprop depth", _bpf(out_backprop=np.zeros((1, 5, 6, 5), np.float32)), ValueError,
     ["out_backprop", "depth", "(6)", "5"]),
    ("out_backprop spatial", _bpf(out_backprop=np.zeros((1, 5, 5, 6), np.float32)), ValueError,
     ["out_backprop", "spatial", "[5, 6]", "[5, 5]"]),
    ("output size negative", _op("Conv2D", input=_X[:, :1], filter=_F, strides=[1, 1, 1, 1], padding="VALID"),
     ValueError, ["Conv2D", "negative", "H"]),
    ("result too large", _op("Conv2DBackpropInput", input_sizes=[1, 1, 2 ** 39, 1], filter=np.zeros((2, 1, 1, 1),
                             np.float32), out_backprop=np.zeros((1, 0, 2 ** 39, 1), np.float32), strides=[1, 1, 1, 1],
                             padding="VALID"), ValueError, ["Conv2DBackpropInput", "memory"]),
    ("use_cudnn_on_gpu bool", _bpf(use_cudnn_on_gpu="yes"), TypeError, ["use_cudnn_on_gpu", "bool"]),
    ("name string", _bpf(name=3), TypeError, ["name", "3"]),
]


@pytest.mark.parametrize("rule,call,kind,fragments", VALIDATION, ids=[v[0] for v in VALIDATION])
def test_validation(rule, call, kind, fragments):
    with pytest.raises(convgrad.ConvError) as info:
        call()
    assert isinstance(info.value, kind), (rule, type(info.value))
    msg = str(info.value)
    assert msg.split(":")[0] in OPS, msg                    # the message starts with the op's name
    for frag in fragments:
        assert frag in msg, (rule, frag, msg)


def test_positional_and_unknown_arguments_are_refused():
    """Plain Python TypeErrors, as tf.raw_ops gives: keyword-only, and V1 3-D ops have no data_format."""
    with pytest.raises(TypeError):
        R.Conv2D(_X, _F, [1, 1, 1, 1], "SAME")
    with pytest.raises(TypeError, match="data_format"):
        R.Conv3DBackpropFilter(input=_X5, filter=_F5, out_backprop=_X5, strides=[1] * 5, padding="SAME",
                               data_format="NDHWC")
