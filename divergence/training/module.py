"""The LightningModule of a single run: one ``Arm`` trained on the recipe's step-indexed batches.

Manual optimization: the arm does forward, backward (through ``manual_backward``), unscaling,
clipping and its optimizer and LR steps itself; the module then ticks one ``StepCounter`` so
Lightning's ``global_step`` counts batches. A pair module holds two arms the same way and calls
``inputs.prepare`` once per step for both.

The DataLoader serves ``StepBatch(step)`` starting at the restored ``global_step`` (Lightning
calls ``train_dataloader`` after restoring a checkpoint), and every batch is checked against
``global_step``: a resumed run sees exactly the inputs an uninterrupted one saw.
"""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader

from divergence.data.batches import StepBatch
from divergence.recipe.run import RunRecipe
from divergence.recipe.schema import to_dict
from divergence.training.arm import Arm, StepOutput
from divergence.training.inputs import Inputs
from divergence.training.optim import StepCounter

STATE_KEY = "divergence"


class DiffusionRun(L.LightningModule):
    """One text-to-image diffusion model trained from one recipe."""

    def __init__(self, recipe: RunRecipe, recorder=None):
        super().__init__()
        self.automatic_optimization = False
        self.recipe = recipe
        # The resolved recipe goes to every logger's config and into the .ckpt.
        self.save_hyperparameters(to_dict(recipe))
        self.inputs = Inputs(recipe)
        self.arm = Arm(recipe, self.inputs.tokenizer, name=recipe.name, recorder=recorder)

    def checkpoint_arms(self) -> dict[str, Arm]:
        """Arms by output prefix (weights go to ``<out>/<prefix>/checkpoints``)."""
        return {"": self.arm}

    def setup(self, stage: str) -> None:
        device = self.trainer.strategy.root_device
        self.arm.setup(device)
        self.inputs.to(device)

    def configure_optimizers(self):
        self.arm.configure_optimizers()
        return StepCounter()

    def train_dataloader(self) -> DataLoader:
        return step_dataloader(self.trainer, self.inputs, self.recipe.data.workers)

    def transfer_batch_to_device(self, batch: StepBatch, device: torch.device, dataloader_idx: int) -> StepBatch:
        return batch.to(device)

    def training_step(self, batch: StepBatch, batch_idx: int) -> torch.Tensor:
        check_step(batch, self.global_step)
        out = self.arm.training_step(self.inputs.prepare(batch), backward=self.manual_backward)
        self.optimizers().step()  # one tick of global_step (see StepCounter)
        self._log_step(out)
        return out.loss

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[STATE_KEY] = {"recipe": to_dict(self.recipe), "arms": {"": self.arm.train_state_dict()}}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.arm.load_train_state_dict(checkpoint[STATE_KEY]["arms"][""])

    def _log_step(self, out: StepOutput) -> None:
        self.log("train/loss", out.loss, prog_bar=True)
        self.log_dict({"train/grad_norm": out.grad_norm, "train/lr": out.lr, "train/loss_scale": out.loss_scale})
        if not torch.isfinite(out.loss) and self.arm.policy.name != "16-mixed":
            raise FloatingPointError(
                f"loss is {out.loss.item()} at step {self.global_step - 1}; lower train.lr or enable train.grad_clip"
            )


def step_dataloader(trainer, inputs: Inputs, workers: int) -> DataLoader:
    """Batches of steps ``global_step, global_step + 1, ...`` (Lightning calls ``train_dataloader``
    after restoring a checkpoint, so a resumed run starts at the right step)."""
    stream = inputs.stream(trainer.global_step, trainer.global_rank, trainer.world_size)
    return DataLoader(stream, batch_size=None, num_workers=workers, persistent_workers=workers > 0)


def check_step(batch: StepBatch, global_step: int) -> None:
    """The batch must be the one of the step being trained (a resume or loader bug otherwise)."""
    if batch.step != global_step:
        raise RuntimeError(f"data loader served the batch of step {batch.step} at global step {global_step}")
