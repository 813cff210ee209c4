"""The mixture-of-experts variants: each takes effect on the tiny MoE DiT (its arm differs from the
reference arm after a step), each against itself is exactly zero (the control), and an arm without
experts is refused."""

import pytest
import torch

from divergence.errors import RecipeError
from divergence.variants import parse_variant
from tests.pairs.helpers import pair_recipe
from tests.training.tiny import one_torch_thread  # noqa: F401  (fixture)
from tests.variants.test_atlas_variants import SMALL, _arms, _max_difference, _step

PAIRS = {"router-bf16": (), "expert-grouped": ()}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_the_moe_variant_takes_effect_and_against_itself_is_exactly_zero(name):
    pair = pair_recipe(name, *SMALL, *PAIRS[name])
    assert pair.base.model.moe is not None
    (a, b, a2), inputs = _arms(pair, "a", "b", "a")
    assert _max_difference(a, b) == 0.0  # the same initial weights
    _step([a, b, a2], inputs)
    assert _max_difference(a, b) > 0.0, f"{name}: arm a computes what arm b does"
    assert _max_difference(a, a2) == 0.0, f"{name}: the variant against itself is not exactly zero"


def test_router_bf16_pairs_train_under_bf16_autocast_and_set_the_router():
    pair = pair_recipe("router-bf16", *SMALL)
    assert {r.train.precision for r in pair.arm_recipes.values()} == {"bf16-mixed"}
    assert pair.arm_recipes["a"].model.moe.router_precision == "autocast"
    assert pair.arm_recipes["b"].model.moe.router_precision == "fp32"


def test_an_arm_without_experts_is_refused_naming_the_fix():
    with pytest.raises(RecipeError, match="a variant sets model.moe.expert_compute, but model.moe is null"):
        pair_recipe("expert-grouped", *SMALL, "model.moe=null")
    from divergence.variants.moe import ExpertLoop

    class Dense:
        unet = torch.nn.Linear(2, 2)

    with pytest.raises(RuntimeError, match="expert-loop: the denoiser has no mixture-of-experts layers; set model.moe"):
        ExpertLoop().verify(Dense())


def test_bad_values_name_the_key():
    with pytest.raises(RecipeError, match=r"arms.a\[0\]: expected true or false"):
        parse_variant({"router-bf16": "yes"}, "arms.a[0]")


def test_an_expert_variant_on_a_base_without_moe_is_refused_not_switched_on(tmp_path):
    """A base recipe with no ``model.moe`` at all (the tiny DiT) turned MoE on with its defaults:
    the variant's one key created the section. A section that is off by default is refused."""
    from divergence.variants.pair_recipe import load_pair_recipe

    recipes = __import__("pathlib").Path(__file__).resolve().parents[2] / "recipes"
    pair = tmp_path / "pair.yaml"
    pair.write_text(
        f"name: grouped-on-dense\nbase: {recipes}/tiny-dit.yaml\n"
        "arms: {a: [{expert-grouped: true}], b: [{expert-grouped: false}]}\n"
    )
    with pytest.raises(
        RecipeError, match="the base recipe has no model.moe .off by default.; give model.moe a mapping"
    ):
        load_pair_recipe(pair)
