"""Why no replicate has an unsaturated window: the one condition that failed, in words.

The window U_r (``analysis.dose``) holds the steps, from the first common step t0 on, that both
pairs tracked, before either saturates (E >= 0.1 E_S), where both local growth rates agree
(``window.alike``); it needs ``min_window`` of them. Read in that order, the first count under
``min_window`` is the cause:

    tracked    = #{t >= t0 tracked by both pairs}
    unsaturated = #{t in tracked, t < first saturated step}
    alike       = the longest stretch of unsaturated steps where both grow alike (n_window)

so "track earlier and densely" is said only when tracking is what is missing. When fewer than
``min_window`` steps lie between t0 and the first saturated step at all, no tracking can give a
window: what was measured is said instead (which pair's E reached which share of the seed pair's
E_S at which step, and whether the seed pair's arms started from the same weights, E_S(0) = 0,
with pairs not all recognized as a fine-tune: then its level is no ceiling, docs/method.md).
"""

from __future__ import annotations

import numpy as np

from divergence.analysis import every_step
from divergence.analysis.dose import SATURATED_E
from divergence.analysis.replicates import replicate_or_first
from divergence.analysis.window import RATE_FACTOR, local_rates


def why_no_window(study, reference, estimates, min_window: int, seeds=(), saturated: float = SATURATED_E) -> str:
    """The reason no replicate has a window: a reference that does not drift, a pair that does not
    grow, too few tracked steps, saturation before the window, or pairs that do not grow alike
    (``seeds``: the seed pair's replicates, whose level saturation is measured against;
    ``saturated``: the share of it that ends a window, ``SATURATED_E`` or a fine-tune's)."""
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
    best = max(estimates, key=lambda e: _tracked(e, unsaturated=True))
    unsaturated = _tracked(best, unsaturated=True)
    if unsaturated < min_window:
        start = best.window_start if best.window_start is not None else 0
        if best.saturated_at - start < min_window:  # every step before it tracked would still be too few
            return _saturated_at_once(study, reference, seeds, best, start, min_window, saturated)
        return (
            f"saturated before the window: a pair's difference reaches {saturated:g} of the seed pair's at step "
            f"{best.saturated_at}, leaving {unsaturated} tracked step(s) before it (need {min_window}): "
            f"track earlier and densely (every step from step {start} to step {best.saturated_at})"
        )
    longest = max((e.n_window for e in estimates), default=0)
    return (
        f"{x} and {p} do not grow alike: over {unsaturated} unsaturated tracked steps their local growth "
        f"rates agree (within {RATE_FACTOR:g}x) on at most {longest} in a row (need {min_window}), so their ratio "
        "is not a dose ratio: see the curves (does each pair's arms differ in its one change only?)"
    )


def crossing_text(estimates) -> str:
    """No window and valid steps on both sides of 0: no bound holds at every step either."""
    values = every_step.steps_of(estimates)
    if not values.size:
        return ""
    return (
        f"; nor does a bound hold at every valid step: log10(E_X/E_P) runs from {values.min():+.2f} "
        f"to {values.max():+.2f}"
    )


def why_valid_steps(study, reference, windows, min_window, seeds, level) -> str:
    """The caveat of a dose read on every valid step: why no growth-rate window was read."""
    head = "read on every valid step, as a bound, since "
    without = every_step.left_out(windows)
    if len(without) < len(windows):
        return head + f"replicate(s) {', '.join(map(str, without))} form no growth-rate window of {min_window} steps"
    return (
        head
        + "no replicate forms a growth-rate window: "
        + why_no_window(study, reference, windows, min_window, seeds, level)
    )


def _tracked(e, unsaturated: bool = False) -> int:
    """Steps both pairs tracked from the window's first step t0 on (``unsaturated``: of those, the steps
    before the first saturated one)."""
    steps = np.asarray(e.steps)
    keep = steps >= (e.window_start if e.window_start is not None else 0)
    if unsaturated and e.saturated_at is not None:
        keep &= steps < e.saturated_at
    return int(keep.sum())


def _saturated_at_once(study, reference, seeds, best, start: int, min_window: int, saturated: float) -> str:
    """Saturation closer to t0 than ``min_window`` steps: the measured E's, and the seed pair's start."""
    at = best.saturated_at
    seed, r = replicate_or_first(seeds, best.replicate), best.replicate
    e_s = _e_at(seed, at)
    shares = [(p.name, _e_at(p, at)) for p in (replicate_or_first(study, r), replicate_or_first(reference, r)) if p]
    name, e = max(shares, key=lambda s: s[1] if np.isfinite(s[1]) else -np.inf)
    text = (
        f"saturated at once: at step {at} {name}'s difference E = {e:.2g} is already {e / e_s:.2g} of the seed "
        f"pair {seed.name}'s (E_S = {e_s:.2g}; saturated is {saturated:g} of it), and only {at - start} step(s) "
        f"come before it from step {start} (need {min_window}), so no tracking gives a window"
    )
    if _e_at(seed, 0) == 0 and saturated == SATURATED_E:  # the seed pair starts equal, yet no fine-tune was recognized
        text += (
            f"; {seed.name}'s arms start from the same weights (E_S = 0 at step 0), so its level is no ceiling "
            "the other pairs approach, but not every pair's arms start equal and no pair.json records a start, so "
            'the pairs were not read as a fine-tune (docs/method.md, "Fine-tuning"): record the pretrained '
            "weights each pair starts from (ArmWriter(start=...)), or use a seed pair whose arms start from "
            "different initial weights when training from scratch"
        )
    return text


def _e_at(pair, step: int) -> float:
    """E of ``pair`` at ``step``; NaN when the pair is missing or did not track it."""
    if pair is None:
        return float("nan")
    where = np.flatnonzero(np.asarray(pair.steps) == step)
    return float(pair.rel_l2[where[0]]) if where.size else float("nan")
