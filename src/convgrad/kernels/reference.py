"""Direct reference kernels: the test oracle (kernel layer: arrays and a ConvSpec only).

Plain and obviously correct: the input is zero-padded, and for every kernel tap ``k`` the
strided window ``src_pad[..., k*d : k*d + (dst-1)*s + 1 : s]`` meets the weights slice
``w[:, :, k]`` in one ``einsum`` over channels. The three directions are the same loop:

    fwd          dst[n, g, o, y]       += sum_c  win_k[n, g, c, y] * w[g, o, c, k]
    bwd_weights  dw[g, o, c, k]         = sum_ny win_k[n, g, c, y] * ddst[n, g, o, y]
    bwd_data     dsrc_pad[win_k][n,g,c] += sum_o ddst[n, g, o, y] * w[g, o, c, k]

Inputs must already be in the accumulation type (float64, or int64 for exact integers).
"""

from __future__ import annotations

import itertools

import numpy as np

from ..spec import ConvSpec


def _window(spec: ConvSpec, tap: tuple[int, ...]) -> tuple[slice, ...]:
    dst = spec.dst
    return (slice(None), slice(None)) + tuple(
        slice(k * d, k * d + (o - 1) * s + 1, s)
        for k, d, o, s in zip(tap, spec.dilations, dst, spec.strides))


def _padded_shape(spec: ConvSpec) -> tuple[int, ...]:
    return (spec.mb, spec.ic) + tuple(i + b + e for i, b, e in zip(spec.src, spec.pads_begin, spec.pads_end))


def _interior(spec: ConvSpec) -> tuple[slice, ...]:
    return (slice(None), slice(None)) + tuple(slice(b, b + i) for b, i in zip(spec.pads_begin, spec.src))


def _axes(spec: ConvSpec) -> str:
    """einsum letters for the spatial axes (any rank)."""
    return "".join(chr(ord("A") + j) for j in range(spec.nsp))


def _taps(spec: ConvSpec):
    return itertools.product(*(range(k) for k in spec.kernel))


def conv_forward(spec: ConvSpec, src: np.ndarray, weights: np.ndarray) -> np.ndarray:
    g, n = spec.groups, spec.mb
    src_pad = np.zeros(_padded_shape(spec), dtype=src.dtype)
    src_pad[_interior(spec)] = src
    w = weights.reshape((g, spec.ocg, spec.icg) + spec.kernel)
    dst = np.zeros((n, g, spec.ocg) + spec.dst, dtype=src.dtype)
    x = _axes(spec)
    for tap in _taps(spec):
        win = src_pad[_window(spec, tap)].reshape((n, g, spec.icg) + spec.dst)
        dst += np.einsum(f"ngc{x},goc->ngo{x}", win, w[(slice(None),) * 3 + tap])
    return dst.reshape(spec.dst_shape)


def conv_backward_weights(spec: ConvSpec, src: np.ndarray, diff_dst: np.ndarray) -> np.ndarray:
    g, n = spec.groups, spec.mb
    src_pad = np.zeros(_padded_shape(spec), dtype=src.dtype)
    src_pad[_interior(spec)] = src
    ddst = diff_dst.reshape((n, g, spec.ocg) + spec.dst)
    dw = np.zeros((g, spec.ocg, spec.icg) + spec.kernel, dtype=src.dtype)
    x = _axes(spec)
    for tap in _taps(spec):
        win = src_pad[_window(spec, tap)].reshape((n, g, spec.icg) + spec.dst)
        dw[(slice(None),) * 3 + tap] = np.einsum(f"ngc{x},ngo{x}->goc", win, ddst)
    return dw.reshape(spec.weights_shape)


def conv_backward_data(spec: ConvSpec, diff_dst: np.ndarray, weights: np.ndarray) -> np.ndarray:
    g, n = spec.groups, spec.mb
    ddst = diff_dst.reshape((n, g, spec.ocg) + spec.dst)
    w = weights.reshape((g, spec.ocg, spec.icg) + spec.kernel)
    dsrc_pad = np.zeros(_padded_shape(spec), dtype=diff_dst.dtype)
    x = _axes(spec)
    for tap in _taps(spec):
        contrib = np.einsum(f"ngo{x},goc->ngc{x}", ddst, w[(slice(None),) * 3 + tap])
        dsrc_pad[_window(spec, tap)] += contrib.reshape((n, spec.ic) + spec.dst)
    return np.ascontiguousarray(dsrc_pad[_interior(spec)])
