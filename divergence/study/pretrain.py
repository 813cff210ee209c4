"""A fine-tuning study's starting weights: the base model pretrained on first use, cached in the study.

A study recipe with ``pretrain: {steps: N}`` (``recipes/study-finetune.yaml``) fine-tunes every pair
from one pretrained model (``docs/method.md``, "Fine-tuning"). On first use ``divergence study``
trains the base recipe (with ``pretrain.recipe``'s changes) N steps as a single run into
``OUT/pretrained/run`` (``divergence train``, a child process like every pair run), then writes its
step-N denoiser and text encoder as ``save_pretrained`` folders, ``OUT/pretrained/unet`` and
``OUT/pretrained/text_encoder``: what a diffusers user fine-tunes from. Every pair's recipe loads
them (``model.unet.path``, ``model.text_encoder.path``), so every arm starts from bitwise the same
weights and each ``pair.json`` records them as ``start``. A study run again finds the folders and
trains nothing; an interrupted pretraining resumes like any run.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from divergence.errors import RecipeError, UserInputError
from divergence.config.yaml_safe import short
from divergence.training import child_start

PARTS = ("unet", "text_encoder")  # the trained parts a fine-tune starts from, as save_pretrained folders
PRETRAIN_KEYS = {"steps", "recipe"}
POLL_SECONDS = 2.0  # how often the pretraining bar reads the run's log


def check_pretrain(spec, where: str) -> dict | None:
    """``pretrain`` of a study recipe: ``{steps: N >= 1, recipe: {...}}`` or None (train from scratch)."""
    if spec is None:
        return None
    if not isinstance(spec, dict) or set(spec) - PRETRAIN_KEYS or "steps" not in spec:
        raise RecipeError(
            f"{where}: pretrain: expected {{steps: N, recipe: {{...}}}} (recipe optional), got {short(spec)}"
        )
    steps = spec["steps"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise RecipeError(f"{where}: pretrain.steps: expected a positive integer, got {short(steps)}")
    if not isinstance(spec.get("recipe") or {}, dict):
        raise RecipeError(f"{where}: pretrain.recipe: expected a mapping of base-recipe changes")
    return {"steps": steps, "recipe": dict(spec.get("recipe") or {})}


def folder(out: Path) -> Path:
    return Path(out) / "pretrained"


def start_paths(out: Path) -> dict:
    """The recipe changes that make a pair fine-tune from the study's pretrained model."""
    where = folder(out).resolve()
    return {"model": {part: {"path": str(where / part)} for part in PARTS}}


def with_start(recipe: dict, out: Path) -> dict:
    """A pair's ``recipe`` (changes to the base) with the pretrained parts' paths merged in."""
    merged = copy.deepcopy(recipe)
    model = merged.setdefault("model", {})
    for part, value in start_paths(out)["model"].items():
        model[part] = {**(model.get(part) or {}), **value}
    return merged


def ensure_pretrained(base: Path, pretrain: dict, out: Path, quiet: bool = False) -> Path:
    """``OUT/pretrained``, trained and written when its parts are missing (the cache otherwise)."""
    where = folder(out)
    if all((where / part / "config.json").is_file() for part in PARTS):
        return where
    run = where / "run"
    recipe = _merge(yaml.safe_load(Path(base).read_text()) or {}, pretrain["recipe"])
    recipe.setdefault("train", {})["max_steps"] = pretrain["steps"]
    recipe["train"]["checkpoint_every"] = pretrain["steps"]
    recipe.setdefault("sample", {})["enabled"] = False
    where.mkdir(parents=True, exist_ok=True)
    (where / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    if not quiet:
        print(f"pretraining the start of every pair: {pretrain['steps']} steps into {run}", flush=True)
    command = [sys.executable, "-m", "divergence", "train", "--recipe", str(where / "recipe.yaml"), "--out", str(run)]
    with open(where / "pretrain.log", "a") as log:
        child = child_start.start(  # forked from the zygote the study's pair runs then reuse, or Popen
            [*command, "log.wandb=false", "log.progress_bar=false"],
            dict(os.environ),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    code = _wait_showing_steps(child, run, pretrain["steps"], quiet)
    if code != 0:
        raise UserInputError(f"pretraining failed (exit {code}): see {where / 'pretrain.log'}")
    export_parts(where / "recipe.yaml", run / "checkpoints" / f"step_{pretrain['steps']:06d}.safetensors", where)
    return where


def _wait_showing_steps(child: subprocess.Popen | child_start.ForkedChild, run: Path, steps: int, quiet: bool) -> int:
    """The child's exit code, with a bar of the steps its CSV log (``run/csv/metrics.csv``) has
    reached; a Ctrl-C or an error stops the child before it is raised."""
    from tqdm import tqdm

    bar = tqdm(total=steps, desc=f"{'pretraining':<22}", unit="step", disable=quiet)
    try:
        while child.poll() is None:
            time.sleep(POLL_SECONDS)
            bar.update(max(0, min(steps_logged(run), steps) - bar.n))
        bar.update(max(0, min(steps_logged(run), steps) - bar.n))
        return child.returncode
    except BaseException:
        child.kill()
        child.wait()
        raise
    finally:
        bar.close()


def steps_logged(run: Path) -> int:
    """The steps a single run has finished, from its CSV log's last row (0 before the first)."""
    try:
        lines = (run / "csv" / "metrics.csv").read_text().split("\n")[:-1]  # whole lines: a row half written waits
        step = lines[0].split(",").index("step")
        return int(lines[-1].split(",")[step]) + 1 if len(lines) > 1 else 0
    except (OSError, IndexError, ValueError):  # not written yet
        return 0


def export_parts(recipe_path: Path, weights: Path, out: Path) -> None:
    """The denoiser and text encoder of a run's weights file as ``save_pretrained`` folders in ``out``."""
    from safetensors.torch import load_file

    from divergence.recipe.run import load_run_recipe
    from divergence.training.arm import Arm
    from divergence.training.inputs import Inputs

    recipe = load_run_recipe(recipe_path)
    arm = Arm(recipe, Inputs(recipe).tokenizer)
    state = {k: v for k, v in load_file(str(weights)).items() if not k.startswith("ema.")}
    missing, unexpected = arm.load_state_dict(state, strict=False)
    wanted = [k for k in missing if k.startswith(tuple(f"{p}." for p in PARTS))]
    if wanted or unexpected:
        raise UserInputError(f"{weights}: does not hold the recipe's model ({(wanted or unexpected)[0]})")
    for part in PARTS:
        getattr(arm, part).save_pretrained(str(out / part))


def _merge(base: dict, changes: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
