"""The grad-noise calibration variant: eps 0 is bitwise the reference; the dose grows with eps."""

import pytest
import torch

from divergence.errors import RecipeError
from divergence.variants.pair_recipe import load_pair_recipe
from divergence.training.arm import Arm
from divergence.training.inputs import Inputs
from tests.training.tiny import DIT, one_torch_thread, tiny_recipe  # noqa: F401  (autouse)

CPU = torch.device("cpu")


def _train(recipe, inputs, steps=3) -> dict:
    arm = Arm(recipe, inputs.tokenizer)
    arm.setup(CPU)
    arm.configure_optimizers()
    for step in range(steps):
        arm.training_step(inputs.prepare(inputs.batches.batch(step)))
    return arm.weights()


def _rel_l2(a: dict, b: dict) -> float:
    diff = sum(float(((a[k].double() - b[k].double()) ** 2).sum()) for k in a)
    return (diff / sum(float((b[k].double() ** 2).sum()) for k in b)) ** 0.5


def test_eps_zero_is_bitwise_the_reference_and_the_difference_grows_with_eps():
    """On the DiT: the noise is added to the gradients whatever the denoiser (a step ~3x cheaper)."""
    reference = tiny_recipe(*DIT)
    inputs = Inputs(reference)
    base = _train(reference, inputs)
    zero = _train(tiny_recipe(*DIT, "train.grad_noise=0.0"), inputs)
    assert all(torch.equal(base[k], zero[k]) for k in base)
    distances = [_rel_l2(_train(tiny_recipe(*DIT, f"train.grad_noise={eps}"), inputs), base) for eps in (1e-4, 1e-2)]
    assert 0 < distances[0] < distances[1]
    # same dose, same seeds: the noise is reproducible
    assert _rel_l2(_train(tiny_recipe(*DIT, "train.grad_noise=1e-4"), inputs), base) == distances[0]


def test_ladder_pair_recipe_and_bad_doses(tmp_path):
    (tmp_path / "base.yaml").write_text("name: base\n")
    path = tmp_path / "pair.yaml"
    path.write_text("base: base.yaml\nname: grad-noise-0.001\narms: {a: [{grad-noise: 1e-3}], b: []}\n")
    pair = load_pair_recipe(path)
    assert pair.labels() == {"a": ["grad-noise=0.001"], "b": []} and pair.category == "optimization"
    assert pair.arm_recipes["a"].train.grad_noise == 0.001 and pair.arm_recipes["b"].train.grad_noise is None
    path.write_text("base: base.yaml\narms: {a: [{grad-noise: -1}], b: []}\n")
    with pytest.raises(RecipeError, match=r"arms.a\[0\]: expected a finite relative dose"):
        load_pair_recipe(path)
