"""Folders written by ``save_pretrained`` (diffusers, transformers) and diffusers pipelines.

Resolution order inside a model folder, as ``from_pretrained`` does:
``*.safetensors.index.json`` (sharded) > one ``*.safetensors`` > ``*.bin.index.json`` >
one ``*.bin``. A pipeline folder (``model_index.json``) is read component by component,
each tensor named ``<component>.<name>`` (``unet.conv_in.weight``): the components
``model_index.json`` lists, so the ``checkpoint-N/`` folders a diffusers training script leaves
beside its final pipeline in ``output_dir`` are skipped (and said: ``skipped_folders`` in the
source's metadata; ``divergence track`` compares them as a series).

A shard index is untrusted input: its ``weight_map`` must map tensor names to file names,
and every shard must be a relative path inside the folder (no ``..`` component, not
absolute), so an index cannot make divergence read ``/etc/passwd`` or a sibling's files.
Shards themselves may be symbolic links (the Hugging Face cache links into ``blobs/``).
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

from divergence.atomic import read_json
from divergence.checkpoints.files import read_regular
from divergence.checkpoints.pickled import load_pickled
from divergence.checkpoints.safetensors_file import SafetensorsFile
from divergence.checkpoints.source import CompositeSource, TensorSource
from divergence.errors import CheckpointError

# The names save_pretrained uses for unsharded weights, preferred over other files.
STANDARD_NAMES = ("model", "diffusion_pytorch_model", "pytorch_model", "adapter_model")


def open_folder(path: Path, prefix: str = "", pipeline: bool = True) -> TensorSource:
    """The weights of a model folder, or of a pipeline folder's components (``pipeline=False``
    inside a pipeline: components are model folders, so a linked loop cannot recurse)."""
    if pipeline and (path / "model_index.json").is_file():
        return _open_pipeline(path)
    for pattern, opener in (
        ("*.safetensors.index.json", _open_sharded),
        ("*.safetensors", _open_single),
        ("*.bin.index.json", _open_sharded),
        ("*.bin", _open_single),
    ):
        candidates = sorted(path.glob(pattern))
        if pattern.endswith(".json"):
            candidates = [c for c in candidates if c.is_file()]
        if candidates:
            return opener(path, _pick(path, candidates, pattern), prefix)
    raise _NoWeights(
        f"{path}: no weights found: expected a save_pretrained folder (*.safetensors, "
        "*.safetensors.index.json, *.bin) or a diffusers pipeline (model_index.json)" + _pickle_hint(path)
    )


PICKLE_SUFFIXES = (".pt", ".pth", ".ckpt")


def _pickle_hint(path: Path) -> str:
    """Where a folder holds a torch pickle of the model (DeepSpeed's ``global_stepN/
    mp_rank_00_model_states.pt``), how to point at it; an optimizer state's file is not one."""
    files = sorted(
        p.relative_to(path).as_posix() for p in path.glob("*") if p.suffix in PICKLE_SUFFIXES and p.is_file()
    )
    if not files:  # a DeepSpeed save_checkpoint folder: global_stepN/ inside it
        files = sorted(
            p.relative_to(path).as_posix() for p in path.glob("global_step*/*model_states.pt") if p.is_file()
        )
    models = [f for f in files if "model" in f] or [f for f in files if "optim" not in f]
    if not models:
        return ""
    return f"; it holds {models[0]}, a torch pickle divergence reads: point at that file ({path / models[0]})"


class _NoWeights(CheckpointError):
    """A folder without weight files (a pipeline's tokenizer/ or scheduler/)."""


def _pick(folder: Path, candidates: list[Path], pattern: str) -> Path:
    """One file among candidates: the only one, or the unique save_pretrained standard name."""
    if len(candidates) == 1:
        return candidates[0]
    suffix = pattern.lstrip("*")
    standard = [c for c in candidates if c.name.removesuffix(suffix) in STANDARD_NAMES]
    if len(standard) == 1:
        return standard[0]
    names = ", ".join(c.name for c in candidates[:5])
    raise CheckpointError(f"{folder}: several weight files ({names}); point at one file instead of the folder")


def _open_single(folder: Path, file: Path, prefix: str) -> TensorSource:
    return SafetensorsFile(file, prefix) if file.suffix == ".safetensors" else load_pickled(file, prefix)


MAX_INDEX = 100_000_000  # bytes; the largest real index files are a few MB


def _read_weight_map(index: Path) -> dict[str, str]:
    data = read_regular(index, MAX_INDEX, "shard index")
    try:
        weight_map = json.loads(data.decode("utf-8"))["weight_map"]
    except RecursionError:
        raise CheckpointError(f"{index}: corrupt shard index: JSON nested too deeply") from None
    except (ValueError, KeyError, TypeError):
        raise CheckpointError(f"{index}: corrupt shard index (expected a JSON object with 'weight_map')") from None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index}: corrupt shard index: 'weight_map' must map tensor names to shard files")
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise CheckpointError(f"{index}: corrupt shard index: tensor {name!r} maps to {shard!r}, not a file name")
        parts = PurePosixPath(shard.replace("\\", "/")).parts
        if not shard or shard.startswith(("/", "\\")) or ".." in parts or ":" in shard:
            raise CheckpointError(
                f"{index}: tensor {name!r} points at {shard!r}, outside the folder; shard files must be "
                "relative paths inside it"
            )
    return weight_map


def _open_sharded(folder: Path, index: Path, prefix: str) -> TensorSource:
    weight_map = _read_weight_map(index)
    shards = sorted(set(weight_map.values()))
    if not shards:
        raise CheckpointError(f"{index}: the shard index lists no tensors")
    missing = [s for s in shards if not (folder / s).is_file()]
    if missing:
        raise CheckpointError(f"{index}: shard {missing[0]} is missing ({len(missing)} of {len(shards)} missing)")
    parts = [_open_single(folder, folder / s, prefix) for s in shards]
    source = CompositeSource(index, parts)
    listed = {prefix + n for n in weight_map}
    if set(source.names) != listed:
        extra = sorted(listed.symmetric_difference(source.names))
        raise CheckpointError(f"{index}: index and shards disagree on {len(extra)} tensors, e.g. {extra[0]!r}")
    return source


def _open_pipeline(path: Path) -> TensorSource:
    listed = _pipeline_components(path)
    parts, skipped = [], []
    for component in sorted(p for p in path.iterdir() if p.is_dir()):
        if listed is not None and component.name not in listed:
            skipped.append(component.name)  # checkpoint-N/, logs/: not a part of the pipeline
            continue
        try:
            parts.append(open_folder(component, prefix=f"{component.name}.", pipeline=False))
        except _NoWeights:
            continue  # tokenizer/, scheduler/ and other folders without weights
    if not parts:
        raise CheckpointError(f"{path}: a diffusers pipeline folder with no component weights")
    source = CompositeSource(path, parts)
    if skipped:
        source.metadata["skipped_folders"] = _skipped_line(path, skipped)
    return source


def _pipeline_components(path: Path) -> set[str] | None:
    """The component names ``model_index.json`` lists (its keys but ``_class_name``, ``_diffusers_version``);
    None when it lists none or cannot be read as a JSON object (every folder is then tried)."""
    index = read_json(path / "model_index.json")
    listed = {k for k in index if not k.startswith("_")} if isinstance(index, dict) else set()
    return listed or None


def _skipped_line(path: Path, skipped: list[str]) -> str:
    series = [s for s in skipped if s.startswith("checkpoint-")]
    shown = ", ".join(f"{s}/" for s in skipped[:3]) + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")
    line = f"compared {path}'s final pipeline; skipped {shown} (not in its model_index.json)"
    if series:
        models = sorted(p.name for p in (path / series[0]).iterdir() if p.is_dir() and "ema" not in p.name)
        component = f" --component {models[0]}" if models else ""  # diffusers' save hook: checkpoint-N/unet
        line += (
            f"; to compare the {len(series)} training checkpoints step by step: divergence track "
            f"{path} OTHER_OUTPUT_DIR{component} --out PAIR"
        )
    return line
