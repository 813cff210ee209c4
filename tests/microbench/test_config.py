"""The microbench recipe: defaults, the shipped YAML, and one error per impossible value."""

from pathlib import Path

import pytest

from divergence.errors import RecipeError
from divergence.microbench.config import MicrobenchRecipe, load_recipe
from divergence.microbench.sweep import plan

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "microbench.yaml"


def test_shipped_recipe_is_the_defaults():
    assert load_recipe(str(RECIPE)) == MicrobenchRecipe()


def test_default_tiles_follow_the_rule():
    recipe = MicrobenchRecipe()
    assert recipe.tiles.reference_tile(64) == (64, 256)
    assert [t for _, t in recipe.tiles.study_tiles(64)][-1] == (64, 512)


def test_plan_has_no_duplicates_and_all_studies():
    cases, notes = plan(load_recipe(None, quick=True))
    assert len(cases) == len(set(cases)) and not notes
    assert {c.block_order for c in cases if c.impl == "flash"} == {"default", "swapped", "square"}
    assert not [c for c in cases if c.precision in ("fp32", "fp64") and c.accumulate == "fp32"]


@pytest.mark.parametrize(
    "override,message",
    [
        ("sweep.precisions=[bf8]", "sweep.precisions: 'bf8' is not one of bf16"),
        ("sweep.impls=[flashy]", "sweep.impls: 'flashy' is not one of"),
        ("sweep.accumulate=[fp8]", "sweep.accumulate: 'fp8'"),
        ("sweep.reference_seq_len=3", "reference_seq_len: 3 is not one of"),
        ("sweep.device=tpu", "sweep.device: 'tpu'"),
        ("tiles.orders=[diagonal]", "tiles.orders: 'diagonal'"),
        ("tiles.block_sizes=[12y3]", "block size '12y3'"),
        ("inputs.heads=0", "inputs.heads: must be at least 1"),
        ("inputs.std=1000", "inputs.std"),
        ("inputs.headz=2", "unknown key 'inputs.headz'"),
        ("tiles.memory=1000000", "larger than sequence length 256"),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(RecipeError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_recipe(None, [override])
