"""Fuzzing every front-end op: each call returns the correct result or raises a clean ConvError.

Every example is a call of one front-end op (oneDNN Graph, OpenVINO, TensorFlow raw ops) drawn
valid most of the time from a canonical problem, then given 0 to 2 mutations: attribute values
of the wrong length, zero, negative, huge, float, NaN, string, None; inputs of the wrong rank,
channel counts that do not divide by groups, a diff_dst off by one, zero-sized dimensions,
kernels larger than the padded input, shape inputs missing or wrong; bool / complex / object /
string / integer element types and mixed types; non-arrays. Valid inputs come in odd forms
(Fortran order, read-only, negative strides, strided views, lists) and must stay unchanged.

The oracle is a *model* written here, independent of the front-ends: it reads the call as the
framework documents it (layouts as explicit axis permutations, auto_pad / SAME / output_shape
rules from PEERS.md), builds the canonical problem and computes it with the float64 (int64)
reference kernel. Then:

* an unmutated call must return the model's result (rel <= 1e-12 in f64, 1e-5 in f32, 2e-2 in
  f16/bf16, exact for integers), a new C-contiguous array of the inputs' type, and
  ``infer_shape`` (where the op has it) must give its shape;
* a mutated call either returns the model's result (the mutation happened to keep it valid;
  a result the model calls invalid fails the test) or raises ConvError, a ValueError or
  TypeError, whose message starts with the op's name and, when every mutation was to a named
  attribute's type or an input's element type, names it.

Each entry point's tally of results and errors is printed (``-s``) and both must be well
represented. Default tier: a few hundred examples per front-end; slow tier: 10,000 or more.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convgrad import onednn as od
from convgrad import openvino as ov
from convgrad.kernels import reference as ref
from convgrad.spec import ConvSpec

from .fuzzing import BAD_DTYPES, GOOD_DTYPES, INT_DTYPES, array, attr_values, expect_clean_error, odd_scalars
from .helpers import rel_err

MAXV = 2 ** 40
FLOATS = tuple(np.dtype(t) for t in GOOD_DTYPES)


class Invalid(Exception):
    """The model finds the call invalid (so the front-end must not return a result)."""


# ---------------------------------------------------------------------------------------------
# The model's building blocks (nothing from the front-ends)


def m_int(v) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise Invalid(f"not an integer: {v!r}")
    v = int(v)
    if abs(v) > MAXV:
        raise Invalid(f"out of range: {v}")
    return v


def m_ints(v) -> tuple[int, ...]:
    if isinstance(v, np.ndarray):
        if v.ndim != 1 or v.dtype.kind not in "iu":
            raise Invalid(f"not a 1-D integer array: {v!r}")
        v = v.tolist()
    if not isinstance(v, (list, tuple)):
        raise Invalid(f"not a list of integers: {v!r}")
    return tuple(m_int(x) for x in v)


def m_min(vals, lo: int, what: str) -> tuple[int, ...]:
    if any(x < lo for x in vals):
        raise Invalid(f"{what} below {lo}: {vals}")
    return tuple(vals)


def m_choice(v, allowed: tuple[str, ...]) -> str:
    if not isinstance(v, str) or v.lower() not in allowed:
        raise Invalid(f"not one of {allowed}: {v!r}")
    return v.lower()


def m_array(v) -> np.ndarray:
    if v is None:
        raise Invalid("None input")
    try:
        a = np.asarray(v)
    except (ValueError, TypeError) as e:
        raise Invalid(f"not an array: {e}") from None
    return a


def m_dtypes(arrays, allowed_kinds: str = "") -> np.dtype:
    dt = arrays[0].dtype
    if any(a.dtype != dt for a in arrays):
        raise Invalid("mixed element types")
    if dt not in FLOATS and not (dt.kind in allowed_kinds and dt.kind in "iu"):
        raise Invalid(f"element type {dt}")
    return dt


def ek(k: int, d: int) -> int:
    return d * (k - 1) + 1


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def same_pads(i: int, k: int, s: int, d: int, upper: bool) -> tuple[int, int]:
    """Forward SAME: output ceil(i/s), total max((o-1)*s + ek - i, 0); upper: odd unit at the end."""
    o = -(-i // s)
    tot = max((o - 1) * s + ek(k, d) - i, 0)
    return (tot // 2, tot - tot // 2) if upper else (tot - tot // 2, tot // 2)


def forward_pads(mode, src, k, s, d, pb, pe):
    if mode in ("none", "explicit"):
        return tuple(pb), tuple(pe)
    if mode == "valid":
        return (0,) * len(src), (0,) * len(src)
    pairs = [same_pads(*a, upper=mode == "same_upper") for a in zip(src, k, s, d)]
    return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)


def m_spec(mb, ic, oc, g, src, k, s, d, pb, pe) -> ConvSpec:
    """A canonical problem, checked the way the API documents (raises Invalid)."""
    if g < 1 or ic % g or oc % g:
        raise Invalid(f"channels {ic}/{oc} and groups {g}")
    if len({len(src), len(k), len(s), len(d), len(pb), len(pe)}) != 1 or not src:
        raise Invalid("per-axis lengths")
    if any(v < 1 for v in k) or any(v < 1 for v in s) or any(v < 1 for v in d):
        raise Invalid("kernel / strides / dilations")
    if any(v < 0 for v in tuple(src) + tuple(pb) + tuple(pe)):
        raise Invalid("negative size or pad")
    if any(i + b + e < ek(kk, dd) for i, kk, dd, b, e in zip(src, k, d, pb, pe)):
        raise Invalid("kernel larger than the padded input")
    return ConvSpec(mb=mb, ic=ic, oc=oc, groups=g, src=tuple(src), kernel=tuple(k), strides=tuple(s),
                    dilations=tuple(d), pads_begin=tuple(pb), pads_end=tuple(pe))


def acc_type(dt: np.dtype):
    return np.int64 if dt.kind in "iu" else np.float64


def m_run(direction: str, spec: ConvSpec, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    acc = acc_type(a.dtype)
    fn = {"fwd": ref.conv_forward, "bwd_weights": ref.conv_backward_weights,
          "bwd_data": ref.conv_backward_data}[direction]
    return fn(spec, a.astype(acc), b.astype(acc))


def m_window(full: np.ndarray, offset, size) -> np.ndarray:
    """out[..., o] = full[..., o + offset] where that index lies in the full result, else 0."""
    out = np.zeros(full.shape[:2] + tuple(size), full.dtype)
    src, dst = [], []
    for ax, (p, o) in enumerate(zip(offset, size)):
        lo, hi = max(p, 0), min(p + o, full.shape[2 + ax])
        if hi <= lo:
            return out
        src.append(slice(lo, hi))
        dst.append(slice(lo - p, hi - p))
    out[(Ellipsis,) + tuple(dst)] = full[(Ellipsis,) + tuple(src)]
    return out


def m_transposed(data, weights, g, s, d) -> np.ndarray:
    """The full transposed convolution (L = s*(i-1) + ek rows per axis): the data gradient of the
    unpadded convolution whose output is ``data``. weights: canonical (C_data, C_out/g, *k)."""
    n, c = data.shape[:2]
    k = weights.shape[2:]
    full = [si * (i - 1) + ek(kk, di) for i, kk, si, di in zip(data.shape[2:], k, s, d)]
    spec = m_spec(n, weights.shape[1] * g, c, g, full, k, s, d, (0,) * len(k), (0,) * len(k))
    return m_run("bwd_data", spec, data, weights)


def perm_nxc(nsp: int) -> tuple[int, ...]:
    """Canonical (N, C, *X) -> (N, *X, C)."""
    return (0, *range(2, nsp + 2), 1)


def perm_xio(nsp: int) -> tuple[int, ...]:
    """Canonical (O, I, *X) -> (*X, I, O)."""
    return (*range(2, nsp + 2), 1, 0)


def to_canon(a: np.ndarray, perm) -> np.ndarray:
    return a.transpose(np.argsort(perm))


def shape_to_canon(shape, perm) -> tuple[int, ...]:
    return tuple(shape[p] for p in np.argsort(perm))


def shape_from_canon(shape, perm) -> tuple[int, ...]:
    return tuple(shape[p] for p in perm)


# ---------------------------------------------------------------------------------------------
# A call, its checks and the tally


@dataclass
class Call:
    framework: str
    op: str
    attrs: dict
    args: list                         # positional inputs, in the op's order
    kwargs: dict = field(default_factory=dict)
    names: tuple = ()                  # input names, in order
    mutations: list = field(default_factory=list)
    named: set = field(default_factory=set)   # what an error for a type mutation must name

    def __repr__(self) -> str:
        def show(v):
            return f"array{v.shape}:{v.dtype}" if isinstance(v, np.ndarray) else repr(v)[:80]
        return (f"{self.framework}.{self.op}({self.attrs})({', '.join(show(a) for a in self.args)}, "
                f"{ {k: show(v) for k, v in self.kwargs.items()} }) mutations={self.mutations}")


TALLY: dict[str, Counter] = {}


@pytest.fixture(scope="module", autouse=True)
def _print_tally():
    yield
    for fw, c in sorted(TALLY.items()):
        ops = ", ".join(f"{k[3:]} {v} ({c['ok:' + k[3:]]} results)" for k, v in sorted(c.items())
                        if k.startswith("op:"))
        print(f"\n[fuzz {fw}] {c['ok']} results, {c['error']} clean errors; {ops}")


def _snapshot(v):
    return v.copy() if isinstance(v, np.ndarray) else copy.deepcopy(v)


def _unchanged(before, after) -> None:
    if isinstance(after, np.ndarray):
        np.testing.assert_array_equal(after, before)
    elif isinstance(after, (list, tuple)):
        assert after == before


def tolerance(dt: np.dtype) -> float:
    return {2: 2e-2, 4: 1e-5, 8: 1e-12}[dt.itemsize]


def check_call(call: Call, run, model, infer=None) -> str:
    """Run one call under the contract; returns "ok" or "error"."""
    inputs = list(call.args) + list(call.kwargs.values())
    before = [_snapshot(v) for v in inputs]
    try:
        try:
            got = run(call)
        except Exception as e:  # noqa: BLE001 - the contract is checked here
            expect_clean_error(call.op, e)
            assert call.mutations, f"a valid call was refused: {e}\n{call}"
            if call.named and all(m.startswith(("type:", "dtype")) for m in call.mutations):
                assert any(n in str(e) for n in call.named), f"error does not name {call.named}: {e}"
            outcome = "error"
        else:
            try:
                want = model(call)
            except Invalid as why:
                raise AssertionError(f"returned a result for an invalid call ({why}): {call}") from None
            assert isinstance(got, np.ndarray) and got.flags.c_contiguous, call
            assert got.shape == want.shape, (got.shape, want.shape, call)
            dt = next(a.dtype for a in map(np.asarray, call.args) if a.dtype != object)
            assert got.dtype == dt, (got.dtype, dt, call)
            assert not any(isinstance(v, np.ndarray) and np.shares_memory(got, v) for v in inputs), call
            if dt.kind in "iu":
                np.testing.assert_array_equal(got, want.astype(dt))
            else:
                err = rel_err(got.astype(np.float64), want)
                assert err <= tolerance(dt), (err, call)
            if infer is not None:
                assert tuple(infer(call)) == got.shape, call
            outcome = "ok"
    finally:
        for b, a in zip(before, inputs):
            _unchanged(b, a)
    if infer is not None and outcome == "error":   # shape inference: a shape or a clean error
        try:
            infer(call)
        except Exception as e:  # noqa: BLE001
            expect_clean_error(call.op, e)
    return outcome


def fuzz(framework: str, strategy, check, n: int) -> Counter:
    """Run ``n`` examples of ``strategy`` through ``check``; tally and print the outcomes."""
    counts = TALLY.setdefault(framework, Counter())
    local = Counter()

    @settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(strategy)
    def inner(call):
        outcome = check(call)
        for c in (counts, local):
            c[outcome] += 1
            c[f"op:{call.op}"] += 1
            c[f"{outcome}:{call.op}"] += 1

    inner()
    total = local["ok"] + local["error"]
    assert total >= n * 0.9, local
    need = 0.1 * total if total >= 500 else 1     # both outcomes well represented (a few in short runs)
    assert local["ok"] >= need and local["error"] >= need, local
    return local


# ---------------------------------------------------------------------------------------------
# Inputs: odd forms of valid arrays, and the mutations shared by every front-end


def odd_form(draw, a: np.ndarray):
    """The same values as ``a`` in a form a user might pass."""
    kind = draw(st.sampled_from(["plain"] * 4 + ["fortran", "readonly", "reversed", "strided", "list"]))
    if kind == "fortran":
        return np.asfortranarray(a)
    if kind == "readonly":
        b = a.copy()
        b.flags.writeable = False
        return b
    if kind == "reversed" and a.ndim:
        return np.flip(np.flip(a, -1).copy(), -1)          # a negative-stride view
    if kind == "strided" and a.ndim:
        big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        big[..., ::2] = a
        return big[..., ::2]
    if kind == "list" and a.dtype == np.float64 and 0 not in a.shape:
        return a.tolist()
    return a


NON_ARRAYS = [None, "abc", [[1.0, 2.0], [3.0]], object(), {"a": 1}]


def mutate_shape(draw, shapes: dict, names: list) -> str:
    """Wrong rank or a wrong dimension of one input's shape (lists in the op's layout)."""
    name = draw(st.sampled_from(names))
    shape = shapes[name]
    if draw(st.booleans()):
        if shape and draw(st.booleans()):
            shape.pop(draw(st.integers(0, len(shape) - 1)))
        else:
            shape.insert(draw(st.integers(0, len(shape))), draw(st.integers(1, 3)))
        return f"rank:{name}"
    if shape:
        shape[draw(st.integers(0, len(shape) - 1))] = draw(st.sampled_from([0, 0, 1, 2, 3, 5, 8]))
    return f"dim:{name}"


def build_inputs(draw, call: Call, shapes: dict, dtypes: dict) -> None:
    """Arrays for ``call.names`` from (possibly mutated) shapes and element types."""
    args = []
    for name in call.names:
        if name in call.kwargs:
            continue
        shape = tuple(max(v, 0) for v in shapes[name])
        a = array(draw, shape, dtypes[name])
        args.append(odd_form(draw, a))
    call.args = args


def mutate_dtype(draw, call: Call, dtypes: dict, names: list, allowed_int: bool) -> None:
    if draw(st.booleans()):
        dt = draw(st.sampled_from(BAD_DTYPES + ([] if allowed_int else INT_DTYPES)))
        for n in names:
            dtypes[n] = dt
        call.mutations.append("dtype:all")
        call.named.update(["element type"])
    else:
        n = draw(st.sampled_from(names))
        dtypes[n] = draw(st.sampled_from(GOOD_DTYPES + BAD_DTYPES + INT_DTYPES))
        call.mutations.append(f"dtype:{n}")
        call.named.update(["element type", n])


def mutate_non_array(draw, call: Call) -> None:
    k = draw(st.integers(0, len(call.args) - 1))
    call.args[k] = draw(st.sampled_from(NON_ARRAYS))
    call.mutations.append(f"nonarray:{call.names[k]}")


def mutate_attr(draw, call: Call, nsp: int, names, *, strings: dict, scalar_ok: bool = False) -> None:
    """A per-axis attribute or a string attribute gets a random value (a "type:" mutation when
    the value is not a list of integers, or an integer where ``scalar_ok``)."""
    kind = draw(st.sampled_from(["list", "list", "list", "string"] if strings else ["list"]))
    if kind == "list":
        name = draw(st.sampled_from(names))
        value = draw(attr_values(nsp))
        call.attrs[name] = value
        def is_int(v):
            return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
        typed = (isinstance(value, (list, tuple)) and all(map(is_int, value))) or (scalar_ok and is_int(value))
        call.mutations.append(("attr:" if typed else "type:") + name)
        call.named.add(name)
    else:
        name = draw(st.sampled_from(sorted(strings)))
        call.attrs[name] = draw(st.one_of(st.sampled_from(strings[name]), st.text(max_size=4), odd_scalars))
        call.mutations.append("type:" + name if not isinstance(call.attrs[name], str) else "attr:" + name)
        call.named.add(name)


def big_stride(draw, strides: list) -> list:
    """A copy of ``strides`` with one huge entry: still valid for a forward op (one window)."""
    out = list(strides)
    out[draw(st.integers(0, len(out) - 1))] = 2 ** draw(st.integers(20, 40))
    return out


def spelled(draw, value: str) -> str:
    return draw(st.sampled_from([value.lower(), value.upper(), value.title()]))


# ---------------------------------------------------------------------------------------------
# oneDNN Graph: six ops


DNNL_OPS = ("Convolution", "ConvolutionBackwardData", "ConvolutionBackwardWeights", "ConvTranspose",
            "ConvTransposeBackwardData", "ConvTransposeBackwardWeights")
DNNL_INPUTS = {"Convolution": ("src", "weights", "bias"), "ConvolutionBackwardData": ("diff_dst", "weights"),
               "ConvolutionBackwardWeights": ("src", "diff_dst"), "ConvTranspose": ("src", "weights", "bias"),
               "ConvTransposeBackwardData": ("diff_dst", "weights"),
               "ConvTransposeBackwardWeights": ("src", "diff_dst")}
DNNL_AUTO = ("none", "same_upper", "same_lower", "valid")


@st.composite
def onednn_calls(draw, op: str) -> Call:
    deconv = op.startswith("ConvTranspose")
    nsp = draw(st.integers(1, 3))
    g = draw(st.integers(1, 3))
    a, b = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    mb = draw(st.integers(0, 2))
    k = [draw(st.integers(1, 3)) for _ in range(nsp)]
    d = [draw(st.integers(1, 2)) for _ in range(nsp)]
    s = [draw(st.integers(1, 3)) for _ in range(nsp)]
    pb = [draw(st.integers(0, 4)) for _ in range(nsp)]
    pe = [draw(st.integers(0, 4)) for _ in range(nsp)]
    mode = draw(st.sampled_from(("none", "none", "same_upper", "same_lower", "valid")))
    df = draw(st.sampled_from(["NXC", "NCX"]))
    wf = draw(st.sampled_from(["XOI", "IOX"] if deconv else ["XIO", "OIX"]))
    dperm = perm_nxc(nsp) if df == "NXC" else tuple(range(nsp + 2))
    wperm = perm_xio(nsp) if wf in ("XIO", "XOI") else tuple(range(nsp + 2))
    attrs = dict(strides=s, pads_begin=pb, pads_end=pe, dilations=d)
    for name, value, default in (("auto_pad", "None" if mode == "none" else mode, "None"), ("groups", g, 1),
                                 ("data_format", df, "NXC"), ("weights_format", wf, "XOI" if deconv else "XIO")):
        if value != default or draw(st.booleans()):
            attrs[name] = spelled(draw, value) if isinstance(value, str) else value
    call = Call("onednn", op, attrs, [], {}, DNNL_INPUTS[op])
    shapes: dict[str, list] = {}
    if op == "ConvTranspose":
        # deconvolution input i >= 1; output s*(i-1) + ek - pb - pe + output_padding >= 1
        opad = [draw(st.integers(0, v - 1)) for v in s]
        if any(opad) or draw(st.booleans()):
            attrs["output_padding"] = opad
        tot = [max(0, ek(kk, dd) - ss) for kk, dd, ss in zip(k, d, s)]
        rpb, rpe = (pb, pe) if mode == "none" else ([0] * nsp, [0] * nsp) if mode == "valid" else (
            [t // 2 if mode == "same_upper" else t - t // 2 for t in tot],
            [t - t // 2 if mode == "same_upper" else t // 2 for t in tot])
        i = [max(draw(st.integers(1, 5)), 1 + max(0, ceil_div(x + y - p + 1 - ek(kk, dd), ss)))
             for kk, dd, ss, x, y, p in zip(k, d, s, rpb, rpe, opad)]
        shapes["src"] = list(shape_from_canon((mb, g * a, *i), dperm))
        shapes["weights"] = list(shape_from_canon((g * a, b, *k), wperm))
        if draw(st.booleans()):
            shapes["bias"] = [g * b]
    else:
        # the convolution whose src has these spatial sizes: big enough for its pads
        need = {"none": [ek(kk, dd) - x - y for kk, dd, x, y in zip(k, d, pb, pe)],
                "valid": [ek(kk, dd) for kk, dd in zip(k, d)]}.get(mode, [1] * nsp)
        src = [max(draw(st.integers(1, 7)), n) for n in need]
        cpb, cpe = forward_pads(mode, src, k, s, d, pb, pe)
        dst = [(i + x + y - ek(kk, dd)) // ss + 1 for i, kk, dd, ss, x, y in zip(src, k, d, s, cpb, cpe)]
        if not deconv:
            x_shape, y_shape, w_shape = (mb, g * a, *src), (mb, g * b, *dst), (g * b, a, *k)
        else:   # ConvTranspose's diff_dst is this convolution's src; its src this convolution's dst
            x_shape, y_shape, w_shape = (mb, g * b, *src), (mb, g * a, *dst), (g * a, b, *k)
        if op == "Convolution":
            shapes.update(src=list(shape_from_canon(x_shape, dperm)), weights=list(shape_from_canon(w_shape, wperm)))
            if draw(st.booleans()):
                shapes["bias"] = [g * b]
        elif op in ("ConvolutionBackwardData", "ConvTransposeBackwardData"):
            shapes.update(diff_dst=list(shape_from_canon(x_shape if deconv else y_shape, dperm)),
                          weights=list(shape_from_canon(w_shape, wperm)))
            if not deconv:
                full = list(shape_from_canon(x_shape, dperm))
                _shape_value(draw, call, "dst_shape", full)
                if draw(st.booleans()):
                    attrs["output_padding"] = [draw(st.integers(0, 3)) for _ in range(nsp)]
        else:
            shapes.update(src=list(shape_from_canon(y_shape if deconv else x_shape, dperm)),
                          diff_dst=list(shape_from_canon(x_shape if deconv else y_shape, dperm)))
            _shape_value(draw, call, "weights_shape", list(shape_from_canon(w_shape, wperm)))
    names = [n for n in call.names if n in shapes]
    call.names = tuple(names)
    dt = draw(st.sampled_from(GOOD_DTYPES))
    dtypes = {n: dt for n in names}
    strings = {"auto_pad": ["None", "SAME_UPPER", "valid"], "data_format": ["NCX", "nxc"],
               "weights_format": ["OIX", "XIO", "IOX", "XOI"]}
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):
        what = draw(st.sampled_from(["attr", "attr", "groups", "shape", "shape", "dtype", "dy", "kernel",
                                     "shape_value", "output_padding", "nonarray", "bigstride"]))
        if what == "attr":
            mutate_attr(draw, call, nsp, ["strides", "dilations", "pads_begin", "pads_end"], strings=strings)
        elif what == "bigstride" and op in ("Convolution", "ConvTransposeBackwardData"):
            attrs["strides"] = big_stride(draw, s)
            call.mutations.append("attr:strides")
        elif what == "groups":
            attrs["groups"] = draw(odd_scalars)
            call.mutations.append("type:groups" if not isinstance(attrs["groups"], (int, np.integer))
                                  or isinstance(attrs["groups"], bool) else "attr:groups")
            call.named.add("groups")
        elif what == "shape":
            call.mutations.append(mutate_shape(draw, shapes, names))
        elif what == "dtype":
            mutate_dtype(draw, call, dtypes, names, allowed_int=False)
        elif what == "dy" and "diff_dst" in shapes:
            sp = [j for j, ch in enumerate(df.replace("X", "X" * nsp)) if ch == "X"]
            shapes["diff_dst"][draw(st.sampled_from(sp))] += draw(st.sampled_from([-1, 1]))
            call.mutations.append("dy")
        elif what == "kernel":
            ax = draw(st.integers(0, nsp - 1))
            j = wperm.index(2 + ax)
            big = draw(st.integers(9, 14))
            target = next((t for t in (shapes.get("weights"), call.kwargs.get("weights_shape"),
                                       attrs.get("weights_shape")) if isinstance(t, list)), None)
            if isinstance(target, list) and j < len(target):
                target[j] = big
                call.mutations.append("kernel")
        elif what == "shape_value" and op in ("ConvolutionBackwardData", "ConvolutionBackwardWeights",
                                              "ConvTransposeBackwardWeights"):
            key = "dst_shape" if "dst_shape" in attrs or "dst_shape" in call.kwargs else "weights_shape"
            where = call.kwargs if key in call.kwargs else attrs
            where[key] = draw(st.one_of(st.none(), attr_values(nsp + 2, -1, 6), st.just([0] * 12)))
            call.mutations.append(f"shape_value:{key}")
        elif what == "output_padding" and op in ("ConvolutionBackwardData", "ConvTranspose"):
            attrs["output_padding"] = draw(st.one_of(attr_values(nsp, -1, 4), st.just([0] * 12)))
            call.mutations.append("attr:output_padding")
        elif what == "nonarray":
            call.mutations.append("nonarray")
    build_inputs(draw, call, shapes, dtypes)
    if "nonarray" in call.mutations:
        call.mutations.remove("nonarray")
        mutate_non_array(draw, call)
    return call


def _shape_value(draw, call: Call, key: str, value: list) -> None:
    """A shape given as the attribute, the input (which wins over a wrong attribute), or both."""
    how = draw(st.sampled_from(["attr", "input", "both"]))
    if how in ("input", "both"):
        call.kwargs[key] = draw(st.sampled_from([list, tuple, lambda v: np.asarray(v, np.int64)]))(value)
    if how == "attr":
        call.attrs[key] = value
    elif how == "both":
        call.attrs[key] = [v + 1 for v in value]


def onednn_run(call: Call):
    op = getattr(od, call.op)(**call.attrs)
    return op(*call.args, **call.kwargs)


def shape_of(v):
    """An input's shape for infer_shape (a non-array goes as it is: infer_shape must refuse it)."""
    try:
        return np.shape(v) if isinstance(v, (np.ndarray, list)) else v
    except ValueError:   # a ragged list
        return v


def onednn_infer(call: Call):
    op = getattr(od, call.op)(**call.attrs)
    return op.infer_shape(*map(shape_of, call.args), **call.kwargs)


def _dnnl_shape_attr(v):
    if v is None:
        return None
    vals = m_min(m_ints(v), 0, "shape")
    return None if len(vals) == 12 and not any(vals) else vals


def onednn_model(call: Call) -> np.ndarray:
    """oneDNN Graph's semantics from its documentation and the measurements in PEERS.md."""
    at = call.attrs
    op = call.op
    s = m_min(m_ints(at["strides"]), 1, "strides")
    d = m_min(m_ints(at["dilations"]), 1, "dilations")
    pb = m_min(m_ints(at["pads_begin"]), 0, "pads_begin")
    pe = m_min(m_ints(at["pads_end"]), 0, "pads_end")
    nsp = len(s)
    if nsp == 0 or {len(d), len(pb), len(pe)} != {nsp}:
        raise Invalid("attribute lengths")
    mode = m_choice(at.get("auto_pad", "none"), DNNL_AUTO)
    g = m_int(at.get("groups", 1))
    if g < 1:
        raise Invalid("groups")
    df = m_choice(at.get("data_format", "nxc"), ("nxc", "ncx"))
    deconv = op.startswith("ConvTranspose")
    wf = m_choice(at.get("weights_format", "xoi" if deconv else "xio"), ("xoi", "iox") if deconv else ("xio", "oix"))
    dperm = perm_nxc(nsp) if df == "nxc" else tuple(range(nsp + 2))
    wperm = perm_xio(nsp) if wf in ("xio", "xoi") else tuple(range(nsp + 2))
    given = [(n, v) for n, v in zip(call.names, call.args) if not (n == "bias" and v is None)]  # None: no bias
    arrs = [m_array(v) for _, v in given]
    m_dtypes(arrs)
    for (name, _), a in zip(given, arrs):
        if name != "bias" and a.ndim != nsp + 2:
            raise Invalid(f"{name} rank")
    opad = None
    if "output_padding" in at and at["output_padding"] is not None:
        opad = m_min(m_ints(at["output_padding"]), 0, "output_padding")
        if len(opad) < nsp or any(opad[nsp:]):
            raise Invalid("output_padding length")
        opad = opad[:nsp]
    names = {n: a for (n, _), a in zip(given, arrs)}

    def bias_add(out, channels):
        if "bias" not in names:
            return out
        bias = names["bias"]
        if bias.shape != (channels,):
            raise Invalid("bias shape")
        return out + bias.astype(np.float64).reshape((1, channels) + (1,) * nsp)

    def shape_arg(key, positive):
        v = call.kwargs.get(key)
        if v is not None:
            vals = m_min(m_ints(v), 1 if positive else 0, key)
        else:
            vals = _dnnl_shape_attr(at.get(key))
            if vals is None:
                raise Invalid(f"{key} missing")
        if len(vals) != nsp + 2 or (positive and min(vals) < 1):
            raise Invalid(f"{key}")
        return vals

    if op in ("Convolution", "ConvTransposeBackwardData"):
        x = to_canon(names["src" if op == "Convolution" else "diff_dst"], dperm)
        w = to_canon(names["weights"], wperm)
        n, c, src = x.shape[0], x.shape[1], x.shape[2:]
        o, i, k = w.shape[0], w.shape[1], w.shape[2:]
        if i * g != c:
            raise Invalid("weights I")
        spec = m_spec(n, c, o, g, src, k, s, d, *forward_pads(mode, src, k, s, d, pb, pe))
        out = bias_add(m_run("fwd", spec, x, w), o)
        return np.ascontiguousarray(out.transpose(dperm))
    if op == "ConvolutionBackwardData":
        if opad is None and "output_padding" in at and at["output_padding"] is not None:
            raise Invalid("output_padding")
        dy = to_canon(names["diff_dst"], dperm)
        w = to_canon(names["weights"], wperm)
        full = shape_to_canon(shape_arg("dst_shape", False), dperm)
        n, c, src = full[0], full[1], full[2:]
        o, i, k = w.shape[0], w.shape[1], w.shape[2:]
        if c != i * g:
            raise Invalid("dst_shape channels")
        spec = m_spec(n, c, o, g, src, k, s, d, *forward_pads(mode, src, k, s, d, pb, pe))
        if dy.shape != spec.dst_shape:
            raise Invalid("diff_dst shape")
        return np.ascontiguousarray(m_run("bwd_data", spec, dy, w).transpose(dperm))
    if op == "ConvolutionBackwardWeights":
        x = to_canon(names["src"], dperm)
        dy = to_canon(names["diff_dst"], dperm)
        wshape = shape_to_canon(shape_arg("weights_shape", True), wperm)
        n, c, src = x.shape[0], x.shape[1], x.shape[2:]
        o, i, k = wshape[0], wshape[1], wshape[2:]
        if c != i * g:
            raise Invalid("weights_shape I")
        spec = m_spec(n, c, o, g, src, k, s, d, *forward_pads(mode, src, k, s, d, pb, pe))
        if dy.shape != spec.dst_shape:
            raise Invalid("diff_dst shape")
        return np.ascontiguousarray(m_run("bwd_weights", spec, x, dy).transpose(wperm))
    if op == "ConvTranspose":
        x = to_canon(names["src"], dperm)
        w = to_canon(names["weights"], wperm)     # (C_in, C_out/g, *k): the OIX weights of a convolution
        n, c, i = x.shape[0], x.shape[1], x.shape[2:]
        k = w.shape[2:]
        if w.shape[0] != c or c % g or min(i) < 1:
            raise Invalid("weights I / src")
        opad = opad or (0,) * nsp
        if any(p >= ss for p, ss in zip(opad, s)):
            raise Invalid("output_padding >= strides")
        if mode == "none":
            rpb, rpe = pb, pe
        else:  # the library's deconvolution rule: total = max(0, ek - s), whatever the input size
            tot = [0 if mode == "valid" else max(0, ek(kk, dd) - ss) for kk, dd, ss in zip(k, d, s)]
            small = [t // 2 for t in tot]
            rpb = small if mode == "same_upper" else [t - sm for t, sm in zip(tot, small)]
            rpe = [t - b for t, b in zip(tot, rpb)]
        size = [ss * (ii - 1) + ek(kk, dd) - b - e + p for ii, kk, ss, dd, b, e, p in zip(i, k, s, d, rpb, rpe, opad)]
        if min(size) < 1:
            raise Invalid("output size")
        full = m_transposed(x, w, g, s, d)
        out = bias_add(m_window(full, rpb, size), w.shape[1] * g)
        return np.ascontiguousarray(out.transpose(dperm))
    # ConvTransposeBackwardWeights: the weights gradient of the convolution of diff_dst
    x = to_canon(names["src"], dperm)
    dy = to_canon(names["diff_dst"], dperm)
    wshape = shape_to_canon(shape_arg("weights_shape", True), wperm)
    k = wshape[2:]
    if wshape[0] != x.shape[1] or wshape[1] * g != dy.shape[1] or x.shape[1] % g:
        raise Invalid("weights_shape")
    src = dy.shape[2:]
    spec = m_spec(dy.shape[0], dy.shape[1], x.shape[1], g, src, k, s, d, *forward_pads(mode, src, k, s, d, pb, pe))
    if x.shape != spec.dst_shape:
        raise Invalid("src shape")
    return np.ascontiguousarray(m_run("bwd_weights", spec, dy, x).transpose(wperm))


def check_onednn(call: Call) -> str:
    return check_call(call, onednn_run, onednn_model, onednn_infer)


@pytest.mark.parametrize("op", DNNL_OPS)
def test_fuzz_onednn(op):
    fuzz("onednn", onednn_calls(op), check_onednn, 60)


@pytest.mark.slow
@pytest.mark.parametrize("op", DNNL_OPS)
def test_fuzz_onednn_slow(op):
    """1,700 examples per op: 10,200 for the front-end."""
    fuzz("onednn", onednn_calls(op), check_onednn, 1700)


# ---------------------------------------------------------------------------------------------
# OpenVINO: four ops


OV_OPS = ("Convolution", "GroupConvolution", "ConvolutionBackpropData", "GroupConvolutionBackpropData")
OV_MODES = ("explicit", "same_upper", "same_lower", "valid")


def _ov_attr(draw, values: list, default: int):
    """An int[] attribute as a user might write it: a list, a tuple, an array, a scalar, []."""
    if all(v == default for v in values) and draw(st.integers(0, 3)) == 0:
        return []
    if len(set(values)) == 1 and draw(st.integers(0, 3)) == 0:
        return values[0]
    return draw(st.sampled_from([list, tuple, lambda v: np.asarray(v, np.int64)]))(values)


@st.composite
def openvino_calls(draw, op: str) -> Call:
    grouped, backprop = op.startswith("Group"), "Backprop" in op
    nsp = draw(st.integers(1, 3))
    g = draw(st.integers(1, 3)) if grouped else 1
    cin, cout = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    mb = draw(st.integers(0, 2))
    k = [draw(st.integers(1, 3)) for _ in range(nsp)]
    d = [draw(st.integers(1, 2)) for _ in range(nsp)]
    s = [draw(st.integers(1, 3)) for _ in range(nsp)]
    mode = draw(st.sampled_from(("explicit", "explicit", "same_upper", "same_lower", "valid")))
    lo = 0 if mode == "explicit" else -2   # pads are ignored (even negative) unless explicit
    pb = [draw(st.integers(lo, 4)) for _ in range(nsp)]
    pe = [draw(st.integers(lo, 4)) for _ in range(nsp)]
    attrs = dict(strides=_ov_attr(draw, s, 1), pads_begin=_ov_attr(draw, pb, 0), pads_end=_ov_attr(draw, pe, 0),
                 dilations=_ov_attr(draw, d, 1))
    if mode != "explicit" or draw(st.booleans()):
        attrs["auto_pad"] = spelled(draw, mode)
    call = Call("openvino", op, attrs, [], {}, ("data", "filters"))
    if backprop:
        opad = [draw(st.integers(-1, 4)) for _ in range(nsp)]
        if any(opad) or draw(st.booleans()):
            attrs["output_padding"] = _ov_attr(draw, opad, 0)
        else:
            opad = [0] * nsp
        with_shape = draw(st.booleans())
        if mode == "explicit" and not with_shape:   # L - pb - pe + output_padding >= 0
            i = [max(draw(st.integers(1, 5)), 1 + max(0, ceil_div(b + e - p - ek(kk, dd), ss)))
                 for kk, dd, ss, b, e, p in zip(k, d, s, pb, pe, opad)]
        else:
            i = [draw(st.integers(1, 5)) for _ in range(nsp)]
        if with_shape:
            full = [ss * (ii - 1) + ek(kk, dd) for ii, kk, ss, dd in zip(i, k, s, d)]
            out = [draw(st.integers(max(0, L - 3), L + 3)) for L in full]
            call.kwargs["output_shape"] = draw(st.sampled_from([list, tuple, lambda v: np.asarray(v, np.int64)]))(out)
            call.names = ("data", "filters", "output_shape")
        fshape = [cin, cout, *k]
    else:
        need = {"explicit": [ek(kk, dd) - b - e for kk, dd, b, e in zip(k, d, pb, pe)],
                "valid": [ek(kk, dd) for kk, dd in zip(k, d)]}.get(mode, [1] * nsp)
        i = [max(draw(st.integers(1, 7)), n) for n in need]
        fshape = [cout, cin, *k]
    shapes = {"data": [mb, g * cin, *i], "filters": ([g] if grouped else []) + fshape}
    names = ["data", "filters"]
    dt = draw(st.sampled_from(GOOD_DTYPES * 2 + INT_DTYPES))
    dtypes = {n: dt for n in names}
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):
        what = draw(st.sampled_from(["attr", "attr", "shape", "shape", "dtype", "kernel", "output_shape",
                                     "output_padding", "auto_pad", "nonarray", "bigstride"]))
        if what == "attr":
            mutate_attr(draw, call, nsp, ["strides", "dilations", "pads_begin", "pads_end"], strings={},
                        scalar_ok=True)
        elif what == "bigstride" and not backprop:
            attrs["strides"] = big_stride(draw, s)
            call.mutations.append("attr:strides")
        elif what == "auto_pad":
            attrs["auto_pad"] = draw(st.one_of(st.sampled_from(["SAME_UPPER", "Valid", "notset", "same"]),
                                               st.text(max_size=4), odd_scalars))
            call.mutations.append(("attr:" if isinstance(attrs["auto_pad"], str) else "type:") + "auto_pad")
            call.named.add("auto_pad")
        elif what == "shape":
            call.mutations.append(mutate_shape(draw, shapes, names))
        elif what == "dtype":
            mutate_dtype(draw, call, dtypes, names, allowed_int=True)
        elif what == "kernel":
            kk = shapes["filters"]
            j = len(kk) - nsp + draw(st.integers(0, nsp - 1))
            if 0 <= j < len(kk):
                kk[j] = draw(st.integers(9, 14))
                call.mutations.append("kernel")
        elif what == "output_shape" and backprop:
            call.kwargs["output_shape"] = draw(st.one_of(
                attr_values(nsp, -2, 9), st.just(np.zeros((nsp, 1), np.int64)), st.just(np.ones(nsp, np.float64))))
            call.names = ("data", "filters", "output_shape")
            call.mutations.append("output_shape")
        elif what == "output_padding" and backprop:
            attrs["output_padding"] = draw(attr_values(nsp, -3, 5))
            call.mutations.append("attr:output_padding")
        elif what == "nonarray":
            call.mutations.append("nonarray")
    build_inputs(draw, call, shapes, dtypes)
    if "nonarray" in call.mutations:
        call.mutations.remove("nonarray")
        mutate_non_array(draw, call)
    return call


def openvino_run(call: Call):
    return getattr(ov, call.op)(**call.attrs)(*call.args, **call.kwargs)


def openvino_infer(call: Call):
    op = getattr(ov, call.op)(**call.attrs)
    return op.infer_shape(*map(shape_of, call.args), **call.kwargs)


def _ov_ints(v, nsp: int, default: int, lo: int) -> tuple[int, ...]:
    """OpenVINO int[]: a scalar broadcasts, [] means the default, else one entry per axis."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        vals = (m_int(v),) * nsp
    else:
        vals = m_ints(v)
        if not vals:
            vals = (default,) * nsp
    if len(vals) != nsp:
        raise Invalid("attribute length")
    return m_min(vals, lo, "attribute")


def openvino_model(call: Call) -> np.ndarray:
    """OpenVINO's semantics as PEERS.md measures them on the 2026.4 runtime."""
    at, op = call.attrs, call.op
    grouped, backprop = op.startswith("Group"), "Backprop" in op
    mode = m_choice(at.get("auto_pad", "explicit"), OV_MODES)
    data, filters = (m_array(v) for v in call.args[:2])
    m_dtypes([data, filters], "iu")
    if not 3 <= data.ndim <= 5 or filters.ndim != data.ndim + grouped:
        raise Invalid("ranks")
    nsp = data.ndim - 2
    s = _ov_ints(at["strides"], nsp, 1, 1)
    d = _ov_ints(at["dilations"], nsp, 1, 1)
    plo = 0 if mode == "explicit" else -MAXV
    pb, pe = _ov_ints(at["pads_begin"], nsp, 0, plo), _ov_ints(at["pads_end"], nsp, 0, plo)
    g = filters.shape[0] if grouped else 1
    f = filters.reshape((1,) + filters.shape) if not grouped else filters
    c_in, c_out = (f.shape[1], f.shape[2]) if backprop else (f.shape[2], f.shape[1])
    k, i, n = f.shape[3:], data.shape[2:], data.shape[0]
    if g < 1 or c_in < 1 or min(k) < 1 or data.shape[1] != g * c_in or min(i) < 1:
        raise Invalid("channels / sizes")
    if not backprop:
        w = f.reshape((g * c_out, c_in) + k)
        spec = m_spec(n, g * c_in, g * c_out, g, i, k, s, d, *forward_pads(mode, i, k, s, d, pb, pe))
        return m_run("fwd", spec, data, w)
    opad = _ov_ints(at.get("output_padding") if at.get("output_padding") is not None else [], nsp, 0, -MAXV)
    full = [ss * (ii - 1) + ek(kk, dd) for ii, kk, ss, dd in zip(i, k, s, d)]
    shape = call.kwargs.get("output_shape")
    if shape is None:
        offset = pb if mode == "explicit" else (0,) * nsp
        size = [L - b - e + p for L, b, e, p in zip(full, pb, pe, opad)] if mode == "explicit" else \
            [L + p for L, p in zip(full, opad)]
        if min(size) < 0:
            raise Invalid("negative output size")
    else:
        size = m_min(m_ints(shape), 0, "output_shape")
        if len(size) != nsp:
            raise Invalid("output_shape length")
        tot = [max(L + p - o, 0) for L, p, o in zip(full, opad, size)]
        offset = {"explicit": pb, "valid": (0,) * nsp, "same_upper": [t - t // 2 for t in tot],
                  "same_lower": [t // 2 for t in tot]}[mode]
    w = f.reshape((g * c_in, c_out) + k)
    return m_window(m_transposed(data, w, g, s, d), offset, size)


def check_openvino(call: Call) -> str:
    return check_call(call, openvino_run, openvino_model, openvino_infer)


@pytest.mark.parametrize("op", OV_OPS)
def test_fuzz_openvino(op):
    fuzz("openvino", openvino_calls(op), check_openvino, 75)


@pytest.mark.slow
@pytest.mark.parametrize("op", OV_OPS)
def test_fuzz_openvino_slow(op):
    """2,500 examples per op: 10,000 for the front-end."""
    fuzz("openvino", openvino_calls(op), check_openvino, 2500)


# ---------------------------------------------------------------------------------------------
# TensorFlow: thirteen raw ops

_F = tuple(GOOD_DTYPES)
_F_I32 = _F + (np.int32,)
_F_NO_BF16 = (np.float16, np.float32, np.float64)
# op -> (spatial axes, direction, inputs in order, element types, data_format?, use_cudnn_on_gpu?, depthwise?)
TF_OPS = {
    "Conv2D": (2, "fwd", ("input", "filter"), _F_I32, True, True, False),
    "Conv2DBackpropFilter": (2, "bwd_weights", ("input", "filter_sizes", "out_backprop"), _F, True, True, False),
    "Conv2DBackpropFilterV2": (2, "bwd_weights", ("input", "filter", "out_backprop"), _F, True, True, False),
    "Conv2DBackpropInput": (2, "bwd_data", ("input_sizes", "filter", "out_backprop"), _F_I32, True, True, False),
    "Conv2DBackpropInputV2": (2, "bwd_data", ("input", "filter", "out_backprop"), _F_I32, True, True, False),
    "DepthwiseConv2dNative": (2, "fwd", ("input", "filter"), _F, True, False, True),
    "DepthwiseConv2dNativeBackpropFilter": (2, "bwd_weights", ("input", "filter_sizes", "out_backprop"), _F, True,
                                            False, True),
    "DepthwiseConv2dNativeBackpropInput": (2, "bwd_data", ("input_sizes", "filter", "out_backprop"), _F, True, False,
                                           True),
    "Conv3D": (3, "fwd", ("input", "filter"), _F, True, False, False),
    "Conv3DBackpropFilter": (3, "bwd_weights", ("input", "filter", "out_backprop"), _F_NO_BF16, False, False, False),
    "Conv3DBackpropFilterV2": (3, "bwd_weights", ("input", "filter_sizes", "out_backprop"), _F, True, False, False),
    "Conv3DBackpropInput": (3, "bwd_data", ("input", "filter", "out_backprop"), _F_NO_BF16, False, False, False),
    "Conv3DBackpropInputV2": (3, "bwd_data", ("input_sizes", "filter", "out_backprop"), _F, True, False, False),
}
TF_SIZES = ("filter_sizes", "input_sizes")
TF_FORMATS = {2: ("NHWC", "NCHW"), 3: ("NDHWC", "NCDHW")}


def _tf_perm(fmt: str) -> tuple[int, ...]:
    return perm_nxc(len(fmt) - 2) if fmt.endswith("C") else tuple(range(len(fmt)))


def _tf_dims(fmt: str, n, c, spatial) -> list:
    """A per-dimension attribute or shape in data_format order."""
    return list(shape_from_canon((n, c, *spatial), _tf_perm(fmt)))


@st.composite
def tensorflow_calls(draw, op: str) -> Call:
    nsp, direction, names, dts, has_df, has_cudnn, dw = TF_OPS[op]
    fmt = draw(st.sampled_from(TF_FORMATS[nsp])) if has_df else TF_FORMATS[nsp][0]
    padding = draw(st.sampled_from(["SAME", "VALID", "EXPLICIT"] if nsp == 2 else ["SAME", "VALID"]))
    mb = draw(st.integers(0, 2))
    k = [draw(st.integers(1, 3)) for _ in range(nsp)]
    d = [draw(st.integers(1, 2)) for _ in range(nsp)]
    s = [draw(st.integers(1, 3)) for _ in range(nsp)]
    pads = [[draw(st.integers(0, 4)) for _ in range(2)] if padding == "EXPLICIT" else [0, 0] for _ in range(nsp)]
    two_sizes = op == "Conv2DBackpropInput" and draw(st.integers(0, 3)) == 0
    if dw:
        c, m = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        fshape = [*k, c, m]
    else:
        g = 1 if two_sizes else draw(st.integers(1, 2))
        a, b = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        c, fshape = g * a, [*k, a, g * b]
    if padding == "SAME":
        i = [draw(st.integers(1, 7)) for _ in range(nsp)]
    else:   # mostly a full window; sometimes an input short of the dilated kernel (empty output)
        i = [max(0 if draw(st.integers(0, 9)) == 0 else 1, draw(st.integers(1, 7)),
                 ek(kk, dd) - sum(p) - (ss - 1 if draw(st.integers(0, 9)) == 0 else 0))
             for kk, dd, ss, p in zip(k, d, s, pads)]
    attrs = dict(strides=_tf_dims(fmt, 1, 1, s), padding=padding)
    if any(v != 1 for v in d) or draw(st.booleans()):
        attrs["dilations"] = _tf_dims(fmt, 1, 1, d)
    if padding == "EXPLICIT":
        pairs = _tf_dims(fmt, (0, 0), (0, 0), [tuple(p) for p in pads])
        attrs["explicit_paddings"] = [v for p in pairs for v in p]
    if has_df and (fmt != TF_FORMATS[nsp][0] or draw(st.booleans())):
        attrs["data_format"] = fmt
    if has_cudnn and draw(st.integers(0, 3)) == 0:
        attrs["use_cudnn_on_gpu"] = draw(st.booleans())
    if draw(st.integers(0, 3)) == 0:
        attrs["name"] = draw(st.sampled_from(["conv", "", None]))
    # shapes in data_format order; out_backprop from TensorFlow's output-size rule
    oc = c * fshape[-1] if dw else fshape[-1]
    dst = []
    for ii, kk, dd, ss, (b, e) in zip(i, k, d, s, pads):
        if padding == "SAME":
            dst.append(ceil_div(ii, ss))
        else:
            dst.append(max(0, (ii + b + e - ek(kk, dd) + ss) // ss))
    shapes = {"input": _tf_dims(fmt, mb, c, i), "filter": list(fshape), "out_backprop": _tf_dims(fmt, mb, oc, dst)}
    call = Call("tensorflow", op, attrs, [], {}, names)
    tensors = [n for n in names if n not in TF_SIZES]
    for n in names:
        if n == "filter_sizes":
            call.kwargs[n] = draw(st.sampled_from([list, tuple, lambda v: np.asarray(v, np.int32)]))(list(fshape))
        elif n == "input_sizes":
            full = shapes["input"]
            value = [full[j] for j, ch in enumerate(fmt) if ch not in "NC"] if two_sizes else full
            call.kwargs[n] = draw(st.sampled_from([list, tuple, lambda v: np.asarray(v, np.int64)]))(value)
    dt = draw(st.sampled_from(dts))
    dtypes = {n: dt for n in tensors}
    rank = nsp + 2
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):
        what = draw(st.sampled_from(["attr", "attr", "padding", "explicit", "flags", "shape", "shape", "dtype",
                                     "dy", "kernel", "sizes", "nonarray", "bigstride"]))
        if what == "attr":
            mutate_attr(draw, call, rank, ["strides", "dilations"], strings={})
        elif what == "bigstride" and direction == "fwd":
            attrs["strides"] = _tf_dims(fmt, 1, 1, big_stride(draw, s))
            call.mutations.append("attr:strides")
        elif what == "padding":
            attrs["padding"] = draw(st.one_of(st.sampled_from(["same", "Valid", "EXPLICIT", "FULL"]), odd_scalars))
            call.mutations.append(("attr:" if isinstance(attrs["padding"], str) else "type:") + "padding")
            call.named.add("padding")
        elif what == "explicit" and nsp == 2:
            attrs["explicit_paddings"] = draw(attr_values(2 * rank, -1, 3))
            call.mutations.append("attr:explicit_paddings")
        elif what == "flags":
            key = draw(st.sampled_from(["name"] + (["data_format"] if has_df else [])
                                       + (["use_cudnn_on_gpu"] if has_cudnn else [])))
            attrs[key] = draw(st.one_of(odd_scalars, st.sampled_from(["NCHW", "nhwc", "NDHWC", "NCDHW"])))
            call.mutations.append(f"attr:{key}")
        elif what == "shape":
            call.mutations.append(mutate_shape(draw, shapes, [n for n in tensors if n in shapes]))
        elif what == "dtype":
            mutate_dtype(draw, call, dtypes, tensors, allowed_int=False)
        elif what == "dy" and "out_backprop" in tensors:
            sp = [j for j, ch in enumerate(fmt) if ch not in "NC"]
            shapes["out_backprop"][draw(st.sampled_from(sp))] += draw(st.sampled_from([-1, 1]))
            call.mutations.append("dy")
        elif what == "kernel":
            big = draw(st.integers(9, 14))
            ax = draw(st.integers(0, nsp - 1))
            if "filter" in tensors:
                shapes["filter"][ax] = big
            else:
                call.kwargs["filter_sizes"] = list(fshape[:ax]) + [big] + list(fshape[ax + 1:])
            call.mutations.append("kernel")
        elif what == "sizes" and any(n in TF_SIZES for n in names):
            key = next(n for n in names if n in TF_SIZES)
            call.kwargs[key] = draw(st.one_of(attr_values(rank, -1, 6), st.just(np.zeros((rank, 1), np.int64)),
                                              st.just(np.ones(rank)), st.just("1,2,3,4")))
            call.mutations.append(f"sizes:{key}")
        elif what == "nonarray":
            call.mutations.append("nonarray")
    call.names = tuple(tensors)
    build_inputs(draw, call, shapes, dtypes)
    if "nonarray" in call.mutations:
        call.mutations.remove("nonarray")
        mutate_non_array(draw, call)
    return call


def tensorflow_run(call: Call):
    from convgrad.tensorflow import raw_ops
    return getattr(raw_ops, call.op)(**dict(zip(call.names, call.args)), **call.kwargs, **call.attrs)


def tensorflow_model(call: Call) -> np.ndarray:
    """TensorFlow's op definitions: strides/dilations per dimension in data_format order (batch
    and depth 1), SAME = ceil(i/s) with the odd pad after, VALID/EXPLICIT = (i + pads - ek + s) / s
    truncated (0 = an empty output), groups = input depth / filter in_channels."""
    op, at = call.op, call.attrs
    nsp, direction, _, dts, has_df, has_cudnn, dw = TF_OPS[op]
    rank = nsp + 2
    if has_cudnn and not isinstance(at.get("use_cudnn_on_gpu", True), (bool, np.bool_)):
        raise Invalid("use_cudnn_on_gpu")
    if at.get("name") is not None and not isinstance(at["name"], str):
        raise Invalid("name")
    fmt = at.get("data_format", TF_FORMATS[nsp][0]) if has_df else TF_FORMATS[nsp][0]
    padding = at["padding"]
    if fmt not in TF_FORMATS[nsp] or padding not in (("SAME", "VALID", "EXPLICIT") if nsp == 2 else ("SAME", "VALID")):
        raise Invalid("data_format / padding")
    perm = _tf_perm(fmt)

    def per_dim(v):
        vals = m_ints(v)
        if len(vals) != rank:
            raise Invalid("attribute length")
        n, c, *sp = shape_to_canon(vals, perm)
        if n != 1 or c != 1:
            raise Invalid("batch / depth entries")
        return m_min(sp, 1, "spatial entries")

    s, d = per_dim(at["strides"]), per_dim(at.get("dilations", [1] * rank))
    ep = m_ints(at.get("explicit_paddings", [])) if nsp == 2 else ()
    if padding != "EXPLICIT" and ep:
        raise Invalid("explicit_paddings without EXPLICIT")
    if padding == "EXPLICIT":
        m_min(ep, 0, "explicit_paddings")
        if len(ep) != 2 * rank:
            raise Invalid("explicit_paddings length")
        pairs = shape_to_canon([(ep[2 * j], ep[2 * j + 1]) for j in range(rank)], perm)
        if pairs[0] != (0, 0) or pairs[1] != (0, 0):
            raise Invalid("batch / depth paddings")
        explicit = pairs[2:]
    else:
        explicit = [(0, 0)] * nsp
    tensors = {n: m_array(v) for n, v in zip(call.names, call.args)}
    dt = m_dtypes(list(tensors.values()), "iu")
    if dt not in [np.dtype(t) for t in dts]:
        raise Invalid(f"element type {dt}")
    if any(a.ndim != rank for a in tensors.values()):
        raise Invalid("rank")
    sizes = {n: m_min(m_ints(v), 0, n) for n, v in call.kwargs.items()}
    fshape = tuple(tensors["filter"].shape) if "filter" in tensors else sizes["filter_sizes"]
    if "input" in tensors:
        ishape = tuple(tensors["input"].shape)
    else:
        ishape = sizes["input_sizes"]
        if op == "Conv2DBackpropInput" and len(ishape) == 2:   # batch from out_backprop, depth from filter
            n = shape_to_canon(tensors["out_backprop"].shape, perm)[0]
            ishape = tuple(_tf_dims(fmt, n, fshape[2], ishape))
    if len(fshape) != rank or len(ishape) != rank:
        raise Invalid("sizes length")
    mb, c, *src = shape_to_canon(ishape, perm)
    k, f_in, f_out = fshape[:nsp], fshape[nsp], fshape[nsp + 1]
    if min(k) < 1:
        raise Invalid("kernel")
    if dw:
        if f_in != c or c < 1:
            raise Invalid("depthwise in_channels")
        g, oc = c, c * f_out
    else:
        if f_in < 1 or c < 1 or c % f_in or f_out % (c // f_in):
            raise Invalid("groups")
        g, oc = c // f_in, f_out
    dst, pb, pe = [], [], []
    for ax in range(nsp):
        if padding == "SAME":
            o = ceil_div(src[ax], s[ax])
            b, e = same_pads(src[ax], k[ax], s[ax], d[ax], upper=True)
        else:
            b, e = explicit[ax]
            num = src[ax] + b + e - ek(k[ax], d[ax]) + s[ax]
            o = num // s[ax] if num >= 0 else -(-num // s[ax])   # C++ division: toward zero
            if o < 0:
                raise Invalid("negative output size")
        dst.append(o)
        pb.append(b)
        pe.append(e)
    if "out_backprop" in tensors and tuple(tensors["out_backprop"].shape) != tuple(_tf_dims(fmt, mb, oc, dst)):
        raise Invalid("out_backprop shape")
    acc = acc_type(dt)
    w_shape = tuple(k) + ((1, c * f_out) if dw else (f_in, f_out))   # HWIO; depthwise as groups = C
    if 0 in dst:
        shape = {"fwd": _tf_dims(fmt, mb, oc, dst), "bwd_weights": fshape, "bwd_data": ishape}[direction]
        return np.zeros(shape, acc)
    spec = m_spec(mb, c, oc, g, src, k, s, d, pb, pe)
    if direction == "fwd":
        w = to_canon(tensors["filter"].reshape(w_shape), perm_xio(nsp))
        return m_run("fwd", spec, to_canon(tensors["input"], perm), w).transpose(perm)
    dy = to_canon(tensors["out_backprop"], perm)
    if direction == "bwd_weights":
        dwt = m_run("bwd_weights", spec, to_canon(tensors["input"], perm), dy)
        return np.ascontiguousarray(dwt.transpose(perm_xio(nsp))).reshape(fshape)
    w = to_canon(tensors["filter"].reshape(w_shape), perm_xio(nsp))
    return m_run("bwd_data", spec, dy, w).transpose(perm)


def check_tensorflow(call: Call) -> str:
    return check_call(call, tensorflow_run, tensorflow_model)


@pytest.mark.parametrize("op", sorted(TF_OPS))
def test_fuzz_tensorflow(op):
    fuzz("tensorflow", tensorflow_calls(op), check_tensorflow, 30)


@pytest.mark.slow
@pytest.mark.parametrize("op", sorted(TF_OPS))
def test_fuzz_tensorflow_slow(op):
    """800 examples per op: 10,400 for the front-end."""
    fuzz("tensorflow", tensorflow_calls(op), check_tensorflow, 800)
