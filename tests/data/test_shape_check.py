"""The shapes checker: the dataset's own images read at >= 99%, noise at chance, captions parsed."""

from collections import Counter

import numpy as np
import pytest
import torch

from divergence.data.shape_check import (
    NUM_CLASSES,
    chance_levels,
    evaluation_captions,
    parse_caption,
    read_attributes,
    score,
)
from divergence.data.shapes import ShapesDataset
from divergence.metrics.score_intervals import wilson_interval


def one_shape_images(seed: int, count: int, resolution: int) -> tuple[torch.Tensor, list[str]]:
    """The one-shape examples among the dataset's first ``count``: (N, H, W, 3) uint8 and captions."""
    dataset = ShapesDataset(seed, count, resolution)
    pairs = [(np.asarray(image), caption) for image, caption in (dataset[i] for i in range(count))]
    pairs = [(image, caption) for image, caption in pairs if " and " not in caption]
    return torch.from_numpy(np.stack([p[0] for p in pairs])), [p[1] for p in pairs]


@pytest.mark.parametrize(("seed", "count", "resolution"), [(0, 900, 32), (7, 150, 64), (3, 900, 16)])
def test_the_datasets_own_images_score_at_least_99_percent(seed, count, resolution):
    images, captions = one_shape_images(seed, count, resolution)
    assert len(captions) > count // 2
    hits = score(images, captions)
    rates = {name: float(value.float().mean()) for name, value in hits.items()}
    assert set(rates) == {"colour", "shape", "position", "object", "all"}
    assert all(rate >= 0.99 for rate in rates.values()), rates


def test_images_under_other_captions_score_far_below():
    """The checker reads the image, not the caption: shifting the captions by one drops every score."""
    images, captions = one_shape_images(0, 300, 32)
    hits = score(images, captions[1:] + captions[:1])
    assert all(float(value.float().mean()) < 0.5 for value in hits.values())


@pytest.mark.parametrize("kind", ["uniform", "gaussian"])
def test_pure_noise_scores_at_chance(kind):
    """Noise under the balanced evaluation captions (each 5 times): every attribute's hit rate has
    chance (1 / classes) inside its Wilson interval at 99.9%."""
    captions = evaluation_captions() * 5
    gen = torch.Generator().manual_seed(0)
    shape = (len(captions), 32, 32, 3)
    if kind == "uniform":
        images = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
    else:  # what an untrained pixel-space sampler returns: N(0, 1) clamped to [-1, 1], as uint8
        images = ((torch.randn(shape, generator=gen).clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    hits = score(images, captions)
    for name, chance in chance_levels().items():
        low, high = wilson_interval(int(hits[name].sum()), len(captions), confidence=0.999)
        assert low <= chance <= high, (name, float(hits[name].float().mean()), chance)


def test_the_chance_levels_and_the_balanced_caption_set():
    levels = chance_levels()
    assert levels == pytest.approx(
        {"colour": 1 / 6, "shape": 1 / 3, "position": 1 / 9, "object": 1 / 18, "all": 1 / 162}
    )
    captions = evaluation_captions()
    assert len(captions) == len(set(captions)) == 324
    scenes = [parse_caption(caption) for caption in captions]
    for name, classes in NUM_CLASSES.items():
        assert Counter(getattr(s, name) for s in scenes) == {c: 324 // classes for c in range(classes)}
    assert all(s.caption == c for s, c in zip(scenes, captions))


def test_a_caption_the_checker_cannot_read_is_refused_by_name():
    with pytest.raises(ValueError, match="a small red circle at the top and a large blue square at the left"):
        parse_caption("a small red circle at the top and a large blue square at the left")
    with pytest.raises(ValueError, match="images: expected"):
        read_attributes(torch.zeros(2, 32, 32, 3))


def test_a_blank_image_has_no_shape():
    images = torch.full((1, 32, 32, 3), 20, dtype=torch.uint8)
    assert {name: int(value) for name, value in read_attributes(images).items()} == {
        "colour": -1,
        "shape": -1,
        "position": -1,
    }


def test_max_shapes_1_renders_one_shape_and_2_renders_what_it_always_has():
    from divergence.data import build_dataset
    from divergence.errors import RecipeError
    from divergence.recipe.run import DataConfig

    two, one = ShapesDataset(3, 60, 16), build_dataset(DataConfig(seed=3, num_examples=60, resolution=16, max_shapes=1))
    captions = [two[i][1] for i in range(60)], [one[i][1] for i in range(60)]
    assert any(" and " in c for c in captions[0]) and not any(" and " in c for c in captions[1])
    # a one-shape example of the default is the same example at max_shapes 1: the count is drawn either way
    same = [i for i, c in enumerate(captions[0]) if " and " not in c]
    assert same and all(captions[1][i] == captions[0][i] for i in same)
    assert all(np.array_equal(np.asarray(one[i][0]), np.asarray(two[i][0])) for i in same[:5])
    with pytest.raises(RecipeError, match="max_shapes"):
        DataConfig(max_shapes=3)
