"""The checks of the machine a run starts on: the memory floors, where a run starts, not in a recipe."""

import re

import pytest

from divergence.config.schema import apply_overrides, parse
from divergence.errors import RecipeError
from divergence.recipe.run import RunRecipe
from divergence.training.host import check_memory, machine_memory, memory_floors


def recipe(*overrides):
    return parse(RunRecipe, apply_overrides({}, overrides))


def test_batch_floor_counts_inputs_and_first_feature_map():
    r = recipe("train.batch_size=4")
    floors = {key: (value, unit) for key, value, unit, _ in memory_floors(r)}
    # tiny: pixel space 3x32x32, first UNet width 32: 4 bytes x 32 x 32 x (4 x 3 + 32) per example
    assert floors["train.batch_size"] == (4, 4 * 32 * 32 * (4 * 3 + 32))


def test_largest_batch_the_message_offers_passes_and_one_more_fails():
    memory = 10**9
    with pytest.raises(RecipeError) as err:
        check_memory(recipe("train.batch_size=100000"), memory)  # 4.5 GB
    largest = int(re.search(r"use at most (\d+)", str(err.value)).group(1))
    check_memory(recipe(f"train.batch_size={largest}"), memory)
    with pytest.raises(RecipeError, match="train.batch_size"):
        check_memory(recipe(f"train.batch_size={largest + 1}"), memory)


def test_shipped_recipes_fit_this_machine():
    assert machine_memory() > 0
    check_memory(RunRecipe())


def test_ema_adds_one_fp32_copy_of_the_trained_weights():
    def model_floor(*overrides):
        return {key: unit for key, _, unit, _ in memory_floors(recipe(*overrides))}["model"]

    # weights, gradients and AdamW's two moments (x4), plus the EMA (x5); frozen text encoder: x1
    assert model_floor("train.ema={decay: 0.99}") * 4 == model_floor() * 5
    frozen = ("model.text_encoder={train: false}",)
    assert model_floor(*frozen, "train.ema={decay: 0.99}") > model_floor(*frozen)
    assert model_floor(*frozen, "train.ema={decay: 0.99}") * 4 < model_floor(*frozen) * 5


def test_a_recipe_too_large_for_this_machine_is_still_a_recipe():
    """Reading a recipe judges no machine (launch on a login node, watch on a comparator node):
    the refusal comes where the run starts (train_run / train_pair / train_arm)."""
    big = recipe("train.batch_size=100000000")
    assert big.train.batch_size == 100000000
    with pytest.raises(RecipeError, match="train.batch_size: .*need at least"):
        check_memory(big)
