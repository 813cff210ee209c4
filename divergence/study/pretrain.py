"""A fine-tuning study's starting weights: the base model pretrained on first use, cached in the study.

A study recipe with ``pretrain: {steps: N}`` (``recipes/study-finetune.yaml``) fine-tunes every pair
from one pretrained model (``docs/method.md``, "Fine-tuning"). On first use ``divergence study``
trains the base recipe (with ``pretrain.recipe``'s changes) N steps as a single run into
``OUT/pretrained/run`` (``divergence train``, a child process like every pair run), then writes its
step-N denoiser and text encoder as ``save_pretrained`` folders, ``OUT/pretrained/unet`` and
``OUT/pretrained/text_encoder``: what a diffusers user fine-tunes from. Every pair's recipe loads
them (``model.unet.path``, ``model.text_encoder.path``), so every arm starts from bitwise the same
weights and each ``pair.json`` records them as ``start``.

The cache is keyed on the resolved pretraining recipe: ``OUT/pretrained/recipe.yaml`` (the base
with ``pretrain.recipe``'s changes and ``train.max_steps`` = ``pretrain.steps``) is what the folders
were built from. A study run again with the same recipe finds the folders and trains nothing; an
interrupted pretraining of it resumes like any run. A different recipe (``pretrain.steps=5`` over
a 200-step model, an edited base) pretrains again, in one line saying which key changed; when pair
runs in OUT already fine-tuned the old model it is refused instead, in one line saying what to do
(their report would mix two starts).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import yaml

from divergence.errors import RecipeError, UserInputError
from divergence.config.yaml_safe import read_yaml, short
from divergence.pairfolder.layout import PAIR_RECIPE_FILE, RUN_RECIPE_FILE
from divergence.recipe.pair import merge
from divergence.training import child_start
from divergence.training.separate_pair import arm_command

PARTS = ("unet", "text_encoder")  # the trained parts a fine-tune starts from, as save_pretrained folders
PRETRAIN_KEYS = {"steps", "recipe"}
POLL_SECONDS = 0.2  # how often the pretraining bar reads the run's log, and how soon its end is seen


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


def with_start(recipe: dict, out: Path) -> dict:
    """A pair's ``recipe`` (changes to the base) with the pretrained parts' paths merged in: the
    changes that make a pair fine-tune from the study's pretrained model."""
    where = folder(out).resolve()
    return merge(recipe, {"model": {part: {"path": str(where / part)} for part in PARTS}})


def ensure_pretrained(base: Path, pretrain: dict, out: Path, quiet: bool = False, runs=()) -> Path:
    """``OUT/pretrained``, trained and written unless its parts were built from this pretraining
    recipe (the cache; see the module docstring). ``runs``: the study's pair-run folders, whose
    started runs keep a changed recipe from replacing the model they fine-tuned."""
    where = folder(out)
    recipe = pretrain_recipe(base, pretrain)
    change = _change(where, recipe)
    if change is None and all((where / part / "config.json").is_file() for part in PARTS):
        return where
    if change is not None and _built(where):
        _replace(where, change, runs)
    run = where / "run"
    where.mkdir(parents=True, exist_ok=True)
    (where / RUN_RECIPE_FILE).write_text(yaml.safe_dump(recipe, sort_keys=False))
    if not quiet:
        print(f"pretraining the start of every pair: {pretrain['steps']} steps into {run}", flush=True)
    command = arm_command(where / RUN_RECIPE_FILE, run, ["log.wandb=false", "log.progress_bar=false"])
    with open(where / "pretrain.log", "a") as log:
        child = child_start.start(  # forked from the zygote the study's pair runs then reuse, or Popen
            command,
            dict(os.environ),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    code = _wait_showing_steps(child, run, pretrain["steps"], quiet)
    if code != 0:
        raise UserInputError(f"pretraining failed (exit {code}): see {where / 'pretrain.log'}")
    export_parts(where / RUN_RECIPE_FILE, run / "checkpoints" / f"step_{pretrain['steps']:06d}.safetensors", where)
    return where


def pretrain_recipe(base: Path, pretrain: dict) -> dict:
    """The run recipe pretraining trains: the base file with ``pretrain.recipe``'s changes, N steps,
    one checkpoint (the last), no samples."""
    recipe = merge(yaml.safe_load(Path(base).read_text()) or {}, pretrain["recipe"])
    recipe.setdefault("train", {})["max_steps"] = pretrain["steps"]
    recipe["train"]["checkpoint_every"] = pretrain["steps"]
    recipe.setdefault("sample", {})["enabled"] = False
    return recipe


def _built(where: Path) -> bool:
    """Whether ``where`` holds anything pretraining made: a part or the run."""
    return any((where / name).exists() for name in (*PARTS, "run"))


def _change(where: Path, recipe: dict) -> str | None:
    """How ``recipe`` differs from the one ``where`` was built from (its first differing key), or None."""
    saved = where / RUN_RECIPE_FILE
    try:
        built = read_yaml(saved) if saved.is_file() else None
    except (OSError, RecipeError):
        built = None
    if built is None:
        return None if not _built(where) else f"no readable {RUN_RECIPE_FILE} says what it was built from"
    key, old, new = _first_difference(built, recipe)
    return None if key is None else f"{key} {short(old)}, this study's {short(new)}"


def _first_difference(old, new, key: str = ""):
    """(dotted key, old value, new value) of the first difference between two plain-data trees, or
    (None, None, None) when they are equal."""
    if isinstance(old, dict) and isinstance(new, dict):
        for name in [*old, *(k for k in new if k not in old)]:
            found = _first_difference(old.get(name), new.get(name), f"{key}.{name}" if key else str(name))
            if found[0] is not None:
                return found
        return None, None, None
    return (None, None, None) if old == new else (key or "the recipe", old, new)


def _replace(where: Path, change: str, runs) -> None:
    """Discard a pretrained model built from another recipe, saying why; refused (one line) when a
    pair run of this study already started from it."""
    started = [r for r in runs if (Path(r) / PAIR_RECIPE_FILE).is_file()]
    if started:
        raise UserInputError(
            f"{where}: pretrained from another recipe ({change}), and {started[0]} (and every pair run beside "
            f"it) fine-tunes that model; give a new --out, or delete {where.parent}'s pair runs and {where} "
            "to pretrain again"
        )
    print(f"{where}: pretrained from another recipe ({change}): pretraining again", flush=True)
    for part in PARTS:  # the parts first: a rebuild stopped half-way leaves no part to be taken for the new one
        shutil.rmtree(where / part, ignore_errors=True)
    shutil.rmtree(where / "run", ignore_errors=True)


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
