"""Variants: the one thing two arms of a pair differ in, registered by name.

A variant is a small class with a name. It changes one arm's recipe through dotted-key
overrides (``attention.name``, ``model.seed``, ``train.precision``), so an arm is fully
described by its resolved recipe (saved with its checkpoints), and it verifies after the
arm is built that the change really took (``verify``): no global switches, nothing
silently skipped. A variant also states the numerics it is used in where it is deployed (``deployment``; flash
kernels: fp16/bf16 autocast), so a study measures it there. Adding a training optimization to
study is one subclass::

    @register
    class ChannelsLast(Variant):
        name = "channels-last"
        help = "UNet weights and activations in channels-last memory format"
        sets = ("model.channels_last",)  # overrides(): {"model.channels_last": value}

A variant declares the recipe keys it sets (``sets``); code that must look past the variants asks
them (``as_base``: a recipe read as if no variant had changed it, which is how the calibration
tells a recipe's identity), so adding a variant needs no edit anywhere else.

In a pair recipe an arm lists its variants as ``name`` or ``{name: value}``::

    arms:
      a: [{attention: sdpa-flash}]
      b: [{attention: baseline}]
"""

from __future__ import annotations

import functools
import re
from typing import Any, ClassVar

from divergence.errors import RecipeError
from divergence.config.yaml_safe import short
from divergence.pairfolder.pair_json import CATEGORIES

# What a variant changes, which sets a pair's role in a bounding study: a pair's categories
# (divergence.pairfolder.pair_json.CATEGORIES, the one list) but "control", which is a pair of
# identical arms, and "reordering", which a pair recipe declares (``reordering: true``) of
# fp32-equivalent arms.
VARIANT_CATEGORIES = tuple(c for c in CATEGORIES if c not in ("control", "reordering"))

VARIANTS: dict[str, type["Variant"]] = {}
_COUNTS = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*$")


class Variant:
    """One named change to an arm. Subclasses set ``name``, ``help``, ``category``."""

    name: ClassVar[str]
    help: ClassVar[str] = ""
    category: ClassVar[str] = "optimization"
    # The value used when the recipe gives the bare name (``- gradient-checkpointing``).
    default: ClassVar[Any] = True
    # Mathematically the identity in fp32: the change only reorders fp32 sums (accumulation, thread
    # count, fused kernels, compilation), so a pair of such arms should sit near the reordering
    # reference, and a verdict says when it does not ("look for a bug"; divergence.analysis.reordering).
    fp32_equivalent: ClassVar[bool] = False
    # The dotted recipe keys this variant sets, and the only ones ``overrides`` may return.
    sets: ClassVar[tuple[str, ...]] = ()
    # Its keys are fixed per process (how an arm's ranks are launched or share the work: world size,
    # strategy, sharding), so a lockstep job cannot hold two arms that differ in them: such a pair
    # trains each arm as its own multi-process job (divergence.training.separate_pair).
    per_process: ClassVar[bool] = False
    # Keys of ``sets`` this variant may set over an earlier variant of the same arm (it comes after it):
    # ``[{data-parallel: 2x8}, {fsdp: full}]`` is DDP's layout of ranks with FSDP as their strategy.
    refines: ClassVar[tuple[str, ...]] = ()
    # The values it may take (none: any ``validate`` accepts).
    choices: ClassVar[tuple] = ()

    def __init__(self, value: Any = None, key: str = ""):
        self.value = self.default if value is None else value
        self.key = key
        self.validate()

    def validate(self) -> None:
        """Raise ``RecipeError`` naming ``self.key`` if ``self.value`` is unusable (by default: not one of
        ``choices``, when it has them)."""
        if self.choices and self.value not in self.choices:
            self.fail(f"{self.value!r} is not one of {', '.join(self.choices)}")

    def overrides(self) -> dict[str, Any]:
        """Dotted recipe keys this variant sets on its arm, some of ``sets``: by default its one key at
        ``value``; a variant that sets several keys (or transforms the value) defines its own."""
        if len(self.sets) != 1:
            raise NotImplementedError(f"variant {self.name} sets {self.sets}: it defines overrides()")
        return {self.sets[0]: self.value}

    @classmethod
    def as_base(cls, recipe: dict, base: dict) -> dict:
        """``recipe`` (a resolved recipe as a dict) read as if this variant had not changed it: each key
        of ``sets`` that ``recipe`` holds at ``base``'s value, or left out where ``base`` has none. A
        variant whose change keeps something the keys do not show (a global batch) defines its own."""
        for key in cls.sets:
            recipe = _replace(recipe, key.split("."), _lookup(base, key.split(".")))
        return recipe

    def verify(self, arm) -> None:
        """Check on the built arm that the change took; raise RuntimeError if not."""

    def deployment(self):
        """The numerics this change is used in where it is deployed (a ``Deployment``), or None when
        it is used in any; a study trains its pair under study in them (``variants.deployment``)."""
        return None

    def label(self) -> str:
        return self.name if self.value is True else f"{self.name}={_short(self.value)}"

    def fail(self, message: str) -> None:
        raise RecipeError(f"{self.key or self.name}: {short(message, 300, text=True)}")

    def counts(self, expected: str) -> tuple[int, int]:
        """``self.value`` as ``NxB``, two positive counts (the value normalized to ``"NxB"``); else
        ``fail`` saying it ``expected`` them."""
        match = _COUNTS.match(str(self.value))
        if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
            self.fail(f"expected {expected}, got {self.value!r}")
        n, b = int(match.group(1)), int(match.group(2))
        self.value = f"{n}x{b}"
        return n, b


class Switch(Variant):
    """A variant that is on or off: its value true or false (the bare name: true)."""

    def validate(self):
        if not isinstance(self.value, bool):
            self.fail(f"expected true or false, got {self.value!r}")


def register(cls: type[Variant]) -> type[Variant]:
    if cls.category not in VARIANT_CATEGORIES:
        raise ValueError(f"variant {cls.__name__}: category {cls.category!r} is not one of {VARIANT_CATEGORIES}")
    if not cls.sets or not all(isinstance(k, str) and k and "" not in k.split(".") for k in cls.sets):
        raise ValueError(f"variant {cls.__name__}: sets must name the dotted recipe keys it sets, got {cls.sets!r}")
    VARIANTS[cls.name] = cls
    return cls


def fp32_equivalent(arms: dict) -> bool:
    """Whether a pair's arms (``pair.json``'s labels, ``{"a": ["grad-accumulation=4x4"], ...}``)
    differ only by fp32-equivalent variants: at least one label, each naming a registered variant
    that declares ``fp32_equivalent``. Labels of a user's own training name no variant: False.

    >>> fp32_equivalent({"a": ["adamw-impl=fused"], "b": ["adamw-impl=loop"]})
    True
    >>> fp32_equivalent({"a": ["precision=bf16-mixed"], "b": ["precision=32-true"]})
    False
    """
    names = [str(label).split("=", 1)[0] for labels in (arms or {}).values() for label in labels or ()]
    return bool(names) and all(name in VARIANTS and VARIANTS[name].fp32_equivalent for name in names)


def parse_variant(spec: Any, key: str) -> Variant:
    """``"name"`` or ``{name: value}`` from a recipe -> a validated Variant."""
    if isinstance(spec, str):
        name, value = spec, None
    elif isinstance(spec, dict) and len(spec) == 1:
        ((name, value),) = spec.items()
    else:
        raise RecipeError(f"{key}: a variant is a name or a one-key mapping {{name: value}}, got {short(spec)}")
    if not isinstance(name, str) or name not in VARIANTS:
        raise RecipeError(f"{key}: unknown variant {short(name)}; registered variants: {', '.join(sorted(VARIANTS))}")
    return VARIANTS[name](value, key)


def as_base(recipe: dict) -> dict:
    """``recipe`` (a resolved recipe as a dict) with what every registered variant sets read as the
    default recipe has it (each variant's ``Variant.as_base``): two arms that differ only in their
    variants read the same. ``recipe`` is not modified."""
    base = _default_recipe()
    for cls in VARIANTS.values():
        recipe = cls.as_base(recipe, base)
    return recipe


def one_batch(recipe: dict, key: str, **also) -> dict:
    """``recipe`` (a dict) with its ``train.<key>`` groups of ``train.batch_size`` examples read as one
    batch of their product, ``<key>`` 1 and ``also`` set; as it is where either is no integer or
    ``<key>`` is 1 (an ``as_base`` that keeps the global batch: accumulation, data parallelism)."""
    train = recipe.get("train")
    if not isinstance(train, dict) or not isinstance(train.get(key), int) or train[key] == 1:
        return recipe
    if not isinstance(train.get("batch_size"), int):
        return recipe
    return {**recipe, "train": {**train, "batch_size": train["batch_size"] * train[key], key: 1, **also}}


def check_overrides(variant: Variant, overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` of ``variant``, refused when they set a key the variant does not declare in ``sets``
    (``as_base`` would not know to look past it). A variant put into ``VARIANTS`` by hand without any
    ``sets`` is not checked: ``as_base`` leaves its keys as they are (its arm is its own recipe)."""
    declared = type(variant).sets
    undeclared = sorted(set(overrides) - set(declared))
    if declared and undeclared:
        raise RuntimeError(f"variant {variant.name} sets {undeclared}, which its sets {type(variant).sets} omit")
    return overrides


def off_by_default(path: list[str]) -> bool:
    """Whether the section at ``path`` (``["model", "moe"]``) is null in the default recipe: a
    variant that sets a key inside it would switch the whole section on with its defaults."""
    return _lookup(_default_recipe(), path) is None


@functools.lru_cache(maxsize=1)
def _default_recipe() -> dict:
    from divergence.config.schema import to_dict
    from divergence.recipe.run import RunRecipe

    return to_dict(RunRecipe())


_MISSING = object()


def _lookup(node: Any, path: list[str]) -> Any:
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _replace(node: dict, path: list[str], value: Any) -> dict:
    """A copy of ``node`` with ``path`` set to ``value`` (left out when ``_MISSING``), where it exists."""
    head, *rest = path
    if not isinstance(node, dict) or head not in node:
        return node
    if rest:
        return {**node, head: _replace(node[head], rest, value)}
    if value is _MISSING:
        return {k: v for k, v in node.items() if k != head}
    return {**node, head: value}


def _short(value: Any) -> str:
    if isinstance(value, dict):
        name = value.get("name", "")
        rest = ",".join(f"{k}={v}" for k, v in value.items() if k != "name")
        return f"{name}({rest})" if rest else str(name)
    return str(value)
