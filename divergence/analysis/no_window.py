"""Why no replicate has an unsaturated window: the one condition that failed, in words.

The window U_r (``analysis.dose``) holds the steps, from the first common step t0 on, that both
pairs tracked, before either saturates (E >= 0.1 E_S), where both local growth rates agree
(``window.alike``); it needs ``min_window`` of them. Read in that order, the first count under
``min_window`` is the cause:

    tracked    = #{t >= t0 tracked by both pairs}
    unsaturated = #{t in tracked, t < first saturated step}
    alike       = the longest stretch of unsaturated steps where both grow alike (n_window)

so "track earlier and densely" is said only when tracking is what is missing.
"""

from __future__ import annotations

import numpy as np

from divergence.analysis.window import RATE_FACTOR, local_rates


def why_no_window(study, reference, estimates, min_window: int) -> str:
    """The reason no replicate has a window: a reference that does not drift, a pair that does not
    grow, too few tracked steps, saturation before the window, or pairs that do not grow alike."""
    if not any(np.any(np.isfinite(p.rel_l2) & (p.rel_l2 > 0)) for p in reference):
        return (
            f"{reference[0].name}'s difference is zero (or missing) at every tracked step, so it cannot serve "
            "as the yardstick: check that its arms differ in precision"
        )
    rates = np.concatenate([local_rates(p.steps, p.rel_l2) for p in study]) if study else np.zeros(0)
    rates = rates[np.isfinite(rates)]
    if rates.size and np.median(rates) <= 0:
        return (
            f"{study[0].name}'s difference does not grow over training (constant or shrinking), unlike a "
            "perturbation that training amplifies: there is no dose ratio to read; see the curves"
        )
    x, p = study[0].name, reference[0].name
    tracked = max((_tracked(e) for e in estimates), default=0)
    if tracked < min_window:
        return (
            f"too few tracked steps: {x} and {p} share {tracked} tracked step(s) in the window's range (need "
            f"{min_window}): track earlier and densely (every step in the first tens of steps)"
        )
    best = max(estimates, key=_unsaturated)
    if _unsaturated(best) < min_window:
        return (
            f"saturated before the window: a pair's difference reaches 0.1 of the seed pair's at step "
            f"{best.saturated_at}, leaving {_unsaturated(best)} tracked step(s) before it (need {min_window}): "
            f"track earlier and densely (every step before step {best.saturated_at})"
        )
    longest = max((e.n_window for e in estimates), default=0)
    return (
        f"{x} and {p} do not grow alike: over {_unsaturated(best)} unsaturated tracked steps their local growth "
        f"rates agree (within {RATE_FACTOR:g}x) on at most {longest} in a row (need {min_window}), so their ratio "
        "is not a dose ratio: see the curves (does each pair's arms differ in its one change only?)"
    )


def _tracked(e) -> int:
    """Steps both pairs tracked from the window's first step t0 on."""
    start = e.window_start if e.window_start is not None else 0
    return int(np.sum(np.asarray(e.steps) >= start))


def _unsaturated(e) -> int:
    """Of those, the steps before the first saturated one."""
    start = e.window_start if e.window_start is not None else 0
    steps = np.asarray(e.steps)
    before = steps < e.saturated_at if e.saturated_at is not None else np.ones(len(steps), dtype=bool)
    return int(np.sum((steps >= start) & before))
