"""A series of checkpoints of one training run, found in a folder and numbered by step.

What a training run leaves behind, one checkpoint per save, with the step in the name:

- diffusers / accelerate: ``checkpoint-500/`` folders (with ``component``: ``checkpoint-500/unet``);
- Lightning: a ``.ckpt`` is numbered by the ``global_step`` stored in it (read with the
  weights-only loader), whatever its name says (``epoch=3.ckpt``, ``{epoch}-{val_loss:.2f}``
  names); one that stores none by the number after ``step=`` in its name, else by the last
  number of a name without ``=``. ``last.ckpt`` and ``last-vN.ckpt`` are left out when they
  repeat a step another checkpoint of the folder holds;
- ``step_500.safetensors``, ``model-500.pt`` (the last number in the name), or
  ``save_pretrained`` folders ``step_500/``, ``step-500/``, ``500/``;
- an arm's ``checkpoints/step_000500.dcp/`` DCP folders (``ArmWriter(..., format="dcp")``), once
  their ``complete.json`` is written (one without it is being written and left out).

Two checkpoints of one step are an error naming both. Anything else in the folder (logs,
hidden temporary files) is left out.
"""

from __future__ import annotations

import re
from pathlib import Path

from divergence.errors import CheckpointError, UserInputError
from divergence.formats import DCP_COMPLETE_FILE  # an arm's step_N.dcp/ is complete once it holds it

SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth", ".bin")
_LIGHTNING_STEP = re.compile(r"step=(\d+)")
_LAST_NUMBER = re.compile(r"(\d+)(?!.*\d)")
_LAST = re.compile(r"^last(?:-v\d+)?$")  # Lightning's save_last copies (-vN when the name was taken)
_FOLDER = re.compile(r"^(?:checkpoint|checkpoints|step|global_step|iter|ckpt)?[-_=]?(\d+)(?:\.dcp)?$")


def find_series(folder: str | Path, component: str | None = None) -> dict[int, Path]:
    """``{step: checkpoint path}`` of the checkpoints in ``folder``, sorted by step."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserInputError(f"{folder}: not a folder; give the folder a run saved its checkpoints into")
    series: dict[int, Path] = {}
    latest: dict[int, list[Path]] = {}  # last.ckpt, last-vN.ckpt: kept where no other checkpoint has the step
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(".") or not (entry.is_dir() or entry.suffix in SUFFIXES):
            continue
        step = step_of(entry)
        if step is None or (entry.suffix == ".dcp" and not (entry / DCP_COMPLETE_FILE).is_file()):
            continue  # not a checkpoint, or an arm's DCP folder still being written
        path = entry / component if component and entry.is_dir() else entry
        if component and entry.is_dir() and not path.exists():
            raise UserInputError(
                f"{entry}: no component {component!r} in it (found: "
                f"{', '.join(sorted(p.name for p in entry.iterdir())[:8]) or 'nothing'})"
            )
        if not component and entry.is_dir():
            _check_no_component_needed(entry)
        if _LAST.match(entry.stem):
            latest.setdefault(step, []).append(path)
        else:
            _add(series, step, path, folder)
    for step, paths in latest.items():
        if step not in series:
            for path in paths:
                _add(series, step, path, folder)
    if not series:
        raise UserInputError(
            f"{folder}: no step-numbered checkpoints (checkpoint-N/, *.ckpt, step_N.safetensors or "
            "step_N/ save_pretrained folders)"
        )
    return dict(sorted(series.items()))


def _add(series: dict[int, Path], step: int, path: Path, folder: Path) -> None:
    if step in series:
        how = " (a .ckpt is numbered by the global_step stored in it)" if path.suffix == ".ckpt" else ""
        raise UserInputError(
            f"{folder}: two checkpoints of step {step} ({series[step].name}, {path.name}){how}; move one of them out"
        )
    series[step] = path


def _check_no_component_needed(entry: Path) -> None:
    """An accelerate ``checkpoint-N/`` whose model lies in a subfolder (diffusers' save hook writes
    ``checkpoint-N/unet``; accelerate's FSDP ``save_state`` the DCP folder ``pytorch_model_fsdp_0/``
    beside ``optimizer_0/``) beside optimizer and RNG files: name the subfolder to compare."""
    if (entry / "model_index.json").is_file() or any(entry.glob("*.safetensors")):
        return  # a pipeline (read component by component) or the model's own weights at the top
    from divergence.checkpoints.dcp import OPTIMIZER_PREFIX, is_dcp_folder

    models = sorted(
        d.name
        for d in entry.iterdir()
        if d.is_dir()
        and (any(d.glob("*.safetensors")) or (is_dcp_folder(d) and not d.name.startswith(OPTIMIZER_PREFIX)))
    )
    if models:
        raise UserInputError(
            f"{entry}: the model lies in a subfolder ({', '.join(models)}) beside optimizer and RNG files; "
            f"pass --component {models[0]} to compare it"
        )


def step_of(entry: Path) -> int | None:
    """The training step of a checkpoint: what a ``.ckpt`` holds, else what its name gives."""
    if entry.is_dir():
        found = _FOLDER.match(entry.name)
        return int(found.group(1)) if found else None
    stem = entry.stem
    if entry.suffix == ".ckpt":
        stored = stored_global_step(entry)
        if stored is not None:
            return stored
        found = _LIGHTNING_STEP.search(stem)
        if not found and "=" not in stem and not _LAST.match(stem):  # epoch=3, last-v1: no step in the name
            found = _LAST_NUMBER.search(stem)
    else:
        found = _LIGHTNING_STEP.search(stem) or _LAST_NUMBER.search(stem)
    return int(found.group(1)) if found else None


def stored_global_step(path: Path) -> int | None:
    """The ``global_step`` a Lightning ``.ckpt`` stores (None when it stores none), loaded weights-only:
    a file that cannot be loaded safely, or whose ``global_step`` is not a step, is a ``CheckpointError``."""
    from divergence.checkpoints.pickled import load_checked

    obj = load_checked(path)
    step = obj.get("global_step") if isinstance(obj, dict) else None
    if step is None:
        return None
    if type(step) is not int or step < 0:
        raise CheckpointError(
            f"{path}: global_step is {str(step)[:40]!r}, not a step number (an integer >= 0); "
            "re-save the checkpoint or move it out of the folder"
        )
    return step
