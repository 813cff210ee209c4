"""Where a reading is read: the growth-rate window, or every valid step (``docs/method.md``, "Which
reading applies when").

The window U_r (``dose``, ``window``) asks for a shared exponential regime: both pairs' local
growth rates alike for ``min_window`` steps. That is the from-scratch regime the dose ratio was
made for, where the ratio of two differences is a constant to estimate. Where no such regime
forms (a fine-tune, in which nothing amplifies exponentially and both differences creep at rates
whose ratio says nothing; doses dex apart; a bug that saturates early), the curves may still
answer plainly: log10(E_X / E_ref) on the same side of the line at every step. So a replicate is
also read over its valid steps

    V_r = {t >= start: E_X, E_ref > 0 and finite, before either pair saturates}  (``on_valid_steps``)

(at least ``min_window`` of them; start = max(10, warm-up) with LR warm-up, else 1, the window's
earliest start: the first-steps transient that t0 skips matters to a plateau's level, not to a
statement that holds at each step, and a bug that saturates early has few steps to spare), and ``choose`` decides, for one reading against one line
(0 for the dose against low precision, ``REORDERING_DEX`` against a reordering):

    every replicate has a window                        -> "window" (the growth-rate criterion)
    else, every valid step of every replicate read on
      V_r on one side of the line, at least as many
      replicates as have a window                       -> "valid_steps", every replicate kept
    else, some replicates have a window                 -> "window", the others left out (counted)
    else                                                -> "valid_steps" (its steps cross the line:
                                                           no status holds at every step)

so a replicate whose valid steps all say the same is never dropped for want of a window. On the
valid steps the dose is a bound that holds at every step (``bound``): per replicate the largest
log10(E_X / E_P) over V_r when every step is below 0 ("at most 10^m of P's at every step"), the
smallest when every step is above 0, pooled over replicates with the t interval.

>>> side(np.array([-4.1, -3.9]), 0.0), side(np.array([0.2, 1.4]), 1.0), side(np.array([1.2, 1.4]), 1.0)
('below', None, 'above')
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from divergence.analysis.dose import WindowEstimate
from divergence.analysis.replicates import Pooled
from divergence.analysis.window import drift

READ_ON = ("window", "valid_steps")


def method_text() -> str:
    """The report's Method paragraph on which reading applies when, rendered from the constants."""
    from divergence.analysis.dose import MIN_WINDOW
    from divergence.analysis.window import RATE_FACTOR

    return (
        "Which reading: the unsaturated window (local growth rates within a factor "
        f"{RATE_FACTOR:g}, at least {MIN_WINDOW} steps) is the from-scratch regime the dose ratio is made for. Where "
        "a replicate forms none (a fine-tune, where nothing amplifies exponentially; doses far apart; early "
        "saturation), every replicate is read over its valid steps (both E > 0 and finite, unsaturated, at least "
        f"{MIN_WINDOW} of them) when every one of them lies on one side of the line: the dose as a bound that holds "
        "at every valid step (per replicate the largest log10(E_X / E_P) there, pooled with the t interval: bounded "
        "when its upper end is below 0, 'at most 10^m of P's at every valid step'; the smallest, above 0: not "
        "bounded), the reordering as beyond or like at every valid step. Otherwise the replicates with a window are "
        "read on it and the others left out, counted in the sentence. The headline names the reading used."
    )


def on_valid_steps(e: WindowEstimate) -> WindowEstimate:
    """One replicate read over its valid steps V_r instead of a window: t >= start, the log ratio
    finite (both E > 0 and finite), before the first saturated step; ``log10`` the median there, NaN
    (not usable) with fewer than ``min_window`` of them."""
    steps = np.asarray(e.steps)
    first = e.start if e.start is not None else e.window_start
    keep = np.isfinite(e.log_ratio) & (steps >= (first or 0))
    if e.saturated_at is not None:
        keep &= steps < e.saturated_at
    n = int(keep.sum())
    span = (int(steps[keep][0]), int(steps[keep][-1])) if n else None
    if n < e.min_window:
        return replace(e, window=span, n_window=n, in_window=keep, log10=math.nan, drift=math.nan)
    median = float(np.median(e.log_ratio[keep]))
    return replace(e, window=span, n_window=n, in_window=keep, log10=median, drift=drift(steps, e.log_ratio, keep))


def side(values: np.ndarray, line: float) -> str | None:
    """``below`` when every value is at most ``line`` (strictly below when ``line`` is 0: a dose equal
    to the reference's is not less), ``above`` when every one is above it, None when they cross it."""
    values = np.asarray(values, dtype=float)
    if values.size and np.all(values > line):
        return "above"
    if values.size and np.all(values < line if line == 0 else values <= line):
        return "below"
    return None


def steps_of(estimates) -> np.ndarray:
    """The log ratios at every step read, over the usable replicates."""
    usable = [e for e in estimates if e.usable]
    return np.concatenate([e.log_ratio[e.in_window] for e in usable]) if usable else np.zeros(0)


def choose(windows: list[WindowEstimate], line: float) -> tuple[str, list[WindowEstimate]]:
    """(read_on, the replicates' estimates as read) for a reading against ``line`` (module docstring)."""
    windows = list(windows)
    if windows and all(e.usable for e in windows):
        return "window", windows
    valid = [on_valid_steps(e) for e in windows]
    n_valid, n_windows = sum(e.usable for e in valid), sum(e.usable for e in windows)
    if n_valid and n_valid >= n_windows and side(steps_of(valid), line) is not None:
        return "valid_steps", valid
    if n_windows:
        return "window", windows
    return "valid_steps", valid


def left_out(estimates) -> tuple[int, ...]:
    """The replicates a reading could not use (no window, or under ``min_window`` valid steps)."""
    return tuple(e.replicate for e in estimates if not e.usable)


def left_out_text(estimates, read_on: str) -> str:
    """``; 2 of 6 replicates left out (no window of 5 steps)``, or nothing when every replicate is read."""
    out = left_out(estimates)
    if not out or not estimates:
        return ""
    n = estimates[0].min_window
    why = f"no window of {n} steps" if read_on == "window" else f"under {n} valid steps"
    return f"; {len(out)} of {len(estimates)} replicates left out ({why})"


def bound(estimates: list[WindowEstimate], where: str) -> list[WindowEstimate]:
    """Each replicate read on its valid steps as a bound: its largest log ratio there when every step is
    below the line (``where`` ``below``), its smallest when above; the function-space twin is not read."""
    pick = np.max if where == "below" else np.min
    return [
        replace(e, log10=float(pick(e.log_ratio[e.in_window])), log10_function=math.nan) if e.usable else e
        for e in estimates
    ]


def bound_status(dose: Pooled, where: str) -> tuple[str, list[str]]:
    """The dose question on every valid step: every step below 0 and the pooled largest log ratio's
    interval below 0: bounded; every step above 0 and the smallest's interval above 0: not bounded."""
    lo, hi = (dose.lo, dose.hi) if dose.interval else (dose.mean, dose.mean)
    if where == "below" and hi < 0:
        return "bounded", []
    if where == "above" and lo > 0:
        return "not_bounded", []
    which = "largest" if where == "below" else "smallest"
    return "inconclusive", [
        f"every valid step lies {where} 0, but the interval of each replicate's {which} log10(E_X/E_P) "
        f"({lo:+.2f} to {hi:+.2f} dex) holds 0"
    ]


def spans_text(estimates, one: str = "valid steps", each: str = "valid steps") -> str:
    """``valid steps 1-30 in every replicate`` or each usable replicate's span (``one``, ``each``: what
    one span shared by the replicates, or theirs one by one, is called: ``window steps``, ``windows steps``)."""
    spans = [e.window for e in estimates if e.usable and e.window]
    if not spans:
        return f"no {one}"
    if len(set(spans)) == 1:
        (first, last), every = spans[0], " in every replicate" if len(spans) > 1 else ""
        return f"{one} {first}-{last}{every}"
    return f"{each} " + ", ".join(f"{a}-{b}" for a, b in spans)
