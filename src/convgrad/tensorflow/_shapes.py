"""TensorFlow attribute checks and shape inference (front-end layer: pure functions on shapes).

Everything TensorFlow-specific about a convolution's *attributes* is resolved here into the
canonical vocabulary of ``convgrad.spec``; no arrays are touched:

* ``strides`` / ``dilations`` have one entry per dimension of the data in ``data_format``
  order (4 for the 2-D ops, 5 for the 3-D ops); the batch and channel entries must be 1.
* ``padding`` is ``SAME`` / ``VALID`` / ``EXPLICIT`` (the 3-D ops have no ``EXPLICIT``);
  ``explicit_paddings`` holds (before, after) per dimension in ``data_format`` order, is
  empty unless ``padding == "EXPLICIT"``, and pads only the spatial dimensions.
* TensorFlow's output size per spatial axis (``GetWindowedOutputSize``), with
  ``ek = d * (k - 1) + 1``::

      SAME:             o = ceil(i / s), pads from convgrad.padding.same_pads (odd unit after)
      VALID / EXPLICIT: o = (i + pb + pe - ek + s) / s   in C++ integer division (toward 0)

  The VALID/EXPLICIT size is floor((i + pb + pe - ek) / s) + 1, the canonical size, whenever
  the padded input holds one window; otherwise the C++ division truncates toward zero and
  TensorFlow's kernels accept an empty output (0) as long as the quotient is not negative.
  ``Problem.empty`` marks such problems: they have no window at all.
* Groups are inferred as TensorFlow does: ``in_depth / filter_in_depth`` (``filter`` is
  HWIO / DHWIO); the depthwise ops use ``groups = in_depth`` and ``O = in_depth * multiplier``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..errors import ConvTypeError, ConvValueError
from ..padding import same_pads
from ..spec import MAX_DIM, effective_kernel, int_list

PADDINGS_2D = ("SAME", "VALID", "EXPLICIT")
PADDINGS_3D = ("SAME", "VALID")
FORMATS = {2: ("NHWC", "NCHW"), 3: ("NDHWC", "NCDHW")}


@dataclass(frozen=True)
class Window:
    """The resolved attributes of one call: spatial entries only, canonical order."""

    data_format: str                 # as the user spelled it: NHWC, NCHW, NDHWC, NCDHW
    layout: str                      # convgrad.layout string: "NXC" or "NCX"
    padding: str                     # SAME, VALID, EXPLICIT
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    explicit: tuple[tuple[int, int], ...]   # (before, after) per spatial axis; zeros unless EXPLICIT

    @property
    def nsp(self) -> int:
        return len(self.strides)

    @property
    def axis_names(self) -> str:
        """Spatial dimension letters in canonical order: "HW" or "DHW"."""
        return self.data_format.replace("N", "").replace("C", "")


@dataclass(frozen=True)
class Problem:
    """A TensorFlow convolution in canonical terms (all sizes resolved, shapes only)."""

    window: Window
    mb: int
    ic: int
    oc: int
    groups: int
    src: tuple[int, ...]
    kernel: tuple[int, ...]
    dst: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]

    @property
    def empty(self) -> bool:
        """True when some output axis has no window (TensorFlow returns an empty output)."""
        return 0 in self.dst

    def canonical_kwargs(self) -> dict:
        w = self.window
        return dict(strides=w.strides, dilations=w.dilations, pads_begin=self.pads_begin,
                    pads_end=self.pads_end, groups=self.groups)


def _string(op: str, name: str, value: object, allowed: tuple[str, ...]) -> str:
    """A string attribute; TensorFlow's spellings are case-sensitive."""
    if not isinstance(value, str):
        raise ConvTypeError(f"{op}: {name} must be a string, one of {list(allowed)}, but got {value!r}")
    if value not in allowed:
        raise ConvValueError(f"{op}: {name} must be one of {list(allowed)} (case-sensitive), but got {value!r}")
    return value


def _dims(op: str, name: str, value: object, data_format: str, *, batch_depth_one: bool) -> tuple[int, ...]:
    """A per-dimension attribute in data_format order -> its spatial entries, canonical order."""
    rank = len(data_format)
    vals = int_list(op, name, value)
    if len(vals) != rank:
        raise ConvValueError(f"{op}: {name} must have {rank} entries (one per dimension of {data_format}), "
                             f"but got {len(vals)}: {list(vals)}")
    spatial = [vals[j] for j, ch in enumerate(data_format) if ch not in "NC"]
    if batch_depth_one and (vals[data_format.index("N")] != 1 or vals[data_format.index("C")] != 1):
        raise ConvValueError(f"{op}: {name} in the batch (N) and depth (C) dimensions must be 1, but got "
                             f"{list(vals)} for {data_format}")
    bad = [v for v in spatial if v < 1 or v > MAX_DIM]
    if bad:
        raise ConvValueError(f"{op}: {name} in the spatial dimensions must be positive integers (at most 2**40), "
                             f"but got {list(vals)} for {data_format}")
    return tuple(spatial)


def window(op: str, nsp: int, *, strides: object, padding: object, explicit_paddings: object,
           data_format: object, dilations: object) -> Window:
    """Validate the attributes shared by every TensorFlow convolution op."""
    fmt = _string(op, "data_format", data_format, FORMATS[nsp])
    pad = _string(op, "padding", padding, PADDINGS_2D if nsp == 2 else PADDINGS_3D)
    s = _dims(op, "strides", strides, fmt, batch_depth_one=True)
    d = _dims(op, "dilations", dilations, fmt, batch_depth_one=True)
    explicit = ((0, 0),) * nsp
    if nsp == 2:  # the 3-D ops have no explicit_paddings attribute
        ep = int_list(op, "explicit_paddings", explicit_paddings)
        if pad != "EXPLICIT":
            if ep:
                raise ConvValueError(f"{op}: explicit_paddings must be empty unless padding is 'EXPLICIT', but got "
                                     f"{list(ep)} with padding {pad!r}")
        else:
            rank = len(fmt)
            if len(ep) != 2 * rank:
                raise ConvValueError(f"{op}: explicit_paddings must have {2 * rank} entries ((before, after) for each "
                                     f"dimension of {fmt}), but got {len(ep)}: {list(ep)}")
            if any(v < 0 or v > MAX_DIM for v in ep):
                raise ConvValueError(f"{op}: explicit_paddings must be non-negative integers (at most 2**40), but "
                                     f"got {list(ep)}")
            pairs = [(ep[2 * j], ep[2 * j + 1]) for j in range(rank)]
            if any(pairs[fmt.index(ch)] != (0, 0) for ch in "NC"):
                raise ConvValueError(f"{op}: explicit_paddings in the batch (N) and depth (C) dimensions must be 0, "
                                     f"but got {list(ep)} for {fmt}")
            explicit = tuple(p for p, ch in zip(pairs, fmt) if ch not in "NC")
    layout = "NXC" if fmt.endswith("C") else "NCX"
    return Window(data_format=fmt, layout=layout, padding=pad, strides=s, dilations=d, explicit=explicit)


def data_shape(w: Window, shape: Sequence[int]) -> tuple[int, int, tuple[int, ...]]:
    """(batch, depth, spatial sizes) of a data shape in data_format order."""
    fmt = w.data_format
    spatial = tuple(int(shape[j]) for j, ch in enumerate(fmt) if ch not in "NC")
    return int(shape[fmt.index("N")]), int(shape[fmt.index("C")]), spatial


def shape_in_format(w: Window, n: int, c: int, spatial: Sequence[int]) -> tuple[int, ...]:
    """The inverse of data_shape: a data shape in data_format order."""
    it = iter(spatial)
    return tuple(n if ch == "N" else c if ch == "C" else int(next(it)) for ch in w.data_format)


def groups_of(op: str, in_depth: int, filter_shape: Sequence[int], *, depthwise: bool) -> tuple[int, int]:
    """(groups, output depth) from the input depth and an HWIO (DHWIO) filter shape."""
    nsp = len(filter_shape) - 2
    f_in, f_out = int(filter_shape[nsp]), int(filter_shape[nsp + 1])
    if depthwise:
        # [filter_height, filter_width, in_channels, channel_multiplier]: output channel c * M + m
        if f_in != in_depth:
            raise ConvValueError(f"{op}: filter in_channels (dimension 2 of filter {tuple(filter_shape)}) must equal "
                                 f"the input depth ({in_depth}), but got {f_in}")
        return in_depth, in_depth * f_out
    if f_in < 1:
        raise ConvValueError(f"{op}: filter in_channels (dimension {nsp} of filter {tuple(filter_shape)}) must be "
                             f"positive, but got {f_in}")
    if in_depth < 1 or in_depth % f_in:
        raise ConvValueError(f"{op}: input depth must be a positive multiple of the filter's in_channels "
                             f"({f_in}; groups = input depth / in_channels), but got input depth {in_depth}")
    groups = in_depth // f_in
    if f_out % groups:
        raise ConvValueError(f"{op}: filter out_channels must be divisible by the number of groups ({in_depth} / "
                             f"{f_in} = {groups}), but got {f_out}")
    return groups, f_out


def check_kernel(op: str, name: str, filter_shape: Sequence[int]) -> tuple[int, ...]:
    nsp = len(filter_shape) - 2
    kernel = tuple(int(v) for v in filter_shape[:nsp])
    if any(k < 1 for k in kernel):
        raise ConvValueError(f"{op}: {name} must have positive spatial sizes (the first {nsp} dimensions), but got "
                             f"{tuple(filter_shape)}")
    return kernel


def output_size(op: str, w: Window, ax: int, i: int, k: int) -> tuple[int, int, int]:
    """(o, pad_before, pad_after) of one spatial axis, by TensorFlow's rule (see module doc)."""
    s, d = w.strides[ax], w.dilations[ax]
    ek = effective_kernel(k, d)
    if w.padding == "SAME":
        pb, pe = same_pads(i, k, s, d, upper=True)
        return -(-i // s), pb, pe
    pb, pe = w.explicit[ax]
    num = i + pb + pe - ek + s
    o = num // s if num >= 0 else -(-num // s)   # C++ division truncates toward zero
    if o < 0:
        raise ConvValueError(
            f"{op}: the output size of spatial dimension {w.axis_names[ax]} would be negative: with {w.padding} "
            f"padding it is (input {i} + pads {pb} + {pe} - dilated filter {d}*({k}-1)+1 + stride {s}) / {s} = {o}")
    return o, pb, pe


def problem(op: str, w: Window, *, mb: int, in_depth: int, src: Sequence[int], filter_shape: Sequence[int],
            depthwise: bool, filter_name: str = "filter") -> Problem:
    """Resolve groups, pads and the output size of a problem given by input and filter shapes."""
    kernel = check_kernel(op, filter_name, filter_shape)
    groups, oc = groups_of(op, in_depth, filter_shape, depthwise=depthwise)
    sizes = [output_size(op, w, ax, int(i), k) for ax, (i, k) in enumerate(zip(src, kernel))]
    return Problem(window=w, mb=int(mb), ic=int(in_depth), oc=oc, groups=groups, src=tuple(int(i) for i in src),
                   kernel=kernel, dst=tuple(t[0] for t in sizes), pads_begin=tuple(t[1] for t in sizes),
                   pads_end=tuple(t[2] for t in sizes))


def check_out_backprop(op: str, p: Problem, shape: Sequence[int]) -> None:
    """out_backprop must have exactly the forward output's shape (data_format order)."""
    n, c, spatial = data_shape(p.window, shape)
    if n != p.mb:
        raise ConvValueError(f"{op}: out_backprop must have the input's batch size ({p.mb}), but got {n} "
                             f"(out_backprop shape {tuple(shape)})")
    if c != p.oc:
        raise ConvValueError(f"{op}: out_backprop depth must equal the filter's output depth ({p.oc}), but got {c} "
                             f"(out_backprop shape {tuple(shape)})")
    if spatial != p.dst:
        w = p.window
        terms = "; ".join(
            f"{w.axis_names[ax]}: input {p.src[ax]}, filter {p.kernel[ax]}, stride {w.strides[ax]}, dilation "
            f"{w.dilations[ax]}, pads {p.pads_begin[ax]}+{p.pads_end[ax]} -> {p.dst[ax]}" for ax in range(w.nsp))
        raise ConvValueError(f"{op}: out_backprop spatial sizes must be the forward output's "
                             f"{list(p.dst)} ({w.padding} padding; {terms}), but got {list(spatial)} "
                             f"(out_backprop shape {tuple(shape)})")


def sizes_vector(op: str, name: str, value: object, allowed_lengths: tuple[int, ...]) -> tuple[int, ...]:
    """A shape given as a 1-D integer vector (filter_sizes, input_sizes)."""
    vals = int_list(op, name, value)
    if len(vals) not in allowed_lengths:
        want = " or ".join(str(n) for n in allowed_lengths)
        raise ConvValueError(f"{op}: {name} must have {want} entries, but got {len(vals)}: {list(vals)}")
    if any(v < 0 or v > MAX_DIM for v in vals):
        raise ConvValueError(f"{op}: {name} must be non-negative sizes (at most 2**40), but got {list(vals)}")
    return vals
