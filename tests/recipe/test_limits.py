"""Range checks from outside the recipe: the memory floors and Lightning's strategy names."""

import re

import pytest

from divergence.errors import RecipeError
from divergence.recipe.limits import STRATEGIES, check_memory, check_strategy, machine_memory, memory_floors
from divergence.recipe.run import RunRecipe
from divergence.config.schema import apply_overrides, parse
from divergence.config.yaml_safe import read_yaml_value, short


def recipe(*overrides):
    return parse(RunRecipe, apply_overrides({}, overrides))


def test_strategy_names_are_lightnings_registry():
    from lightning.pytorch.strategies import StrategyRegistry

    assert set(STRATEGIES) == {"auto", *StrategyRegistry.available_strategies()}


@pytest.mark.parametrize("name", ["auto", "ddp", "DDP", "fsdp", "ddp_find_unused_parameters_true"])
def test_lightning_strategy_names_pass(name):
    check_strategy(name)


@pytest.mark.parametrize("name", ["", " ", "dp", "ddp ", "../x"])
def test_other_strategy_names_are_refused(name):
    with pytest.raises(RecipeError, match="strategy: .* is not a Lightning strategy"):
        check_strategy(name)


def test_batch_floor_counts_inputs_and_first_feature_map():
    r = recipe("train.batch_size=4")
    floors = {key: (value, unit) for key, value, unit, _ in memory_floors(r)}
    # tiny: pixel space 3x32x32, first UNet width 32: 4 bytes x 32 x 32 x (4 x 3 + 32) per example
    assert floors["train.batch_size"] == (4, 4 * 32 * 32 * (4 * 3 + 32))


def test_largest_batch_the_message_offers_passes_and_one_more_fails():
    memory = 10 ** 9
    with pytest.raises(RecipeError) as err:
        check_memory(recipe("train.batch_size=100000"), memory)  # 4.5 GB
    largest = int(re.search(r"use at most (\d+)", str(err.value)).group(1))
    check_memory(recipe(f"train.batch_size={largest}"), memory)
    with pytest.raises(RecipeError, match="train.batch_size"):
        check_memory(recipe(f"train.batch_size={largest + 1}"), memory)


def test_shipped_recipes_fit_this_machine():
    assert machine_memory() > 0
    check_memory(RunRecipe())  # also run on every RunRecipe construction; stated here for the record


def test_alias_in_an_override_is_refused_but_plain_text_stays_text():
    with pytest.raises(RecipeError, match="override train.lr: .*anchors and aliases"):
        read_yaml_value("[&a [1, 2], *a]", "override train.lr")
    assert read_yaml_value("a: b: c", "override x") == "a: b: c"  # not YAML: kept as the string given


def test_short_bounds_any_value():
    assert len(short("x" * 10 ** 6)) <= 80
    assert len(short(list(range(10 ** 5)))) <= 80
    assert short("abc") == "'abc'"


def test_ema_adds_one_fp32_copy_of_the_trained_weights():
    def model_floor(*overrides):
        return {key: unit for key, _, unit, _ in memory_floors(recipe(*overrides))}["model"]

    # weights, gradients and AdamW's two moments (x4), plus the EMA (x5); frozen text encoder: x1
    assert model_floor("train.ema={decay: 0.99}") * 4 == model_floor() * 5
    frozen = ("model.text_encoder={train: false}",)
    assert model_floor(*frozen, "train.ema={decay: 0.99}") > model_floor(*frozen)
    assert model_floor(*frozen, "train.ema={decay: 0.99}") * 4 < model_floor(*frozen) * 5
