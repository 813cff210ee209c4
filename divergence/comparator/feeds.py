"""What one arm job has written so far: its status, its losses, its complete checkpoints.

The comparator only ever takes a checkpoint that is complete: the exact name
``step_NNNNNN.safetensors`` (the arm writes under a hidden temporary name and renames), a
header that parses, every tensor's bytes inside the file (a truncated file fails this), and
metadata naming the step asked for. Anything else is "not there yet" and is looked at again
at the next poll.
"""

from __future__ import annotations

from pathlib import Path

from divergence.checkpoints.safetensors_file import SafetensorsFile
from divergence.errors import CheckpointError
from divergence.store.arm_status import ArmStatus
from divergence.store.losses import LossFile
from divergence.training.weights import weights_path


class ArmFeed:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.loss_file = LossFile(self.folder)

    def status(self) -> ArmStatus | None:
        return ArmStatus.read(self.folder)

    def losses(self) -> dict[int, float]:
        return self.loss_file.read_new()

    def checkpoint(self, step: int) -> Path | None:
        """The complete weights file of ``step``, or None while it is missing or partial."""
        path = weights_path(self.folder / "checkpoints", step)
        try:
            written_step = SafetensorsFile(path).metadata.get("step")
        except (CheckpointError, OSError):
            return None
        return path if written_step in (None, str(step)) else None
