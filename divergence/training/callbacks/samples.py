"""Sample a grid of images for the recipe's fixed prompts every N steps and at the end of training.

Each arm's grid goes to ``root/<prefix>/samples/step_NNNNNN.png`` (one row per prompt) and to the
loggers that take images (wandb, TensorBoard). Sampling draws its noise from its own seeded
generator and touches no training state, so it never changes what training computes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

from divergence.models.sampling import generate, image_grid
from divergence.pairfolder.folder import RunFolder
from divergence.recipe.run import SampleConfig


class SampleGrid(Callback):
    def __init__(
        self,
        root: str | Path,
        config: SampleConfig,
        *,
        arms: Callable[[object], dict],
        inputs: Callable[[object], object],
    ):
        """``arms(pl_module)``: ``{folder prefix: Arm}`` to sample; ``inputs(pl_module)``: the shared
        ``divergence.training.inputs.Inputs`` (tokenizer, codec, noise scheduler)."""
        self.root, self.config, self.arms, self.inputs = Path(root), config, arms, inputs
        self._sampled_step = -1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.config.every and trainer.global_step % self.config.every == 0:
            self._sample(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._sampled_step != trainer.global_step:
            self._sample(trainer, pl_module)

    def _sample(self, trainer, pl_module) -> None:
        self._sampled_step = step = trainer.global_step
        if not trainer.is_global_zero:
            return
        inputs = self.inputs(pl_module)
        decode = inputs.codec.decode if inputs.codec.latent_space else None
        for prefix, arm in self.arms(pl_module).items():
            images = generate(
                arm.unet,
                arm.text_encoder,
                inputs.tokenizer,
                inputs.noise_scheduler,
                self.config,
                inputs.latent_shape,
                decode=decode,
                autocast=arm.policy.autocast,
            )
            grid = image_grid(images, self.config.per_prompt)
            path = RunFolder(self.root / prefix).samples_dir / f"step_{step:06d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            grid.save(path)
            self._log(trainer, f"samples/{arm.name}", grid, step)

    def _log(self, trainer, key: str, grid, step: int) -> None:
        caption = " | ".join(self.config.prompts)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_image(key=key, images=[grid], step=step, caption=[caption])
            elif isinstance(logger, TensorBoardLogger):
                logger.experiment.add_image(key, np.asarray(grid), step, dataformats="HWC")
