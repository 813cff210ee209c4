"""The arm's side of the pair-folder contract (``docs/pair-folder.md``): what one arm's writer keeps.

An arm trained as its own job (``ArmWriter``, ``ArmCheckpoints``, the transformers callback, the
built-in trainer's separate arm) leaves in its arm folder (``divergence.pairfolder.ArmFolder``):

- ``lock``: ``<arm>/writer.lock``, one writer per arm (``ArmLock``; ``PairLock`` for a writer of
  the whole pair; ``writer_alive``);
- ``steps``: the checks of the step rules (``check_step``, ``loss_value``, ``check_tensor_names``,
  ``tracked_with_stride``); the rules are stated once, in ``docs/pair-folder.md`` ("The step
  rules every arm writer checks");
- ``weights_file``, ``weights_dcp``: ``checkpoints/step_NNNNNN.safetensors`` or ``.dcp/``
  (``save_weights``, ``save_dcp``, ``completed``);
- ``losses``: ``losses.jsonl`` (``LossFile``); ``status``: ``status.json`` (``ArmStatus``);
- ``journal``: ``ArmJournal``, status, losses, the step order and the cut kept once for every
  arm writer, and the arm folder's records at a (re)start (``claim_arm_folder``: a re-run
  refused; ``drop_after``: a restart's cut).

The names below (``ArmWriter``'s) load on first use (importing the package loads neither torch nor a submodule).
"""

from __future__ import annotations

import importlib

_LAZY = {
    "ArmLock": "lock",
    "check_step": "steps",
    "check_loss": "steps",
    "check_stride": "steps",
    "loss_value": "steps",
    "tracked_with_stride": "steps",
    "save_weights": "weights_file",
    "save_dcp": "weights_dcp",
    "claim_arm_folder": "journal",
    "ArmJournal": "journal",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'divergence.pairfolder.arm' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
