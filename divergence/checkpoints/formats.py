"""Checkpoint formats by name, for ``--format``: force one reader instead of recognising the path.

``open_checkpoint(path)`` recognises a path by what it holds; ``open_as(path, name)`` opens it
with the named reader, whatever it looks like, so a folder that looks like two things (a DCP
folder beside a stray ``model.safetensors``) reads as the one the user means, and a wrong
guess is that reader's one-line error about what it expected.
"""

from __future__ import annotations

from pathlib import Path

from divergence.checkpoints.dcp import DcpFolder
from divergence.checkpoints.folder import open_folder
from divergence.checkpoints.lora import open_adapter
from divergence.checkpoints.megatron import MegatronFolder
from divergence.checkpoints.pickled import load_pickled
from divergence.checkpoints.safetensors_file import SafetensorsFile
from divergence.checkpoints.source import TensorSource
from divergence.checkpoints.zero_folder import open_zero_folder
from divergence.errors import UserInputError
from divergence.formats import AUTO, FORMATS

__all__ = ["AUTO", "FORMATS", "READERS", "open_as"]

READERS = {
    "safetensors": SafetensorsFile,
    "pickle": load_pickled,
    "pretrained": open_folder,
    "lora": open_adapter,
    "dcp": DcpFolder,
    "megatron": MegatronFolder,
    "deepspeed": open_zero_folder,
}
if set(READERS) != set(FORMATS):  # pragma: no cover - a new name needs its reader, and the reverse
    raise ImportError(f"divergence.formats.FORMATS and READERS differ: {set(READERS) ^ set(FORMATS)}")


def open_as(path: str | Path, name: str) -> TensorSource:
    """``path`` read by the reader named ``name`` (one of ``divergence.formats.FORMATS``)."""
    if name not in READERS:
        raise UserInputError(f"--format {name!r}: not a format; choose one of {AUTO}, {', '.join(FORMATS)}")
    return READERS[name](Path(path))
