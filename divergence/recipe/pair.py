"""A pair recipe: one base run recipe and two arms, each a list of named variants.

::

    name: flash-vs-baseline
    base: ../tiny.yaml              # a run recipe, relative to this file
    recipe: {train: {max_steps: 500}}   # optional changes to the base, for both arms
    arms:
      a: [{attention: sdpa-flash}]
      b: [{attention: baseline}]
    tracking: {every: 10}           # plus the dense early schedule, see TrackingConfig
    replicate: 0                    # optional: which replicate (seeds), see replicate_seed

Each arm's run recipe is the base with its variants' overrides applied, validated like any
run recipe. Arms that end up identical are an error unless ``control: true`` (the harness's
own zero check). Command-line ``key=value`` overrides go to the pair for ``tracking.*``, ``arms.*``,
``control``, ``name`` and ``replicate``, and to the base recipe (both arms) otherwise.

Replicates: ``replicate: N`` derives the data seed, every arm's init seed and the probe seed
from N with ``replicate_seed``, the same way for every pair, so replicate N of two different
pairs are common random numbers (same initial weights, same batches, same probe set), and a
seed pair's arm b keeps a different init seed from arm a in every replicate. Replicate 0
keeps the recipe's seeds unchanged (runs made before replicates existed are replicate 0).

"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable

from divergence.errors import RecipeError
from divergence.pairfolder.layout import ARMS
from divergence.pairfolder.settings import TrackingConfig
from divergence.recipe.names import check_name
from divergence.recipe.run import RunRecipe
from divergence.config.schema import apply_overrides, load_yaml, parse, to_dict
from divergence.config.yaml_safe import short

PAIR_KEYS = {"name", "description", "base", "recipe", "control", "arms", "tracking", "replicate"}
PAIR_OVERRIDE_PREFIXES = ("tracking.", "arms.", "control", "name", "description", "replicate")


def replicate_seed(seed: int, replicate: int) -> int:
    """The seed replicate ``replicate`` uses where the recipe says ``seed``.

    Replicate 0 is the recipe itself; replicate r > 0 hashes (seed, r), so distinct recipe seeds
    stay distinct in every replicate (a seed pair's arms 0 and 1 become two fresh, different
    seeds) and equal recipe seeds stay equal (both arms of a flash pair, and every pair's arm
    a, start from one init).

    >>> replicate_seed(7, 0), replicate_seed(0, 1) == replicate_seed(0, 1) != replicate_seed(1, 1)
    (7, True)
    """
    from divergence.data.sampling import derive_seed

    return seed if replicate == 0 else derive_seed("replicate", seed, replicate) % 2**31


@dataclass(frozen=True)
class PairRecipe:
    """Two arms that differ in their variants, trained in lockstep from one base recipe."""

    name: str
    base: RunRecipe
    arms: dict  # {"a": (Variant, ...), "b": (...)}
    arm_recipes: dict  # {"a": RunRecipe, "b": RunRecipe}
    control: bool = False
    description: str = ""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    replicate: int = 0

    @property
    def probe_seed(self) -> int:
        """The probe set's seed in this replicate."""
        return replicate_seed(self.tracking.probe.seed, self.replicate)

    @property
    def category(self) -> str:
        """``control``, ``seed``, ``precision`` or ``optimization`` (see PairInfo)."""
        if self.control:
            return "control"
        categories = {v.category for arm in ARMS for v in self.arms[arm]}
        return categories.pop() if len(categories) == 1 else "optimization"

    def labels(self) -> dict[str, list[str]]:
        return {arm: [v.label() for v in self.arms[arm]] for arm in ARMS}

    def summary_line(self) -> str:
        labels = self.labels()
        return self.description or " vs ".join(", ".join(labels[a]) or "base" for a in ARMS)


def is_pair_recipe(path: str | Path) -> bool:
    return "arms" in load_yaml(path)


def load_pair_recipe(path: str | Path, overrides: Iterable[str] = ()) -> PairRecipe:
    """Read a pair recipe, resolve its base and both arms; every problem names its key."""
    from divergence.variants import parse_variant

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
    arms = {arm: tuple(parse_variant(spec, f"arms.{arm}[{i}]") for i, spec in enumerate(_arm_list(data, arm)))
            for arm in ARMS}
    arm_recipes = {arm: with_replicate(_arm_recipe(base_data, arms[arm], f"{name}.{arm}"), replicate) for arm in ARMS}
    control = _bool(data.get("control", False), "control")
    _check_arms(arm_recipes, control)
    tracking = parse(TrackingConfig, data.get("tracking"), "tracking")
    return PairRecipe(name=name, base=base, arms=arms, arm_recipes=arm_recipes,
                      control=control, description=str(data.get("description", "")), tracking=tracking,
                      replicate=replicate)


def with_replicate(recipe: RunRecipe, replicate: int) -> RunRecipe:
    """``recipe`` with its data seed and init seed mapped through ``replicate_seed``."""
    if replicate == 0:
        return recipe
    return replace(recipe, model=replace(recipe.model, seed=replicate_seed(recipe.model.seed, replicate)),
                   data=replace(recipe.data, seed=replicate_seed(recipe.data.seed, replicate)))


def _base_data(path: Path, data: dict) -> dict:
    if "base" not in data:
        raise RecipeError(f"{path}: missing key 'base' (the run recipe both arms start from, e.g. base: ../tiny.yaml)")
    looked = path.parent / str(data["base"])
    base_path = existing_file(looked)
    if base_path is None:
        raise RecipeError(f"{path}: base {short(data['base'])} not found (looked for "
                          f"{short(looked, 200, text=True)})")
    base = load_yaml(base_path)
    extra = data.get("recipe") or {}
    if not isinstance(extra, dict):
        raise RecipeError(f"{path}: 'recipe' must be a mapping of base-recipe changes")
    return _merge(base, extra)


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
    overrides = {"name": name}
    for variant in variants:
        for key, value in variant.overrides().items():
            if key in overrides and key != "name":
                raise RecipeError(f"{variant.key}: sets {key}, which another variant of the same arm sets too")
            overrides[key] = value
    data = copy.deepcopy(base_data)
    for key, value in overrides.items():
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    try:
        return parse(RunRecipe, data)
    except RecipeError as err:
        raise RecipeError(f"arm {name}: {err}") from None


def _check_arms(recipes: dict, control: bool) -> None:
    a, b = (dict(to_dict(recipes[arm]), name=None) for arm in ARMS)
    if a == b and not control:
        raise RecipeError("arms a and b are identical: give them different variants, or set control: true "
                          "for the harness's zero check")
    if a != b and control:
        raise RecipeError("control: true but the arms differ; a control pair has two identical arms")
    if to_dict(recipes["a"].model) != to_dict(recipes["b"].model):
        changed = [k for k in ("unet", "text_encoder", "tokenizer", "vae")
                   if getattr(recipes["a"].model, k) != getattr(recipes["b"].model, k)]
        if changed:
            raise RecipeError(f"arms build different models (model.{changed[0]} differs): "
                              "weights could not be matched tensor by tensor")


def _bool(value, key: str) -> bool:
    if not isinstance(value, bool):
        raise RecipeError(f"{key}: expected true or false, got {short(value)}")
    return value


def existing_file(path: Path) -> Path | None:
    """``path`` resolved if it is a regular file; None if not (missing, a folder, a loop, a bad name)."""
    try:
        path = path.resolve()
        return path if path.is_file() else None
    except (OSError, RuntimeError, ValueError):  # RuntimeError: a symlink loop before Python 3.13
        return None


def pair_name(value, key: str) -> str:
    """A pair's name, which names folders (``<study>/<name>/``) and jobs: ``divergence.recipe.names``' rule."""
    return check_name(value, key, "pair name", "the pair's folder and its jobs")


def _merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
