"""The files of a pair folder that grow step by step, read and written safely (the contract's names
and formats are ``divergence.pairfolder``'s, ``docs/pair-folder.md``):

- ``metrics_store``: ``metrics.jsonl``, committed step blocks (``MetricsStore``);
- ``losses``, ``arm_status``: an arm's ``losses.jsonl`` and ``status.json`` (``LossFile``, ``ArmStatus``);
- ``arm_records``: an arm folder's records at a (re)start (a re-run refused, a restart's cut);
- ``jsonl``: the torn-line and duplicate rules all three JSONL files share; ``repair``, ``export``.
"""

from divergence.store.metrics_store import MetricsStore

__all__ = ["MetricsStore"]
