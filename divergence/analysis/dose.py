"""The dose ratio per replicate: how much more (or less) a change perturbs training than a reference.

Two arms that start from the same weights and differ by a small numeric change separate like
a chaotic system (``docs/method.md``): linearised, delta_{t+1} = J_t delta_t + eps_X u_t xi_t, with
the Jacobian J_t shared by every pair of one recipe. Before saturation every pair's difference
grows at the recipe's rate lambda, so E_X(t) / E_P(t) ~= eps_X / eps_P at every step: a ratio
that does not depend on when training stops, unlike a ratio of slopes.

For the pair under study X, the reference (low-precision) pair P and the seed pair S of one
replicate r, at their shared tracked steps t:

    E(t)     whole-model rel_l2 = ||theta_a - theta_b|| / ||theta_b||     (step record ``rel_l2``)
    F(t)     the probe's ||out_a(Q) - out_b(Q)|| / ||out_b(Q)||             (``probe_rel_diff``)
    phi(t)   F(t) / F_S(t): the fraction of the way to a different-seed model

Unsaturated window U_r: the steps of the shared exponential regime, past the first-steps transient,
as ``window`` defines them, a pair saturated from E >= ``SATURATED_E`` x E_S (with a seed pair).
start = max(10, warm-up) for a recipe with LR warm-up; without one the first steps count (start = 1;
the transient rule decides where the reading begins). lr^F is the median over the window's probed
steps (``tracking.probe.every``; NaN with fewer than ``min_window`` of them).

Saturation is read in weight space, where the statistic is, and not from phi = F / F_S as the
method's first version had it. Measured on the tiny recipe (``make demo``, 3 replicates): the seed
pair's function distance F_S falls from 1.4 to 0.3 over 30 steps as both seeds learn the same
data, so phi_P of bf16-vs-fp32 passes 0.1 by step 10 through its shrinking denominator, while
its weights are 1-2% of a seed change (E_P / E_S = 0.007-0.026), both pairs' local growth rates
agree within 10% and log10(E_X / E_P) stays within 0.02 dex over steps 14-30. phi still gives
t10 and t50 (how far each pair has gone towards a different-seed model) and the outcome's scale.

    lr_r      = median over U_r of log10(E_X / E_P)            (the dose ratio, in dex)
    lr_r^F    = median over U_r of log10(F_X / F_P)            (its function-space twin)
    drift_r   = OLS slope of log10(E_X / E_P) on t over U_r, times the window's length
    lambda_r  = OLS slope of ln E over U_r (per step), for X and for P
    t10, t50  = first tracked step with phi >= SATURATED_PHI / HALF_WAY (None: censored, not reached)

Example: X injects 1000x less per step than P and both grow at the same rate, E_X(t) = 1e-3 E_P(t):
log10(E_X / E_P) = -3 at every step of the window, so lr_r = -3.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from divergence.analysis.growth import ols_slope
from divergence.analysis.trajectories import PairData
from divergence.analysis.window import alike, common_start, drift, first_run, local_rates, settle_step

SATURATED_E = 0.1  # E / E_S (weight space) from which a pair has left the shared exponential regime: ends the window
SATURATED_PHI = 0.1  # phi = F / F_S from which a pair counts as saturated: t10, an anchor's end (calibration)
HALF_WAY = 0.5
DEFAULT_START = 10  # first step of the window for recipes with LR warm-up
MIN_WINDOW = 5


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
    t10: dict[str, int | None] = field(default_factory=dict)  # "study"/"reference" -> first step phi >= SATURATED_PHI
    t50: dict[str, int | None] = field(default_factory=dict)
    # for the figures: the shared steps, log10(E_X/E_P) there, and which of them are in U_r
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    log_ratio: np.ndarray = field(default_factory=lambda: np.zeros(0))
    in_window: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    min_window: int = MIN_WINDOW
    phi: dict[str, np.ndarray] = field(default_factory=dict)  # "study"/"reference" -> phi at ``steps``
    saturated_at: int | None = None  # first shared step with E_X or E_P >= SATURATED_E x E_S (None: not reached)
    settled_at: int | None = None  # this replicate's first step past its transient (None: never settled)
    window_start: int | None = None  # t0, the first step common to the replicates read together
    start: int | None = None  # the earliest step any window may start at (before t0's transient rule)

    @property
    def usable(self) -> bool:
        return self.n_window >= self.min_window and math.isfinite(self.log10)


def window_start(recipe: dict) -> int:
    """t >= max(10, warm-up) for recipes with LR warm-up; without one, the first steps count."""
    warmup = int(((recipe or {}).get("train") or {}).get("warmup_steps") or 0)
    return max(DEFAULT_START, warmup) if warmup > 0 else 1


@dataclass(frozen=True)
class _Curves:
    """One replicate's series at the steps both pairs tracked, (T,) each."""

    study: PairData
    steps: np.ndarray
    e_x: np.ndarray
    e_p: np.ndarray
    f_x: np.ndarray
    f_p: np.ndarray
    phi_x: np.ndarray
    phi_p: np.ndarray
    log_ratio: np.ndarray  # log10(E_X / E_P)
    valid: np.ndarray  # both E finite and > 0, before the first saturated step
    regime: np.ndarray  # valid and growing alike
    space: str
    saturated_at: int | None


def estimate(
    study: PairData,
    reference: PairData,
    seed: PairData | None,
    start: int | None = None,
    min_window: int = MIN_WINDOW,
    saturated: float = SATURATED_E,
) -> WindowEstimate:
    """The window and dose ratio of one replicate of ``study`` against ``reference``, read alone
    (its own transient's end); ``estimate_replicates`` reads several from one common first step."""
    return estimate_replicates([(study, reference, seed)], start, min_window, saturated)[0]


def estimate_replicates(
    runs: list[tuple[PairData, PairData, PairData | None]],
    start: int | None = None,
    min_window: int = MIN_WINDOW,
    saturated: float = SATURATED_E,
) -> list[WindowEstimate]:
    """Every replicate's window and dose ratio: (study, reference, seed) runs of one replicate
    each, read from the first step t0 common to them (``window.common_start``). ``saturated``: the
    E / E_S that ends a window (``SATURATED_E``; a fine-tune's ``finetune.SATURATED_FINETUNE``)."""
    if not runs:
        return []
    start = window_start(runs[0][0].recipe) if start is None else start
    length = max(2, min_window)
    curves = [_curves(x, p, s, saturated) for x, p, s in runs]
    settled = [settle_step(c.steps, c.log_ratio, c.regime, c.valid, start, length) for c in curves]
    t0 = common_start(settled, start)
    return [
        _summarise(
            c, first_run(c.regime & (c.steps >= t0), length), length, settled_at=at, window_start=t0, start=start
        )
        for c, at in zip(curves, settled)
    ]


def _curves(study: PairData, reference: PairData, seed: PairData | None, level: float = SATURATED_E) -> _Curves:
    steps, i_x, i_p = np.intersect1d(study.steps, reference.steps, return_indices=True)
    e_x, e_p = study.rel_l2[i_x], reference.rel_l2[i_p]
    f_x, f_p = probe_values(study)[i_x], probe_values(reference)[i_p]
    f_s, e_s = seed_at(seed, steps)
    e_s = np.where(e_s > 0, e_s, np.nan)  # a seed pair still equal (a fine-tune's step 0) is no ceiling yet
    space = "function" if np.isfinite(f_x).any() and np.isfinite(f_p).any() and np.isfinite(f_s).any() else "weight"
    with np.errstate(divide="ignore", invalid="ignore"):
        phi_x, phi_p = (f_x / f_s, f_p / f_s) if space == "function" else (e_x / e_s, e_p / e_s)
        log_ratio = np.log10(e_x / e_p)
        # E / E_S, NaN without a seed pair: never saturated
        saturated = (e_x / e_s >= level) | (e_p / e_s >= level)
    ends = np.flatnonzero(saturated)
    before = np.arange(len(steps)) < (ends[0] if ends.size else len(steps))
    valid = (e_x > 0) & (e_p > 0) & np.isfinite(log_ratio) & before
    regime = valid & alike(local_rates(steps, e_x), local_rates(steps, e_p), space)
    return _Curves(
        study,
        steps,
        e_x,
        e_p,
        f_x,
        f_p,
        phi_x,
        phi_p,
        log_ratio,
        valid,
        regime,
        space,
        int(steps[ends[0]]) if ends.size else None,
    )


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


def _summarise(c: _Curves, keep: np.ndarray, min_window: int, **where) -> WindowEstimate:
    """The estimate over the kept steps (NaN readings under ``min_window`` of them); ``where``: its
    ``settled_at``, ``window_start`` and ``start``."""
    steps, n, nan = c.steps, int(keep.sum()), math.nan
    log10, log10_function, drift_dex, lam = nan, nan, nan, {"study": nan, "reference": nan}
    if n >= min_window:
        t = steps[keep].astype(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_f = np.log10(c.f_x[keep] / c.f_p[keep])
        finite_f = log_f[np.isfinite(log_f)]
        log10 = float(np.median(c.log_ratio[keep]))
        log10_function = float(np.median(finite_f)) if finite_f.size >= min_window else nan
        drift_dex = drift(steps, c.log_ratio, keep)
        lam = {"study": float(ols_slope(t, np.log(c.e_x[keep]))), "reference": float(ols_slope(t, np.log(c.e_p[keep])))}
    return WindowEstimate(
        c.study.replicate,
        c.space,
        (int(steps[keep][0]), int(steps[keep][-1])) if n else None,
        n,
        log10,
        log10_function,
        drift_dex,
        lam,
        {"study": _first(steps, c.phi_x, SATURATED_PHI), "reference": _first(steps, c.phi_p, SATURATED_PHI)},
        {"study": _first(steps, c.phi_x, HALF_WAY), "reference": _first(steps, c.phi_p, HALF_WAY)},
        steps=steps,
        log_ratio=c.log_ratio,
        in_window=keep,
        min_window=min_window,
        phi={"study": c.phi_x, "reference": c.phi_p},
        saturated_at=c.saturated_at,
        **where,
    )


def _first(steps: np.ndarray, phi: np.ndarray, level: float) -> int | None:
    reached = np.flatnonzero(phi >= level)
    return int(steps[reached[0]]) if reached.size else None
