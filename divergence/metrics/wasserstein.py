"""1-D Wasserstein-1 distance between the value distributions of two tensors.

For samples ``u`` (n values) and ``v`` (m values) with empirical CDFs ``U`` and ``V``,

    W1(u, v) = integral over x of |U(x) - V(x)| dx                         (1)

which, when n == m, equals the mean distance between matched order statistics,

    W1(u, v) = (1/n) * sum_i |u_(i) - v_(i)|                               (2)

(Ramdas, Garcia, Cuturi, "On Wasserstein two sample testing and related families of
nonparametric tests", 2017, eq. 1; the definition ``scipy.stats.wasserstein_distance`` uses).

Where the time goes: scipy evaluates (1) for any n, m: it argsorts both inputs, merge-sorts
their concatenation (2n values, stable sort), and runs two binary searches of 2n queries,
all in float64 and on one core. Form (2) needs only the two sorts, no indices, no merge and
no search; the sorts run in float32 (order is preserved exactly by the upcast, so sorting
before upcasting changes nothing) on two threads at once, and the sum is taken in float64,
chunk by chunk (``distance_chunks``, exactly rounded across chunks by ``math.fsum``). On a
CUDA tensor the sort runs on its GPU.

Unequal sizes fall back to (1), computed in torch on the tensors' device.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from divergence.metrics.parallel import pool
from divergence.metrics.tensors import CHUNK, as_tensor, chunks, float64_chunks, numpy_values


def wasserstein(a, b) -> float:
    """Wasserstein-1 distance between the value distributions of ``a`` and ``b``.

    Parameters
    ----------
    a, b : torch.Tensor or numpy.ndarray, any shape and float dtype (fp64, fp32, bf16, fp16)
        Both are flattened; sizes may differ. Computed in float64 on ``a``'s device.

    Returns
    -------
    float
        The value ``scipy.stats.wasserstein_distance(a.ravel(), b.ravel())`` returns, to
        a relative 1e-9 or better. NaN if either input holds a NaN or an infinity.

    Examples
    --------
    >>> wasserstein(torch.tensor([0.0, 1.0, 3.0]), torch.tensor([5.0, 6.0, 8.0]))
    5.0
    >>> wasserstein(np.array([0.0, 1.0]), np.array([0.0, 0.0, 3.0]))  # sizes may differ
    0.8333333333333334
    """
    a, b = as_tensor(a).reshape(-1), as_tensor(b).reshape(-1)
    if a.numel() == 0 or b.numel() == 0:
        raise ValueError("wasserstein: both tensors need at least one value")
    b = b.to(a.device)
    if a.numel() != b.numel():
        return _cdf_distance(a, b)
    if a.device.type != "cpu":
        sa, sb = torch.sort(_sortable(a)).values, torch.sort(_sortable(b)).values
        if not (ends_finite(sa) and ends_finite(sb)):
            return float("nan")
        return mean_distance(a.numel(), [float(abs(x - y).sum()) for x, y in float64_chunks(sa, sb)])
    # numpy's vectorized quicksort, both sides at once (torch's CPU sort is ~3x slower and
    # also builds an index tensor)
    sa, sb = pool().map(np.sort, (numpy_values(a), numpy_values(b)))
    if not (ends_finite(sa) and ends_finite(sb)):
        return float("nan")
    return mean_distance(a.numel(), distance_chunks(sa, sb))


def ends_finite(sorted_values) -> bool:
    """Whether every value of an ascending sort is finite: NaN sorts last and -inf first."""
    ends = sorted_values[[0, -1]]
    return bool(np.isfinite(ends).all()) if isinstance(ends, np.ndarray) else bool(torch.isfinite(ends).all())


def distance_chunks(sa: np.ndarray, sb: np.ndarray, span: slice = slice(None)) -> list[float]:
    """sum |sa - sb| of each CHUNK of ``sa[span]``, ``sb[span]`` (flat, sorted), in float64.

    ``span`` starts at a multiple of CHUNK, so its chunks are chunks of the whole sum.
    """
    sa, sb = sa[span], sb[span]
    buffer, parts = np.empty(min(CHUNK, sa.size)), []
    for s in chunks(sa.size):
        d = buffer[: s.stop - s.start]
        np.subtract(sa[s], sb[s], out=d, dtype=np.float64)  # widened exactly, then subtracted
        parts.append(float(np.abs(d, out=d).sum()))
    return parts


def mean_distance(n: int, parts: list[float]) -> float:
    """Form (2) from the chunks' sums of |u_(i) - v_(i)|, in chunk order."""
    return math.fsum(parts) / n


def _sortable(x: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 -> fp32 (exact); integers and bool -> fp64; others unchanged (on x's device)."""
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    elif not x.is_floating_point():
        x = x.double()
    return x


def _cdf_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """Form (1) for samples of different sizes, as scipy's ``_cdf_distance`` with p = 1."""
    if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())):
        return float("nan")
    a, b = torch.sort(a.double()).values, torch.sort(b.double()).values
    values = torch.sort(torch.cat([a, b])).values
    deltas = torch.diff(values)
    cdf_a = torch.searchsorted(a, values[:-1], right=True).double() / a.numel()
    cdf_b = torch.searchsorted(b, values[:-1], right=True).double() / b.numel()
    return float(torch.sum(torch.abs(cdf_a - cdf_b) * deltas))
