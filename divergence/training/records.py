"""Moved to ``divergence.tracking.records``; kept for old imports."""

from divergence.tracking.records import (  # noqa: F401
    ARMS, SUMMARY_KEYS, comparison_records, divergence_records, is_tracked, loss_record,
)
