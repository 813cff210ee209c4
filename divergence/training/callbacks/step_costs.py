"""Write each step's per-arm costs (``ArmsModule.last_costs``) to ``costs.jsonl`` (see ``training.step_costs``)."""

from __future__ import annotations

from pathlib import Path

import lightning as L

from divergence.training.step_costs import append_costs, memory_kind


class StepCosts(L.Callback):
    """After every step, rank zero appends the arms' step time and peak memory to ``out/costs.jsonl``."""

    def __init__(self, out: Path):
        self.out = Path(out)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        costs = getattr(pl_module, "last_costs", None)
        if costs and trainer.is_global_zero:
            append_costs(self.out, trainer.global_step, memory_kind(pl_module.device), costs)
