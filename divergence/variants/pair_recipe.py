"""Reading a pair recipe: its base run recipe and both arms, each arm the base with its variants'
overrides applied and validated like any run recipe (the format: ``divergence.recipe.pair``).

It lives with the variants because an arm is a list of them: the registry resolves each name.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Iterable

from divergence.config.schema import apply_overrides, load_yaml, parse, to_dict
from divergence.config.yaml_safe import short
from divergence.errors import RecipeError
from divergence.pairfolder.layout import ARMS
from divergence.pairfolder.settings import TrackingConfig
from divergence.recipe.pair import (
    PAIR_KEYS,
    PAIR_OVERRIDE_PREFIXES,
    PairRecipe,
    _base_data,
    _bool,
    pair_name,
    with_replicate,
)
from divergence.recipe.run import RunRecipe
from divergence.variants.registry import VARIANTS, check_overrides, off_by_default, parse_variant


def load_pair_recipe(path: str | Path, overrides: Iterable[str] = ()) -> PairRecipe:
    """Read a pair recipe, resolve its base and both arms; every problem names its key."""
    path = Path(path)
    data = load_yaml(path)
    unknown = sorted(map(str, set(data) - PAIR_KEYS))
    if unknown:
        raise RecipeError(f"{path}: unknown key {short(unknown[0])}; a pair recipe has {', '.join(sorted(PAIR_KEYS))}")
    pair_overrides = [o for o in overrides if o.startswith(PAIR_OVERRIDE_PREFIXES)]
    data = apply_overrides(data, pair_overrides)
    name = pair_name(data.get("name", path.stem), f"{path}: name")
    base_data = _base_data(path, data)
    base_data = apply_overrides(base_data, [o for o in overrides if o not in pair_overrides])
    replicate = data.get("replicate", 0)
    if isinstance(replicate, bool) or not isinstance(replicate, int) or replicate < 0:
        raise RecipeError(f"{path}: replicate: expected a non-negative integer, got {replicate!r}")
    base = with_replicate(parse(RunRecipe, base_data), replicate)
    arms = {
        arm: tuple(parse_variant(spec, f"arms.{arm}[{i}]") for i, spec in enumerate(_arm_list(data, arm)))
        for arm in ARMS
    }
    arm_recipes = {arm: with_replicate(_arm_recipe(base_data, arms[arm], f"{name}.{arm}"), replicate) for arm in ARMS}
    control = _bool(data.get("control", False), "control")
    _check_arms(arm_recipes, control)
    reordering = _bool(data.get("reordering", False), "reordering")
    if reordering:
        _check_reordering(arms, control)
    tracking = parse(TrackingConfig, data.get("tracking"), "tracking")
    return PairRecipe(
        name=name,
        base=base,
        arms=arms,
        arm_recipes=arm_recipes,
        control=control,
        description=str(data.get("description", "")),
        tracking=tracking,
        replicate=replicate,
        reordering=reordering,
    )


def _check_reordering(arms: dict, control: bool) -> None:
    """``reordering: true`` holds only arms that differ by fp32-equivalent variants."""
    if control:
        raise RecipeError("reordering: true and control: true; a pair is one or the other")
    for variant in (v for arm in ARMS for v in arms[arm]):
        if not variant.fp32_equivalent:
            allowed = ", ".join(sorted(n for n, cls in VARIANTS.items() if cls.fp32_equivalent))
            raise RecipeError(
                f"{variant.key}: {variant.label()} is not an fp32-equivalent transformation, and reordering: true "
                f"declares a pair that only reorders fp32 sums; use variants among {allowed}"
            )


def _arm_list(data: dict, arm: str) -> list:
    arms = data.get("arms")
    if not isinstance(arms, dict) or set(arms) != set(ARMS):
        got = sorted(map(str, arms)) if isinstance(arms, dict) else arms
        raise RecipeError(f"arms: expected exactly two arms 'a' and 'b', got {short(got)}")
    specs = arms[arm] or []
    if not isinstance(specs, list):
        raise RecipeError(f"arms.{arm}: expected a list of variants, got {short(specs)}")
    return specs


def _arm_recipe(base_data: dict, variants, name: str) -> RunRecipe:
    overrides, refined = {"name": name}, set()
    for variant in variants:
        for key, value in check_overrides(variant, variant.overrides()).items():
            if key in refined or (key in overrides and key != "name" and key not in type(variant).refines):
                raise RecipeError(
                    f"{variant.key}: sets {key}, which another variant of the same arm sets too{_after(key)}"
                )
            if key in type(variant).refines:
                refined.add(key)
            overrides[key] = value
    data = copy.deepcopy(base_data)
    for key, value in overrides.items():
        node = data
        *parents, leaf = key.split(".")
        for i, part in enumerate(parents):
            section = ".".join(parents[: i + 1])
            if node.get(part, {}) is None:  # a variant sets a key of a section the base turns off
                raise RecipeError(f"arm {name}: a variant sets {key}, but {section} is null; give {section} a mapping")
            if part not in node and off_by_default(parents[: i + 1]):  # it would switch the section on
                raise RecipeError(
                    f"arm {name}: a variant sets {key}, but the base recipe has no {section} (off by default); "
                    f"give {section} a mapping in the base recipe (e.g. recipes/tiny-moe.yaml for model.moe)"
                )
            node = node.setdefault(part, {})
        node[leaf] = value
    try:
        return parse(RunRecipe, data)
    except RecipeError as err:
        raise RecipeError(f"arm {name}: {err}") from None


def _after(key: str) -> str:
    """The hint for a key that a variant may set over an earlier one's (``Variant.refines``)."""
    refiners = sorted(name for name, cls in VARIANTS.items() if key in cls.refines)
    return f" ({' and '.join(refiners)} may set it after another variant, not before)" if refiners else ""


def _check_arms(recipes: dict, control: bool) -> None:
    a, b = (dict(to_dict(recipes[arm]), name=None) for arm in ARMS)
    if a == b and not control:
        raise RecipeError(
            "arms a and b are identical: give them different variants, or set control: true "
            "for the harness's zero check"
        )
    if a != b and control:
        raise RecipeError("control: true but the arms differ; a control pair has two identical arms")
    if to_dict(recipes["a"].model) != to_dict(recipes["b"].model):
        changed = [
            k
            for k in ("unet", "text_encoder", "tokenizer", "vae")
            if getattr(recipes["a"].model, k) != getattr(recipes["b"].model, k)
        ]
        if changed:
            raise RecipeError(
                f"arms build different models (model.{changed[0]} differs): "
                "weights could not be matched tensor by tensor"
            )
