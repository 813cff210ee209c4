"""The dose ratio of one replicate: how much more (or less) a change perturbs training than a reference.

Two arms that start from the same weights and differ by a small numeric change separate like
a chaotic system (``METHOD.md``): linearised, delta_{t+1} = J_t delta_t + eps_X u_t xi_t, with
the Jacobian J_t shared by every pair of one recipe. Before saturation every pair's difference
grows at the recipe's rate lambda, so E_X(t) / E_P(t) ~= eps_X / eps_P at every step: a ratio
that does not depend on when training stops, unlike a ratio of slopes.

For the pair under study X, the reference (low-precision) pair P and the seed pair S of one
replicate r, at their shared tracked steps t:

    E(t)     whole-model rel_l2 = ||theta_a - theta_b|| / ||theta_b||     (step record ``rel_l2``)
    F(t)     the probe's ||out_a(Q) - out_b(Q)|| / ||out_b(Q)||             (``probe_rel_diff``)
    phi(t)   F(t) / F_S(t): the fraction of the way to a different-seed model
    g(t)     local log-growth rate: OLS slope of ln E over the tracked steps i-2..i+2

Unsaturated window U_r, function space (X, P and S carry the probe): t >= start, E_X, E_P > 0,
and 1/2 <= g_X / g_P <= 2 (both growing alike); weight space (no probe): t >= start, E_X, E_P > 0,
g_X > 0 and g_P >= g_X / 2 (the reference still amplifies at least half as fast). Either way the
window is the first stretch of tracked steps where these hold, with at most 2 failing steps in a
row inside it (``first_run``: once one pair stops growing like the other, the shared regime is
over, even if later both crawl at similar rates), and it ends at the first step where a pair's weights saturate, E >= 0.1 E_S
(with a seed pair).
start = max(10, warm-up) for a recipe with LR warm-up; without one the first steps count (start =
1: with dense early tracking they hold the window on a recipe whose reference saturates within
tens of steps). lr^F is the median over the window's probed steps (``tracking.probe.every``; NaN
with fewer than ``min_window`` of them).

Saturation is read in weight space, where the statistic is, and not from phi = F / F_S as
METHOD.md first wrote it. Measured on the tiny recipe (``make demo``, 3 replicates): the seed
pair's function distance F_S falls from 1.4 to 0.3 over 30 steps as both seeds learn the same
data, so phi_P of bf16-vs-fp32 passes 0.1 by step 10 through its shrinking denominator, while
its weights are 1-2% of a seed change (E_P / E_S = 0.007-0.026), both pairs' local growth rates
agree within 10% and log10(E_X / E_P) stays within 0.02 dex over steps 14-30. phi still gives
t10 and t50 (how far each pair has gone towards a different-seed model) and the outcome's scale.

    lr_r      = median over U_r of log10(E_X / E_P)            (the dose ratio, in dex)
    lr_r^F    = median over U_r of log10(F_X / F_P)            (its function-space twin)
    drift_r   = OLS slope of log10(E_X / E_P) on t over U_r, times the window's length
    lambda_r  = OLS slope of ln E over U_r (per step), for X and for P
    t10, t50  = first tracked step with phi >= 0.1 / 0.5 (None: censored, not reached)

Example: X injects 1000x less per step than P and both grow at the same rate:

>>> import numpy as np
>>> steps = np.arange(0, 60)
>>> e_p = 1e-5 * np.exp(0.05 * steps); e_x = 1e-3 * e_p
>>> round(window_log_ratio(steps, e_x, e_p, start=10).log10, 6)
-3.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from divergence.analysis.growth import ols_slope
from divergence.analysis.trajectories import PairData

SATURATED = 0.1  # phi at which a pair has left the shared exponential regime
HALF_WAY = 0.5
RATE_FACTOR = 2.0  # local log-growth rates "alike": within this factor of each other
DEFAULT_START = 10  # first step of the window for recipes with LR warm-up
MIN_WINDOW = 5
NEIGHBOURS = 2  # the local growth rate fits ln E over i-2..i+2
MAX_GAP = 2  # failing tracked steps in a row that a window stretch survives (see first_run)


@dataclass(frozen=True)
class WindowEstimate:
    """The dose ratio of one replicate and what it was read from."""

    replicate: int
    space: str  # "function" (probe window) or "weight" (weight-space window)
    window: tuple[int, int] | None  # (first step, last step) of U_r
    n_window: int
    log10: float  # lr_r, NaN when the window is under MIN_WINDOW steps
    log10_function: float  # lr_r^F, NaN without the probe
    drift: float  # change of log10(E_X/E_P) across the window (dex), from its OLS fit
    lam: dict[str, float] = field(default_factory=dict)  # "study"/"reference" -> slope of ln E
    t10: dict[str, int | None] = field(default_factory=dict)  # "study"/"reference" -> first step phi >= 0.1
    t50: dict[str, int | None] = field(default_factory=dict)
    # for the figures: the shared steps, log10(E_X/E_P) there, and which of them are in U_r
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    log_ratio: np.ndarray = field(default_factory=lambda: np.zeros(0))
    in_window: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    min_window: int = MIN_WINDOW
    phi: dict[str, np.ndarray] = field(default_factory=dict)  # "study"/"reference" -> phi at ``steps``
    saturated_at: int | None = None  # first shared step with E_X or E_P >= 0.1 E_S (None: not reached)

    @property
    def usable(self) -> bool:
        return self.n_window >= self.min_window and math.isfinite(self.log10)


def local_rates(steps: np.ndarray, values: np.ndarray, neighbours: int = NEIGHBOURS) -> np.ndarray:
    """g(t_i): OLS slope of ln(values) over the tracked steps i-k..i+k; NaN where a value is <= 0."""
    steps = np.asarray(steps, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where(values > 0, np.log(np.where(values > 0, values, 1.0)), np.nan)
    out = np.full(len(steps), np.nan)
    for i in range(len(steps)):
        lo, hi = max(0, i - neighbours), min(len(steps), i + neighbours + 1)
        y, x = logs[lo:hi], steps[lo:hi]
        ok = np.isfinite(y)
        if ok.sum() >= 3:
            out[i] = float(ols_slope(x[ok], y[ok]))
    return out


def window_start(recipe: dict) -> int:
    """t >= max(10, warm-up) for recipes with LR warm-up; without one, the first steps count."""
    warmup = int(((recipe or {}).get("train") or {}).get("warmup_steps") or 0)
    return max(DEFAULT_START, warmup) if warmup > 0 else 1


def estimate(study: PairData, reference: PairData, seed: PairData | None, start: int | None = None,
             min_window: int = MIN_WINDOW) -> WindowEstimate:
    """The window and dose ratio of one replicate of ``study`` against ``reference``."""
    start = window_start(study.recipe) if start is None else start
    steps, i_x, i_p = np.intersect1d(study.steps, reference.steps, return_indices=True)
    e_x, e_p = study.rel_l2[i_x], reference.rel_l2[i_p]
    f_x, f_p = probe_values(study)[i_x], probe_values(reference)[i_p]
    f_s, e_s = seed_at(seed, steps)
    space = "function" if np.isfinite(f_x).any() and np.isfinite(f_p).any() and np.isfinite(f_s).any() else "weight"
    g_x, g_p = local_rates(steps, e_x), local_rates(steps, e_p)
    alike = _alike(g_x, g_p, space)
    with np.errstate(divide="ignore", invalid="ignore"):
        phi_x, phi_p = (f_x / f_s, f_p / f_s) if space == "function" else (e_x / e_s, e_p / e_s)
        log_ratio = np.log10(e_x / e_p)
        # E / E_S, NaN without a seed pair: never saturated
        saturated = (e_x / e_s >= SATURATED) | (e_p / e_s >= SATURATED)
    ends = np.flatnonzero(saturated)
    before = np.arange(len(steps)) < (ends[0] if ends.size else len(steps))
    keep = first_run((steps >= start) & (e_x > 0) & (e_p > 0) & np.isfinite(log_ratio) & alike & before,
                     max(2, min_window))
    result = _summarise(study, steps, keep, log_ratio, e_x, e_p, f_x, f_p, phi_x, phi_p, space, max(2, min_window))
    return replace(result, saturated_at=int(steps[ends[0]]) if ends.size else None)


def first_run(ok: np.ndarray, min_length: int, max_gap: int = MAX_GAP) -> np.ndarray:
    """The steps of the first stretch of ``ok`` holding at least ``min_length`` True steps (else
    of the stretch holding the most), a stretch ending at more than ``max_gap`` False in a row.

    The shared exponential regime is one stretch of training: once a pair stops growing like the
    other (the larger dose leaves it first), a later step where both crawl at similar rates is
    not back in it. Up to ``max_gap`` failing steps inside a stretch (noise in a local rate) are
    left out of it without ending it.

    >>> first_run(np.array([1, 0, 0, 0, 1, 1, 0, 1, 1, 0, 0, 0, 1, 1, 1, 1], dtype=bool), 4).astype(int)
    array([0, 0, 0, 0, 1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0])
    """
    stretches, current, gap = [], [], 0
    for i, value in enumerate(ok):
        if value:
            current.append(i)
            gap = 0
        elif current:
            gap += 1
            if gap > max_gap:
                stretches.append(current)
                current, gap = [], 0
    if current:
        stretches.append(current)
    out = np.zeros(len(ok), dtype=bool)
    if stretches:
        chosen = next((c for c in stretches if len(c) >= min_length), max(stretches, key=len))
        out[chosen] = True
    return out


def _alike(g_x: np.ndarray, g_p: np.ndarray, space: str) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        if space == "function":
            return (g_x > 0) & (g_p > 0) & (g_x / g_p <= RATE_FACTOR) & (g_p / g_x <= RATE_FACTOR)
        return (g_x > 0) & (g_p >= g_x / RATE_FACTOR)


def probe_values(pair: PairData) -> np.ndarray:
    """F(t) at the pair's tracked steps, (T,); NaN where the probe was not recorded."""
    return pair.probe.get("probe_rel_diff", np.full(len(pair.steps), np.nan))


def seed_at(seed: PairData | None, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The seed pair's F and E at ``steps`` (NaN where it has no tracked step there)."""
    f_s, e_s = np.full(len(steps), np.nan), np.full(len(steps), np.nan)
    if seed is None:
        return f_s, e_s
    where = {int(t): i for i, t in enumerate(seed.steps)}
    rows = [(j, where[int(t)]) for j, t in enumerate(steps) if int(t) in where]
    if rows:
        j, i = map(np.array, zip(*rows))
        f_s[j] = probe_values(seed)[i]
        e_s[j] = seed.rel_l2[i]
    return f_s, e_s


def _summarise(study, steps, keep, log_ratio, e_x, e_p, f_x, f_p, phi_x, phi_p, space, min_window) -> WindowEstimate:
    n = int(keep.sum())
    window = (int(steps[keep][0]), int(steps[keep][-1])) if n else None
    t10 = {"study": _first(steps, phi_x, SATURATED), "reference": _first(steps, phi_p, SATURATED)}
    t50 = {"study": _first(steps, phi_x, HALF_WAY), "reference": _first(steps, phi_p, HALF_WAY)}
    phi = {"study": phi_x, "reference": phi_p}
    if n < min_window:
        return WindowEstimate(study.replicate, space, window, n, math.nan, math.nan, math.nan,
                              {"study": math.nan, "reference": math.nan}, t10, t50, steps, log_ratio, keep, min_window,
                              phi)
    t = steps[keep].astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_f = np.log10(f_x[keep] / f_p[keep])
    finite_f = log_f[np.isfinite(log_f)]
    drift = float(ols_slope(t, log_ratio[keep])) * (t[-1] - t[0])
    lam = {"study": float(ols_slope(t, np.log(e_x[keep]))), "reference": float(ols_slope(t, np.log(e_p[keep])))}
    return WindowEstimate(study.replicate, space, window, n, float(np.median(log_ratio[keep])),
                          float(np.median(finite_f)) if finite_f.size >= min_window else math.nan,
                          drift, lam, t10, t50, steps, log_ratio, keep, min_window, phi)


def _first(steps: np.ndarray, phi: np.ndarray, level: float) -> int | None:
    reached = np.flatnonzero(phi >= level)
    return int(steps[reached[0]]) if reached.size else None


def window_log_ratio(steps, e_x, e_p, start: int = DEFAULT_START) -> WindowEstimate:
    """The estimate from two arrays of E (weight space, no seed pair): for examples and tests."""
    def pair(values):
        return PairData(name="", category="optimization", description="", finished=True, last_step=None,
                        max_steps=0, steps=np.asarray(steps), model={}, layers=(), kinds=(), numel=np.zeros(0),
                        layer_values={}, kind_values={}, loss_steps=np.zeros(0), loss={}, spikes={},
                        rel_l2=np.asarray(values, dtype=float))
    return estimate(pair(e_x), pair(e_p), None, start=start)
