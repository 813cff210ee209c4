"""The pair-folder contract (``docs/pair-folder.md``): what any training leaves behind for divergence.

One package owns every file name and format of a run, pair and arm folder:

- ``layout``: the file names (``PAIR_JSON``, ``METRICS``, ``LOSSES``, ``STATUS``, ``CHECKPOINTS``,
  ``weights_path``, ...) and the contract version ``CONTRACT``;
- ``pair_json``: ``pair.json`` (``PairInfo``, ``write_pair_files``, ``read_pair_json``);
- ``schedule``: what a reader follows a pair by (``read_schedule``: max_steps, tracking schedule);
- ``weights_file``: ``checkpoints/step_NNNNNN.safetensors`` (``save_weights``, ``completed``);
- the rules every arm writer shares: ``arm_steps`` (each step an integer, once, in order, within
  ``max_steps``; the loss a number; the same tensors at every tracked step; ``stride``),
  ``arm_records`` (a re-run refused, a restart's cut) and ``arm_lock`` (one writer per arm);
- the metrics store, ``losses.jsonl`` and ``status.json`` readers and writers live in
  ``divergence.store`` (``MetricsStore``, ``LossFile``, ``ArmStatus``), re-exported here.

Writers (``divergence.writers``, ``divergence.lightning``, the built-in trainer) and readers
(``divergence watch``, ``report``, ``export``) import this package; it imports neither.
"""

from __future__ import annotations

import importlib

from divergence.pairfolder.layout import (
    ARMS, ATTENTION, CHECKPOINTS, CONTRACT, LOSSES, METRICS, PAIR_JSON, PAIR_RECIPE, RUN_RECIPE, STATUS,
    WATCH_STATE, weights_name, weights_path,
)

_LAZY = {
    "PairInfo": "divergence.pairfolder.pair_json",
    "read_pair_json": "divergence.pairfolder.pair_json",
    "write_pair_files": "divergence.pairfolder.pair_json",
    "ensure_pair_files": "divergence.pairfolder.pair_json",
    "PairSchedule": "divergence.pairfolder.schedule",
    "read_schedule": "divergence.pairfolder.schedule",
    "save_weights": "divergence.pairfolder.weights_file",
    "MetricsStore": "divergence.store.metrics_store",
    "LossFile": "divergence.store.losses",
    "ArmStatus": "divergence.store.arm_status",
}

__all__ = ["ARMS", "ATTENTION", "CHECKPOINTS", "CONTRACT", "LOSSES", "METRICS", "PAIR_JSON", "PAIR_RECIPE",
           "RUN_RECIPE", "STATUS", "WATCH_STATE", "weights_name", "weights_path", *_LAZY]


def __getattr__(name: str):  # the readers and writers load on first use (no import cycle with store/)
    if name not in _LAZY:
        raise AttributeError(f"module 'divergence.pairfolder' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
