"""Calibration: scales and zero points from a profile's ranges, and weights in int8.

Activations are uint8, asymmetric, per tensor: a clip range ``[lo, hi]`` holding 0 maps
onto 0..255 with ``scale = (hi - lo) / 255`` and ``zero_point = rint(-lo / scale)``, so
0 is exact (padding, ReLU). The clip range is chosen by a method:

- ``minmax``: the values' minimum and maximum;
- ``percentile``: the range holding ``percentile`` % of the values, ``(100 - p) / 2`` %
  cut from each end of the histogram;
- ``entropy``: the range ``[t * lo, t * hi]`` of the histogram's range whose uint8
  quantization loses the least information: the Kullback-Leibler divergence between
  the histogram (values beyond the range clipped into its end bins) and that histogram
  quantized to 256 levels (each level's count spread over the level's non-empty bins),
  as TensorRT's entropy calibration measures it.

Weights are int8, symmetric (zero point 0) with ``scale = max|w| / 127``, per output
channel (``axis``) or per tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polyfuse.errors import ArgumentError
from polyfuse.ir.profile import TensorRange

METHODS = ("minmax", "percentile", "entropy")
LEVELS = 256          # uint8
WEIGHT_MAX = 127      # int8, symmetric (-128 unused)
ENTROPY_STEPS = 128   # candidate clip ranges the entropy method compares


@dataclass(frozen=True)
class Quantization:
    """``real = (q - zero_point) * scale``; arrays of one value per tensor or per channel."""

    scale: np.ndarray        # float32
    zero_point: np.ndarray   # uint8 or int8


@dataclass(frozen=True)
class QuantizeOptions:
    """How a model is quantized: the activations' calibration ``method`` (and its
    ``percentile``), weights per output channel or per tensor, and the nodes (by name)
    kept float."""

    method: str = "minmax"
    percentile: float = 99.99
    per_channel: bool = True
    keep_float: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        check_method(self.method, self.percentile)
        if isinstance(self.keep_float, str) or not all(isinstance(n, str) for n in self.keep_float):
            raise ArgumentError("keep_float is a set of node names")
        object.__setattr__(self, "keep_float", frozenset(self.keep_float))


def check_method(method: str, percentile: float) -> None:
    if method not in METHODS:
        raise ArgumentError(f"calibration method {method!r} is unknown; choose one of "
                            f"{', '.join(METHODS)}")
    if isinstance(percentile, bool) or not isinstance(percentile, (int, float)) \
            or not 50.0 < percentile <= 100.0:
        raise ArgumentError(f"percentile must be a number in (50, 100], got {percentile!r}")


def activation_quantization(r: TensorRange, method: str = "minmax",
                            percentile: float = 99.99) -> Quantization:
    """uint8 scale and zero point of a tensor of range ``r``."""
    check_method(method, percentile)
    if method == "percentile":
        lo, hi = _percentile_range(r, percentile)
    elif method == "entropy":
        lo, hi = _entropy_range(r)
    else:
        lo, hi = r.min, r.max
    return uint8_quantization(lo, hi)


def uint8_quantization(lo: float, hi: float) -> Quantization:
    """The uint8 quantization of the clip range ``[lo, hi]`` widened to hold 0."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = np.float32((hi - lo) / (LEVELS - 1)) if hi > lo else np.float32(1.0)
    zero = np.clip(np.rint(-lo / np.float64(scale)), 0, LEVELS - 1)
    return Quantization(np.array(scale, np.float32), np.array(zero, np.uint8))


def _percentile_range(r: TensorRange, percentile: float) -> tuple[float, float]:
    """The values at the ``(100 - p) / 2`` and ``(100 + p) / 2`` percentiles (interpolated in
    the histogram), within the extremes."""
    cumulative = np.concatenate([[0.0], np.cumsum(r.counts)])
    total = cumulative[-1]
    cut = total * (100.0 - percentile) / 200.0
    edges = r.edges
    lo = float(np.interp(cut, cumulative, edges))
    hi = float(np.interp(total - cut, cumulative, edges))
    return max(lo, r.min), min(hi, r.max)


def _entropy_range(r: TensorRange) -> tuple[float, float]:
    """The clip range ``[t * lo, t * hi]`` of least divergence (see the module's text)."""
    bins = len(r.counts)
    if bins < LEVELS or r.counts.sum() == 0:
        return r.min, r.max
    edges = r.edges
    zero_bin = int(np.searchsorted(edges, 0.0, side="right")) - 1
    best, best_range = np.inf, (r.min, r.max)
    for t in np.linspace(LEVELS / bins, 1.0, ENTROPY_STEPS):
        first = max(int(round(zero_bin - t * zero_bin)), 0)
        last = min(int(round(zero_bin + t * (bins - zero_bin))), bins)
        if last - first < LEVELS:
            continue
        divergence = _divergence(r.counts, first, last)
        if divergence < best:
            best, best_range = divergence, (float(edges[first]), float(edges[last]))
    lo, hi = best_range
    return max(lo, r.min), min(hi, r.max)


def _divergence(counts: np.ndarray, first: int, last: int) -> float:
    """KL(P || Q): P the counts of bins ``first:last`` with those outside added to the end
    bins, Q the same bins quantized to LEVELS levels."""
    p = counts[first:last].copy()
    p[0] += counts[:first].sum()
    p[-1] += counts[last:].sum()
    q = np.zeros_like(p)
    for level in np.array_split(np.arange(len(p)), LEVELS):
        inside = counts[first:last][level]
        used = inside > 0
        if used.any():
            q[level[used]] = inside.sum() / used.sum()
    p_sum, q_sum = p.sum(), q.sum()
    if p_sum == 0 or q_sum == 0:
        return np.inf
    mask = p > 0
    if (q[mask] == 0).any():   # clipped mass in an end bin the levels left empty
        q = np.where(mask & (q == 0), 1e-4 * q_sum / len(q), q)
        q_sum = q.sum()
    p, q = p[mask] / p_sum, q[mask] / q_sum
    return float(np.sum(p * np.log(p / q)))


def weight_quantization(w: np.ndarray, axis: int | None) -> tuple[np.ndarray, Quantization]:
    """``w`` in int8 and its symmetric quantization: per slice along ``axis`` (a scale per
    output channel), or per tensor when ``axis`` is None."""
    w64 = np.asarray(w, np.float64)
    if axis is None:
        peak = np.array(np.abs(w64).max(initial=0.0))
        shape: tuple[int, ...] = ()
    else:
        others = tuple(d for d in range(w.ndim) if d != axis)
        peak = np.abs(w64).max(axis=others, initial=0.0)
        shape = tuple(-1 if d == axis else 1 for d in range(w.ndim))
    scale = np.where(peak > 0, peak / WEIGHT_MAX, 1.0).astype(np.float32)
    s = scale.reshape(shape) if shape else scale
    q = np.clip(np.rint(w64 / s.astype(np.float64)), -WEIGHT_MAX, WEIGHT_MAX).astype(np.int8)
    return q, Quantization(scale, np.zeros(scale.shape, np.int8))


def bias_quantization(b: np.ndarray, input_scale: np.ndarray, weight_scale: np.ndarray
                      ) -> tuple[np.ndarray, Quantization]:
    """A bias in int32 at the scale of the product it is added to (input scale times each
    channel's weight scale, in float32), zero point 0."""
    scale = (np.float32(input_scale) * weight_scale.astype(np.float32)).astype(np.float32)
    safe = np.where(scale > 0, scale, 1.0).astype(np.float64)
    info = np.iinfo(np.int32)
    q = np.clip(np.rint(np.asarray(b, np.float64) / safe), info.min, info.max).astype(np.int32)
    return q, Quantization(scale, np.zeros(scale.shape, np.int32))
