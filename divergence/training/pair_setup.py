"""What a pair recipe makes before training: its arms' module, ``pair.yaml``, ``pair.json``.

Shared by the lockstep pair (``training.lockstep``) and a separate arm (``training.separate_arm``):
the resolved pair as plain data (``pair.yaml``, the loggers' config), the model-agnostic
``pair.json`` (``divergence.pairfolder.pair_json``), the check that both arms read identical inputs,
and the ``ArmsModule`` over some of the pair's arms.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from divergence.atomic import write_atomic
from divergence.errors import RecipeError
from divergence.pairfolder.folder import PairFolder
from divergence.pairfolder.folder import as_pair_folder
from divergence.pairfolder.pair_json import PairInfo
from divergence.recipe.pair import ARMS, PairRecipe
from divergence.config.schema import to_dict
from divergence.variants.deployment import arm_numerics, outside_deployment
from divergence.variants.registry import fp32_equivalent

# Recipe sections that decide the inputs: both arms must agree on them to share one batch, but for
# ``data.seed`` (the data-seed variant: that arm draws its own batches of the same data). The batch itself is the step's global batch, batch_size x accumulate examples (``data.batches``): arms
# that split it differently (4 micro-batches of 4 against one of 16) see the same examples.
SHARED_INPUTS = ("data", "noise", "model.tokenizer", "model.vae", "train.max_steps")


def pair_module(pair: PairRecipe, arms: tuple[str, ...] = ARMS):
    """The ``ArmsModule`` of ``arms`` of ``pair``: both in lockstep (files under ``a/``, ``b/``),
    or one separate arm (files in its own folder); builds everything, so bad variants fail here."""
    from divergence.training.arms_module import ArmsModule

    check_shared_inputs(pair)
    folders = {arm: arm if len(arms) > 1 else "" for arm in arms}
    recorders = {arm: shadow_recorder(pair.arm_recipes[arm]) for arm in arms}
    config, key = (pair_config(pair), "pair") if len(arms) > 1 else (to_dict(pair.arm_recipes[arms[0]]), "recipe")
    return ArmsModule(
        {arm: pair.arm_recipes[arm] for arm in arms},
        folders=folders,
        labels={arm: f"{pair.name}.{arm}" for arm in arms},
        config=config,
        config_key=key,
        variants={arm: pair.arms[arm] for arm in arms},
        recorders=recorders,
    )


def pair_info(pair: PairRecipe) -> PairInfo:
    """The ``pair.json`` of a pair that starts training (``finished`` false)."""
    numerics = pair_numerics(pair)
    return PairInfo(
        name=pair.name,
        category=pair.category,
        arms=pair.labels(),
        description=pair.summary_line(),
        max_steps=pair.base.train.max_steps,
        recipe=pair_config(pair)["recipes"]["a"],
        replicate=pair.replicate,
        tracking=to_dict(pair.tracking),
        numerics=numerics,
        outside_deployment=outside_deployment(pair.arms, numerics),
        start=pretrained_start(pair.base),
        expect_identity=fp32_equivalent(pair.labels()) or None,  # the fp32-equivalent variants declare it
    )


def pretrained_start(recipe) -> str | None:
    """``pair.json``'s ``start``: the pretrained weights both arms' trained parts load (the denoiser's
    ``model.<denoiser>.path``, and the text encoder's when it trains), or None when the denoiser is
    built from ``model.seed`` (training from scratch; a frozen pretrained part does not make a fine-tune).

    >>> from divergence.recipe.run import RunRecipe
    >>> pretrained_start(RunRecipe()) is None
    True
    """
    model = recipe.model
    denoiser = getattr(model, model.denoiser)
    if denoiser.path is None:
        return None
    parts = [(f"model.{model.denoiser}", denoiser)]
    if model.text_encoder.train and model.text_encoder.path is not None:
        parts.append(("model.text_encoder", model.text_encoder))
    return ", ".join(
        f"{key}.path={part.path}"
        + "".join(f" {o}={getattr(part, o)}" for o in ("revision", "subfolder", "variant") if getattr(part, o))
        for key, part in parts
    )


def pair_numerics(pair: PairRecipe) -> dict:
    """arm -> the numerics it trains in (``pair.json``'s ``numerics``)."""
    return {arm: arm_numerics(pair.arm_recipes[arm]) for arm in ARMS}


def write_pair_files(pair_folder: PairFolder | Path, pair: PairRecipe, *, keep: bool) -> None:
    """``pair.yaml`` and ``pair.json`` (atomic: separate arms may race); ``keep``: leave files a
    first job wrote. Call on global rank zero only."""
    pair_folder = as_pair_folder(pair_folder)
    if not (keep and pair_folder.pair_yaml.is_file()):
        write_atomic(pair_folder.pair_yaml, yaml.safe_dump(pair_config(pair), sort_keys=False))
    if not (keep and pair_folder.pair_json.is_file()):
        pair_info(pair).write(pair_folder)


def shadow_recorder(recipe):
    """A ShadowRecorder for a recipe on the ``shadow`` attention variant, else None."""
    from divergence.models.attention import SHADOW

    if recipe.attention.name != SHADOW:
        return None
    from divergence.attention.shadow import ShadowRecorder

    return ShadowRecorder()


def pair_config(pair: PairRecipe) -> dict:
    """The resolved pair as plain data: name, arms' variants and both arms' recipes."""
    return {
        "name": pair.name,
        "category": pair.category,
        "control": pair.control,
        "replicate": pair.replicate,
        "arms": pair.labels(),
        "tracking": to_dict(pair.tracking),
        "recipes": {arm: to_dict(pair.arm_recipes[arm]) for arm in ARMS},
    }


def check_shared_inputs(pair: PairRecipe) -> None:
    """Both arms must read identical inputs; a variant that changes them breaks the pairing."""
    a, b = (to_dict(pair.arm_recipes[arm]) for arm in ARMS)
    for recipe in (a, b):  # data.seed may differ: an arm with its own seed gets its own batches (data-seed)
        recipe["data"] = {k: v for k, v in (recipe.get("data") or {}).items() if k != "seed"}
    for key in SHARED_INPUTS:
        if dotted(a, key) != dotted(b, key):
            raise RecipeError(
                f"arms differ in {key}, which decides the shared inputs; a pair must train on "
                "identical batches (change it in the base recipe for both arms)"
            )
    # the global batch: data-parallel ranks x accumulate x batch_size (an arm on 2 ranks of 8 sees one of
    # 16's examples; the ranks of a tensor-parallel group share one batch)
    sizes = {
        arm: (r.train.devices * r.train.num_nodes // r.train.tensor_parallel, r.train.accumulate, r.train.batch_size)
        for arm, r in pair.arm_recipes.items()
    }
    if len({n * k * b for n, k, b in sizes.values()}) > 1:
        said = ", ".join(
            f"arm {arm} {f'{n} ranks x ' if n > 1 else ''}{k}x{b} = {n * k * b}" for arm, (n, k, b) in sizes.items()
        )
        what = (
            "train.accumulate x train.batch_size"
            if {n for n, _, _ in sizes.values()} == {1}
            else "ranks x train.accumulate x train.batch_size"
        )
        raise RecipeError(
            f"arms differ in the global batch ({what}: {said}), which decides "
            "the shared inputs; a pair must train on identical batches (the same product for both arms)"
        )


def dotted(data: dict, key: str):
    """``data``'s value at the dotted ``key`` (``train.devices``), None where a part is missing."""
    for part in key.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data
