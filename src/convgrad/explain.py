"""Shape inference of one op, term by term, for a human reading a mismatch (front-end layer, pure).

    print(convgrad.explain.explain("tensorflow", "Conv2D", {"strides": [1, 2, 2, 1], "padding": "SAME"},
                                   {"input": (1, 7, 7, 3), "filter": (3, 3, 3, 4)}))

For every spatial axis: the effective (dilated) kernel, how the framework's padding rule
resolved the pads (and where the odd unit went), the forward output size with its floor
remainder (input rows no window reads), and for transposed ops the size of the full result.
The problem is read by :func:`convgrad.translate.read`, the same reader ``translate`` uses.
"""

from __future__ import annotations

from typing import Mapping

from .spec import effective_kernel
from .translate import _TITLE, Reading, axis_names, read

__all__ = ["explain", "explain_reading"]

_WHAT = {"fwd": "forward convolution", "bwd_data": "data gradient (transposed convolution)",
         "bwd_weights": "weights gradient"}


def explain_reading(r: Reading) -> str:
    spec, call = r.spec, r.call
    lines = [f"{_TITLE[call.framework]} {call.op}: {_WHAT[r.direction]}, {spec.nsp} spatial "
             f"ax{'is' if spec.nsp == 1 else 'es'}"]
    for t in call.inputs:
        lines.append(f"  input  {t.name:<12} {t.layout:<28} {t.shape}")
    lines.append(f"  output {call.output.name:<12} {call.output.layout:<28} {call.output.shape}")
    lines.append(f"canonical problem: {spec}")
    lines.append(f"  src (N, C, *X) {spec.src_shape}, weights (O, C/groups, *k) {spec.weights_shape}, "
                 f"dst (N, O, *Y) {spec.dst_shape}, groups {spec.groups}")
    for ax, name in enumerate(axis_names(spec.nsp)):
        i, k, s, d = spec.src[ax], spec.kernel[ax], spec.strides[ax], spec.dilations[ax]
        pb, pe = spec.pads_begin[ax], spec.pads_end[ax]
        ek = effective_kernel(k, d)
        o = spec.dst[ax]
        rem = (i + pb + pe - ek) % s
        lines.append(f"axis {name}: input {i}, kernel {k}, stride {s}, dilation {d}")
        lines.append(f"  effective kernel = {d}*({k}-1) + 1 = {ek}")
        lines.append(f"  pads: {r.pad_notes[ax]}")
        lines.append(f"  resolved pads: begin {pb}, end {pe}")
        lines.append(f"  output = floor(({i} + {pb} + {pe} - {ek}) / {s}) + 1 = {o}")
        if rem:
            unread = max(rem - pe, 0)
            tail = (f"; {unread} of them input rows, which get zero gradient" if unread
                    else "; all of them padding")
            lines.append(f"  remainder ({i} + {pb} + {pe} - {ek}) mod {s} = {rem}: the last {rem} padded rows "
                         f"are never read{tail}")
        else:
            lines.append("  remainder 0: the last window ends on the last padded row")
        if r.direction == "bwd_data":
            full = s * (o - 1) + ek
            past = pb + i - full
            tail = f" (the last {past} past its end, zero)" if past > 0 else ""
            lines.append(f"  transposed view: the full result has {s}*({o}-1) + {ek} = {full} rows; the output is "
                         f"its rows {pb}..{pb + i - 1}{tail}")
    for n in r.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def explain(framework: str, op: str, attrs: Mapping | None = None, shapes: Mapping | None = None) -> str:
    """The shape inference of ``op`` of ``framework``, term by term (raises ConvError on bad input)."""
    return explain_reading(read(framework, op, attrs, shapes))
