"""``Measurer``: every rank's part of ``divergence watch``: its share of a step's checkpoint pair.

Given the ``Task`` rank 0 planned (``comparator.task``), every rank opens the step's two weights
files and compares the tensors assigned to it (``comparator.distributed.compare_files``); the
records are gathered on rank 0, which gets the ``Comparison`` (or the error that kept the files
from being compared) and records the step (``comparator.planner.Planner.record``). The other
ranks get nothing back: they write nothing and decide nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from divergence.checkpoints.compare import Comparison
from divergence.comparator.distributed import compare_files
from divergence.comparator.ranks import Ranks
from divergence.comparator.task import Task
from divergence.errors import CheckpointError


@dataclass(frozen=True)
class Measurement:
    """Rank 0's result of a step: its ``comparison`` (None at an untracked step), or the ``error``
    that kept the two files from being compared. Off rank 0 both are None."""

    comparison: Comparison | None = None
    error: CheckpointError | None = None


class Measurer:
    def __init__(self, ranks: Ranks, device="cpu"):
        self.ranks, self.device = ranks, device

    def measure(self, task: Task) -> Measurement:
        """Compare ``task``'s two weights files on every rank (collective at a tracked step)."""
        if not task.tracked:
            return Measurement()
        try:
            comparison = compare_files(task.paths["a"], task.paths["b"], self.ranks, self.device, task.order)
        except CheckpointError as err:  # raised on rank 0 only
            return Measurement(error=err)
        return Measurement(comparison=comparison)
