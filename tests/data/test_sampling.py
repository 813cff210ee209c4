"""Inputs are a pure function of (data seed, step, rank), and of nothing about the model."""

import dataclasses

import pytest
import torch

from divergence.data.batches import StepBatch
from divergence.data.sampling import batch_indices
from divergence.data.shapes import ShapesDataset
from divergence.training.inputs import Inputs
from tests.training.tiny import tiny_recipe


def _same(a: StepBatch, b: StepBatch) -> bool:
    return all(
        torch.equal(getattr(a, f.name), getattr(b, f.name))
        if isinstance(getattr(a, f.name), torch.Tensor)
        else getattr(a, f.name) == getattr(b, f.name)
        for f in dataclasses.fields(StepBatch)
    )


def test_each_epoch_visits_every_example_once():
    n, size = 12, 4
    seen = [i for step in range(6) for i in batch_indices(n, size, seed=1, step=step)]
    assert sorted(seen[:n]) == list(range(n)) and sorted(seen[n:]) == list(range(n))
    assert seen[:n] != seen[n:]  # a fresh order each epoch


def test_ranks_split_the_global_batch():
    n, size, world = 64, 4, 2
    for step in range(3):
        a = batch_indices(n, size, 0, step, rank=0, world_size=world)
        b = batch_indices(n, size, 0, step, rank=1, world_size=world)
        assert not set(a) & set(b)


def test_order_depends_on_the_seed_only():
    assert batch_indices(100, 8, 3, 5) == batch_indices(100, 8, 3, 5)
    assert batch_indices(100, 8, 3, 5) != batch_indices(100, 8, 4, 5)


@pytest.mark.parametrize("variant", ["model.seed=7", "train.precision=bf16-mixed", "attention.name=baseline"])
def test_batches_ignore_model_seed_precision_and_attention(variant):
    base, other = Inputs(tiny_recipe()), Inputs(tiny_recipe(variant))
    for step in (0, 3):
        assert _same(base.batches.batch(step), other.batches.batch(step))


def test_batches_differ_by_step_rank_and_data_seed():
    a, b = Inputs(tiny_recipe()), Inputs(tiny_recipe("data.seed=1"))
    x = a.batches.batch(0)
    assert not torch.equal(x.noise, a.batches.batch(1).noise)
    assert not torch.equal(x.noise, a.batches.batch(0, rank=1, world_size=2).noise)
    assert not torch.equal(x.noise, b.batches.batch(0).noise)


def test_batch_shapes_and_ranges():
    recipe = tiny_recipe()
    batch = Inputs(recipe).batches.batch(0)
    assert batch.pixels.shape == (2, 3, 32, 32) and batch.pixels.dtype == torch.float32
    assert -1.0 <= batch.pixels.min() and batch.pixels.max() <= 1.0
    assert batch.input_ids.shape == (2, recipe.model.tokenizer.max_length)
    assert batch.noise.shape == (2, 3, 32, 32)
    assert 0 <= int(batch.timesteps.min()) and int(batch.timesteps.max()) < 1000
    assert batch.posterior is None


def test_shapes_are_rendered_from_seed_and_index():
    a, b = ShapesDataset(0, 10, 32), ShapesDataset(0, 10, 32)
    assert a[3][0].tobytes() == b[3][0].tobytes() and a[3][1] == b[3][1]
    assert ShapesDataset(1, 10, 32)[3][0].tobytes() != a[3][0].tobytes()


def test_captions_describe_the_picture():
    image, caption = next(
        (im, c)
        for im, c in (ShapesDataset(0, 200, 32)[i] for i in range(200))
        if c.startswith("a large red") and c.endswith("in the centre") and " and " not in c
    )
    r, g, b = image.getpixel((16, 16))
    assert r > 150 and g < 100 and b < 100, (caption, (r, g, b))


def test_loader_workers_serve_steps_in_order():
    inputs = Inputs(tiny_recipe())
    loader = torch.utils.data.DataLoader(inputs.stream(start=5), batch_size=None, num_workers=2)
    served = [b for b, _ in zip(loader, range(4))]
    assert [b.step for b in served] == [5, 6, 7, 8]
    assert all(_same(b, inputs.batches.batch(b.step)) for b in served)
