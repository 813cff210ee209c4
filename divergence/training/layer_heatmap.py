"""Moved to ``divergence.tracking.layer_heatmap``; kept for old imports."""

from divergence.tracking.layer_heatmap import HEATMAP_METRICS, LayerHistory, heatmap_image  # noqa: F401
