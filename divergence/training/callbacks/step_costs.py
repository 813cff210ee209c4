"""Write each step's per-arm costs to ``costs.jsonl`` (see ``training.step_costs``)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import lightning as L

from divergence.pairfolder.folder import PairFolder, as_pair_folder
from divergence.training.step_costs import append_costs, memory_kind


class StepCosts(L.Callback):
    """After every step, rank zero appends the arms' step time and peak memory to ``out/costs.jsonl``."""

    def __init__(self, pair_folder: PairFolder | Path, costs: Callable[[L.LightningModule], dict | None]):
        self.pair_folder = as_pair_folder(pair_folder)
        self.costs = costs  # the module's last step's {arm: {"seconds", "peak_bytes"}}, or None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        costs = self.costs(pl_module)
        if costs and trainer.is_global_zero:
            append_costs(self.pair_folder.costs, trainer.global_step, memory_kind(pl_module.device), arms=costs)


class RankCosts(L.Callback):
    """After every step, every rank appends its own step time and peak memory to ``path(rank)``
    (an arm job's ``costs.rank<R>.jsonl``; ``divergence.training.step_costs.merge_rank_costs``)."""

    def __init__(self, path: Callable[[int], Path], costs: Callable[[L.LightningModule], dict | None]):
        self.path = path
        self.costs = costs  # the module's last step's {arm: {"seconds", "peak_bytes"}} on this rank

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        costs = self.costs(pl_module)
        if costs:
            (cost,) = costs.values()
            append_costs(self.path(trainer.global_rank), trainer.global_step, memory_kind(pl_module.device), **cost)
