"""The paired sample distance: RMS pixel difference of two arms' images from the same noises."""

import math

import pytest
import torch

from divergence.metrics.sample_distance import sample_distance


def test_the_same_pictures_are_at_0_and_a_known_difference_at_its_rms():
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(0, 200, (6, 8, 8, 3), generator=gen, dtype=torch.uint8)
    assert sample_distance(a, a) == {"value": 0.0, "lo": 0.0, "hi": 0.0, "images": 6}
    b = a.clone()
    b[..., 0] += 51  # one channel of three moved by 0.2: RMS 0.2 / sqrt(3) in every image
    d = sample_distance(a, b)
    assert d["value"] == pytest.approx(0.2 / math.sqrt(3)) and d["lo"] == pytest.approx(d["hi"])


def test_the_interval_brackets_the_mean_of_unequal_images():
    a = torch.zeros(20, 4, 4, 3, dtype=torch.uint8)
    b = a.clone()
    b[:10] = 255  # half the pairs differ everywhere: distance 1 for them, 0 for the rest
    d = sample_distance(a, b)
    assert d["value"] == pytest.approx(0.5) and 0.2 < d["lo"] < 0.5 < d["hi"] < 0.8


def test_stacks_of_other_shapes_are_refused():
    with pytest.raises(ValueError, match="images_a, images_b"):
        sample_distance(torch.zeros(2, 4, 4, 3, dtype=torch.uint8), torch.zeros(3, 4, 4, 3, dtype=torch.uint8))
