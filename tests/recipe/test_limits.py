"""Range checks from outside the recipe: Lightning's strategy names; the YAML loader's bounds."""

import pytest

from divergence.errors import RecipeError
from divergence.recipe.limits import STRATEGIES, check_strategy
from divergence.config.yaml_safe import read_yaml_value, short


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


def test_alias_in_an_override_is_refused_but_plain_text_stays_text():
    with pytest.raises(RecipeError, match="override train.lr: .*anchors and aliases"):
        read_yaml_value("[&a [1, 2], *a]", "override train.lr")
    assert read_yaml_value("a: b: c", "override x") == "a: b: c"  # not YAML: kept as the string given


def test_short_bounds_any_value():
    assert len(short("x" * 10**6)) <= 80
    assert len(short(list(range(10**5)))) <= 80
    assert short("abc") == "'abc'"
