"""Reading checkpoints written by the real libraries, safely and tensor by tensor.

``open_checkpoint(path)`` returns a ``TensorSource`` (names, shapes and dtypes up front,
``load(name)`` for one tensor) for:

- a ``.safetensors`` file;
- a folder written by ``save_pretrained`` (diffusers or transformers, sharded included) or
  a diffusers pipeline folder;
- a peft LoRA adapter folder (``adapter_config.json``), read as each layer's effective weight
  change ``(alpha/r) B A`` named ``<module>.lora_delta`` (see ``lora``);
- torch ``.pt`` / ``.pth`` / ``.bin`` state dicts and Lightning ``.ckpt`` files (weights
  under ``state_dict``), loaded with ``weights_only=True``: never arbitrary unpickling;
- a ``torch.distributed.checkpoint`` folder (``.metadata`` + ``*.distcp``: FSDP2, torchtitan,
  sharded Lightning and accelerate), each tensor assembled from its chunks (see ``dcp``), and
  Megatron-Core ``torch_dist`` folders, stacked layers split per layer (see ``megatron``);
- a DeepSpeed checkpoint (``save_dir`` with ``latest``, or ``global_stepN/``; ZeRO 0-2): the
  model states file's ``module``, weights-only (see ``zero_folder``).

``open_checkpoint(path)`` recognises a path by what it holds; ``open_checkpoint(path,
format="dcp")`` (``--format``) opens it with the reader of that name in ``READERS``, whatever it
looks like, so a folder that looks like two things (a DCP folder beside a stray
``model.safetensors``) reads as the one the user means, and a wrong guess is that reader's
one-line error about what it expected.

``match_tensors`` pairs two checkpoints' tensors by name (see ``matching``).
"""

from __future__ import annotations

import stat
from pathlib import Path

from divergence.checkpoints.dcp import DcpFolder, is_dcp_folder
from divergence.checkpoints.files import check_path
from divergence.checkpoints.folder import open_folder
from divergence.checkpoints.lora import is_adapter_folder, open_adapter
from divergence.checkpoints.matching import Match, match_tensors
from divergence.checkpoints.megatron import MegatronFolder, is_megatron_folder
from divergence.checkpoints.pickled import load_pickled
from divergence.checkpoints.safetensors_file import SafetensorsFile
from divergence.checkpoints.source import TensorInfo, TensorSource
from divergence.checkpoints.zero_folder import is_zero_folder, open_zero_folder
from divergence.errors import CheckpointError, UserInputError
from divergence.formats import AUTO, FORMATS

PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
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

__all__ = ["Match", "TensorInfo", "TensorSource", "match_tensors", "open_checkpoint"]


def open_checkpoint(path: str | Path, format: str | None = None) -> TensorSource:
    """Open any supported checkpoint; raise ``CheckpointError`` naming the file if it cannot be.
    ``format``: a name in ``divergence.formats.FORMATS`` to force that reader (None or ``"auto"``: recognise it)."""
    path = Path(path)
    info = check_path(path)
    if format not in (None, AUTO):
        return open_as(path, format)
    if stat.S_ISDIR(info.st_mode):
        if is_dcp_folder(path):
            return open_as(path, "megatron" if is_megatron_folder(path) else "dcp")
        if is_zero_folder(path):
            return open_as(path, "deepspeed")
        return open_as(path, "lora" if is_adapter_folder(path) else "pretrained")
    if path.suffix in (".safetensors", *PICKLE_SUFFIXES):
        return open_as(path, "safetensors" if path.suffix == ".safetensors" else "pickle")
    raise CheckpointError(
        f"{path}: unknown checkpoint format {path.suffix or '(no suffix)'!r}; expected .safetensors, "
        f"{', '.join(PICKLE_SUFFIXES)}, a save_pretrained folder or a torch.distributed.checkpoint folder"
    )


def open_as(path: Path, name: str) -> TensorSource:
    """``path`` read by the reader named ``name`` (one of ``divergence.formats.FORMATS``)."""
    if name not in READERS:
        raise UserInputError(f"--format {name!r}: not a format; choose one of {AUTO}, {', '.join(FORMATS)}")
    return READERS[name](path)
