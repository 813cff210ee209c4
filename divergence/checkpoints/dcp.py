"""``torch.distributed.checkpoint`` (DCP) folders as a tensor source, one tensor assembled at a time.

What the folder holds is described in ``dcp_metadata``; its ``.metadata`` is read there
without running code. Here:

- **which tensors are the model's**: DCP saves a nested state dict flattened
  (``planner_data`` keeps each tensor's path). When the top level holds a model under one of
  the names the pickled readers look for (``STATE_DICT_KEYS``: ``model``, ``state_dict``,
  ...; accelerate and Lightning write ``{"model": ...}``), its tensors are the weights,
  named by their path inside it (``model.layers.0.weight`` -> ``layers.0.weight``), as a
  ``.pt`` holding ``{"model": state_dict}`` reads. Otherwise (torchtitan saves the model at
  the top level) every tensor is, except those under a top-level ``optim*`` key (optimizer
  state: moments, step counters). Non-tensor entries (``BytesStorageMetadata``: pickled
  objects) are never read.
- **loading one tensor**: ``load(name)`` allocates the full tensor and fills each chunk's
  place (``tensor[o0:o0+s0, o1:o1+s1, ...]``) from the chunk's ``torch.save`` archive in its
  byte range, read with the weights-only unpickler (``saved_tensor``). Where that place is
  contiguous (FSDP's row shards, a tensor stored whole) the bytes are read straight into
  it; otherwise (a column shard) the chunk is read apart and copied in. So a comparison
  holds the tensors it is measuring plus at most one chunk, never the model, and reads each
  byte once, as the safetensors reader does; ``compare_pairs`` overlaps the reading of the
  next pair with the measuring of the current ones, as for every format. A folder saved with
  ``serialization_format=SAFETENSORS`` (each shard one safetensors file, a tensor's chunk
  under its flattened name) is read through the safetensors reader instead.
"""

from __future__ import annotations

from pathlib import Path

import torch

from divergence.checkpoints.dcp_metadata import METADATA_FILE, read_metadata, stored_tensors
from divergence.checkpoints.files import open_regular
from divergence.checkpoints.pickled import STATE_DICT_KEYS
from divergence.checkpoints.safetensors_file import SafetensorsFile
from divergence.checkpoints.saved_tensor import load_saved_tensor
from divergence.checkpoints.source import TensorSource
from divergence.checkpoints.tied import folder_ties
from divergence.errors import CheckpointError

OPTIMIZER_PREFIX = "optim"  # optimizer, optimizers, optim, optimizer_0 ...


def is_dcp_folder(path: Path) -> bool:
    """A folder ``torch.distributed.checkpoint.save`` wrote: ``.metadata`` beside ``*.distcp`` shards."""
    return (path / METADATA_FILE).is_file() and any(path.glob("*.distcp"))


class DcpFolder(TensorSource):
    """The model tensors of a DCP folder, each read from its chunks when asked for."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        tensors, paths, shards = stored_tensors(self.path, read_metadata(self.path))
        chosen = model_names(paths)
        if not chosen:
            raise CheckpointError(
                f"{self.path}: a DCP checkpoint without model tensors (it holds {len(tensors)} tensors, "
                f"all optimizer state)"
            )
        self._stored = {name: tensors[fqn] for fqn, name in chosen.items()}
        self._fqn = {name: fqn for fqn, name in chosen.items()}
        # shards DCP wrote as safetensors files (serialization_format=SAFETENSORS), each opened once when read
        self._safetensors: dict[str, SafetensorsFile | None] = dict.fromkeys(shards)
        self.metadata = {"format": "dcp"}
        super().__init__({name: stored.info for name, stored in self._stored.items()})
        # an arm's step folder saves a tied tensor once, its other names in its marker (pairfolder.arm.weights_dcp)
        self.tied = {k: v for k, v in folder_ties(self.path).items() if k in self._stored}

    def load(self, name: str) -> torch.Tensor:
        self.info(name)
        return self._rows(name, 0, None)

    def _rows(self, name: str, lo: int, hi: int | None) -> torch.Tensor:
        """Rows ``lo:hi`` (along dim 0; all of a 0-d tensor) of the stored tensor ``name`` (module docstring)."""
        stored = self._stored[name]
        shape = stored.info.shape
        hi = shape[0] if shape and hi is None else hi
        tensor = torch.empty((hi - lo, *shape[1:]) if shape else (), dtype=stored.info.torch_dtype)
        for chunk in stored.chunks:
            first, last = (max(lo, chunk.offsets[0]), min(hi, chunk.offsets[0] + chunk.sizes[0])) if shape else (0, 0)
            if shape and first >= last:
                continue  # none of the rows asked for
            whole = not shape or (first, last) == (chunk.offsets[0], chunk.offsets[0] + chunk.sizes[0])
            place = (
                slice(first - lo, last - lo),
                *(slice(o, o + s) for o, s in zip(chunk.offsets[1:], chunk.sizes[1:])),
            )
            box = tensor[place] if shape else tensor
            piece = self._chunk(name, chunk, box if whole and box.is_contiguous() else None)
            if piece is not box:
                box.copy_(piece if whole else piece[first - chunk.offsets[0] : last - chunk.offsets[0]])
        return tensor

    def _chunk(self, name: str, chunk, out: torch.Tensor | None) -> torch.Tensor:
        """The chunk's tensor, read straight into ``out`` (its contiguous place in the result) when given."""
        file = self.path / chunk.file
        where = f"{file}: chunk of {name!r} at {list(chunk.offsets)}"
        try:
            if chunk.file in self._safetensors:  # one chunk per name, under its flattened name
                shard = self._safetensors[chunk.file] = self._safetensors[chunk.file] or SafetensorsFile(file)
                piece = shard.load(self._fqn[name])
            else:
                with open_regular(file) as f:  # checked on the open file: a FIFO put in its place fails at once
                    piece = load_saved_tensor(f, chunk.offset, chunk.length, where, out)
        except OSError as err:
            raise CheckpointError(f"{file}: cannot read: {err.strerror or err}") from None
        dtype = self._stored[name].info.torch_dtype
        if piece.dtype != dtype or tuple(piece.shape) != chunk.sizes:
            raise CheckpointError(
                f"{where}: holds {piece.dtype} {list(piece.shape)}, but the metadata says {dtype} {list(chunk.sizes)}"
            )
        return piece


def model_names(paths: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """``{flattened name: name to compare}`` of the model's tensors (see the module docstring)."""
    tops = {path[0] for path in paths.values() if len(path) > 1}
    holder = next((key for key in STATE_DICT_KEYS if key in tops), None)
    if holder is not None:
        return {fqn: ".".join(path[1:]) for fqn, path in paths.items() if path[0] == holder and len(path) > 1}
    return {fqn: ".".join(path) for fqn, path in paths.items() if not path[0].startswith(OPTIMIZER_PREFIX)}
