"""The pair-folder contract (``docs/pair-folder.md``): what any training leaves behind for divergence.

One package owns every file name and format of a run, pair and arm folder:

- ``layout``: the file names (``PAIR_FILE``, ``METRICS_FILE``, ``LOSSES_FILE``, ``STATUS_FILE``,
  ``CHECKPOINTS_DIR``, ``weights_name``, ...) and the contract version ``CONTRACT``;
- ``folder``: the pair folder as one object with its paths by name (``PairFolder``: ``pair_json``,
  ``metrics``, ``wandb_id``, ``resume_dir``, ...; ``PairFolder.arm(name)``, an ``ArmFolder``:
  ``losses``, ``status``, ``writer_lock``, ``weights(step)``), handed to every writer and reader;
- ``settings``: ``pair.json``'s ``tracking`` and ``log`` (``TrackingConfig``, ``LogConfig``) and
  the tracked-step rule ``is_tracked``;
- ``pair_json``: ``pair.json`` (``PairInfo``, ``write_pair_files``, ``read_pair_json``);
- ``schedule``: what a reader follows a pair by (``read_schedule``: max_steps, tracking schedule);
- ``jsonl``: the torn-line and duplicate rules every JSONL file of the folder shares;
- ``arm``: the arm's side, what one arm's writer keeps (its lock, the step rules' checks, the
  weights files, ``losses.jsonl``, ``status.json`` and a restart's cut, each listed in
  ``divergence.pairfolder.arm``; ``arm.journal.ArmJournal`` keeps them for every arm writer).

The metrics store (``MetricsStore``) sits one layer up in ``divergence.store``. Writers
(``divergence.writers``, ``divergence.lightning``, the built-in trainer) and readers
(``divergence watch``, ``report``, ``export``) import this package; it imports none of them,
nor the recipes (``divergence.recipe``) or the trainer (``divergence.training``).
"""

from __future__ import annotations

import importlib

from divergence.pairfolder.layout import (
    ARMS,
    ATTENTION_FILE,
    CHECKPOINTS_DIR,
    CONTRACT,
    LOSSES_FILE,
    METRICS_FILE,
    PAIR_FILE,
    PAIR_RECIPE_FILE,
    RUN_RECIPE_FILE,
    STATUS_FILE,
    WATCH_STATE_FILE,
    weights_name,
)
from divergence.pairfolder.folder import ArmFolder, PairFolder, RunFolder

_LAZY = {
    "PairInfo": "divergence.pairfolder.pair_json",
    "read_pair_json": "divergence.pairfolder.pair_json",
    "write_pair_files": "divergence.pairfolder.pair_json",
    "ensure_pair_files": "divergence.pairfolder.pair_json",
    "PairSchedule": "divergence.pairfolder.schedule",
    "read_schedule": "divergence.pairfolder.schedule",
    "save_weights": "divergence.pairfolder.arm.weights_file",
}

__all__ = [
    "ArmFolder",
    "PairFolder",
    "RunFolder",
    "ARMS",
    "ATTENTION_FILE",
    "CHECKPOINTS_DIR",
    "CONTRACT",
    "LOSSES_FILE",
    "METRICS_FILE",
    "PAIR_FILE",
    "PAIR_RECIPE_FILE",
    "RUN_RECIPE_FILE",
    "STATUS_FILE",
    "WATCH_STATE_FILE",
    "weights_name",
    *_LAZY,
]


def __getattr__(name: str):  # the readers and writers load on first use
    if name not in _LAZY:
        raise AttributeError(f"module 'divergence.pairfolder' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
