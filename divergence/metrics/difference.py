"""Elementwise difference metrics between two tensors of the same shape.

With d = a - b over the n elements, all sums in float64:

    max_abs_diff  = max_i |d_i|                 the paper's upper bound (Golden et al. 2024)
    mean_abs_diff = (1/n) sum_i |d_i|
    rms_diff      = sqrt((1/n) sum_i d_i^2)
    rel_l2        = ||d||_2 / ||a||_2           (0 when a == b, inf when only a is zero)
    cosine        = <a, b> / (||a||_2 ||b||_2)  (1 when both are zero, 0 when one is)

One pass over the data yields every sum, chunk by chunk, so the float64 temporaries never
exceed a few tens of MiB whatever the tensor size; the pass runs on the tensors' device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from divergence.metrics.tensors import as_tensor, check_same_shape, float64_chunks


@dataclass(frozen=True)
class DifferenceSums:
    """Sufficient statistics of d = a - b; the metrics and their aggregates derive from them."""

    n: int
    max_abs: float
    sum_abs: float
    sum_sq: float   # ||a - b||^2
    sum_aa: float   # ||a||^2
    sum_bb: float   # ||b||^2
    sum_ab: float   # <a, b>

    @property
    def max_abs_diff(self) -> float:
        return self.max_abs

    @property
    def mean_abs_diff(self) -> float:
        return self.sum_abs / self.n

    @property
    def rms_diff(self) -> float:
        return math.sqrt(self.sum_sq / self.n)

    @property
    def rel_l2(self) -> float:
        return relative_l2(self.sum_sq, self.sum_aa)

    @property
    def cosine(self) -> float:
        return cosine_from_sums(self.sum_ab, self.sum_aa, self.sum_bb)


def relative_l2(sum_sq_diff: float, sum_sq_a: float) -> float:
    if sum_sq_a > 0:
        return math.sqrt(sum_sq_diff / sum_sq_a)
    return 0.0 if sum_sq_diff == 0 else math.inf


def cosine_from_sums(sum_ab: float, sum_aa: float, sum_bb: float) -> float:
    if sum_aa == 0 and sum_bb == 0:
        return 1.0
    if sum_aa == 0 or sum_bb == 0:
        return 0.0
    return max(-1.0, min(1.0, sum_ab / math.sqrt(sum_aa * sum_bb)))


def difference_sums(a, b) -> DifferenceSums:
    """One float64 pass over a and b (same shape; b is moved to a's device)."""
    a, b = as_tensor(a), as_tensor(b)
    check_same_shape(a, b, "difference metrics")
    a, b = a.reshape(-1), b.reshape(-1).to(a.device)
    if a.numel() == 0:
        raise ValueError("difference metrics: the tensors are empty")
    max_abs, parts = 0.0, []
    for x, y in float64_chunks(a, b):
        d = x - y
        max_abs = max(max_abs, float(abs(d).max()))
        parts.append([float(v) for v in (abs(d).sum(), (d * d).sum(), (x * x).sum(), (y * y).sum(), (x * y).sum())])
    totals = [math.fsum(p[i] for p in parts) for i in range(5)]
    return DifferenceSums(a.numel(), max_abs, *totals)


def max_abs_diff(a, b) -> float:
    """max |a - b| over all elements (float64). Example: ([1, 2], [1.5, 0]) -> 2.0"""
    return difference_sums(a, b).max_abs_diff


def mean_abs_diff(a, b) -> float:
    """mean |a - b| (float64). Example: ([1, 2], [1.5, 0]) -> 1.25"""
    return difference_sums(a, b).mean_abs_diff


def rms_diff(a, b) -> float:
    """sqrt(mean (a - b)^2) (float64). Example: ([0, 0], [3, 4]) -> 3.5355..."""
    return difference_sums(a, b).rms_diff


def rel_l2(a, b) -> float:
    """||a - b|| / ||a|| (float64). Example: ([3, 4], [3, 0]) -> 0.8"""
    return difference_sums(a, b).rel_l2


def cosine(a, b) -> float:
    """<a, b> / (||a|| ||b||) (float64). Example: ([1, 0], [1, 1]) -> 0.7071..."""
    return difference_sums(a, b).cosine
