"""Checkpoint formats by name, for ``--format``: force one reader instead of recognising the path.

``open_checkpoint(path)`` recognises a path by what it holds; ``open_as(path, name)`` opens it
with the named reader, whatever it looks like, so a folder that looks like two things (a DCP
folder beside a stray ``model.safetensors``) reads as the one the user means, and a wrong
guess is that reader's one-line error about what it expected.
"""

from __future__ import annotations

from pathlib import Path

from divergence.checkpoints.source import TensorSource
from divergence.errors import UserInputError
from divergence.formats import AUTO, FORMATS

__all__ = ["AUTO", "FORMATS", "READERS", "open_as"]


def _safetensors(path: Path) -> TensorSource:
    from divergence.checkpoints.safetensors_file import SafetensorsFile

    return SafetensorsFile(path)


def _pickle(path: Path) -> TensorSource:
    from divergence.checkpoints.pickled import load_pickled

    return load_pickled(path)


def _pretrained(path: Path) -> TensorSource:
    from divergence.checkpoints.folder import open_folder

    return open_folder(path)


def _lora(path: Path) -> TensorSource:
    from divergence.checkpoints.lora import open_adapter

    return open_adapter(path)


def _dcp(path: Path) -> TensorSource:
    from divergence.checkpoints.dcp import DcpFolder

    return DcpFolder(path)


def _megatron(path: Path) -> TensorSource:
    from divergence.checkpoints.megatron import MegatronFolder

    return MegatronFolder(path)


def _deepspeed(path: Path) -> TensorSource:
    from divergence.checkpoints.zero_folder import open_zero_folder

    return open_zero_folder(path)


READERS = {
    "safetensors": _safetensors,
    "pickle": _pickle,
    "pretrained": _pretrained,
    "lora": _lora,
    "dcp": _dcp,
    "megatron": _megatron,
    "deepspeed": _deepspeed,
}
if set(READERS) != set(FORMATS):  # pragma: no cover - a new name needs its reader, and the reverse
    raise ImportError(f"divergence.formats.FORMATS and READERS differ: {set(READERS) ^ set(FORMATS)}")


def open_as(path: str | Path, name: str) -> TensorSource:
    """``path`` read by the reader named ``name`` (one of ``divergence.formats.FORMATS``)."""
    if name not in READERS:
        raise UserInputError(f"--format {name!r}: not a format; choose one of {AUTO}, {', '.join(FORMATS)}")
    return READERS[name](Path(path))
