"""Moved to ``divergence.tracking.spikes``; kept for old imports."""

from divergence.tracking.spikes import SpikeDetector  # noqa: F401
