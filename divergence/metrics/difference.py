"""Elementwise difference metrics between two tensors of the same shape.

With d = a - b over the n elements, all sums in float64:

    max_abs_diff  = max_i |d_i|                 the paper's upper bound (Golden et al. 2024)
    mean_abs_diff = (1/n) sum_i |d_i|
    rms_diff      = sqrt((1/n) sum_i d_i^2)
    rel_l2        = ||d||_2 / ||a||_2           (0 when a == b, inf when only a is zero)
    cosine        = <a, b> / (||a||_2 ||b||_2)  (1 when both are zero, 0 when one is)

One pass over the data yields every sum, chunk by chunk, so the float64 temporaries never
exceed a few tens of MiB whatever the tensor size; the pass runs on the tensors' device.
Chunk sums are added with ``math.fsum`` (exactly rounded), so a pass split across threads
(``divergence.metrics.pair.compare_pairs``) gives the same bits as one pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from divergence.metrics.tensors import CHUNK, as_tensor, check_same_shape, chunks, float64_chunks, numpy_values

# The sums of one chunk, d = a - b: (max |d|, sum |d|, sum d^2, sum a^2, sum b^2, sum ab).
ChunkSums = tuple[float, float, float, float, float, float]


@dataclass(frozen=True)
class DifferenceSums:
    """Sufficient statistics of d = a - b; the metrics and their aggregates derive from them."""

    n: int
    max_abs: float
    sum_abs: float
    sum_sq: float  # ||a - b||^2
    sum_aa: float  # ||a||^2
    sum_bb: float  # ||b||^2
    sum_ab: float  # <a, b>

    @classmethod
    def from_chunks(cls, n: int, parts: list[ChunkSums]) -> DifferenceSums:
        """The pass's sums from its chunks' (in chunk order); fsum rounds once, whatever the grouping."""
        max_abs = 0.0
        for part in parts:
            max_abs = max(max_abs, part[0])
        return cls(n, max_abs, *(math.fsum(p[i] for p in parts) for i in range(1, 6)))

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
    if a.device.type == "cpu":
        return DifferenceSums.from_chunks(a.numel(), chunk_sums(numpy_values(a), numpy_values(b)))
    parts = []
    for x, y in float64_chunks(a, b):
        d = x - y
        sums = (abs(d).max(), abs(d).sum(), (d * d).sum(), (x * x).sum(), (y * y).sum(), (x * y).sum())
        parts.append(tuple(float(v) for v in sums))
    return DifferenceSums.from_chunks(a.numel(), parts)


def chunk_sums(x: np.ndarray, y: np.ndarray, span: slice = slice(None)) -> list[ChunkSums]:
    """The sums of each CHUNK of ``x[span]`` and ``y[span]`` (flat float32/float64 arrays).

    ``span`` starts at a multiple of CHUNK, so its chunks are chunks of the whole pass. Each
    chunk is widened once (exactly) into float64 buffers; |d| overwrites d, and d^2 is taken
    as |d| |d| (the same bits): a chunk costs 2 copies, 5 elementwise ops and 6 reductions.
    """
    x, y = x[span], y[span]
    size = min(CHUNK, x.size)
    x64, y64, t64 = np.empty(size), np.empty(size), np.empty(size)
    parts = []
    # inf - inf is NaN: the pass may run before the sorts tell that the pair is not finite
    with np.errstate(invalid="ignore"):
        for s in chunks(x.size):
            parts.append(
                _chunk_sums(x[s], y[s], x64[: s.stop - s.start], y64[: s.stop - s.start], t64[: s.stop - s.start])
            )
    return parts


def _chunk_sums(x: np.ndarray, y: np.ndarray, xs: np.ndarray, ys: np.ndarray, t: np.ndarray) -> ChunkSums:
    np.copyto(xs, x)
    np.copyto(ys, y)
    np.abs(np.subtract(xs, ys, out=t), out=t)
    max_abs, sum_abs = t.max(), t.sum()
    sum_sq = np.multiply(t, t, out=t).sum()
    sum_aa = np.multiply(xs, xs, out=t).sum()
    sum_bb = np.multiply(ys, ys, out=t).sum()
    sum_ab = np.multiply(xs, ys, out=t).sum()
    return tuple(float(v) for v in (max_abs, sum_abs, sum_sq, sum_aa, sum_bb, sum_ab))


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
