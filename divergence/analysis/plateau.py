"""Where a run has converged: the step from which its curve stays within its noise of the final value.

For the seed pair's arms of a consequence run (``study.consequence_runs.seed_pair_series``), each
series x_k(t) (one arm's score, or its probe loss) is read at the steps every arm has. The mean
curve m(t) = mean_k x_k(t) is compared with its final value m(T); the noise is the arms' spread at
the end, s = standard deviation over k of x_k(T) (ddof 1): how far two seeds' finished models lie
apart. The plateau step is the first t from which every later |m(t') - m(T)| <= s. A curve still
moving by more than a seed's spread at its last steps has plateaued only at T itself, which says
so: ``plateau_step == final step`` with ``steps_within`` 1.
"""

from __future__ import annotations

import math

import numpy as np


def plateau(series: dict[str, dict[int, float]]) -> dict:
    """``{"steps", "mean", "spread", "final", "plateau_step", "steps_within", "arms"}`` of ``series``
    (arm -> {step: value}); ``plateau_step`` None with fewer than two arms or no common step."""
    arms = [s for s in series.values() if s]
    common = sorted(set.intersection(*(set(s) for s in arms))) if arms else []
    empty = {"steps": common, "mean": [], "spread": None, "final": None, "plateau_step": None, "steps_within": 0}
    if len(arms) < 2 or not common:
        return {**empty, "arms": len(arms)}
    values = np.array([[s[t] for t in common] for s in arms])  # (arms, steps)
    mean = values.mean(axis=0)
    spread = float(np.std(values[:, -1], ddof=1))
    within = np.abs(mean - mean[-1]) <= spread
    first = len(common) - 1
    while first > 0 and within[first - 1]:
        first -= 1
    return {
        "steps": common,
        "mean": [float(x) for x in mean],
        "spread": spread if math.isfinite(spread) else None,
        "final": float(mean[-1]),
        "plateau_step": common[first],
        "steps_within": len(common) - first,
        "arms": len(arms),
    }


def sentence(score: dict, probe: dict, steps: int) -> str:
    """When the seed pair's score and probe loss stopped moving, in words."""

    def part(what: str, p: dict, fmt) -> str:
        if p["plateau_step"] is None:
            return f"the {what} has too few arms or steps to tell"
        at = p["plateau_step"]
        still = " (still moving at its last steps)" if at == p["steps"][-1] else ""
        return f"the {what} by step {at}{still}: final {fmt(p['final'])}, seed spread {fmt(p['spread'])}"

    def pct(x):
        return "unknown" if x is None else f"{100 * x:.1f}%"

    def loss(x):
        return "unknown" if x is None else f"{x:.4f}"

    return (
        f"Convergence, from the seed pair's arms over their {steps} steps (within the arms' spread of the final "
        f"value from then on): {part('score', score, pct)}; {part('probe loss', probe, loss)}."
    )
