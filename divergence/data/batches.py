"""The training batch of one step: images, token ids, noise and timesteps, from (seed, step, rank).

``StepBatches(...).batch(step)`` is a pure function: the examples come from
``batch_indices``, and every random draw (caption dropout, crops, flips, diffusion noise,
timesteps, the VAE's posterior sample) from its own named ``step_generator`` stream. A pair of
arms, a resumed run and a run on another device all see the same tensors at the same step.

``StepStream`` serves those batches to a DataLoader from a start step onwards, in order, also
with several worker processes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Sequence

import numpy as np
import torch
from PIL import Image

from divergence.data.sampling import batch_indices, step_generator
from divergence.recipe.run import DataConfig


@dataclass
class StepBatch:
    """Inputs of one step on one rank (CPU tensors until moved)."""

    step: int
    pixels: torch.Tensor      # (B, 3, H, W) float32 in [-1, 1]
    input_ids: torch.Tensor   # (B, L) int64
    noise: torch.Tensor       # (B, C, h, w) float32: diffusion noise, shaped like what the UNet denoises
    timesteps: torch.Tensor   # (B,) int64 in [0, num_train_timesteps)
    posterior: torch.Tensor | None = None  # (B, C, h, w) float32: the VAE posterior sample's noise

    def to(self, device: torch.device | str) -> "StepBatch":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[key] = value.to(device, non_blocking=True)
        return StepBatch(**moved)


class StepBatches:
    """Builds ``StepBatch`` for any step: ``dataset[i] -> (PIL image, caption)`` plus seeds."""

    def __init__(
        self,
        dataset: Sequence[tuple[Image.Image, str]],
        tokenize: Callable[[list[str]], torch.Tensor],
        config: DataConfig,
        batch_size: int,
        latent_shape: tuple[int, int, int],
        num_train_timesteps: int,
        latent_space: bool,
    ):
        self.dataset, self.tokenize, self.config = dataset, tokenize, config
        self.batch_size, self.latent_shape = batch_size, latent_shape
        self.num_train_timesteps, self.latent_space = num_train_timesteps, latent_space

    def batch(self, step: int, rank: int = 0, world_size: int = 1) -> StepBatch:
        cfg, size = self.config, self.batch_size
        indices = batch_indices(len(self.dataset), size, cfg.seed, step, rank, world_size)
        gen = lambda stream: step_generator(cfg.seed, stream, step, rank)  # noqa: E731
        views = gen("views")
        images, captions = [], []
        for index in indices:
            image, caption = self.dataset[index]
            images.append(_prepare(image, cfg.resolution, cfg.center_crop, cfg.random_flip, views))
            captions.append(caption)
        drop = torch.rand(size, generator=gen("captions")) < cfg.caption_dropout
        captions = ["" if d else c for c, d in zip(captions, drop.tolist())]
        shape = (size, *self.latent_shape)
        return StepBatch(
            step=step,
            pixels=torch.stack(images),
            input_ids=self.tokenize(captions),
            noise=torch.randn(shape, generator=gen("noise")),
            timesteps=torch.randint(0, self.num_train_timesteps, (size,), generator=gen("timesteps")),
            posterior=torch.randn(shape, generator=gen("posterior")) if self.latent_space else None,
        )


class StepStream(torch.utils.data.IterableDataset):
    """Batches of steps ``start, start+1, ...`` forever; worker ``w`` of ``W`` makes every W-th.

    A DataLoader reads its workers round-robin, so batches arrive in step order either way.
    """

    def __init__(self, batches: StepBatches, start: int, rank: int = 0, world_size: int = 1):
        super().__init__()
        self.batches, self.start, self.rank, self.world_size = batches, start, rank, world_size

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        step = self.start + worker
        while True:
            yield self.batches.batch(step, self.rank, self.world_size)
            step += workers


def _prepare(image: Image.Image, side: int, center_crop: bool, flip: bool, gen: torch.Generator) -> torch.Tensor:
    """Resize the short side to ``side``, crop a square, maybe flip: (3, side, side) in [-1, 1]."""
    w, h = image.size
    if (w, h) != (side, side):
        scale = side / min(w, h)
        image = image.resize((max(side, round(w * scale)), max(side, round(h * scale))), Image.BILINEAR)
        w, h = image.size
        # Draws happen whatever the settings so that one option does not shift another's stream.
        offsets = torch.rand(2, generator=gen).tolist()
        left, top = ((w - side) // 2, (h - side) // 2) if center_crop else (
            int(offsets[0] * (w - side + 1)), int(offsets[1] * (h - side + 1)))
        image = image.crop((left, top, left + side, top + side))
    do_flip = bool(torch.rand(1, generator=gen) < 0.5)
    if flip and do_flip:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    array = np.asarray(image, dtype=np.float32)  # (H, W, 3) in [0, 255]
    return torch.from_numpy(array).permute(2, 0, 1).div(127.5).sub(1.0).contiguous()
