"""Pure metric functions of tensors: no Lightning, wandb or file code lives here.

Every number divergence reports can be recomputed offline from two saved checkpoints
with these functions. Inputs are torch tensors (any device) or numpy arrays of any float
dtype; results are Python floats computed in float64 where the tensors live.
"""

from divergence.metrics.difference import cosine, max_abs_diff, mean_abs_diff, rel_l2, rms_diff
from divergence.metrics.grouping import (
    BUFFER_DTYPES,
    GROUPINGS,
    KINDS,
    aggregate,
    classify_kinds,
    is_buffer,
    module_of,
    summarize,
)
from divergence.metrics.pair import (
    METRIC_NAMES,
    TRAJECTORY_METRICS,
    comparable,
    compare_pairs,
    compare_tensors,
    count_nonfinite,
)
from divergence.metrics.wasserstein import wasserstein

METRICS = METRIC_NAMES  # the public name (divergence.METRICS) of the six metric names

__all__ = [
    "BUFFER_DTYPES",
    "GROUPINGS",
    "KINDS",
    "METRICS",
    "METRIC_NAMES",
    "TRAJECTORY_METRICS",
    "aggregate",
    "classify_kinds",
    "comparable",
    "compare_pairs",
    "compare_tensors",
    "cosine",
    "count_nonfinite",
    "is_buffer",
    "max_abs_diff",
    "mean_abs_diff",
    "module_of",
    "rel_l2",
    "rms_diff",
    "summarize",
    "wasserstein",
]
