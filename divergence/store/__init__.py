"""Where training leaves its numbers for analysis: the metrics store (and its export).

The readers and writers of ``metrics.jsonl``, ``<arm>/losses.jsonl`` and ``<arm>/status.json``;
their file names and the rest of the pair folder are ``divergence.pairfolder``'s (the contract,
``docs/pair-folder.md``), which re-exports these classes.
"""

from divergence.store.metrics_store import FILENAME, MetricsStore

__all__ = ["FILENAME", "MetricsStore"]
