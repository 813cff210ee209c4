"""Where training leaves its numbers for analysis: the metrics store (and its export)."""

from divergence.store.metrics_store import FILENAME, MetricsStore

__all__ = ["FILENAME", "MetricsStore"]
