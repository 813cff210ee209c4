"""The bounding analysis: pure functions from pair runs' records to a dose ratio per replicate,
pooled over replicates, the outcome test, and the verdict (``docs/method.md``).

Reads no files: ``divergence.report.inputs`` turns run folders into ``PairData``.
"""

from divergence.analysis.dose import MIN_WINDOW, WindowEstimate, estimate, local_rates
from divergence.analysis.growth import (
    Estimate,
    estimate_growth,
    growth_rate,
    layer_mean,
    ols_slope,
)
from divergence.analysis.layers import NoiseFloor, kind_table, noise_floor, top_layers
from divergence.analysis.replicates import Pooled, group, pool
from divergence.analysis.summary import Analysis, analyze, to_summary
from divergence.analysis.trajectories import METRIC_LABELS, PROBE_KEYS, TRAJECTORY_METRICS, PairData, pair_from_records
from divergence.analysis.verdict import STATUSES, Verdict, judge

__all__ = [
    "METRIC_LABELS",
    "MIN_WINDOW",
    "PROBE_KEYS",
    "STATUSES",
    "TRAJECTORY_METRICS",
    "Analysis",
    "Estimate",
    "NoiseFloor",
    "PairData",
    "Pooled",
    "Verdict",
    "WindowEstimate",
    "analyze",
    "estimate",
    "estimate_growth",
    "group",
    "growth_rate",
    "judge",
    "kind_table",
    "layer_mean",
    "local_rates",
    "noise_floor",
    "ols_slope",
    "pair_from_records",
    "pool",
    "to_summary",
    "top_layers",
]
