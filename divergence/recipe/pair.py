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
(read by ``divergence.variants.pair_recipe.load_pair_recipe``, where the variant registry resolves the arms)
run recipe. Arms that end up identical are an error unless ``control: true`` (the harness's
own zero check). ``reordering: true`` declares the pair a reordering of fp32 sums (category
``reordering``, the reordering yardstick of a study, ``recipes/pairs/reordering.yaml``): every
variant of both arms must be one that declares ``fp32_equivalent``. Command-line ``key=value`` overrides go to the pair for ``tracking.*``, ``arms.*``,
``control``, ``name`` and ``replicate``, and to the base recipe (both arms) otherwise.

Replicates: ``replicate: N`` derives the data seed, every arm's init seed and the probe seed
from N with ``replicate_seed``, the same way for every pair, so replicate N of two different
pairs are common random numbers (same initial weights, same batches, same probe set), and a
seed pair's arm b keeps a different init seed from arm a in every replicate. Replicate 0
keeps the recipe's seeds unchanged.

"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from pathlib import Path

from divergence.errors import RecipeError
from divergence.pairfolder.layout import ARMS
from divergence.pairfolder.settings import TrackingConfig
from divergence.recipe.names import check_name
from divergence.recipe.run import RunRecipe
from divergence.config.schema import load_yaml
from divergence.config.yaml_safe import short

PAIR_KEYS = {"name", "description", "base", "recipe", "control", "reordering", "arms", "tracking", "replicate"}
PAIR_OVERRIDE_PREFIXES = ("tracking.", "arms.", "control", "reordering", "name", "description", "replicate")


def replicate_seed(seed: int, replicate: int) -> int:
    """The seed replicate ``replicate`` uses where the recipe says ``seed``.

    Replicate 0 is the recipe itself; replicate r > 0 hashes (seed, r), so distinct recipe seeds
    stay distinct in every replicate (a seed pair's arms 0 and 1 become two fresh, different
    seeds) and equal recipe seeds stay equal (both arms of a flash pair, and every pair's arm
    a, start from one init).

    >>> replicate_seed(7, 0), replicate_seed(0, 1) == replicate_seed(0, 1) != replicate_seed(1, 1)
    (7, True)
    """
    from divergence.recipe.seeds import derive_seed

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
    reordering: bool = False  # a reordering of fp32 sums: the reordering yardstick (category reordering)

    @property
    def probe_seed(self) -> int:
        """The probe set's seed in this replicate."""
        return replicate_seed(self.tracking.probe.seed, self.replicate)

    @property
    def category(self) -> str:
        """``control``, ``reordering``, ``seed``, ``precision`` or ``optimization`` (see PairInfo)."""
        if self.control:
            return "control"
        if self.reordering:
            return "reordering"
        categories = {v.category for arm in ARMS for v in self.arms[arm]}
        return categories.pop() if len(categories) == 1 else "optimization"

    def labels(self) -> dict[str, list[str]]:
        return {arm: [v.label() for v in self.arms[arm]] for arm in ARMS}

    def summary_line(self) -> str:
        labels = self.labels()
        return self.description or " vs ".join(", ".join(labels[a]) or "base" for a in ARMS)


def is_pair_recipe(path: str | Path) -> bool:
    return "arms" in load_yaml(path)


def with_replicate(recipe: RunRecipe, replicate: int) -> RunRecipe:
    """``recipe`` with its data seed and init seed mapped through ``replicate_seed``."""
    if replicate == 0:
        return recipe
    return replace(
        recipe,
        model=replace(recipe.model, seed=replicate_seed(recipe.model.seed, replicate)),
        data=replace(recipe.data, seed=replicate_seed(recipe.data.seed, replicate)),
    )


def _base_data(path: Path, data: dict) -> dict:
    if "base" not in data:
        raise RecipeError(f"{path}: missing key 'base' (the run recipe both arms start from, e.g. base: ../tiny.yaml)")
    looked = path.parent / str(data["base"])
    base_path = existing_file(looked)
    if base_path is None:
        raise RecipeError(f"{path}: base {short(data['base'])} not found (looked for {short(looked, 200, text=True)})")
    base = load_yaml(base_path)
    extra = data.get("recipe") or {}
    if not isinstance(extra, dict):
        raise RecipeError(f"{path}: 'recipe' must be a mapping of base-recipe changes")
    return merge(base, extra)


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


def merge(base: dict, extra: dict) -> dict:
    """A copy of ``base`` with ``extra``'s changes, mapping into mapping (a recipe's ``recipe:`` on its base)."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
