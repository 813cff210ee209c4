"""What one arm job has written so far: its status, its losses, its complete checkpoints.

The comparator only ever takes a checkpoint whose writer says it is complete: the exact name
``step_NNNNNN.safetensors``, metadata naming the step asked for, and the completion marker
``save_weights`` records in it (the data's length and CRC-32, see
``divergence.pairfolder.arm.weights_file``) matching the bytes there. A file being copied in, preallocated
at full size and then filled, or rewritten in place fails the marker and is "not there yet",
looked at again at the next poll; it is never read half-written. An arm written as DCP
(``step_NNNNNN.dcp/``) is taken once its ``complete.json`` is there (``pairfolder.arm.weights_dcp``). The identity of the file taken
(inode, size, mtime) is kept, so a file replaced while it was being compared is noticed.
"""

from __future__ import annotations

from pathlib import Path

from divergence.pairfolder.folder import as_arm_folder
from divergence.pairfolder.arm.weights_file import completed, identity
from divergence.pairfolder.arm.losses import LossFile


class ArmFeed:
    """An arm's folder (``arm_folder``), its losses read so far (``loss_file``) and its complete checkpoints."""

    def __init__(self, arm_dir: str | Path):
        self.arm_folder = as_arm_folder(arm_dir)
        self.loss_file = LossFile(self.arm_folder)

    def checkpoint(self, step: int) -> tuple[Path, tuple] | None:
        """The complete weights file (or DCP folder) of ``step`` and its identity, or None while it is not complete."""
        path = self.arm_folder.saved_weights(step)
        found = completed(path, step, self.arm_folder.arm)  # a DCP folder copied from the other arm: refused
        return None if found is None else (path, found)


def unchanged(path: str | Path, taken: tuple) -> bool:
    """``path`` is still the file taken (same inode, size and modification time)."""
    return identity(path) == tuple(taken)
