"""Growth rate of a pair's weight difference, with its bootstrap CI (the report's pairs table).

The paper (Fig. 8) compares pairs by the *rate of change* of their weight difference over
training: Flash vs Baseline grows about as fast as a change of init seed and 2-5x slower
than FP16 vs FP32. This module turns that reading of a plot into a statistic.

Growth rate. For a pair with tracked steps t_1..t_T, layers l = 1..L with element counts
n_l and per-layer metric D_l(t) (``trajectories``), the layer-mean trajectory is

    y(t) = sum_l n_l D_l(t) / sum_l n_l

and the growth rate is its ordinary least-squares slope over the steps,

    g = sum_i (t_i - mean t)(y(t_i) - mean y) / sum_i (t_i - mean t)^2     [metric per step]

which equals sum_l n_l b_l / sum_l n_l, the numel-weighted mean of the per-layer slopes b_l
(OLS is linear in y). For the Wasserstein distance y(t) is exactly the whole-model value,
so g is the slope of the Fig. 7/8 curve. For the max difference it is the weighted mean of
the layers' max differences (the whole-model max is one layer's value, too brittle to fit).
Subtracting D(t_1) does not change a slope, so g is also the slope of the relative curve.

Why a linear fit of the metric and not of its log: pairs that share initial weights start at
exactly 0, where the log is undefined; the paper reads slopes off linear axes; and a ratio
of linear slopes compares how fast the weights move apart in the same units, whereas log
slopes would rank a tiny but fast-growing difference above a large steady one.

Confidence interval (two-way bootstrap, percentile, 95 %). Each replicate draws L layers
with replacement (layer l counted c_l times) and T steps with replacement, and refits
g* = OLS slope over the drawn steps of sum_l c_l n_l D_l(t) / sum_l c_l n_l. Resampling
layers asks whether the rate depends on which layers the model happens to have; resampling
steps, how much the trend depends on the scatter around it. Consecutive steps of one run are
correlated, which the step resampling ignores, so read the interval as a lower bound on
the uncertainty, not as exact coverage.

Draws are seeded per (seed, pair name, metric), so the numbers do not depend on the order
in which pairs are analysed and a report is reproducible to the last digit.

Example (two layers of equal size that grow at 2 and 4 units per step: g = 3):

>>> import numpy as np
>>> steps = np.array([0, 10, 20, 30])
>>> growth_rate(steps, np.array([2.0 * steps, 4.0 * steps]), np.array([1.0, 1.0]))
3.0
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from divergence.analysis.trajectories import PairData

CONFIDENCE = 0.95
N_BOOT = 2000
MIN_FIT_STEPS = 3  # fewer points leave a slope without any scatter to resample


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its bootstrap interval."""

    value: float
    lo: float
    hi: float
    n_steps: int  # steps the fit used
    n_layers: int  # layers the fit used
    n_boot: int  # replicates that gave a finite value

    @property
    def defined(self) -> bool:
        return bool(np.isfinite(self.value) and np.isfinite(self.lo) and np.isfinite(self.hi))


def ols_slope(x, y) -> np.ndarray:
    """Least-squares slope of y on x along the last axis; NaN where x is constant."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    xc = x - x.mean(axis=-1, keepdims=True)
    sxx = (xc * xc).sum(axis=-1)
    sxy = (xc * (y - y.mean(axis=-1, keepdims=True))).sum(axis=-1)
    safe = np.where(sxx > 0, sxx, 1.0)
    return np.where(sxx > 0, sxy / safe, np.nan)


def layer_mean(pair: PairData, metric: str) -> np.ndarray:
    """y(t): the numel-weighted mean over the pair's finite layers, (T,), the curve g is fitted to."""
    layers = pair.finite_layers(metric)
    if not layers.any():
        return np.full(len(pair.steps), np.nan)
    weights = pair.numel[layers]
    return weights @ pair.layer_values[metric][layers] / weights.sum()


def growth_rate(steps, values, weights) -> float:
    """g: OLS slope of the weighted layer mean. ``values`` (L, T), ``weights`` (L,)."""
    weights = np.asarray(weights, dtype=float)
    trajectory = weights @ np.asarray(values, dtype=float) / weights.sum()  # (T,)
    return float(ols_slope(steps, trajectory))


def estimate_growth(pair: PairData, metric: str, n_boot: int = N_BOOT, seed: int = 0) -> Estimate:
    """The pair's growth rate g over all its tracked steps and finite layers, with its CI; the draws
    seeded by (``seed``, the pair's name, ``metric``)."""
    layers = pair.finite_layers(metric)
    values, weights = pair.layer_values[metric][layers], pair.numel[layers]  # (L, T), (L,)
    n_steps, n_layers = len(pair.steps), int(layers.sum())
    if n_steps < 2 or n_layers == 0:
        return Estimate(np.nan, np.nan, np.nan, n_steps, n_layers, 0)
    value = growth_rate(pair.steps, values, weights)
    if n_steps < MIN_FIT_STEPS:
        return Estimate(value, np.nan, np.nan, n_steps, n_layers, 0)
    rng = np.random.default_rng([seed, *(zlib.crc32(k.encode()) for k in (pair.name, metric))])
    counts = rng.multinomial(n_layers, np.full(n_layers, 1.0 / n_layers), size=n_boot)  # (B, L)
    picks = rng.integers(0, n_steps, size=(n_boot, n_steps))  # (B, T)
    cw = counts * np.asarray(weights, dtype=float)  # (B, L)
    trajectory = cw @ values / cw.sum(axis=1, keepdims=True)  # (B, T)
    rates = ols_slope(np.asarray(pair.steps, dtype=float)[picks], np.take_along_axis(trajectory, picks, axis=1))
    finite = rates[np.isfinite(rates)]
    if finite.size == 0:
        return Estimate(value, np.nan, np.nan, n_steps, n_layers, 0)
    tail = 100 * (1 - CONFIDENCE) / 2
    lo, hi = np.percentile(finite, [tail, 100 - tail])
    return Estimate(float(value), float(lo), float(hi), n_steps, n_layers, int(finite.size))
