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

Finite inputs give finite metrics. A square leaves float64's range once a value passes about
2^512 (1e154; float64 values go to 1.8e308), and loses its digits below about 2^-500: a chunk
whose ||a||^2 or ||b||^2 falls outside [2^-400, 2^460] is measured again with both sides
multiplied by 2^-k, k the binary exponent of its largest |value| (exact: a power of two only
moves the exponent), and its sums carry k; chunks are added at the largest k (a chunk far
smaller than it weighs nothing there). So values near 1e300 give the cosine and rel_l2 of the
same values near 1 (both are scale-free), and rms_diff, mean_abs_diff and the norms are scaled
back (inf only where the true value exceeds float64's range). A chunk inside the range has
k = 0 and the same bits as without the rescaling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from divergence.metrics.tensors import CHUNK, as_tensor, check_same_shape, chunks, float64_chunks, numpy_values

# The sums of one chunk, d = a - b: (max |d|, sum |d|, sum d^2, sum a^2, sum b^2, sum ab, k), the
# values measured as x 2^-k (k = 0 unless the squares would leave float64's range, see above).
ChunkSums = tuple[float, float, float, float, float, float, int]
SQUARES_RANGE = (2.0**-400, 2.0**460)  # ||a||^2 and ||b||^2 of a chunk measured without rescaling
VALUES_RANGE = (2.0**-200, 2.0**200)  # a largest |value| outside it rescales the chunk


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
    k: int = 0  # the sums are of a 2^-k and b 2^-k (module docstring)

    @classmethod
    def from_chunks(cls, n: int, parts: list[ChunkSums]) -> DifferenceSums:
        """The pass's sums from its chunks' (in chunk order), each brought to the largest k (exact
        when all are 0); fsum rounds once, whatever the grouping."""
        k = max((p[6] for p in parts), default=0)
        parts = [_at(p, k) for p in parts]
        max_abs = max((0.0, *(p[0] for p in parts)))  # 0.0 first, then each chunk's in order
        return cls(n, max_abs, *(math.fsum(p[i] for p in parts) for i in range(1, 6)), k)

    @property
    def max_abs_diff(self) -> float:
        return math.ldexp(self.max_abs, self.k)

    @property
    def mean_abs_diff(self) -> float:
        return math.ldexp(self.sum_abs / self.n, self.k)

    @property
    def rms_diff(self) -> float:
        return math.ldexp(math.sqrt(self.sum_sq / self.n), self.k)

    @property
    def norm_a(self) -> float:
        return math.ldexp(math.sqrt(self.sum_aa), self.k)

    @property
    def norm_b(self) -> float:
        return math.ldexp(math.sqrt(self.sum_bb), self.k)

    @property
    def rel_l2(self) -> float:
        return relative_l2(self.sum_sq, self.sum_aa)

    @property
    def cosine(self) -> float:
        return cosine_from_sums(self.sum_ab, self.sum_aa, self.sum_bb)


def _at(part: ChunkSums, k: int) -> ChunkSums:
    """A chunk's sums as sums of values x 2^-k (k at least the chunk's own)."""
    if part[6] == k:
        return part
    shift = part[6] - k
    return (*(math.ldexp(v, shift) for v in part[:2]), *(math.ldexp(v, 2 * shift) for v in part[2:6]), k)


def rescale_exponent(sums, largest) -> int:
    """k for a chunk whose first six sums are ``sums``: 0 when ||a||^2 and ||b||^2 lie in
    SQUARES_RANGE, else the binary exponent of its largest |value| (``largest()``, computed only
    then) when that lies outside VALUES_RANGE; 0 for a chunk of zeros or non-finite values."""
    low, high = SQUARES_RANGE
    if low <= sums[3] <= high and low <= sums[4] <= high:
        return 0
    return outside_exponent(largest())


def outside_exponent(m: float) -> int:
    """The binary exponent of ``m`` when it lies outside VALUES_RANGE (its square would over- or
    underflow), else 0; 0 for 0 or a non-finite ``m``."""
    if not math.isfinite(m) or m == 0 or VALUES_RANGE[0] <= m <= VALUES_RANGE[1]:
        return 0
    return math.frexp(m)[1]


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
    return DifferenceSums.from_chunks(a.numel(), torch_chunk_sums(a, b))


def torch_chunk_sums(a, b) -> list[ChunkSums]:
    """``chunk_sums`` in torch, on the tensors' device (flat, same size), for a GPU's tensors."""
    return [_torch_chunk(x, y) for x, y in float64_chunks(a, b)]


def _torch_chunk(x, y) -> ChunkSums:
    sums = _torch_sums(x, y)
    k = rescale_exponent(sums, lambda: float(max(x.abs().max(), y.abs().max())))
    if k:
        scale = 2.0 ** (-k // 2), 2.0 ** (-k - (-k // 2))  # two factors: 2^-k alone may overflow
        sums = _torch_sums(x * scale[0] * scale[1], y * scale[0] * scale[1])
    return (*sums, k)


def _torch_sums(x, y) -> tuple[float, ...]:
    d = x - y
    sums = (abs(d).max(), abs(d).sum(), (d * d).sum(), (x * x).sum(), (y * y).sum(), (x * y).sum())
    return tuple(float(v) for v in sums)


def chunk_sums(x: np.ndarray, y: np.ndarray, span: slice = slice(None)) -> list[ChunkSums]:
    """The sums of each CHUNK of ``x[span]`` and ``y[span]`` (flat float32/float64 arrays).

    ``span`` starts at a multiple of CHUNK, so its chunks are chunks of the whole pass. Each
    chunk is widened once (exactly) into float64 buffers; |d| overwrites d, and d^2 is taken
    as |d| |d| (the same bits): a chunk costs 2 copies, 5 elementwise ops and 6 reductions
    (twice, with the scaling, for a chunk whose squares leave the range; see the module docstring).
    """
    x, y = x[span], y[span]
    size = min(CHUNK, x.size)
    x64, y64, t64 = np.empty(size), np.empty(size), np.empty(size)
    parts = []
    # inf - inf is NaN: the pass may run before the sorts tell that the pair is not finite; a
    # square that overflows is measured again, rescaled (rescale_exponent)
    with np.errstate(invalid="ignore", over="ignore"):
        for s in chunks(x.size):
            parts.append(
                _chunk_sums(x[s], y[s], x64[: s.stop - s.start], y64[: s.stop - s.start], t64[: s.stop - s.start])
            )
    return parts


def _chunk_sums(x: np.ndarray, y: np.ndarray, xs: np.ndarray, ys: np.ndarray, t: np.ndarray) -> ChunkSums:
    np.copyto(xs, x)
    np.copyto(ys, y)
    sums = _sums(xs, ys, t)
    k = rescale_exponent(sums, lambda: max(float(np.abs(xs, out=t).max()), float(np.abs(ys, out=t).max())))
    if k:
        np.ldexp(xs, -k, out=xs)
        np.ldexp(ys, -k, out=ys)
        sums = _sums(xs, ys, t)
    return (*sums, k)


def _sums(xs: np.ndarray, ys: np.ndarray, t: np.ndarray) -> tuple[float, ...]:
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
