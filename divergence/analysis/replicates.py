"""Replicates: pair runs grouped by name, and a mean over replicates with its t interval.

Replicate r of every pair starts from the same weights and sees the same batches (common
random numbers), so the replicates of one pair measure the run-to-run variance of a
statistic, which a bootstrap over the layers and steps of one run cannot (``docs/method.md``).

For R per-replicate values x_1..x_R: mean xbar, and the two-sided 95% t interval

    xbar -/+ t_{0.975, R-1} * s / sqrt(R),     s the sample standard deviation (ddof 1)

With one replicate there is no interval (lo = hi = None): a point estimate only.

>>> p = pool([1.0, 2.0, 3.0])
>>> p.mean, round(p.lo, 3), round(p.hi, 3)
(2.0, -0.484, 4.484)

How many replicates would decide (``replicates_to_clear``): at the observed mean and spread
(a planning estimate: both assumed to stay as they are), the fewest n >= 2 whose interval
half-width falls below the gap g between the mean and the value to clear,

    t_{0.975, n-1} * s / sqrt(n) < g

e.g. to exclude 0, g = |xbar|; to lie beyond +-d, g = |xbar| - d; to lie inside (-m, m),
g = m - |xbar|. None when g <= 0 (no number of replicates clears it at this mean), when
s is unknown (one replicate), or when n would exceed ``MAX_PLANNED``.

>>> replicates_to_clear(pool([-0.33, -0.56, -0.04]), abs(pool([-0.33, -0.56, -0.04]).mean))
6
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from scipy import stats

from divergence.analysis.trajectories import PairData

CONFIDENCE = 0.95
MAX_PLANNED = 1000  # beyond this many replicates a plan is "not within reach": None


@dataclass(frozen=True)
class Pooled:
    mean: float
    lo: float | None
    hi: float | None
    n: int
    values: tuple[float, ...]

    @property
    def interval(self) -> bool:
        return self.lo is not None and self.hi is not None


def pool(values) -> Pooled:
    """Mean and t interval (R-1 degrees of freedom) of the finite ``values``."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if x.size == 0:
        return Pooled(math.nan, None, None, 0, ())
    mean = float(x.mean())
    if x.size == 1:
        return Pooled(mean, None, None, 1, (mean,))
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return Pooled(mean, mean - half, mean + half, int(x.size), tuple(map(float, x)))


def replicates_to_clear(p: Pooled, gap: float) -> int | None:
    """The fewest replicates whose t interval, at ``p``'s mean and spread, has a half-width under ``gap``."""
    if p.n < 2 or not math.isfinite(gap) or gap <= 0:
        return None
    s = float(np.std(p.values, ddof=1))
    if s == 0:
        return 2
    n = np.arange(2, MAX_PLANNED + 1)
    ok = stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1) * s / np.sqrt(n) < gap
    return int(n[ok][0]) if ok.any() else None


def group(pairs: list[PairData]) -> dict[str, list[PairData]]:
    """name -> that pair's runs, ascending replicate (names repeat across replicates)."""
    out: dict[str, list[PairData]] = defaultdict(list)
    for p in pairs:
        out[p.name].append(p)
    return {name: sorted(runs, key=lambda p: p.replicate) for name, runs in out.items()}


def replicate_of(runs: list[PairData], replicate: int) -> PairData | None:
    """The run of ``runs`` with this replicate number, if any."""
    return next((p for p in runs if p.replicate == replicate), None)


def replicate_or_first(runs: list[PairData], replicate: int) -> PairData | None:
    """The run of ``runs`` with this replicate number, else its first (None without runs): a seed pair
    with fewer replicates than the study still serves every replicate."""
    return replicate_of(runs, replicate) or (runs[0] if runs else None)


def replicate_runs(study: list[PairData], reference: list[PairData], seeds: list[PairData]) -> list[tuple]:
    """(x, its replicate of ``reference``, of ``seeds`` or the first seed run) for every run x of ``study``
    that ``reference`` has the replicate of (common random numbers): ``dose.estimate_replicates``' runs."""
    return [
        (x, p, replicate_or_first(seeds, x.replicate))
        for x in study
        if (p := replicate_of(reference, x.replicate)) is not None
    ]


def pooled_dict(p: Pooled, key: str) -> dict:
    """``p`` as JSON: its mean under ``key``, its interval and its replicates."""
    return {key: num(p.mean), "lo": num(p.lo), "hi": num(p.hi), "replicates": p.n}


def num(x):
    """``x`` as a JSON number: None when missing or not finite."""
    return None if x is None or not math.isfinite(x) else float(x)
