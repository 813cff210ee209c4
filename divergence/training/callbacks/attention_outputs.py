"""Attention-output deviation inside a training run: the paper's in-model comparison.

With the ``shadow`` attention variant, every attention call of an arm runs two kernels on the
identical query, key and value and returns the primary's output (so training is exactly the
primary's); the per-layer deviation ``|O_primary - O_secondary|`` accumulates in a
``ShadowRecorder``. Every ``every`` steps this callback drains the recorders and logs, per
layer, the max and mean absolute difference:

    attention/<arm>/max_abs_diff/<layer>, attention/<arm>/mean_abs_diff/<layer>   (<layer> key-safe:
                                                         down_blocks.0.attn1 -> down_blocks_0_attn1)
    attention/<arm>/max_abs_diff/all                     the max over layers

and appends one line per (step, arm, layer) to ``DIR/attention.jsonl``.
"""

from __future__ import annotations

import json
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from divergence.atomic import write_atomic
from divergence.pairfolder.folder import PairFolder
from divergence.pairfolder.folder import as_pair_folder
from divergence.loggers.step_logging import log_at_step
from divergence.loggers.wandb_mode import key_part


class AttentionOutputDeviation(Callback):
    def __init__(self, pair_folder: PairFolder | str | Path, recorders: dict, every: int):
        self.path = as_pair_folder(pair_folder).attention
        self.recorders, self.every = recorders, every

    def on_train_start(self, trainer, pl_module) -> None:
        """On resume at step G, drop lines after G: the run records those steps again."""
        if trainer.is_global_zero and self.path.is_file():
            kept = [
                line
                for line in self.path.read_text().splitlines(keepends=True)
                if line.endswith("\n") and json.loads(line)["step"] <= trainer.global_step
            ]
            write_atomic(self.path, "".join(kept))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step % self.every:
            return
        stats = {arm: recorder.drain() for arm, recorder in self.recorders.items()}
        if trainer.is_global_zero and any(stats.values()):
            self._write(step, stats)
            self._log(trainer, step, stats)

    def _write(self, step: int, stats: dict) -> None:
        lines = [
            json.dumps({"step": step, "arm": arm, "layer": layer, **values})
            for arm, layers in stats.items()
            for layer, values in layers.items()
        ]
        with open(self.path, "a") as f:
            f.write("\n".join(lines) + "\n")

    def _log(self, trainer, step: int, stats: dict) -> None:
        metrics = {}
        for arm, layers in stats.items():
            if not layers:
                continue
            for layer, values in layers.items():  # layer paths made key-safe: dots become _
                metrics[f"attention/{arm}/max_abs_diff/{key_part(layer)}"] = values["max_abs_diff"]
                metrics[f"attention/{arm}/mean_abs_diff/{key_part(layer)}"] = values["mean_abs_diff"]
            metrics[f"attention/{arm}/max_abs_diff/all"] = max(v["max_abs_diff"] for v in layers.values())
        for logger in trainer.loggers:
            log_at_step(logger, metrics, step)  # wandb: its step set, each key defined (summary max/last)
