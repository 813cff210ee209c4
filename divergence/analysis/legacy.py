"""The first verdict's statistic, kept for the report's appendix only: ratios of growth rates.

rho = g_X / g_ref, the ratio of OLS slopes of the raw weight metric over [0, H] (``growth``),
against each precision and seed pair, read on the lowest replicate of each. It depends on the
horizon H by construction (``docs/method.md``, "Why not a ratio of slopes": it mixes the
dose ratio with where each curve sits on its exponential, then crosses 1 once the reference
saturates), so the verdict does not use it.
"""

from __future__ import annotations

from divergence.analysis.growth import N_BOOT, Ratio, compare_growth
from divergence.analysis.trajectories import TRAJECTORY_METRICS, PairData

NOTE = (
    "horizon-dependent: a ratio of slopes of the raw metric over the whole run; it drifts with the number "
    "of steps trained and is not used by the verdict"
)


def legacy_ratios(study: PairData, references: list[PairData], n_boot: int = N_BOOT, seed: int = 0) -> list[Ratio]:
    """rho of ``study`` against every reference, by every metric (empty where a pair has no layers)."""
    return [
        compare_growth(study, r, m, n_boot, seed)
        for m in TRAJECTORY_METRICS
        for r in references
        if study.layers and r.layers
    ]


def ratio_dict(r: Ratio) -> dict:
    return {
        "reference": r.reference,
        "metric": r.metric,
        "ratio": r.estimate.value,
        "lo": r.estimate.lo,
        "hi": r.estimate.hi,
        "study_rate": r.study_rate,
        "reference_rate": r.reference_rate,
        "reference_growing": r.reference_growing,
        "steps": r.estimate.n_steps,
        "layers": r.estimate.n_layers,
    }
