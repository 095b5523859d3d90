"""Shared test helpers: error norms, random problems, tolerance rules."""

from __future__ import annotations

import numpy as np


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """||got - want|| / ||want|| in float64 (0 for two empty or two all-zero arrays)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    num = float(np.linalg.norm((got - want).ravel()))
    den = float(np.linalg.norm(want.ravel()))
    return num / den if den else num


def feasible(src, kernel, dilations, pads_begin, pads_end) -> bool:
    return all(i + b + e >= d * (k - 1) + 1
               for i, k, d, b, e in zip(src, kernel, dilations, pads_begin, pads_end))


class Tally:
    """Cases compared and worst relative error per key, printed once at the end of a test
    module (shown in passing runs too: the issue notes quote these figures)."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.stats: dict = {}

    def record(self, key, err: float) -> None:
        n, worst = self.stats.get(key, (0, 0.0))
        self.stats[key] = (n + 1, max(worst, err))

    def report(self, request) -> None:
        if not self.stats:
            return
        lines = ["", f"{self.title}: cases, worst rel err"]
        for key, (n, worst) in sorted(self.stats.items()):
            name = "  ".join(map(str, key)) if isinstance(key, tuple) else str(key)
            lines.append(f"  {name:52s} {n:5d}  {worst:.2e}")
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        if capture is None:
            print("\n".join(lines))
            return
        with capture.global_and_fixture_disabled():
            print("\n".join(lines))


def spec_kwargs(spec) -> dict:
    """The public functions' attribute keywords of a ConvSpec."""
    return dict(strides=spec.strides, dilations=spec.dilations, pads_begin=spec.pads_begin,
                pads_end=spec.pads_end, groups=spec.groups)


def spec_inputs(spec, rng, dtype=np.float64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random (src, weights, diff_dst) of a ConvSpec's shapes."""
    return (rng.standard_normal(spec.src_shape).astype(dtype), rng.standard_normal(spec.weights_shape).astype(dtype),
            rng.standard_normal(spec.dst_shape).astype(dtype))
