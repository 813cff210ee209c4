"""int8-qat: torchao's quantization-aware training takes effect on both backbones (fake-quantized
linears change the step), is exactly zero against itself, keeps the weight names, and is not
declared fp32-equivalent (it changes the forward's values, not only the order of its sums)."""

import pytest
import torch

from divergence.errors import RecipeError
from divergence.variants import VARIANTS, parse_variant
from tests.pairs.helpers import pair_recipe
from tests.training.tiny import one_torch_thread  # noqa: F401  (fixture)
from tests.variants.test_atlas_variants import SMALL, _arms, _max_difference, _step


@pytest.mark.parametrize("backbone", [(), ("model.denoiser=transformer",)], ids=["unet", "dit"])
def test_int8_qat_takes_effect_and_against_itself_is_exactly_zero(backbone, capsys):
    pair = pair_recipe("int8-qat", *SMALL, *backbone)
    (a, b, a2), inputs = _arms(pair, "a", "b", "a")
    assert "linear layers fake-quantized to int8; every one" in capsys.readouterr().err
    assert list(a.weights()) == list(b.weights())  # the comparator matches every tensor by name
    linears = [n for n, m in b.unet.named_modules() if isinstance(m, torch.nn.Linear)]
    assert {f"unet.{n}" for n in linears} <= set(a.optimized["qat_layers"])
    _step([a, b, a2], inputs)
    assert _max_difference(a, b) > 0.0
    assert _max_difference(a, a2) == 0.0


def test_int8_qat_is_not_fp32_equivalent_and_refuses_a_non_boolean():
    assert VARIANTS["int8-qat"].fp32_equivalent is False
    with pytest.raises(RecipeError, match=r"arms.a\[0\]: .*true or false"):
        parse_variant({"int8-qat": "yes"}, "arms.a[0]")


def test_the_new_keys_keep_every_calibration_id_and_each_arm_reads_as_its_base():
    """train.qat (off) and train.tensor_parallel are left out of the recipe identity, so the id of
    every calibration.json written before they existed stays (the tiny recipes' ids, measured on
    main before this change); each pair's arms read as their base."""
    from divergence.analysis.calibration import recipe_identity
    from divergence.config.schema import to_dict

    for name in ("int8-qat", "tensor-parallel"):
        pair = pair_recipe(name, "train.max_steps=500")
        ids = {recipe_identity(to_dict(r))["id"] for r in pair.arm_recipes.values()}
        assert ids == {recipe_identity(to_dict(pair.base))["id"]}, name
    from divergence.recipe.run import load_run_recipe

    assert recipe_identity(to_dict(load_run_recipe("recipes/tiny.yaml")))["id"] == "23215bb33b00"
    assert recipe_identity(to_dict(load_run_recipe("recipes/tiny-dit.yaml")))["id"] == "4fe5c635e563"
