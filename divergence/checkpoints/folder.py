"""Folders written by ``save_pretrained`` (diffusers, transformers) and diffusers pipelines.

Resolution order inside a model folder, as ``from_pretrained`` does:
``*.safetensors.index.json`` (sharded) > one ``*.safetensors`` > ``*.bin.index.json`` >
one ``*.bin``. A pipeline folder (``model_index.json``) is read component by component,
each tensor named ``<component>.<name>`` (``unet.conv_in.weight``).
"""

from __future__ import annotations

import json
from pathlib import Path

from divergence.checkpoints.pickled import load_pickled
from divergence.checkpoints.safetensors_file import SafetensorsFile
from divergence.checkpoints.source import CompositeSource, TensorSource
from divergence.errors import CheckpointError

# The names save_pretrained uses for unsharded weights, preferred over other files.
STANDARD_NAMES = ("model", "diffusion_pytorch_model", "pytorch_model", "adapter_model")


def open_folder(path: Path, prefix: str = "") -> TensorSource:
    if (path / "model_index.json").is_file():
        return _open_pipeline(path)
    for pattern, opener in (("*.safetensors.index.json", _open_sharded), ("*.safetensors", _open_single),
                            ("*.bin.index.json", _open_sharded), ("*.bin", _open_single)):
        candidates = sorted(path.glob(pattern))
        if pattern.endswith(".json"):
            candidates = [c for c in candidates if c.is_file()]
        if candidates:
            return opener(path, _pick(path, candidates, pattern), prefix)
    raise CheckpointError(
        f"{path}: no weights found: expected a save_pretrained folder (*.safetensors, "
        "*.safetensors.index.json, *.bin) or a diffusers pipeline (model_index.json)"
    )


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


def _open_sharded(folder: Path, index: Path, prefix: str) -> TensorSource:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise CheckpointError(f"{index}: corrupt shard index (expected a JSON object with 'weight_map')") from None
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
    parts = []
    for component in sorted(p for p in path.iterdir() if p.is_dir()):
        try:
            parts.append(open_folder(component, prefix=f"{component.name}."))
        except CheckpointError:
            continue  # tokenizer/, scheduler/ and other folders without weights
    if not parts:
        raise CheckpointError(f"{path}: a diffusers pipeline folder with no component weights")
    return CompositeSource(path, parts)
