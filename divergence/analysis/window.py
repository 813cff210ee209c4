"""Where the dose ratio is read: the steps of the shared exponential regime, past the first-steps
transient, and the same kind of stretch in every replicate (``docs/method.md``, "The unsaturated window").

For one replicate, at the steps both pairs tracked (``dose.estimate_replicates`` builds them):

    g(t)      local log-growth rate: OLS slope of ln E over the tracked steps i-2..i+2
    regime    E_X, E_P > 0 and finite, neither pair saturated (E < 0.1 E_S), and the two growing
              alike: 1/2 <= g_X / g_P <= 2 (function space), or g_X > 0 and g_P >= g_X / 2
              (weight space: the reference still amplifies at least half as fast)
    stretch   ``first_run``: the first stretch of regime steps, at most 2 failing steps in a row
              inside it (once one pair stops growing like the other the shared regime is over,
              even if later both crawl at similar rates)

The first-steps transient. The first steps carry each change's one-step injection before the
shared dynamics take over: on the tiny recipe log10(E_X / E_P) sits near one level for a few
steps, moves for several more, then holds a plateau for the rest of the shared regime (bf16
flash vs bf16 vs fp32, batch 4, replicate 0: -0.04 over steps 1-8, then -0.17 from step 14 to
30). Read alone, each replicate's first stretch can be that early level in one replicate and the
plateau in another (batch 16: replicates' windows 1-5, 12-30 and 1-30, one replicate read at
-0.08 instead of its -0.33 plateau), which mixes two quantities. So the transient's end is found
from the data, where both pairs' local growth rates have settled alike, i.e. where the log ratio
stops moving for the rest of the shared regime:

    rest(t0)  = the regime steps from t0 to the end of the replicate's last regime stretch of at
                least ``min_window`` steps (a later coincidence of a few alike steps is not in it)
    settled_r = the first tracked step t0 >= start, with at least half of the replicate's
                pre-saturation steps at or after it, such that rest(t0) holds at least
                ``min_window`` steps and its log ratio (3-step running median) stays within
                SETTLED_BAND = 0.05 dex of its median; None if no t0 does
    t0        = max over replicates of settled_r (``common_start``): one first step for every
                replicate, each read past its own transient; start when none settles (a ratio
                that keeps moving is left to the verdict's drift test: "not dose-like")

Each replicate's window is then its first stretch from t0: one start for all, each ending where
its own shared regime ends (saturation, or rates no longer alike). The transient may take at
most half of the pre-saturation steps: a "transient" longer than that is a drift.

>>> ok = np.array([1, 0, 0, 0, 1, 1, 0, 1, 1, 0, 0, 0, 1, 1, 1, 1], dtype=bool)
>>> first_run(ok, 4).astype(int)
array([0, 0, 0, 0, 1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0])
"""

from __future__ import annotations

import numpy as np

from divergence.analysis.growth import ols_slope

RATE_FACTOR = 2.0  # local log-growth rates "alike": within this factor of each other
NEIGHBOURS = 2  # the local growth rate fits ln E over i-2..i+2
MAX_GAP = 2  # failing tracked steps in a row that a window stretch survives (see first_run)
SETTLED_BAND = 0.05  # dex: a log ratio within this of its plateau's median is past the transient


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


def alike(g_x: np.ndarray, g_p: np.ndarray, space: str) -> np.ndarray:
    """Steps where both pairs grow alike (see the module docstring), (T,) bool."""
    with np.errstate(invalid="ignore", divide="ignore"):
        if space == "function":
            return (g_x > 0) & (g_p > 0) & (g_x / g_p <= RATE_FACTOR) & (g_p / g_x <= RATE_FACTOR)
        return (g_x > 0) & (g_p >= g_x / RATE_FACTOR)


def first_run(ok: np.ndarray, min_length: int, max_gap: int = MAX_GAP) -> np.ndarray:
    """The steps of the first stretch of ``ok`` holding at least ``min_length`` True steps (else
    of the stretch holding the most), a stretch ending at more than ``max_gap`` False in a row.

    The shared exponential regime is one stretch of training: once a pair stops growing like the
    other (the larger dose leaves it first), a later step where both crawl at similar rates is
    not back in it. Up to ``max_gap`` failing steps inside a stretch (noise in a local rate) are
    left out of it without ending it.
    """
    stretches = _stretches(ok, max_gap)
    out = np.zeros(len(ok), dtype=bool)
    if stretches:
        chosen = next((c for c in stretches if len(c) >= min_length), max(stretches, key=len))
        out[chosen] = True
    return out


def drift(steps: np.ndarray, log_ratio: np.ndarray, keep: np.ndarray) -> float:
    """Change of the log ratio across the kept steps (dex), from its OLS fit: slope x length."""
    t = steps[keep].astype(float)
    return float(ols_slope(t, log_ratio[keep])) * (t[-1] - t[0]) if t.size >= 2 else float("nan")


def settle_step(
    steps: np.ndarray, log_ratio: np.ndarray, regime: np.ndarray, valid: np.ndarray, start: int, min_window: int
) -> int | None:
    """settled_r: the first step past this replicate's transient (module docstring), or None.

    ``regime``: the regime mask; ``valid``: steps with both E finite, > 0 and unsaturated."""
    stretches = _stretches(regime)
    long = [s for s in stretches if len(s) >= min_window]
    if not long:
        return None
    end = long[-1][-1]  # rest(t0) stops at the last long stretch's last step
    smooth = running_median(log_ratio, 3)
    candidates = np.flatnonzero((steps >= start) & valid)
    for i in candidates[: candidates.size // 2 + 1]:  # the transient takes at most the first half
        rest = np.flatnonzero(regime & (np.arange(len(steps)) >= i) & (np.arange(len(steps)) <= end))
        values = smooth[rest]
        if rest.size >= min_window and np.all(np.abs(values - np.median(values)) <= SETTLED_BAND):
            return int(steps[rest[0]])
    return None


def running_median(x: np.ndarray, k: int) -> np.ndarray:
    """The median of each value with its (k - 1) / 2 neighbours on either side (fewer at the ends),
    over the finite ones; NaN where a value is not finite."""
    x = np.where(np.isfinite(x), x, np.nan)
    half = k // 2
    out = np.full(len(x), np.nan)
    for i in np.flatnonzero(np.isfinite(x)):
        out[i] = np.nanmedian(x[max(0, i - half) : i + half + 1])
    return out


def _stretches(ok: np.ndarray, max_gap: int = MAX_GAP) -> list[list[int]]:
    """The stretches of ``ok`` (indices), split where more than ``max_gap`` steps in a row fail."""
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
    return stretches


def common_start(settled: list[int | None], start: int) -> int:
    """t0: the latest replicate's settled step (each replicate read past its own transient)."""
    known = [s for s in settled if s is not None]
    return max(known) if known else start
