"""Write every arm's weights-only safetensors at step 0, every N steps and at the end."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.callbacks import Callback

from divergence.recipe.schema import to_dict
from divergence.pairfolder.weights_file import save_weights, weights_path


class WeightCheckpoint(Callback):
    """Saves each arm of ``pl_module.checkpoint_arms()`` (``{prefix: Arm}``) to ``root/prefix/checkpoints``.

    Steps are counted in completed optimizer steps: ``step_000000`` holds the initial weights.
    Only global rank zero writes; weights are plain tensors on every rank (not sharded).
    """

    def __init__(self, root: str | Path, every_n_steps: int):
        self.root, self.every = Path(root), every_n_steps

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.global_step == 0:
            self._save(trainer, pl_module, overwrite=False)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.every and trainer.global_step % self.every == 0:
            self._save(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._save(trainer, pl_module, overwrite=False)

    def _save(self, trainer, pl_module, overwrite: bool = True) -> None:
        if not trainer.is_global_zero:
            return
        step = trainer.global_step
        for folder, arm in pl_module.checkpoint_arms().items():
            path = weights_path(self.root / folder / "checkpoints", step)
            if overwrite or not path.exists():
                save_weights(path, arm.weights(), step=step, arm=arm.name, recipe=to_dict(arm.recipe))
