"""DeepSpeed checkpoint folders (``engine.save_checkpoint``), read through the weights-only loader.

The layout DeepSpeed documents and writes (``deepspeed/runtime/engine.py``,
``deepspeed/utils/zero_to_fp32.py``)::

    save_dir/
        latest                                   the newest tag, e.g. "global_step1000"
        global_step1000/
            mp_rank_00_model_states.pt           {"module": state_dict, "buffer_names", "param_shapes",
                                                  "ds_config", "ds_version", ...}
            zero_pp_rank_0_mp_rank_00_optim_states.pt       rank 0's ZeRO optimizer partition
            zero_pp_rank_1_mp_rank_00_optim_states.pt       (bf16_zero_pp_rank_... with bf16)

Under ZeRO stages 0, 1 and 2 every rank holds the whole model, and ``module`` in
``mp_rank_00_model_states.pt`` is its state dict in the training precision (the 16-bit
weights the forward pass used, with mixed precision): those are the weights compared. The
optimizer partitions (flattened fp32 master weights and moments) are never opened. The file is
read by ``pickled.load_checked``: weights-only, sizes checked, memory-mapped.

Refused with the reason and what to do: ZeRO stage 3 (``module`` holds empty placeholders;
the weights live only in the optimizer partitions: save with
``stage3_gather_16bit_weights_on_model_save`` or convert with ``zero_to_fp32.py``), and model
parallelism (``mp_rank_01_...``: each file holds a slice of each layer).

Accepted paths: ``save_dir`` (its ``latest`` tag is read) or a ``global_stepN`` folder.
"""

from __future__ import annotations

import math
import re
import stat
from pathlib import Path

import torch

from divergence.checkpoints import bounds
from divergence.checkpoints.files import check_path, read_regular
from divergence.checkpoints.pickled import find_state_dict, load_checked
from divergence.checkpoints.source import InMemorySource, is_count
from divergence.errors import CheckpointError

LATEST = "latest"
MODEL_STATES = "mp_rank_00_model_states.pt"
_MP_RANK = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
_ZERO3 = "zero_pp_rank_*_mp_rank_*_model_states.pt"
_TAG = re.compile(r"^[\w.\-]+$")


def is_zero_folder(path: Path) -> bool:
    """One tag's folder (``mp_rank_00_model_states.pt`` or ZeRO-3's per-rank states), or a save_dir
    whose ``latest`` file names such a folder (a stray file called ``latest`` elsewhere is not one,
    nor is a ``latest`` that is not a regular file of at most ``bounds.MAX_TAG_BYTES``: it is not read)."""
    if (path / MODEL_STATES).is_file() or any(path.glob(_ZERO3)):
        return True
    try:
        return _tag_folder(path) != path
    except CheckpointError:
        return False


def open_zero_folder(path: str | Path) -> InMemorySource:
    """The model weights of a DeepSpeed checkpoint (see the module docstring)."""
    if not stat.S_ISDIR(check_path(Path(path)).st_mode):
        raise CheckpointError(
            f"{path}: not a folder; a DeepSpeed checkpoint is a save_dir (with its 'latest' file) or a "
            "global_stepN/ folder"
        )
    folder = _tag_folder(Path(path))
    _check_layout(folder)
    states = folder / MODEL_STATES
    checkpoint = load_checked(states)
    weights = find_state_dict(checkpoint, states)
    _check_not_placeholders(states, checkpoint, weights)
    source = InMemorySource(states, weights)
    source.metadata = {"format": "deepspeed"}
    return source


def _tag_folder(path: Path) -> Path:
    """``path`` itself, or the folder its ``latest`` file names."""
    latest = path / LATEST
    if not latest.exists() or latest.is_dir() or (path / MODEL_STATES).is_file():
        return path
    tag = read_regular(latest, bounds.MAX_TAG_BYTES, "DeepSpeed 'latest' tag").decode("utf-8", "replace").strip()
    if not _TAG.match(tag) or tag in (".", ".."):
        raise CheckpointError(
            f"{latest}: names {tag[:200]!r}, not a checkpoint tag inside {path} (e.g. global_step1000)"
        )
    if not (path / tag).is_dir():
        raise CheckpointError(f"{latest}: names the tag {tag!r}, but {path / tag} is not a folder")
    return path / tag


def _check_layout(folder: Path) -> None:
    ranks = sorted(p.name for p in folder.iterdir() if _MP_RANK.match(p.name))
    if len(ranks) > 1:
        raise CheckpointError(
            f"{folder}: a model-parallel DeepSpeed checkpoint ({len(ranks)} model-parallel ranks: "
            f"{', '.join(ranks[:3])}); each file holds a slice of every layer, and divergence reads "
            "model-parallel degree 1 only: merge the slices first"
        )
    if not ranks and any(folder.glob(_ZERO3)):
        raise CheckpointError(f"{folder}: {_ZERO3_ADVICE}")
    if not ranks:
        raise CheckpointError(
            f"{folder}: no {MODEL_STATES}: expected a DeepSpeed checkpoint folder (global_stepN/ or the save_dir "
            "with its 'latest' file)"
        )


_ZERO3_ADVICE = (
    "a ZeRO stage 3 checkpoint: its weights exist only as flattened optimizer partitions; save with "
    '"stage3_gather_16bit_weights_on_model_save": true, or convert with DeepSpeed\'s zero_to_fp32.py, '
    "and compare the result"
)


def _check_not_placeholders(states: Path, checkpoint, weights: dict[str, torch.Tensor]) -> None:
    """ZeRO-3 writes empty tensors in ``module`` where ``param_shapes`` says the real shapes are."""
    shapes = checkpoint.get("param_shapes") if isinstance(checkpoint, dict) else None
    groups = shapes if isinstance(shapes, list) else [shapes] if isinstance(shapes, dict) else []
    for group in groups:
        for name, shape in group.items() if isinstance(group, dict) else ():
            tensor = weights.get(name)
            if tensor is not None and tensor.numel() == 0 and _numel(states, name, shape) > 0:
                raise CheckpointError(f"{states}: {_ZERO3_ADVICE} ({name!r} is an empty placeholder)")


def _numel(states: Path, name, shape) -> int:
    """The number of elements of a ``param_shapes`` entry (a ``torch.Size`` as DeepSpeed saves it)."""
    if not (isinstance(shape, (list, tuple)) and all(map(is_count, shape))):
        raise CheckpointError(
            f"{states}: param_shapes gives {str(name)[:80]!r} the shape {str(shape)[:60]}, not a list of sizes; "
            "the file is corrupt"
        )
    return math.prod(shape)
