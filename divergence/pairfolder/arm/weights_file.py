"""Weights-only checkpoints: plain ``.safetensors`` files at step-indexed paths, written atomically.

This is what ``divergence compare`` (and the pair's divergence tracking) reads::

    <dir>/step_000000.safetensors     initial weights
    <dir>/step_000100.safetensors     weights after 100 optimizer steps
    ...

Keys are ``unet.<name>`` and ``text_encoder.<name>`` (fp32 master weights). The metadata holds
``step``, ``arm``, the resolved recipe as JSON (``recipe``), the tied parameters saved once
(``divergence.tied``: JSON ``{kept name: [other names]}``, only when there are any) and the
writer's completion marker:
``data_bytes`` (the length of the tensor data after the header) and ``data_crc32`` (its CRC-32,
8 hex digits). A file is written under a temporary name in the same folder, fsynced and renamed
(``divergence.atomic``), so a reader either sees the complete file or none at all; a reader that
cannot rely on that (a file copied in, preallocated, or rewritten in place by another tool) reads
it only when the marker matches the bytes there (``completed``).
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import torch

from divergence.atomic import atomic_file
from divergence.checkpoints.tied import METADATA_KEY as TIED_KEY
from divergence.checkpoints.tied import untie
from divergence.errors import CheckpointError
from divergence.pairfolder.arm import weights_dcp
from divergence.pairfolder.arm.weights_dcp import identity

FORMAT = "divergence.weights/1"
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors reference implementation's limit


def save_weights(path: str | Path, tensors: dict[str, torch.Tensor], *, step: int, arm: str, recipe: dict) -> Path:
    """Write ``tensors`` (any device) to ``path`` atomically with step, arm and recipe metadata.

    Equal tensors and metadata give byte-identical files, so a checksum can compare two runs.
    """
    from safetensors.torch import save

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors, tied = untie(tensors)  # a tied tensor (wte / lm_head) saved once, its other names in the metadata
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    metadata = {"format": FORMAT, "step": str(step), "arm": arm, "recipe": json.dumps(recipe, sort_keys=True)}
    if tied:
        metadata[TIED_KEY] = json.dumps(tied, sort_keys=True)
    header, data = _canonical_header(save(cpu, metadata=metadata))
    with atomic_file(path) as f:
        f.write(header)
        f.write(data)
    return path


def completed(path: str | Path, step: int, arm: str | None = None) -> tuple[int, int, int] | None:
    """The identity ``(inode, size, mtime_ns)`` of the weights file of ``step`` when its completion
    marker matches its bytes, else None (missing, partial, preallocated, being rewritten).

    A file whose header parses but carries no marker was not written by ``save_weights``: a
    ``CheckpointError``, since waiting would never make it complete. A DCP folder (``ArmWriter(...,
    format="dcp")``) is complete when its marker says so (``weights_dcp.completed``); one whose
    marker names another arm than ``arm`` (given) is a ``CheckpointError``.
    """
    if os.path.isdir(path):
        return weights_dcp.completed(path, step, arm)
    try:
        before = os.stat(path)
        with open(path, "rb") as f:
            metadata, data_start = _header_metadata(f, before.st_size)
            if metadata is None or metadata.get("step") != str(step):
                return None
            if "data_crc32" not in metadata or "data_bytes" not in metadata:
                raise CheckpointError(
                    f"{path}: no completion marker (data_bytes, data_crc32) in its metadata: not "
                    "written by this divergence's train --arm; train the arm again with it"
                )
            if before.st_size - data_start != int(metadata["data_bytes"]) or _crc32(f) != metadata["data_crc32"]:
                return None
    except CheckpointError:
        raise
    except (OSError, ValueError):  # gone, or a marker that is not a number: not complete
        return None
    after = identity(path)
    return after if after == (before.st_ino, before.st_size, before.st_mtime_ns) else None


def _header_metadata(f, size: int) -> tuple[dict | None, int]:
    """The ``__metadata__`` of an open safetensors file (None while its header does not parse)
    and where its tensor data starts."""
    raw = f.read(8)
    length = int.from_bytes(raw, "little") if len(raw) == 8 else 0
    if not 0 < length <= min(_MAX_HEADER, size - 8):
        return None, 0
    try:
        header = json.loads(f.read(length))
    except (ValueError, RecursionError):
        return None, 0
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return (metadata if isinstance(metadata, dict) else None), 8 + length


def _crc32(f, chunk: int = 1 << 24) -> str:
    crc = 0
    while block := f.read(chunk):
        crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def _canonical_header(blob: bytes) -> tuple[bytes, memoryview]:
    """safetensors writes its JSON header from a hash map (key order varies run to run); sort it,
    and add the completion marker of the data (``data_bytes``, ``data_crc32``).

    Layout: 8-byte little-endian header length, the JSON header padded with spaces to a multiple
    of 8 (as the format allows), then the tensor bytes, whose offsets the header gives (relative
    to the data, so a longer header moves nothing).
    """
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + size])
    data = memoryview(blob)[8 + size :]
    header["__metadata__"].update(data_bytes=str(len(data)), data_crc32=f"{zlib.crc32(data):08x}")
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, data


def read_metadata(path: str | Path) -> dict[str, str]:
    """The metadata of a weights file (recipe still as a JSON string)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})
