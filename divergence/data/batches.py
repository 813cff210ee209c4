"""The training batch of one step: images, token ids, noise and timesteps, from (seed, step).

``StepBatches(...).batch(step, rank, world_size)`` is a pure function. The step's *global
batch* holds ``G = batch_size x world_size x accumulate`` examples: their dataset indices come
from ``batch_indices`` (positions ``step G .. step G + G - 1`` of the run's epoch-wise order),
and every random draw (caption dropout, crops, flips, diffusion noise, timesteps, the VAE's
posterior sample) is made for all ``G`` examples from its own named ``step_generator`` stream,
seeded by (seed, stream, step) alone. Rank ``r`` takes examples ``[r n, (r + 1) n)`` with
``n = batch_size x accumulate``, and its micro-batch ``m`` is ``[m b, (m + 1) b)`` of those
(``StepBatch.micro``). So what a step trains on depends on the step only: one rank
accumulating 2 micro-batches sees the examples and draws that 2 ranks see, a pair of arms, a
resumed run and a run on another device see the same tensors. With one rank and no accumulation
the global batch is the rank's batch, drawn exactly as before accumulation existed (streams
seeded as rank 0's were).

Cost: each rank draws the noise of the whole global batch (``G x C x h x w`` normal numbers,
on the CPU) and, for the crop and flip draws, opens the images before its slice to learn their
sizes; it decodes and prepares only its own.

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
    pixels: torch.Tensor  # (B, 3, H, W) float32 in [-1, 1]
    input_ids: torch.Tensor  # (B, L) int64
    noise: torch.Tensor  # (B, C, h, w) float32: diffusion noise, shaped like what the UNet denoises
    timesteps: torch.Tensor  # (B,) int64 in [0, num_train_timesteps)
    posterior: torch.Tensor | None = None  # (B, C, h, w) float32: the VAE posterior sample's noise

    def micro(self, index: int, count: int) -> "StepBatch":
        """Micro-batch ``index`` of ``count`` equal parts (``train.accumulate``); the batch itself when 1."""
        if count == 1:
            return self
        size = self.pixels.shape[0] // count
        part = slice(index * size, (index + 1) * size)
        cut = {f.name: getattr(self, f.name) for f in fields(self)}
        return StepBatch(**{k: v[part] if isinstance(v, torch.Tensor) else v for k, v in cut.items()})

    def to(self, device: torch.device | str) -> "StepBatch":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[key] = value.to(device, non_blocking=True)
        return StepBatch(**moved)


class StepBatches:
    """Builds ``StepBatch`` for any step: ``dataset[i] -> (PIL image, caption)`` plus seeds.

    ``batch_size``: examples per micro-batch on one rank; ``accumulate``: micro-batches per step.
    """

    def __init__(
        self,
        dataset: Sequence[tuple[Image.Image, str]],
        tokenize: Callable[[list[str]], torch.Tensor],
        config: DataConfig,
        batch_size: int,
        latent_shape: tuple[int, int, int],
        num_train_timesteps: int,
        latent_space: bool,
        accumulate: int = 1,
    ):
        self.dataset, self.tokenize, self.config = dataset, tokenize, config
        self.batch_size, self.latent_shape, self.accumulate = batch_size, latent_shape, accumulate
        self.num_train_timesteps, self.latent_space = num_train_timesteps, latent_space

    def batch(self, step: int, rank: int = 0, world_size: int = 1) -> StepBatch:
        """Rank ``rank``'s ``batch_size x accumulate`` examples of the step's global batch."""
        cfg, size = self.config, self.batch_size * self.accumulate
        total, mine = size * world_size, slice(rank * size, (rank + 1) * size)
        gen = lambda stream: step_generator(cfg.seed, stream, step)  # noqa: E731  (rank 0's seeding)
        views = gen("views")
        for before in range(rank):  # the crop/flip draws of the examples before this rank's
            for index in batch_indices(len(self.dataset), size, cfg.seed, step, before, world_size):
                draw_view(self.dataset[index][0].size, cfg.resolution, views)
        images, captions = [], []
        for index in batch_indices(len(self.dataset), size, cfg.seed, step, rank, world_size):
            image, caption = self.dataset[index]
            images.append(_prepare(image, cfg.resolution, cfg.center_crop, cfg.random_flip, views))
            captions.append(caption)
        drop = (torch.rand(total, generator=gen("captions")) < cfg.caption_dropout)[mine]
        captions = ["" if d else c for c, d in zip(captions, drop.tolist())]
        shape = (total, *self.latent_shape)
        return StepBatch(
            step=step,
            pixels=torch.stack(images),
            input_ids=self.tokenize(captions),
            noise=_part(torch.randn(shape, generator=gen("noise")), mine),
            timesteps=torch.randint(0, self.num_train_timesteps, (total,), generator=gen("timesteps"))[mine],
            posterior=_part(torch.randn(shape, generator=gen("posterior")), mine) if self.latent_space else None,
        )


def _part(draws: torch.Tensor, part: slice) -> torch.Tensor:
    """This rank's rows of a global draw, not keeping the whole draw alive."""
    return draws if part.start == 0 and part.stop == draws.shape[0] else draws[part].clone()


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


def draw_view(size: tuple[int, int], side: int, gen: torch.Generator) -> tuple[list[float] | None, bool]:
    """The crop offsets (two uniforms, only for an image not already ``side x side``) and the
    flip coin of one example. Drawn whatever the settings, so one option does not shift another's
    stream; a rank replays them for the examples before its slice."""
    offsets = torch.rand(2, generator=gen).tolist() if tuple(size) != (side, side) else None
    return offsets, bool(torch.rand(1, generator=gen) < 0.5)


def _prepare(image: Image.Image, side: int, center_crop: bool, flip: bool, gen: torch.Generator) -> torch.Tensor:
    """Resize the short side to ``side``, crop a square, maybe flip: (3, side, side) in [-1, 1]."""
    offsets, do_flip = draw_view(image.size, side, gen)
    w, h = image.size
    if offsets is not None:
        scale = side / min(w, h)
        image = image.resize((max(side, round(w * scale)), max(side, round(h * scale))), Image.BILINEAR)
        w, h = image.size
        left, top = (
            ((w - side) // 2, (h - side) // 2)
            if center_crop
            else (int(offsets[0] * (w - side + 1)), int(offsets[1] * (h - side + 1)))
        )
        image = image.crop((left, top, left + side, top + side))
    if flip and do_flip:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    array = np.asarray(image, dtype=np.float32)  # (H, W, 3) in [0, 255]
    return torch.from_numpy(array).permute(2, 0, 1).div(127.5).sub(1.0).contiguous()
