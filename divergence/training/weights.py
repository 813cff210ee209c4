"""Weights-only checkpoints: plain ``.safetensors`` files at step-indexed paths, written atomically.

This is what ``divergence compare`` (and the pair's divergence tracking) reads::

    <dir>/step_000000.safetensors     initial weights
    <dir>/step_000100.safetensors     weights after 100 optimizer steps
    ...

Keys are ``unet.<name>`` and ``text_encoder.<name>`` (fp32 master weights). The metadata holds
``step``, ``arm`` and the resolved recipe as JSON (``recipe``). A file is written under a
temporary name in the same folder and renamed with ``os.replace``, so a reader either sees the
complete file or none at all.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

FORMAT = "divergence.weights/1"


def weights_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"step_{step:06d}.safetensors"


def save_weights(path: str | Path, tensors: dict[str, torch.Tensor], *, step: int, arm: str, recipe: dict) -> Path:
    """Write ``tensors`` (any device) to ``path`` atomically with step, arm and recipe metadata.

    Equal tensors and metadata give byte-identical files, so a checksum can compare two runs.
    """
    from safetensors.torch import save

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    metadata = {"format": FORMAT, "step": str(step), "arm": arm, "recipe": json.dumps(recipe, sort_keys=True)}
    blob = save(cpu, metadata=metadata)
    header, data = _canonical_header(blob)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _canonical_header(blob: bytes) -> tuple[bytes, memoryview]:
    """safetensors writes its JSON header from a hash map (key order varies run to run); sort it.

    Layout: 8-byte little-endian header length, the JSON header padded with spaces to a multiple
    of 8 (as the format allows), then the tensor bytes, whose offsets the header gives.
    """
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + size])
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, memoryview(blob)[8 + size:]


def read_metadata(path: str | Path) -> dict[str, str]:
    """The metadata of a weights file (recipe still as a JSON string)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})
