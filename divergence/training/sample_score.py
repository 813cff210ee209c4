"""The sample score of a trained arm: its images for the evaluation captions and seeds, checked.

``load_trained(out, arm, step)`` builds an arm of a pair folder (its recipe from ``pair.yaml``) or
a run folder (``recipe.yaml``; ``arm`` None) and loads its weights file of ``step`` (the last one
written when None): the UNet and text encoder, not the EMA. ``draw`` samples it for captions and
seeds (``divergence.models.seeded_sampling``: image ``[s, n]`` from its own noise), and
``score_samples`` reads them with the shapes checker (``divergence.data.shape_check``): the hit
rate per attribute and all together, each with Wilson's interval over the ``S x N`` images and
the bootstrap over seeds (``divergence.metrics.score_intervals``).

The model samples in its recipe's own numerics (precision and attention, as a user's deployed
model would); sampling never changes training, it reads the weights only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from divergence.config.schema import parse
from divergence.config.yaml_safe import read_yaml
from divergence.errors import UserInputError
from divergence.pairfolder.folder import PairFolder, RunFolder, weight_steps
from divergence.recipe.run import RunRecipe, load_run_recipe


@dataclass
class TrainedArm:
    """An arm with trained weights and the recipe's inputs (tokenizer, scheduler, codec)."""

    arm: object  # divergence.training.arm.Arm
    inputs: object  # divergence.training.inputs.Inputs
    step: int


def load_trained(out: str | Path, arm: str | None = None, step: int | None = None, device="cpu") -> TrainedArm:
    """Arm ``arm`` of pair folder ``out`` (or, with ``arm`` None, run folder ``out``) at ``step``."""
    from divergence.training.arm import Arm
    from divergence.training.inputs import Inputs
    from divergence.training.probe_files import _load_weights

    recipe, run_folder = _recipe_and_folder(Path(out), arm)
    if step is None:
        steps = weight_steps(run_folder)
        if not steps:
            raise UserInputError(f"{run_folder.checkpoints_dir}: no weights files (step_NNNNNN.safetensors)")
        step = steps[-1]
    path = run_folder.weights(step)
    if not path.is_file():
        raise UserInputError(f"{path}: no weights file of step {step} (a safetensors file is needed)")
    inputs = Inputs(recipe)
    model = Arm(recipe, inputs.tokenizer, name=arm or "arm")
    model.setup(torch.device(device))
    model.to(device)
    inputs.to(torch.device(device))
    _load_weights(model, str(path))
    model.eval()
    return TrainedArm(model, inputs, step)


def draw(
    trained: TrainedArm,
    captions: list[str],
    seeds: list[int],
    *,
    steps: int = 25,
    sampler: str = "ddim",
    guidance_scale: float = 3.0,
    batch_size: int = 64,
) -> torch.Tensor:
    """(S, N, H, W, 3) uint8: ``trained``'s image of ``captions[n]`` from ``seeds[s]``."""
    from divergence.models.seeded_sampling import sample_images

    inputs, arm = trained.inputs, trained.arm
    return sample_images(
        arm.unet,
        arm.text_encoder,
        inputs.tokenizer,
        inputs.noise_scheduler,
        captions,
        seeds,
        inputs.latent_shape,
        steps=steps,
        sampler=sampler,
        guidance_scale=guidance_scale,
        batch_size=batch_size,
        decode=inputs.codec.decode if inputs.codec.latent_space else None,
        autocast=arm.policy.autocast,
    )


def score_samples(images: torch.Tensor, captions: list[str]) -> dict:
    """``{"hits": {attribute: (S, N) bool}, "rates": {attribute: {rate, wilson, bootstrap}}}``
    for images (S, N, H, W, 3) of ``captions`` (N) from S seeds."""
    from divergence.data.shape_check import score
    from divergence.metrics.score_intervals import seed_bootstrap, wilson_interval

    seeds, count = images.shape[:2]
    hits = score(images.reshape(seeds * count, *images.shape[2:]), list(captions) * seeds)
    hits = {name: value.reshape(seeds, count) for name, value in hits.items()}
    rates = {}
    for name, table in hits.items():
        rate, low, high = seed_bootstrap(table)
        rates[name] = {
            "rate": rate,
            "wilson": list(wilson_interval(int(table.sum()), table.numel())),
            "bootstrap": [low, high],
        }
    return {"hits": hits, "rates": rates}


def _recipe_and_folder(out: Path, arm: str | None) -> tuple[RunRecipe, RunFolder]:
    if arm is None:
        folder = RunFolder(out)
        if not folder.recipe.is_file():
            raise UserInputError(f"{folder.recipe}: not found; {out} is no run folder of `divergence train`")
        return load_run_recipe(folder.recipe), folder
    pair_folder = PairFolder(out)
    if not pair_folder.pair_yaml.is_file():
        raise UserInputError(f"{pair_folder.pair_yaml}: not found; a pair trained by `divergence train` has it")
    recipes = read_yaml(pair_folder.pair_yaml).get("recipes") or {}
    if arm not in recipes:
        raise UserInputError(f"{pair_folder.pair_yaml}: no recipes.{arm}")
    return parse(RunRecipe, recipes[arm], f"recipes.{arm}"), pair_folder.arm(arm)
