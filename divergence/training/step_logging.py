"""Moved to ``divergence.tracking.step_logging``; kept for old imports."""

from divergence.tracking.step_logging import (  # noqa: F401
    KIND_METRICS, LOSS_KEYS, PROBE_KEYS, STEP_KEY, TABLE_COLUMNS, TOP_K, define_keys, is_table_step, log_at_step,
    log_step, module_rows, step_metrics, summary_of,
)
