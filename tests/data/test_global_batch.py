"""The global batch (batch_size x world_size x accumulate) is a function of the step only."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from divergence.data.batches import StepBatch, _prepare
from divergence.data.sampling import batch_indices, step_generator
from divergence.training.inputs import Inputs
from tests.data.test_sampling import _same
from tests.training.tiny import tiny_recipe

TENSORS = ("pixels", "input_ids", "noise", "timesteps", "posterior")


@pytest.fixture
def odd_images(tmp_path):
    """Images of several sizes: random crops draw two offsets for some examples, none for others."""
    rng = np.random.default_rng(0)
    sizes = [(40, 32), (32, 48), (32, 32), (64, 40), (50, 50), (33, 70), (32, 32), (45, 32)]
    lines = []
    for i, (w, h) in enumerate(sizes):
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        lines.append(json.dumps({"file_name": f"{i}.png", "text": f"caption {i}"}))
    (tmp_path / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    return (
        "data.source=imagefolder",
        f"data.path={tmp_path}",
        "data.random_flip=true",
        "data.center_crop=false",
        "data.caption_dropout=0.5",
        "model.vae={block_out_channels: [8, 16], latent_channels: 4}",
    )


def _cat(batches: list[StepBatch]) -> StepBatch:
    parts = {k: torch.cat([getattr(b, k) for b in batches]) for k in TENSORS if getattr(batches[0], k) is not None}
    return StepBatch(step=batches[0].step, **parts)


def _old_batch(batches, step: int) -> StepBatch:
    """The batch of one rank as built before accumulation existed (rank 0's streams)."""
    cfg, size, dataset = batches.config, batches.batch_size, batches.dataset
    gen = lambda stream: step_generator(cfg.seed, stream, step, 0)  # noqa: E731
    views, images, captions = gen("views"), [], []
    for index in batch_indices(len(dataset), size, cfg.seed, step):
        image, caption = dataset[index]
        images.append(_prepare(image, cfg.resolution, cfg.center_crop, cfg.random_flip, views))
        captions.append(caption)
    drop = torch.rand(size, generator=gen("captions")) < cfg.caption_dropout
    shape = (size, *batches.latent_shape)
    return StepBatch(
        step,
        torch.stack(images),
        batches.tokenize(["" if d else c for c, d in zip(captions, drop)]),
        torch.randn(shape, generator=gen("noise")),
        torch.randint(0, batches.num_train_timesteps, (size,), generator=gen("timesteps")),
        torch.randn(shape, generator=gen("posterior")),
    )


def test_one_rank_accumulating_sees_what_several_ranks_see(odd_images):
    """(1 rank, accumulate 4) = (2 ranks, accumulate 2) = (4 ranks, accumulate 1), example for example."""
    split = {
        (world, k): Inputs(tiny_recipe(*odd_images, f"train.accumulate={k}")).batches
        for world, k in ((1, 4), (2, 2), (4, 1))
    }
    for step in range(3):
        whole = split[1, 4].batch(step)
        assert whole.pixels.shape[0] == 8
        for (world, _), batches in split.items():
            assert _same(_cat([batches.batch(step, rank, world) for rank in range(world)]), whole)
        micro = [split[2, 2].batch(step, 1, 2).micro(m, 2) for m in range(2)]
        assert _same(micro[1], split[4, 1].batch(step, 3, 4))  # rank 1's second micro-batch: examples 6, 7


def test_one_rank_without_accumulation_draws_as_before(odd_images):
    for overrides in (odd_images, ("data.random_flip=true", "data.center_crop=false", "data.caption_dropout=0.5")):
        batches = Inputs(tiny_recipe(*overrides, "train.batch_size=3")).batches
        for step in range(2):
            new, old = batches.batch(step), _old_batch(batches, step)
            assert all(torch.equal(getattr(new, k), getattr(old, k)) for k in TENSORS if getattr(new, k) is not None)


def test_micro_batches_partition_the_rank_batch():
    batch = Inputs(tiny_recipe("train.accumulate=3")).batches.batch(0)
    assert batch.pixels.shape[0] == 6 and batch.micro(0, 1) is batch
    assert _same(_cat([batch.micro(m, 3) for m in range(3)]), batch)
