"""Replicates: seeds derived from the replicate the same way for every pair (common random numbers)."""

import pytest
import torch

from divergence.errors import RecipeError
from divergence.recipe.pair import replicate_seed
from divergence.variants.pair_recipe import load_pair_recipe
from divergence.training.arm import Arm
from divergence.training.inputs import Inputs
from tests.pairs.helpers import PAIRS, pair_recipe
from tests.training.tiny import one_torch_thread  # noqa: F401  (autouse)


def _seeds(pair):
    return {arm: (r.model.seed, r.data.seed) for arm, r in pair.arm_recipes.items()}


def test_replicate_zero_is_the_recipe_and_other_replicates_differ():
    r0 = load_pair_recipe(PAIRS / "flash-vs-baseline.yaml")
    assert _seeds(r0) == {"a": (0, 0), "b": (0, 0)} and r0.replicate == 0 and r0.probe_seed == 0
    r1, r2 = (load_pair_recipe(PAIRS / "flash-vs-baseline.yaml", [f"replicate={r}"]) for r in (1, 2))
    assert r1.replicate == 1 and len({_seeds(r)["a"] for r in (r0, r1, r2)}) == 3
    assert len({r.probe_seed for r in (r0, r1, r2)}) == 3
    assert r1.base.data.seed == r1.arm_recipes["a"].data.seed == replicate_seed(0, 1)


@pytest.mark.parametrize("replicate", [0, 3])
def test_every_pair_type_shares_a_replicates_seeds(replicate):
    pairs = {
        name: load_pair_recipe(PAIRS / f"{name}.yaml", [f"replicate={replicate}"])
        for name in ("flash-vs-baseline", "bf16-vs-fp32", "seed-vs-seed", "control")
    }
    arm_a = {_seeds(p)["a"] for p in pairs.values()}
    assert len(arm_a) == 1  # one init and one data seed for every pair's arm a
    assert {p.probe_seed for p in pairs.values()} == {pairs["control"].probe_seed}
    seed = _seeds(pairs["seed-vs-seed"])
    assert seed["a"][1] == seed["b"][1] and seed["a"][0] != seed["b"][0]  # same batches, another init
    assert seed["b"][0] == replicate_seed(1, replicate)


def test_same_weights_and_batches_across_pair_types_not_across_replicates():
    def built(name, replicate):
        pair = pair_recipe(name, f"replicate={replicate}")
        inputs = Inputs(pair.arm_recipes["a"])
        arm = Arm(pair.arm_recipes["a"], inputs.tokenizer)
        return arm.weights()["unet.conv_in.weight"], inputs.batches.batch(4)

    (w_flash, b_flash), (w_bf16, b_bf16), (w_other, b_other) = (
        built("flash-vs-baseline", 1),
        built("bf16-vs-fp32", 1),
        built("flash-vs-baseline", 2),
    )
    assert torch.equal(w_flash, w_bf16) and not torch.equal(w_flash, w_other)
    for field in ("pixels", "input_ids", "noise", "timesteps"):
        assert torch.equal(getattr(b_flash, field), getattr(b_bf16, field)), field
    assert not torch.equal(b_flash.noise, b_other.noise)


def test_a_bad_replicate_is_one_clear_error():
    with pytest.raises(RecipeError, match="replicate: expected a non-negative integer"):
        load_pair_recipe(PAIRS / "control.yaml", ["replicate=-1"])
