"""The metrics store of a pair folder, read and written safely (the contract's names and formats are
``divergence.pairfolder``'s, ``docs/pair-folder.md``; an arm's own files are ``divergence.pairfolder.arm``):

- ``metrics_store``: ``metrics.jsonl``, committed step blocks (``MetricsStore``);
- ``repair``: a store cut back to its committed steps; ``export``: the store as CSV or Parquet.
"""

from divergence.store.metrics_store import MetricsStore

__all__ = ["MetricsStore"]
