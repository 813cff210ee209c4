"""Sampling a trained arm for the sample score: from a run or pair folder, each image from its own noise."""

import pytest
import torch
import yaml
from safetensors.torch import save_file

from divergence.config.schema import to_dict
from divergence.errors import UserInputError
from divergence.pairfolder.folder import PairFolder, RunFolder
from divergence.training.sample_score import draw, load_trained, score_samples
from tests.training.tiny import ready_arm, tiny_recipe

CAPTIONS = [
    "a small red circle at the top left",
    "a large blue square in the centre",
    "a small white triangle at the right",
]


def write_weights(path, arm) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in arm.weights().items()}, str(path))


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A run folder of the tiny recipe with step 0's (untrained) weights and step 3's (perturbed)."""
    out = RunFolder(tmp_path_factory.mktemp("run"))
    out.recipe.write_text(yaml.safe_dump(to_dict(tiny_recipe()), sort_keys=False))
    arm, _ = ready_arm()
    write_weights(out.weights(0), arm)
    with torch.no_grad():
        for p in arm.parameters():
            p.add_(0.01)
    write_weights(out.weights(3), arm)
    return out


def test_draw_shape_and_determinism(run_folder):
    trained = load_trained(run_folder, step=0)
    assert trained.step == 0
    images = draw(trained, CAPTIONS, [0, 1], steps=3)
    assert images.shape == (2, 3, 32, 32, 3) and images.dtype == torch.uint8
    assert torch.equal(images, draw(trained, CAPTIONS, [0, 1], steps=3))  # the same call, the same pixels
    assert not torch.equal(images[0], images[1])  # another seed, other noise
    # an image depends on its caption and seed, not on its batch: one seed alone, in batches of one
    alone = draw(trained, CAPTIONS, [1], steps=3, batch_size=1)
    assert (alone[0].int() - images[1].int()).abs().max() <= 1


def test_ddpm_is_deterministic_given_the_seed(run_folder):
    trained = load_trained(run_folder, step=0)
    first = draw(trained, CAPTIONS[:2], [5], steps=2, sampler="ddpm", guidance_scale=1.0)
    assert torch.equal(first, draw(trained, CAPTIONS[:2], [5], steps=2, sampler="ddpm", guidance_scale=1.0))
    assert not torch.equal(first, draw(trained, CAPTIONS[:2], [5], steps=2, guidance_scale=1.0))


def test_the_last_weights_are_loaded_by_default(run_folder):
    last, first = load_trained(run_folder), load_trained(run_folder, step=0)
    assert last.step == 3
    assert not torch.equal(draw(last, CAPTIONS[:1], [0], steps=2), draw(first, CAPTIONS[:1], [0], steps=2))


def test_an_arm_of_a_pair_folder(tmp_path):
    pair = PairFolder(tmp_path)
    recipes = {arm: to_dict(tiny_recipe()) for arm in "ab"}
    pair.pair_yaml.write_text(yaml.safe_dump({"name": "p", "recipes": recipes}, sort_keys=False))
    arm, _ = ready_arm()
    write_weights(pair.arm("b").weights(10), arm)
    trained = load_trained(pair, arm="b")
    assert trained.step == 10
    result = score_samples(draw(trained, CAPTIONS, [0], steps=2), CAPTIONS)
    assert set(result["rates"]) == {"colour", "shape", "position", "object", "all"}
    assert result["hits"]["all"].shape == (1, 3)
    for rate in result["rates"].values():
        assert rate["wilson"][0] <= rate["rate"] <= rate["wilson"][1]
    with pytest.raises(UserInputError, match="no recipes.c"):
        load_trained(pair, arm="c")
    with pytest.raises(UserInputError, match="no weights file of step 20"):
        load_trained(pair, arm="b", step=20)
    with pytest.raises(UserInputError, match="no weights files"):
        load_trained(pair, arm="a")
