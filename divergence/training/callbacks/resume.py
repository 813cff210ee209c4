"""Keep ``<dir>/last.ckpt`` (full training state) current: every N steps and at the end of training."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.callbacks import Callback

RESUME_NAME = "last.ckpt"


class ResumeCheckpoint(Callback):
    """``trainer.save_checkpoint`` is collective: every rank calls it, rank zero writes."""

    def __init__(self, directory: str | Path, every_n_steps: int):
        self.path, self.every = Path(directory) / RESUME_NAME, every_n_steps
        self._saved_step = -1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.every and trainer.global_step % self.every == 0:
            self._save(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._saved_step != trainer.global_step:
            self._save(trainer)

    def _save(self, trainer) -> None:
        trainer.save_checkpoint(self.path, weights_only=False)
        self._saved_step = trainer.global_step
