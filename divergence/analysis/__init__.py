"""The bounding analysis: pure functions from a pair run's records to trajectories, growth
rates with bootstrap intervals, ratios between pairs and the verdict.

Reads no files: ``divergence.report.inputs`` turns run folders into ``PairData``.
"""

from divergence.analysis.growth import Estimate, Ratio, compare_growth, estimate_growth, growth_rate, layer_mean, ols_slope
from divergence.analysis.layers import NoiseFloor, kind_table, noise_floor, top_layers
from divergence.analysis.study import Analysis, analyze, to_summary
from divergence.analysis.trajectories import METRIC_LABELS, METRICS, PairData, pair_from_records
from divergence.analysis.verdict import MIN_STEPS, Verdict, judge

__all__ = [
    "METRICS", "METRIC_LABELS", "MIN_STEPS", "Analysis", "Estimate", "NoiseFloor", "PairData", "Ratio", "Verdict",
    "analyze", "compare_growth", "estimate_growth", "growth_rate", "judge", "kind_table", "layer_mean", "noise_floor",
    "ols_slope", "pair_from_records", "to_summary", "top_layers",
]
