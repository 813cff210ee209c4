"""The outcome test: does the change move where training ends up, beyond seed-to-seed spread?

For a pair p and replicate r, with per-step losses l_a, l_b of the two arms on the same items,

    Delta_{p,r} = mean over the last 10% of steps of (l_a - l_b) / l_b

From the probe (``probe_loss_a``/``probe_loss_b`` at tracked steps, both arms evaluated on the
same probe set in the reference numerics) when the pairs recorded it; otherwise from the arms'
training losses (``loss_a``/``loss_b``, every step), which are on shared batches because both
arms of a pair read the same data order. The pair under study and the seed pair always use
the same source, so the margin is in the same units.

The margin: sigma_S = standard deviation of Delta over the seed pair's replicates (two
independently initialised models: a difference everyone accepts as "an equivalent model"),
m = factor * sigma_S (factor 0.5 by default, ``docs/method.md``). With a single seed replicate,
|Delta_S| stands in for sigma_S (a one-draw estimate of the spread; said as a caveat).

The test, decided on its own (``decide``), from the t interval [lo, hi] of Delta over replicates:

    within     -m < lo and hi < m         (the change leaves the outcome inside the margin)
    shifted    lo >= m or hi <= -m        (it moves the outcome beyond it; never hidden)
    undecided  otherwise, with the replicates that would decide at the observed mean and spread
               (``replicates_to_clear`` with gap | m - |mean| |), or with one replicate

A pair saturated at the end (``saturated_at_end``: phi >= 0.5 at its last tracked step in the
median replicate, past half way to a different-seed model) has outcome differences that are
seed-like by nature: its Delta is a draw of about sigma_S's size, and showing a mean under
0.5 sigma_S then takes ~20 replicates (``docs/method.md``). Its margin is the seed spread itself
(factor 1: "no larger than a seed change's") instead of half of it.
"""

from __future__ import annotations

import math

import numpy as np

from divergence.analysis.replicates import Pooled, replicates_to_clear
from divergence.analysis.trajectories import PairData

LAST_FRACTION = 0.1
MARGIN_FACTOR = 0.5
SATURATED_FACTOR = 1.0  # the margin of a pair saturated at the end: the seed spread itself
SATURATED_END = 0.5  # phi at the last tracked step from which a pair counts as saturated
OUTCOME_STATUSES = ("within", "shifted", "undecided")


def source(runs: list[PairData]) -> str:
    """ "probe" when every run recorded the probe losses, else "training"."""
    ok = all(
        np.isfinite(p.probe.get("probe_loss_a", np.zeros(0))).any()
        and np.isfinite(p.probe.get("probe_loss_b", np.zeros(0))).any()
        for p in runs
    )
    return "probe" if runs and ok else "training"


def delta(pair: PairData, where: str) -> float:
    """Delta_{p,r}: the mean relative loss difference over the last 10% of steps (NaN if none)."""
    if where == "probe":
        steps, a, b = pair.steps, pair.probe["probe_loss_a"], pair.probe["probe_loss_b"]
    else:
        steps, a, b = pair.loss_steps, pair.loss.get("a", np.zeros(0)), pair.loss.get("b", np.zeros(0))
    ok = np.isfinite(a) & np.isfinite(b) & (b != 0)
    if not ok.any():
        return math.nan
    steps, a, b = steps[ok], a[ok], b[ok]
    first, last = float(steps[0]), float(steps[-1])
    tail = steps >= last - LAST_FRACTION * (last - first)
    return float(np.mean((a[tail] - b[tail]) / b[tail]))


def margin(seed_runs: list[PairData], where: str, factor: float = MARGIN_FACTOR) -> tuple[float, str | None]:
    """(m, caveat): factor * sigma_S from the seed pair's replicates; NaN without a seed pair."""
    deltas = [d for d in (delta(p, where) for p in seed_runs) if math.isfinite(d)]
    if not deltas:
        return math.nan, None
    if len(deltas) == 1:
        return factor * abs(deltas[0]), (
            "one seed replicate: its |Delta| stands in for the seed-to-seed spread "
            "of the outcome, so the margin is rough; train more seed replicates"
        )
    return factor * float(np.std(deltas, ddof=1)), None


def saturated_at_end(phi_ends: list[float]) -> bool:
    """Whether the pair has saturated: the median over replicates of phi at its last tracked step
    (``phi_ends``; NaN where unknown) is at least ``SATURATED_END``."""
    known = [x for x in phi_ends if math.isfinite(x)]
    return bool(known) and float(np.median(known)) >= SATURATED_END


def decide(result: Pooled, m: float) -> tuple[str, int | None]:
    """(status, replicates that would decide) of the outcome interval against the margin ``m``."""
    if not (math.isfinite(m) and m > 0 and math.isfinite(result.mean)) or not result.interval:
        return "undecided", None
    if -m < result.lo and result.hi < m:
        return "within", None
    if result.lo >= m or result.hi <= -m:
        return "shifted", None
    return "undecided", replicates_to_clear(result, abs(m - abs(result.mean)))
