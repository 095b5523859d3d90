"""``convgrad bench``: convgrad side by side with PyTorch, TensorFlow, OpenVINO and JAX (tool layer).

Problems are oneDNN benchdnn convolution descriptors (``mb8ic64ih56oc64oh56kh3ph1n"x"``,
dilation counted from 0; see ``benchmarks/README.md``), read from list files. For every
problem and direction (``bwd_weights``, ``bwd_data``, ``fwd``) each library gets the same
inputs (float32, from a fixed seed, in its own natural layout, prepared outside the timed
region) and the same thread count, runs a warm-up call, then repeated calls whose median
is reported.

Each library runs in its own worker process (``python -m convgrad.bench --worker LIB``),
and the workers take turns, A B C A B C ...: two libraries' calls never interleave in one
process, where the thread pool one leaves spinning would steal the cores of the next. A
pause between turns lets those pools go to sleep. Workers are started without
``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE``, which would force an older, slower
OpenBLAS kernel.

Each worker also returns two random projections of its results; the coordinator turns
them into an estimate of the relative difference from convgrad (``check`` column), so a
peer computing something else cannot win a row unnoticed.

Outputs (``--out``): ``results.csv`` (every measurement), ``results.md`` (tables and the
summary), ``chart.png`` (ratio to the best peer per case). Public entry points:
``add_arguments(parser)``, ``run(args)``, ``main(argv)``; ``parse_descriptor`` and
``read_problems`` read problem lists.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import select
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import ConvValueError
from .spec import ConvSpec, forward_size, make_spec

LIBRARIES = ("convgrad", "torch", "tensorflow", "openvino", "jax")
PEERS = LIBRARIES[1:]
DIRECTIONS = ("bwd_weights", "bwd_data", "fwd")
DEFAULT_LISTS = ("resnet_50", "mobilenet", "mobilenet_dw", "3d_unet", "1d_wavenet", "pathological")
# Variables that make NumPy's OpenBLAS pick an older kernel (about half the matmul speed).
BLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


# ---------------------------------------------------------------------------------------
# Problem descriptors
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Problem:
    """One benchmark problem: a canonical spec plus where it came from."""

    name: str
    spec: ConvSpec
    descriptor: str = ""
    repeats: int = 1
    list_name: str = ""
    scaled: str = ""          # how it was shrunk to fit the time budget ("" if not)


_KEYS = ("mb", "g", "ic", "oc", "id", "ih", "iw", "od", "oh", "ow", "kd", "kh", "kw",
         "sd", "sh", "sw", "pd", "ph", "pw", "ped", "peh", "pew", "dd", "dh", "dw")
_TOKEN = re.compile(r"(mb|ic|oc|id|ih|iw|od|oh|ow|kd|kh|kw|sd|sh|sw|ped|peh|pew|pd|ph|pw|dd|dh|dw|g)(-?\d+)")


def parse_descriptor(text: str, *, list_name: str = "") -> Problem:
    """A benchdnn convolution descriptor as a :class:`Problem` (raises ConvValueError).

    Rules (benchdnn's): ``g`` defaults to 1 and ``mb`` to 2; ``ic``/``oc`` count all
    groups; any ``d`` entry makes the problem 3-D, else any ``h`` entry 2-D, else 1-D;
    a missing lower axis copies the higher one; strides default to 1 and dilations (counted
    from 0) to 0. With ``oh`` missing, ``ph`` defaults to 0 and
    ``oh = (ih - ek + 2 ph) // sh + 1``; with ``oh`` given and ``ph`` missing,
    ``ph = ((oh - 1) sh - ih + ek) // 2``. The back pad ``(oh - 1) sh - ih + ek - ph`` may
    be negative (trailing rows never read): it becomes 0 when the floor output size stays
    ``oh``. convgrad's own ``ped``/``peh``/``pew`` entries (the back pads, which the
    harness writes in its results so that a row can be run again) set the back pad: with
    ``oh`` missing, ``oh = (ih - ek + ph + peh) // sh + 1``; with ``oh`` given, that
    formula must give it.
    """
    line = text.strip()
    tokens = [t for t in line.split() if not t.startswith("--")]
    if len(tokens) != 1:
        raise ConvValueError(f"parse_descriptor: descriptor must be one benchdnn problem, but got {text!r}")
    body = tokens[0]
    name = ""
    m = re.search(r'n"([^"]*)"', body)
    if m:
        name = m.group(1)
        body = body[:m.start()] + body[m.end():]
    elif "n" in body.replace("_", "") and re.search(r"n[^0-9]", body):
        idx = re.search(r"n[^0-9]", body).start()
        name, body = body[idx + 1:], body[:idx]
    body = body.replace("_", "")
    values: dict[str, int] = {}
    pos = 0
    for tok in _TOKEN.finditer(body):
        if tok.start() != pos:
            break
        if tok.group(1) in values:
            raise ConvValueError(f"parse_descriptor: entry {tok.group(1)} must appear once, but got it twice in {text!r}")
        values[tok.group(1)] = int(tok.group(2))
        pos = tok.end()
    if pos != len(body):
        raise ConvValueError(f"parse_descriptor: descriptor must be benchdnn entries ({', '.join(_KEYS)}), "
                             f"but got {body[pos:]!r} in {text!r}")
    nsp = 3 if any(k in values for k in ("id", "od", "kd", "sd", "pd", "dd")) else \
        2 if any(k in values for k in ("ih", "oh", "kh", "sh", "ph", "dh")) else 1
    axes = "dhw"[3 - nsp:]

    def family(f: str) -> list[int | None]:
        out: list[int | None] = []
        for j, a in enumerate(axes):
            v = values.get(f + a)
            if v is None and j > 0:
                v = out[-1]
            out.append(v)
        return out

    for f, what in (("i", "input size"), ("k", "kernel size")):
        if any(v is None for v in family(f)):
            raise ConvValueError(f"parse_descriptor: {what} ({f}{axes[0]}) must be given, but got {text!r}")
    for key in ("ic", "oc"):
        if key not in values:
            raise ConvValueError(f"parse_descriptor: {key} must be given, but got {text!r}")
    src, ker = family("i"), family("k")
    strides = [v if v is not None else 1 for v in family("s")]
    dil = [(v if v is not None else 0) + 1 for v in family("d")]
    outs, pads, ends = family("o"), family("p"), family("pe")
    pb, pe, dst = [], [], []
    for j in range(nsp):
        ek = (ker[j] - 1) * dil[j] + 1
        o, p, e = outs[j], pads[j], ends[j]
        if o is None:
            p = 0 if p is None else p
            o = (src[j] - ek + p + (p if e is None else e)) // strides[j] + 1
        elif p is None:
            p = ((o - 1) * strides[j] - src[j] + ek) // 2
        back = (o - 1) * strides[j] - src[j] + ek - p if e is None else e
        if p < 0 or back < 0 and e is not None:
            which, v = ("front", p) if p < 0 else ("back", back)
            raise ConvValueError(f"parse_descriptor: {which} padding must be non-negative, but got {v} in {text!r}")
        if e is not None and forward_size(src[j], ker[j], strides[j], dil[j], p, e) != o:
            raise ConvValueError(f"parse_descriptor: output size {o} must follow from the input, kernel, "
                                 f"stride and padding (back padding pe{axes[j]}{e}), but got {text!r}")
        if back < 0:
            if forward_size(src[j], ker[j], strides[j], dil[j], p, 0) != o:
                raise ConvValueError(f"parse_descriptor: output size {o} must follow from the input, kernel, "
                                     f"stride and padding, but got {text!r}")
            back = 0
        pb.append(p)
        pe.append(back)
        dst.append(o)
    spec = make_spec("parse_descriptor", mb=values.get("mb", 2), ic=values["ic"], oc=values["oc"],
                     groups=values.get("g", 1), src=src, kernel=ker, strides=strides, dilations=dil,
                     pads_begin=pb, pads_end=pe)
    if spec.dst != tuple(dst):
        raise ConvValueError(f"parse_descriptor: output size must be {tuple(dst)}, but the problem gives {spec.dst} "
                             f"in {text!r}")
    rep = re.search(r"\*(\d+)", name)
    return Problem(name=name or str(spec), spec=spec, descriptor=line, repeats=int(rep.group(1)) if rep else 1,
                   list_name=list_name)


def read_problems(path: str | os.PathLike) -> list[Problem]:
    """Every problem of a benchdnn list file (``#`` comments and blank lines skipped)."""
    path = Path(path)
    out = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            out.append(parse_descriptor(line, list_name=path.name))
    return out


def problems_dir() -> Path | None:
    """``benchmarks/problems`` of a source checkout, when there is one."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        cand = parent / "benchmarks" / "problems"
        if cand.is_dir():
            return cand
    return None


def _with(spec: ConvSpec, **changes) -> ConvSpec:
    fields = dict(mb=spec.mb, ic=spec.ic, oc=spec.oc, groups=spec.groups, src=spec.src, kernel=spec.kernel,
                  strides=spec.strides, dilations=spec.dilations, pads_begin=spec.pads_begin, pads_end=spec.pads_end)
    fields.update(changes)
    return make_spec("bench", **fields)


def scale_problem(problem: Problem, max_gflop: float) -> Problem:
    """Shrink the batch (then, at batch 1, the spatial size) until one direction costs at
    most ``max_gflop`` GFLOP; the problem is otherwise unchanged."""
    spec = problem.spec
    budget = max_gflop * 1e9
    if spec.flops <= budget or max_gflop <= 0:
        return problem
    mb = max(1, int(spec.mb * budget // spec.flops))
    new = _with(spec, mb=mb)
    note = f"mb {spec.mb}->{mb}"
    if new.flops > budget:
        f = (budget / new.flops) ** (1.0 / spec.nsp)
        src = []
        for i, k, d, pb, pe, o in zip(spec.src, spec.kernel, spec.dilations, spec.pads_begin, spec.pads_end, spec.dst):
            need = d * (k - 1) + 1 - pb - pe
            src.append(max(need, 1, int(round(i * f))) if o > 1 else i)
        new = _with(new, src=tuple(src))
        note += f", spatial {'x'.join(map(str, spec.src))}->{'x'.join(map(str, new.src))}"
    return Problem(problem.name, new, problem.descriptor, problem.repeats, problem.list_name, note)


def spec_to_json(spec: ConvSpec) -> dict:
    return dict(mb=spec.mb, ic=spec.ic, oc=spec.oc, groups=spec.groups, src=list(spec.src), kernel=list(spec.kernel),
                strides=list(spec.strides), dilations=list(spec.dilations), pads_begin=list(spec.pads_begin),
                pads_end=list(spec.pads_end))


def spec_from_json(d: dict) -> ConvSpec:
    return make_spec("bench", **d)


# ---------------------------------------------------------------------------------------
# The libraries, as the workers run them. Each `prepare` returns (call, to_canonical):
# `call()` computes one direction (blocking until the result exists), `to_canonical(r)`
# turns its result into a NumPy array in convgrad's layout (outside the timed region).
# ---------------------------------------------------------------------------------------

class Unsupported(Exception):
    """The library has no kernel for this problem and direction."""


def make_inputs(spec: ConvSpec, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 (src, weights, diff_dst) in convgrad's layout, the same in every worker."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(spec.src_shape, dtype=np.float32),
            rng.standard_normal(spec.weights_shape, dtype=np.float32),
            rng.standard_normal(spec.dst_shape, dtype=np.float32))


def _kw(spec: ConvSpec) -> dict:
    return dict(strides=spec.strides, pads_begin=spec.pads_begin, pads_end=spec.pads_end,
                dilations=spec.dilations, groups=spec.groups)


class ConvgradLib:
    name = "convgrad"

    def __init__(self, threads: int):
        import threadpoolctl

        import convgrad
        self.cg = convgrad
        self._limits = threadpoolctl.threadpool_limits(threads, user_api="blas")
        self.version = convgrad.__version__

    def prepare(self, spec, direction, src, w, dy):
        cg, kw = self.cg, _kw(spec)
        if direction == "bwd_weights":
            return (lambda: cg.conv_backward_weights(src, dy, spec.kernel, **kw)), np.asarray
        if direction == "bwd_data":
            return (lambda: cg.conv_backward_data(dy, w, spec.src, **kw)), np.asarray
        return (lambda: cg.conv_forward(src, w, **kw)), np.asarray


class TorchLib:
    name = "torch"

    def __init__(self, threads: int):
        import torch
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
        self.torch = torch
        self.version = torch.__version__

    def prepare(self, spec, direction, src, w, dy):
        torch = self.torch
        x, wt, g = torch.from_numpy(src), torch.from_numpy(w), torch.from_numpy(dy)
        nsp = spec.nsp
        stride, dil = list(spec.strides), list(spec.dilations)
        # torch pads symmetrically; a smaller back pad is the same when the floor output
        # size does not change, otherwise pad explicitly (inside the timed call).
        sym = all(pe <= pb and forward_size(i, k, s, d, pb, pb) == o for i, k, s, d, pb, pe, o in
                  zip(spec.src, spec.kernel, spec.strides, spec.dilations, spec.pads_begin, spec.pads_end, spec.dst))
        pad = list(spec.pads_begin) if sym else [0] * nsp
        flat = []
        for pb, pe in zip(reversed(spec.pads_begin), reversed(spec.pads_end)):
            flat += [pb, pe]
        fpad = torch.nn.functional.pad
        crop = (slice(None), slice(None)) + tuple(slice(pb, pb + i) for pb, i in zip(spec.pads_begin, spec.src))
        cb = torch.ops.aten.convolution_backward
        args = (None, stride, pad, dil, False, [0] * nsp, spec.groups)

        def prep_x():
            return x if sym else fpad(x, flat)

        if direction == "bwd_weights":
            def call():
                with torch.inference_mode():
                    return cb(g, prep_x(), wt, *args, [False, True, False])[1]
        elif direction == "bwd_data":
            xs = prep_x()

            def call():
                with torch.inference_mode():
                    r = cb(g, xs, wt, *args, [True, False, False])[0]
                    return r if sym else r[crop]
        else:
            def call():
                with torch.inference_mode():
                    return torch.ops.aten.convolution(prep_x(), wt, *args)
        return call, lambda r: r.contiguous().numpy()


class TensorflowLib:
    name = "tensorflow"

    def __init__(self, threads: int):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        self.tf = tf
        self.version = tf.__version__

    def prepare(self, spec, direction, src, w, dy):
        tf = self.tf
        nsp = spec.nsp
        if nsp > 3:
            raise Unsupported("no TensorFlow op for more than 3 spatial axes")
        depthwise = spec.groups > 1 and spec.icg == 1 and nsp <= 2
        if spec.groups > 1 and not depthwise and nsp == 3:
            raise Unsupported("no grouped Conv3D gradient kernel on CPU")
        # 1-D runs as 2-D with a unit height, as tf.nn.conv1d does. TF wants channels last.
        ex = (lambda a: a[:, :, None]) if nsp == 1 else (lambda a: a)
        s2, w2, g2 = ex(src), ex(w), ex(dy)
        k = w2.shape[2:]
        last = lambda a: np.ascontiguousarray(np.moveaxis(a, 1, -1))
        x_t, dy_t = tf.constant(last(s2)), tf.constant(last(g2))
        st = [1] + ([1] if nsp == 1 else []) + list(spec.strides) + [1]
        dl = [1] + ([1] if nsp == 1 else []) + list(spec.dilations) + [1]
        pb = ([0] if nsp == 1 else []) + list(spec.pads_begin)
        pe = ([0] if nsp == 1 else []) + list(spec.pads_end)
        if depthwise:
            # (O, 1, *K) with O = C * multiplier -> (*K, C, multiplier)
            f = w2.reshape((spec.groups, spec.ocg) + tuple(k)).transpose(tuple(range(2, 2 + len(k))) + (0, 1))
        else:
            # (O, Cg, *K) -> (*K, Cg, O)
            f = w2.transpose(tuple(range(2, 2 + len(k))) + (1, 0))
        f_t = tf.constant(np.ascontiguousarray(f))
        in_sizes = tf.constant([s2.shape[0]] + [a + b + c for a, b, c in zip(s2.shape[2:], pb, pe)] + [s2.shape[1]],
                               dtype=tf.int32)
        f_sizes = tf.constant(f.shape, dtype=tf.int32)
        raw = tf.raw_ops
        padding = [[0, 0]] + [[a, b] for a, b in zip(pb, pe)] + [[0, 0]]
        need_pad = any(pb) or any(pe)
        crop = (slice(None),) + tuple(slice(a, a + i) for a, i in zip(pb, s2.shape[2:])) + (slice(None),)
        if depthwise:
            ops = (raw.DepthwiseConv2dNativeBackpropFilter, raw.DepthwiseConv2dNativeBackpropInput,
                   raw.DepthwiseConv2dNative)
        elif len(k) == 2:
            ops = (raw.Conv2DBackpropFilter, raw.Conv2DBackpropInput, raw.Conv2D)
        else:
            ops = (raw.Conv3DBackpropFilterV2, raw.Conv3DBackpropInputV2, raw.Conv3D)
        # Padding: VALID on an explicitly padded input (the pad runs inside the timed call).
        if direction == "bwd_weights":
            def call():
                xp = tf.pad(x_t, padding) if need_pad else x_t
                return ops[0](input=xp, filter_sizes=f_sizes, out_backprop=dy_t, strides=st, padding="VALID",
                              dilations=dl)
            conv = lambda r: self._filter_back(r.numpy(), spec, depthwise, nsp)
        elif direction == "bwd_data":
            def call():
                r = ops[1](input_sizes=in_sizes, filter=f_t, out_backprop=dy_t, strides=st, padding="VALID",
                           dilations=dl)
                return r[crop] if need_pad else r
            conv = lambda r: self._data_back(r.numpy(), nsp)
        else:
            def call():
                xp = tf.pad(x_t, padding) if need_pad else x_t
                return ops[2](input=xp, filter=f_t, strides=st, padding="VALID", dilations=dl)
            conv = lambda r: self._data_back(r.numpy(), nsp)
        return call, conv

    @staticmethod
    def _data_back(a, nsp):
        a = np.moveaxis(a, -1, 1)
        return a[:, :, 0] if nsp == 1 else a

    @staticmethod
    def _filter_back(a, spec, depthwise, nsp):
        nk = a.ndim - 2
        if depthwise:            # (*K, C, mult) -> (C*mult, 1, *K)
            a = np.moveaxis(np.moveaxis(a, nk, 0), nk + 1, 1).reshape((spec.oc, 1) + a.shape[:nk])
        else:                    # (*K, Cg, O) -> (O, Cg, *K)
            a = np.moveaxis(np.moveaxis(a, nk + 1, 0), nk + 1, 1)
        return a[:, :, 0] if nsp == 1 else a


class OpenvinoLib:
    name = "openvino"

    def __init__(self, threads: int):
        import openvino as ov
        self.ov = ov
        self.core = ov.Core()
        self.config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads,
                       "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
        self.version = ov.get_version()

    def prepare(self, spec, direction, src, w, dy):
        if direction == "bwd_weights":
            raise Unsupported("OpenVINO has no weights-gradient operation")
        if not 1 <= spec.nsp <= 3:
            raise Unsupported("OpenVINO convolutions take 1 to 3 spatial axes")
        ov = self.ov
        from openvino import opset8 as ops
        from openvino.utils.node_factory import NodeFactory
        g = spec.groups
        attrs = dict(strides=list(spec.strides), pads_begin=list(spec.pads_begin), pads_end=list(spec.pads_end),
                     dilations=list(spec.dilations))
        if direction == "bwd_data":
            data = ops.parameter(list(dy.shape), np.float32)
            fshape = list(w.shape) if g == 1 else [g, spec.ocg, spec.icg] + list(spec.kernel)
            filt = ops.parameter(fshape, np.float32)
            oshape = ops.constant(np.array(spec.src, dtype=np.int64))
            if g == 1:
                node = ops.convolution_backprop_data(data, filt, list(spec.strides), output_shape=oshape,
                                                     pads_begin=list(spec.pads_begin), pads_end=list(spec.pads_end),
                                                     dilations=list(spec.dilations), auto_pad="explicit")
            else:
                node = NodeFactory("opset1").create("GroupConvolutionBackpropData", [data.output(0), filt.output(0),
                                                    oshape.output(0)], dict(attrs, auto_pad="explicit"))
            feeds = (dy, w if g == 1 else w.reshape(fshape))
        else:
            data = ops.parameter(list(src.shape), np.float32)
            fshape = list(w.shape) if g == 1 else [g, spec.ocg, spec.icg] + list(spec.kernel)
            filt = ops.parameter(fshape, np.float32)
            if g == 1:
                node = ops.convolution(data, filt, spec.strides, spec.pads_begin, spec.pads_end, spec.dilations)
            else:
                node = ops.group_convolution(data, filt, spec.strides, spec.pads_begin, spec.pads_end, spec.dilations)
            feeds = (src, w if g == 1 else w.reshape(fshape))
        model = ov.Model([node.output(0)], [data, filt], "bench")
        compiled = self.core.compile_model(model, "CPU", self.config)
        req = compiled.create_infer_request()
        inputs = {0: np.ascontiguousarray(feeds[0]), 1: np.ascontiguousarray(feeds[1])}

        def call():
            req.infer(inputs, share_inputs=True)
            return req.get_output_tensor(0)
        return call, lambda t: np.array(t.data, copy=True)


class JaxLib:
    name = "jax"

    def __init__(self, threads: int):
        import jax
        jax.config.update("jax_platforms", "cpu")
        self.jax = jax
        self.version = jax.__version__

    def prepare(self, spec, direction, src, w, dy):
        jax = self.jax
        lax, jnp = jax.lax, jax.numpy
        letters = "DHW"[3 - spec.nsp:] if spec.nsp <= 3 else None
        if letters is None:
            raise Unsupported("benchmark layouts cover 1 to 3 spatial axes")
        dn = ("NC" + letters, "OI" + letters, "NC" + letters)
        pad = list(zip(spec.pads_begin, spec.pads_end))

        def conv(x, wt):
            return lax.conv_general_dilated(x, wt, spec.strides, pad, rhs_dilation=spec.dilations,
                                            dimension_numbers=dn, feature_group_count=spec.groups,
                                            precision=lax.Precision.HIGHEST)
        x, wt, g = jnp.asarray(src), jnp.asarray(w), jnp.asarray(dy)
        if direction == "bwd_weights":
            f = jax.jit(lambda x_, w_, g_: jax.vjp(lambda ww: conv(x_, ww), w_)[1](g_)[0])
        elif direction == "bwd_data":
            f = jax.jit(lambda x_, w_, g_: jax.vjp(lambda xx: conv(xx, w_), x_)[1](g_)[0])
        else:
            f = jax.jit(lambda x_, w_, g_: conv(x_, w_))
        return (lambda: f(x, wt, g).block_until_ready()), np.asarray


ADAPTERS = {"convgrad": ConvgradLib, "torch": TorchLib, "tensorflow": TensorflowLib, "openvino": OpenvinoLib,
            "jax": JaxLib}


def _projections(a: np.ndarray, seed: int) -> list[float]:
    """Two random projections and the norm of a result (for the cross-library check).

    With BLAS at one thread: a float64 ``np.dot`` of a large result ran on OpenBLAS's
    threads, which then spin for about 0.12 s waiting for more work (measured: the next
    convgrad calls in that process ran 1.6-1.9x slower for 110-120 ms), taking a core from
    whatever is timed next."""
    from threadpoolctl import threadpool_limits
    flat = np.ascontiguousarray(a, dtype=np.float32).ravel().astype(np.float64)
    rng = np.random.default_rng(seed)
    with threadpool_limits(limits=1, user_api="blas"):
        out = [float(np.dot(flat, rng.standard_normal(flat.size))) for _ in range(2)]
        return out + [float(np.linalg.norm(flat))]


# ---------------------------------------------------------------------------------------
# Worker process
# ---------------------------------------------------------------------------------------

def _set_thread_env(threads: int) -> None:
    for var in BLAS_OVERRIDES:
        os.environ.pop(var, None)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        os.environ[var] = str(threads)
    os.environ["TF_NUM_INTEROP_THREADS"] = "1"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'}"
                               f" intra_op_parallelism_threads={threads}").strip()
    try:
        cpus = sorted(os.sched_getaffinity(0))
        if threads < len(cpus):
            os.sched_setaffinity(0, cpus[:threads])
    except (AttributeError, OSError):
        pass


def worker_main(library: str, threads: int) -> int:
    """Serve timing requests for one library: one JSON request per stdin line, one JSON
    reply per line on the original stdout (stray prints of the library go to stderr)."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    _set_thread_env(threads)

    def reply(obj):
        proto.write(json.dumps(obj) + "\n")
        proto.flush()
    try:
        lib = ADAPTERS[library](threads)
    except Exception as e:  # noqa: BLE001 - a missing or broken peer is reported, not fatal
        reply({"ok": False, "error": f"{type(e).__name__}: {e}"})
        return 0
    reply({"ok": True, "version": str(lib.version)})
    cache: dict = {}
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("op") == "quit":
            break
        try:
            reply(_serve(lib, req, cache, threads))
        except Exception as e:  # noqa: BLE001
            reply({"ok": False, "error": f"{type(e).__name__}: {e}"})
    return 0


# Seconds to wait after the SGEMM reading: OpenBLAS's threads spin for about 0.12 s after
# a threaded product (see ``_projections``), and the first turn follows it.
SGEMM_SETTLE = 0.3


def _serve(lib, req: dict, cache: dict, threads: int) -> dict:
    """One request: the SGEMM reading, or a turn of one problem. A turn times every
    direction first and only then runs the cross-library check and the peak-memory call
    (round 0): run between two directions, they slowed the next direction's calls (the
    check's BLAS threads spinning, the memory call's dropped buffers faulted in again);
    measured before this order, in round 0, the data gradients of convgrad and torch (each
    timed right after its weight gradient's check) ran 1.64x and 1.94x (geometric means
    over the 20 ResNet-50 layers) their times in rounds 1 and 2, while OpenVINO's (timed
    first in its turn) and every weight gradient ran 1.00-1.02x."""
    if req["op"] == "sgemm":
        gflops = measure_sgemm(req.get("n", 2048), req.get("reps", 5))
        time.sleep(SGEMM_SETTLE)
        return {"ok": True, "gflops": gflops}
    spec = spec_from_json(req["spec"])
    key = json.dumps(req["spec"], sort_keys=True)
    if cache.get("key") != key:
        cache.clear()
        cache["key"] = key
        cache["inputs"] = make_inputs(spec, req["seed"])
    out: dict = {"ok": True, "times": {}, "unsupported": {}, "check": {}, "peak": {}}
    timed = []
    for direction in req["directions"]:
        entry = cache.get(direction)
        if entry is None:
            try:
                entry = lib.prepare(spec, direction, *cache["inputs"])
            except Unsupported as e:
                entry = str(e)
            except Exception as e:  # noqa: BLE001 - the peer cannot run this problem
                entry = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            cache[direction] = entry
        if isinstance(entry, str):
            out["unsupported"][direction] = entry
            continue
        call, to_canonical = entry
        try:
            out["times"][direction] = _time(call, req["warmup"], req["reps"], req["max_seconds"])
        except Exception as e:  # noqa: BLE001
            cache[direction] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            out["unsupported"][direction] = cache[direction]
            continue
        timed.append((direction, call, to_canonical))
    for direction, call, to_canonical in timed:
        try:
            if req.get("check") and not cache.get("checked_" + direction):
                out["check"][direction] = _projections(to_canonical(call()), req["seed"] + 17)
                cache["checked_" + direction] = True
            if req.get("memory") and lib.name == "convgrad":
                out["peak"][direction] = _peak_bytes(call)
        except Exception as e:  # noqa: BLE001
            cache[direction] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            out["unsupported"][direction] = cache[direction]
            out["times"].pop(direction, None)
            out["check"].pop(direction, None)
    return out


def _time(call, warmup: int, reps: int, max_seconds: float) -> list[float]:
    spent = 0.0
    for _ in range(max(1, warmup)):
        t0 = time.perf_counter()
        call()
        spent = time.perf_counter() - t0
    times = []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
        if sum(times) + spent > max_seconds:
            break
    return times


def _peak_bytes(call) -> int:
    """Peak bytes NumPy allocated during one call (temporaries and the result; the block
    buffers threads keep between calls and the cached result buffers are dropped first, so
    they are counted)."""
    import tracemalloc

    from .kernels import gemm, results
    gemm.release_scratch()
    results.release_result_cache()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        r = call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del r
    return int(peak)


def measure_sgemm(n: int = 2048, reps: int = 5) -> float:
    """GFLOP/s of a square float32 ``np.matmul`` (median), with the current BLAS threads."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)
    np.matmul(a, b, out=c)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.matmul(a, b, out=c)
        ts.append(time.perf_counter() - t0)
    return 2.0 * n ** 3 / float(np.median(ts)) / 1e9


# ---------------------------------------------------------------------------------------
# Coordinator
# ---------------------------------------------------------------------------------------

# The worker runs as ``python -m convgrad.bench``, which would put the current directory
# first on ``sys.path``: a file there named like a module the worker imports (``grp.py``,
# ``trace.py``, ``json.py`` ...) shadowed it, and the peer's turn failed with that file's
# error. Python 3.11's ``-P`` leaves the directory out; 3.10, which has no ``-P``, drops it
# itself before it imports convgrad (only ``site``'s startup imports came before).
_SAFE_PATH_ENTRY = ("import runpy, sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
                    "runpy.run_module('convgrad.bench', run_name='__main__', alter_sys=True)")


def worker_command(library: str, threads: int) -> list[str]:
    """The argv of a worker process for ``library`` (pure), without the current directory
    on its module path."""
    tail = ["--worker", library, "--threads", str(threads)]
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", "convgrad.bench"] + tail
    return [sys.executable, "-c", _SAFE_PATH_ENTRY] + tail


class Worker:
    """One library's worker process and its request/reply pipe."""

    def __init__(self, library: str, threads: int, log_dir: Path):
        self.library, self.threads, self.log_dir = library, threads, log_dir
        self.proc = None
        self.info: dict = {}
        self.start()

    def start(self) -> None:
        env = dict(os.environ)
        for var in BLAS_OVERRIDES:
            env.pop(var, None)
        log = open(self.log_dir / f"worker-{self.library}.log", "ab")
        self.proc = subprocess.Popen(worker_command(self.library, self.threads),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env, text=True,
                                     bufsize=1)
        log.close()
        self.info = self._read(300.0) or {"ok": False, "error": "worker did not start"}

    def _read(self, timeout: float) -> dict | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def request(self, req: dict, timeout: float) -> dict:
        if self.proc.poll() is not None:
            self.start()
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            rep = self._read(timeout)
        except (BrokenPipeError, OSError, ValueError):
            rep = None
        if rep is None:                      # crashed or hung: restart for the next problem
            self.kill()
            self.start()
            return {"ok": False, "error": "worker crashed or timed out"}
        return rep

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self.kill()


@dataclass
class Row:
    problem: Problem
    direction: str
    times: dict = field(default_factory=dict)          # library -> [seconds]
    notes: dict = field(default_factory=dict)          # library -> why it did not run
    check: dict = field(default_factory=dict)          # library -> estimated rel. difference from convgrad
    peak: int | None = None

    def median(self, lib: str) -> float | None:
        t = self.times.get(lib)
        return float(np.median(t)) if t else None

    def best_peer(self) -> tuple[str | None, float | None]:
        best = (None, None)
        for lib in PEERS:
            m = self.median(lib)
            if m is not None and (best[1] is None or m < best[1]):
                best = (lib, m)
        return best

    def ratio(self) -> float | None:
        ours, (_, peer) = self.median("convgrad"), self.best_peer()
        return ours / peer if ours is not None and peer else None


def _load_problems(args) -> list[Problem]:
    problems: list[Problem] = []
    base = problems_dir()
    lists = args.lists
    if lists is None:                     # not given: the default lists, unless problems were
        lists = [] if args.problem else list(DEFAULT_LISTS)
    for item in lists:
        path = Path(item)
        if not path.is_file() and base is not None:
            path = base / item
        if not path.is_file():
            raise ConvValueError(f"bench: --lists must name problem list files or lists in benchmarks/problems, "
                                 f"but got {item!r}")
        found = read_problems(path)
        problems += found[:args.limit] if args.limit else found
    for text in args.problem or []:
        problems.append(parse_descriptor(text, list_name="command line"))
    return [scale_problem(p, args.max_gflop) for p in problems]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``convgrad bench`` (also ``python -m convgrad.bench``)."""
    parser.add_argument("--lists", nargs="*", default=None, metavar="LIST",
                        help="problem list files, or names of lists in benchmarks/problems (default: "
                             f"{' '.join(DEFAULT_LISTS)}; none when --problem is given)")
    parser.add_argument("--problem", action="append", metavar="DESCRIPTOR",
                        help="a benchdnn problem descriptor to run (repeatable); alone, only these run, "
                             "with --lists they are added to the lists' problems")
    parser.add_argument("--libraries", default=",".join(LIBRARIES),
                        help="comma-separated libraries to time (default: %(default)s)")
    parser.add_argument("--directions", default=",".join(DIRECTIONS),
                        help="comma-separated directions (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads per library (default: the CPUs this process may use)")
    parser.add_argument("--rounds", type=int, default=2, help="turns per library and problem (default: 2)")
    parser.add_argument("--reps", type=int, default=3, help="timed calls per turn (default: 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls per turn (default: 1)")
    parser.add_argument("--max-gflop", type=float, default=2.0,
                        help="shrink each problem's batch (then spatial size) to at most this many GFLOP per "
                             "direction, 0 for no limit (default: %(default)s)")
    parser.add_argument("--max-seconds", type=float, default=4.0,
                        help="stop a turn's timed calls after this many seconds (default: %(default)s)")
    parser.add_argument("--pause", type=float, default=0.1,
                        help="seconds between two libraries' turns, for their thread pools to sleep")
    parser.add_argument("--limit", type=int, default=0, help="only the first N problems of each list")
    parser.add_argument("--seed", type=int, default=0, help="seed of the inputs (default: 0)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a worker turn is abandoned")
    parser.add_argument("--no-check", action="store_true", help="skip the cross-library result check")
    parser.add_argument("--out", default="bench-results", help="output directory (default: %(default)s)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _split(value: str, allowed: tuple, what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise ConvValueError(f"bench: {what} must be a comma-separated subset of {', '.join(allowed)}, but got {value!r}")
    return items


def run(args: argparse.Namespace) -> int:
    """Run the benchmark described by parsed ``args``; returns the exit status."""
    libraries = _split(args.libraries, LIBRARIES, "--libraries")
    directions = _split(args.directions, DIRECTIONS, "--directions")
    if "convgrad" not in libraries:
        libraries.insert(0, "convgrad")
    threads = args.threads or _available_cpus()
    problems = _load_problems(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    workers = {lib: Worker(lib, threads, out) for lib in libraries}
    versions = {}
    for lib, w in list(workers.items()):
        if not w.info.get("ok"):
            print(f"bench: {lib} unavailable ({w.info.get('error')}); its columns show '—'", file=sys.stderr)
            w.close()
            del workers[lib]
        else:
            versions[lib] = w.info.get("version", "")
    sgemm = workers["convgrad"].request({"op": "sgemm"}, args.timeout).get("gflops")
    rows: list[Row] = []
    bar = _progress(len(problems), args.quiet)
    try:
        for prob in problems:
            prob_rows = {d: Row(prob, d) for d in directions}
            for rnd in range(args.rounds):
                for lib, w in workers.items():
                    # A library slower than --max-seconds per call already has its sample.
                    if rnd and all((prob_rows[d].median(lib) or 0) > args.max_seconds or lib in prob_rows[d].notes
                                   for d in directions):
                        continue
                    req = {"op": "run", "spec": spec_to_json(prob.spec), "directions": directions, "seed": args.seed,
                           "reps": args.reps, "warmup": args.warmup, "max_seconds": args.max_seconds,
                           "check": not args.no_check and rnd == 0, "memory": lib == "convgrad" and rnd == 0}
                    rep = w.request(req, args.timeout)
                    for d in directions:
                        row = prob_rows[d]
                        if not rep.get("ok"):
                            row.notes[lib] = rep.get("error", "failed")
                            continue
                        if d in rep["times"]:
                            row.times.setdefault(lib, []).extend(rep["times"][d])
                        if d in rep["unsupported"]:
                            row.notes[lib] = rep["unsupported"][d]
                        if d in rep.get("check", {}):
                            row.check[lib] = rep["check"][d]
                        if d in rep.get("peak", {}):
                            row.peak = rep["peak"][d]
                    time.sleep(args.pause)
            for row in prob_rows.values():
                _finish_check(row)
                rows.append(row)
            bar.update(1)
        end = workers["convgrad"].request({"op": "sgemm"}, args.timeout).get("gflops")
        readings = [v for v in (sgemm, end) if v]
        sgemm = max(readings) if readings else None
    finally:
        bar.close()
        for w in workers.values():
            w.close()
    meta = {"threads": threads, "sgemm_gflops": sgemm, "sgemm_readings": readings, "versions": versions,
            "seconds": time.time() - started, "rounds": args.rounds, "reps": args.reps, "max_gflop": args.max_gflop,
            "blas": _blas_info(), "workspace_limit": _workspace_limit()}
    write_csv(rows, out / "results.csv")
    (out / "results.md").write_text(render_markdown(rows, meta))
    write_chart(rows, out / "chart.png")
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    print(render_summary(rows, meta))
    print(f"bench: wrote {out / 'results.csv'}, {out / 'results.md'}, {out / 'chart.png'}")
    return 0


def _workspace_limit() -> int:
    from .dispatch import get_workspace_limit
    return get_workspace_limit()


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _blas_info() -> str:
    try:
        import threadpoolctl
        info = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
        return ", ".join(f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')})" for i in info)
    except Exception:  # noqa: BLE001
        return ""


def _finish_check(row: Row) -> None:
    """Projections -> estimated relative difference from convgrad's result."""
    ref = row.check.get("convgrad")
    est = {}
    for lib, proj in row.check.items():
        if lib == "convgrad" or ref is None or not isinstance(proj, list):
            continue
        norm = ref[2] or 1.0
        est[lib] = (abs(proj[0] - ref[0]) + abs(proj[1] - ref[1])) / 2 / norm
    row.check = est


def _progress(total: int, quiet: bool):
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None

    class _Null:
        def update(self, n): pass
        def close(self): pass
    class _Lines:                          # not a terminal: one line per finished problem
        def __init__(self):
            self.done = 0

        def update(self, n):
            self.done += n
            print(f"bench: {self.done}/{total} problems", file=sys.stderr, flush=True)

        def close(self): pass
    if quiet:
        return _Null()
    if tqdm is None or not sys.stderr.isatty():
        return _Lines()
    return tqdm(total=total, desc="bench", unit="problem")


# ---------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------

def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v * 1e3:.2f}"


def write_csv(rows: list[Row], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        wr = csv.writer(fh)
        wr.writerow(["list", "name", "descriptor", "scaled", "direction", "gflop", "library", "median_ms",
                     "gflops", "samples", "ratio_to_best_peer", "check_rel_diff", "peak_bytes", "note"])
        for r in rows:
            gf = r.problem.spec.flops / 1e9
            for lib in LIBRARIES:
                m = r.median(lib)
                if m is None and lib not in r.notes:
                    continue
                wr.writerow([r.problem.list_name, r.problem.name, str(r.problem.spec), r.problem.scaled, r.direction,
                             f"{gf:.4f}", lib, "" if m is None else f"{m * 1e3:.4f}",
                             "" if not m else f"{gf / m:.2f}", len(r.times.get(lib, [])),
                             "" if lib != "convgrad" or r.ratio() is None else f"{r.ratio():.4f}",
                             "" if lib not in r.check else f"{r.check[lib]:.2e}",
                             r.peak if lib == "convgrad" and r.peak is not None else "", r.notes.get(lib, "")])


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(rows: list[Row]) -> list[dict]:
    """Per list and direction: geometric-mean ratio to the best peer, worst case, count."""
    out = []
    keys = []
    for r in rows:
        k = (r.problem.list_name, r.direction)
        if k not in keys:
            keys.append(k)
    for lst, d in keys:
        sel = [r for r in rows if r.problem.list_name == lst and r.direction == d and r.ratio() is not None]
        if not sel:
            continue
        worst = max(sel, key=lambda r: r.ratio())
        out.append({"list": lst, "direction": d, "cases": len(sel), "geomean": geomean([r.ratio() for r in sel]),
                    "worst": worst.ratio(), "worst_case": worst.problem.name,
                    "over_1_5": sum(1 for r in sel if r.ratio() > 1.5)})
    return out


def deep_resnet_rate(rows: list[Row], sgemm: float | None) -> dict | None:
    """convgrad's GFLOP/s on the deep ResNet-50 layers (res4*, res5*) vs the SGEMM rate, and
    for context each peer's average over the same measurements where it ran (``peers``:
    library -> (mean GFLOP/s, measurements)) and the best peer's of each measurement
    (``best_peer``)."""
    sel = [r for r in rows if "resnet_50" in r.problem.list_name and re.search(r"res[45]", r.problem.name)
           and r.direction in ("bwd_weights", "bwd_data") and r.median("convgrad")]
    if not sel or not sgemm:
        return None

    def rate(r: Row, t: float) -> float:
        return r.problem.spec.flops / 1e9 / t

    rates = [rate(r, r.median("convgrad")) for r in sel]
    peers = {}
    for lib in PEERS:
        theirs = [rate(r, r.median(lib)) for r in sel if r.median(lib)]
        if theirs:
            peers[lib] = (float(np.mean(theirs)), len(theirs))
    best = [rate(r, r.best_peer()[1]) for r in sel if r.best_peer()[1]]
    return {"cases": len(sel), "mean_gflops": float(np.mean(rates)), "min_gflops": float(min(rates)),
            "sgemm": sgemm, "percent": 100.0 * float(np.mean(rates)) / sgemm, "peers": peers,
            "best_peer": (float(np.mean(best)), len(best)) if best else None}


def _result_bytes(spec: ConvSpec, direction: str) -> int:
    shape = {"bwd_weights": spec.weights_shape, "bwd_data": spec.src_shape, "fwd": spec.dst_shape}[direction]
    return 4 * int(np.prod(shape))


def peak_memory(rows: list[Row], cap: int | None) -> dict | None:
    """The largest temporaries (peak minus the result) of a convgrad call against the cap."""
    sel = [r for r in rows if r.peak is not None]
    if not sel or not cap:
        return None
    temps = [(r.peak - _result_bytes(r.problem.spec, r.direction), r) for r in sel]
    worst, row = max(temps, key=lambda t: t[0])
    return {"cases": len(sel), "max_temp": max(0, worst), "case": f"{row.problem.name} {row.direction}",
            "cap": cap, "over": sum(1 for t, _ in temps if t > cap)}


def _readings(meta: dict) -> str:
    """How the SGEMM rate was chosen, where the run took two readings: the machine's noise
    moves them apart (stop 43: 141, 152 and 170 GFLOP/s in three processes back to back),
    and the target is read against the higher one."""
    r = meta.get("sgemm_readings") or []
    if len(r) != 2:
        return ""
    return f" (the higher of two readings: {r[0]:.1f} before the first problem, {r[1]:.1f} after the last)"


def render_summary(rows: list[Row], meta: dict) -> str:
    lines = ["| list | direction | cases | geomean convgrad/best peer | worst (case) | cases > 1.5 |",
             "|---|---|---|---|---|---|"]
    for s in summarize(rows):
        lines.append(f"| {s['list']} | {s['direction']} | {s['cases']} | {s['geomean']:.2f} | "
                     f"{s['worst']:.2f} ({s['worst_case']}) | {s['over_1_5']} |")
    mem = peak_memory(rows, meta.get("workspace_limit"))
    if mem:
        lines.append("")
        lines.append(f"Peak memory of one convgrad call (NumPy allocations: temporaries and result, {mem['cases']} "
                     f"measurements): at most {mem['max_temp'] / 2**20:.1f} MiB of temporaries beyond the result "
                     f"({mem['case']}); the workspace cap is {mem['cap'] / 2**20:.0f} MiB; calls over "
                     f"inputs + outputs + cap: {mem['over']}.")
    deep = deep_resnet_rate(rows, meta.get("sgemm_gflops"))
    if deep:
        lines.append("")
        lines.append(f"Deep ResNet-50 layers (res4*, res5*; gradients): convgrad {deep['mean_gflops']:.1f} GFLOP/s "
                     f"on average (min {deep['min_gflops']:.1f}) = {deep['percent']:.0f} % of the measured SGEMM "
                     f"rate {deep['sgemm']:.1f} GFLOP/s{_readings(meta)} ({deep['cases']} measurements).")
        def share(name: str, g: float, n: int) -> str:
            return (f"{name} {g:.1f} ({100.0 * g / deep['sgemm']:.0f} %"
                    + ("" if n == deep["cases"] else f", {n} measurements") + ")")

        context = [share(lib, g, n) for lib, (g, n) in deep["peers"].items()]
        if deep["best_peer"]:
            context.append(share("the best peer of each measurement", *deep["best_peer"]))
        if context:
            lines.append(f"The peers on the same layers, GFLOP/s on average: {'; '.join(context)}.")
    return "\n".join(lines)


def render_markdown(rows: list[Row], meta: dict) -> str:
    head = (f"Threads: {meta['threads']}; SGEMM (2048^3, float32): {meta.get('sgemm_gflops') or 0:.1f} GFLOP/s; "
            f"BLAS: {meta.get('blas', '')}; versions: "
            + ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items())
            + f"; {meta['rounds']} rounds x {meta['reps']} timed calls per library; "
            f"run time {meta['seconds'] / 60:.1f} min.")
    parts = [head, "", "## Summary", "", render_summary(rows, meta), ""]
    lists = []
    for r in rows:
        if r.problem.list_name not in lists:
            lists.append(r.problem.list_name)
    for lst in lists:
        parts += [f"## {lst}", "", "| case | dir | GFLOP | convgrad ms | GFLOP/s | torch | tensorflow | openvino | jax "
                  "| best peer | ratio | max check |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if r.problem.list_name != lst:
                continue
            gf = r.problem.spec.flops / 1e9
            ours = r.median("convgrad")
            best, _ = r.best_peer()
            ratio = r.ratio()
            chk = max(r.check.values()) if r.check else None
            name = r.problem.name + (f" ({r.problem.scaled})" if r.problem.scaled else "")
            parts.append(f"| {name} | {r.direction} | {gf:.3f} | {_ms(ours)} | "
                         f"{'—' if not ours else f'{gf / ours:.1f}'} | "
                         + " | ".join(_ms(r.median(p)) for p in PEERS)
                         + f" | {best or '—'} | {'—' if ratio is None else f'{ratio:.2f}'} | "
                         f"{'—' if chk is None else f'{chk:.0e}'} |")
        parts.append("")
    return "\n".join(parts)


def write_chart(rows: list[Row], path: Path) -> None:
    """Bar chart: convgrad time / best peer time per case (log scale), one panel per direction."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    dirs = [d for d in DIRECTIONS if any(r.direction == d for r in rows)]
    fig, axes = plt.subplots(len(dirs), 1, figsize=(max(8, 0.22 * len(rows) / max(1, len(dirs)) + 3),
                                                    3.2 * len(dirs)), squeeze=False)
    for ax, d in zip(axes[:, 0], dirs):
        sel = [r for r in rows if r.direction == d]
        ratios = [r.ratio() or float("nan") for r in sel]
        colors = ["tab:green" if v <= 1 else "tab:orange" if v <= 1.5 else "tab:red" for v in
                  [x if x == x else 1 for x in ratios]]
        ax.bar(range(len(sel)), ratios, color=colors)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(1.5, color="tab:red", lw=0.6, ls="--")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator([0.125, 0.25, 0.5, 1, 1.5, 2, 4, 8, 16, 32]))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(axis="y", lw=0.3, alpha=0.5)
        ax.set_ylabel("convgrad / best peer")
        ax.set_title(f"{d}: time ratio (below 1: convgrad faster)")
        ax.set_xticks(range(len(sel)))
        ax.set_xticklabels([f"{r.problem.list_name}:{r.problem.name.split(':')[-1]}" for r in sel],
                           rotation=90, fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="convgrad bench", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--worker", choices=LIBRARIES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args.worker, args.threads or 1)
    try:
        return run(args)
    except ConvValueError as e:
        print(str(e), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
