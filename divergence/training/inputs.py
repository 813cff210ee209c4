"""The input side of a run, shared by every arm: data, tokenizer, codec and the forward process.

Everything an arm consumes at a step is computed here once, in fp32 and outside any arm's
autocast: the noisy latents ``x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps`` and the regression
target (``eps``, or ``v = sqrt(abar_t) eps - sqrt(1 - abar_t) x_0`` for v-prediction). Two arms fed
from one ``Inputs`` therefore differ only in what their own models compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from divergence.data import build_dataset
from divergence.data.batches import StepBatch, StepBatches, StepStream
from divergence.recipe.seeds import derive_seed
from divergence.models.build import build_noise_scheduler, build_vae, check_local_paths
from divergence.models.codec import LatentCodec
from divergence.models.tokenizers import build_tokenizer
from divergence.recipe.run import RunRecipe, latent_shape


@dataclass
class DiffusionInputs:
    """What an arm trains on at one step (on the arm's device)."""

    step: int
    noisy: torch.Tensor  # (B, C, h, w) float32: x_t
    timesteps: torch.Tensor  # (B,) int64
    input_ids: torch.Tensor  # (B, L) int64
    target: torch.Tensor  # (B, C, h, w) float32: eps or v


class Inputs:
    """Dataset, tokenizer, step batches, latent codec and training noise scheduler of a recipe."""

    def __init__(self, recipe: RunRecipe):
        self.recipe = recipe
        check_local_paths(recipe.model, recipe.data.source, recipe.data.path)
        self.tokenizer = build_tokenizer(recipe.model.tokenizer)
        vae = recipe.model.vae
        self.codec = LatentCodec(
            build_vae(vae, derive_seed(recipe.data.seed, "vae")) if vae is not None else None,
            vae.scaling_factor if vae is not None else 1.0,
        )
        self.noise_scheduler = build_noise_scheduler(recipe.noise)
        self.latent_shape = latent_shape(recipe)
        self.batches = StepBatches(
            build_dataset(recipe.data),
            self.tokenizer,
            recipe.data,
            recipe.train.batch_size,
            self.latent_shape,
            recipe.noise.num_train_timesteps,
            self.codec.latent_space,
            recipe.train.accumulate,
        )

    def stream(self, start: int, rank: int = 0, world_size: int = 1) -> StepStream:
        """Batches of steps ``start, start + 1, ...`` for a DataLoader."""
        return StepStream(self.batches, start, rank, world_size)

    def to(self, device: torch.device) -> "Inputs":
        self.codec.to(device)
        return self

    def prepare_step(self, batch: StepBatch) -> list[DiffusionInputs]:
        """The step's micro-batches (``train.accumulate`` of them), each encoded, noised and targeted."""
        count = self.recipe.train.accumulate
        return [self.prepare(batch.micro(index, count)) for index in range(count)]

    def prepare(self, batch: StepBatch) -> DiffusionInputs:
        """Encode, noise and target a batch already on the training device."""
        x0 = self.codec.encode(batch.pixels, batch.posterior)
        sched = self.noise_scheduler
        with torch.autocast(x0.device.type, enabled=False):
            noisy = sched.add_noise(x0, batch.noise, batch.timesteps)
            target = (
                batch.noise
                if sched.config.prediction_type == "epsilon"
                else (sched.get_velocity(x0, batch.noise, batch.timesteps))
            )
        return DiffusionInputs(batch.step, noisy, batch.timesteps, batch.input_ids, target)
