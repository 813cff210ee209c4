"""A series of checkpoints of one training run, found in a folder and numbered by step.

What a training run leaves behind, one checkpoint per save, with the step in the name:

- diffusers / accelerate: ``checkpoint-500/`` folders (with ``component``: ``checkpoint-500/unet``);
- Lightning: ``epoch=0-step=500.ckpt`` (the step after ``step=``; a ``.ckpt`` without one is
  numbered by the ``global_step`` stored in it, read with the weights-only loader);
- ``step_500.safetensors``, ``model-500.pt`` (the last number in the name), or
  ``save_pretrained`` folders ``step_500/``, ``step-500/``, ``500/``;
- an arm's ``checkpoints/step_000500.dcp/`` DCP folders (``ArmWriter(..., format="dcp")``), once
  their ``complete.json`` is written (one without it is being written and left out).

Anything else in the folder (logs, a ``last.ckpt`` repeating a numbered step, hidden
temporary files) is left out.
"""

from __future__ import annotations

import re
from pathlib import Path

from divergence.errors import CheckpointError, UserInputError
from divergence.pairfolder.layout import DCP_COMPLETE_FILE  # an arm's step_N.dcp/ is complete once it holds it

SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth", ".bin")
_LIGHTNING_STEP = re.compile(r"step=(\d+)")
_LAST_NUMBER = re.compile(r"(\d+)(?!.*\d)")
_FOLDER = re.compile(r"^(?:checkpoint|checkpoints|step|global_step|iter|ckpt)?[-_=]?(\d+)(?:\.dcp)?$")


def find_series(folder: str | Path, component: str | None = None) -> dict[int, Path]:
    """``{step: checkpoint path}`` of the checkpoints in ``folder``, sorted by step."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserInputError(f"{folder}: not a folder; give the folder a run saved its checkpoints into")
    series: dict[int, Path] = {}
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
        if step in series:
            raise UserInputError(
                f"{folder}: two checkpoints of step {step} ({series[step].name}, {entry.name}); move one of them out"
            )
        series[step] = path
    if not series:
        raise UserInputError(
            f"{folder}: no step-numbered checkpoints (checkpoint-N/, *step=N*.ckpt, "
            "step_N.safetensors or step_N/ save_pretrained folders)"
        )
    return dict(sorted(series.items()))


def _check_no_component_needed(entry: Path) -> None:
    """An accelerate ``checkpoint-N/`` whose model lies in a subfolder (diffusers' save hook writes
    ``checkpoint-N/unet``) beside optimizer and RNG files: name the subfolder to compare."""
    if (entry / "model_index.json").is_file() or any(entry.glob("*.safetensors")):
        return  # a pipeline (read component by component) or the model's own weights at the top
    models = sorted(d.name for d in entry.iterdir() if d.is_dir() and any(d.glob("*.safetensors")))
    if models:
        raise UserInputError(
            f"{entry}: the model lies in a subfolder ({', '.join(models)}) beside optimizer and RNG files; "
            f"pass --component {models[0]} to compare it"
        )


def step_of(entry: Path) -> int | None:
    """The training step a checkpoint's name (or, for an unnumbered ``.ckpt``, its content) gives."""
    if entry.is_dir():
        found = _FOLDER.match(entry.name)
        return int(found.group(1)) if found else None
    stem = entry.stem
    found = _LIGHTNING_STEP.search(stem) or _LAST_NUMBER.search(stem)
    if found:
        return int(found.group(1))
    if entry.suffix == ".ckpt" and stem != "last":
        return _stored_global_step(entry)
    return None


def _stored_global_step(path: Path) -> int | None:
    from divergence.checkpoints.pickled import load_checked

    try:
        obj = load_checked(path)
    except CheckpointError:
        return None
    step = obj.get("global_step") if isinstance(obj, dict) else None
    return int(step) if isinstance(step, int) else None
