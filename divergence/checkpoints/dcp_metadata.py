"""The ``.metadata`` file of a ``torch.distributed.checkpoint`` (DCP) folder, read without running code.

DCP (``torch.distributed.checkpoint.save``, used by FSDP2, torchtitan, Lightning's sharded
strategies, accelerate's FSDP ``save_state`` and Megatron-Core's ``torch_dist``) writes a
folder::

    .metadata          a pickle of torch.distributed.checkpoint.metadata.Metadata
    __0_0.distcp       rank 0's chunks, each a torch.save archive at an (offset, length)
    __1_0.distcp       rank 1's chunks ...

``Metadata.state_dict_metadata`` maps each flattened name (``model.layers.0.weight``) to its
global shape, dtype and chunks (``ChunkStorageMetadata``: ``offsets``, ``sizes`` in
elements); ``Metadata.storage_data`` maps ``MetadataIndex(fqn, offset)`` to where the chunk
lies (``_StorageInfo``: ``relative_path``, ``offset``, ``length`` in bytes);
``planner_data`` maps each flattened name to its path in the nested state dict
(``('model', 'layers.0.weight')``).

torch's own ``FileSystemReader.read_metadata`` calls ``pickle.load`` on this file, so any
folder could run code on load. ``read_metadata`` here uses a ``pickle.Unpickler`` whose
``find_class`` knows only the metadata's own vocabulary: each DCP metadata class becomes an
inert ``Record`` holding its pickled fields (the real class is never imported, so not even
its ``__setstate__`` runs), ``torch.Size`` and the torch dtypes are themselves, a layout or
a path is its name. Any other global is refused by name before it is imported.
"""

from __future__ import annotations

import io
import os
import pickle
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import torch

from divergence.checkpoints import bounds
from divergence.checkpoints.dcp_chunks import check_counts, check_distinct_bytes, check_tiling
from divergence.checkpoints.files import open_regular, read_regular
from divergence.checkpoints.source import TensorInfo, check_comparable, is_count
from divergence.errors import CheckpointError

METADATA_FILE = ".metadata"
_DCP = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
# Every class a DCP .metadata pickle names, since torch 2.0 (older releases kept
# TensorProperties in torch.distributed._shard).
DCP_CLASSES = {
    (module, name)
    for module in (*_DCP, "torch.distributed._shard.sharded_tensor.metadata")
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
        "MEM_FORMAT_ENCODING",
        "_StorageInfo",
        "_StoragePrefix",
    )
}
_PATH_CLASSES = ("Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath")
_PATHS = {(module, name) for module in ("pathlib", "pathlib._local") for name in _PATH_CLASSES}
_DTYPES = {name: value for name, value in vars(torch).items() if isinstance(value, torch.dtype)}


class Record:
    """An instance of an allow-listed DCP class: its constructor arguments and pickled state, nothing run."""

    def __init__(self, *args):
        self.args = args
        self.state = None

    def __new__(cls, *args):
        return object.__new__(cls)

    def __setstate__(self, state):
        self.state = state

    def field(self, name: str, position: int | None = None):
        """A field from the pickled state: a dataclass's ``__dict__`` or a ``__getstate__`` tuple."""
        state = self.state[1] if isinstance(self.state, tuple) and len(self.state) == 2 else self.state
        if isinstance(state, dict):
            return state.get(name)
        if isinstance(self.state, tuple) and position is not None and position < len(self.state):
            return self.state[position]
        return None


_RECORDS: dict[tuple[str, str], type] = {}  # one Record subclass per DCP class, named as it


def _layout(name="torch.strided"):
    return str(name)


def _path(*parts):
    return "/".join(map(str, parts))


class MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that builds only the DCP metadata vocabulary (see the module docstring)."""

    def __init__(self, file, where: Path):
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str):
        if (module, name) in DCP_CLASSES:
            return _RECORDS.setdefault(
                (module, name), type(name, (Record,), {"__module__": "divergence.dcp." + module})
            )
        if module == "torch" and name == "Size":
            return torch.Size
        if module == "torch" and name in _DTYPES:
            return _DTYPES[name]
        if (module, name) == ("torch.serialization", "_get_layout"):
            return _layout
        if (module, name) in _PATHS:
            return _path
        if (module, name) in (("collections", "OrderedDict"), ("builtins", "dict")):
            return dict
        raise CheckpointError(
            f"{self.where}: refused to unpickle: it references {module}.{name}, which could run code. "
            "divergence reads only torch.distributed.checkpoint metadata classes, tensors' sizes and dtypes"
        )

    def persistent_load(self, pid):
        raise CheckpointError(f"{self.where}: corrupt DCP metadata (a persistent id {str(pid)[:60]})")


def read_metadata(folder: Path) -> Record:
    """The folder's ``.metadata``, unpickled into ``Record``s; refused, naming the global, if it names
    anything outside the DCP vocabulary."""
    path = folder / METADATA_FILE
    data = read_regular(path, bounds.MAX_METADATA_BYTES, "DCP .metadata")
    try:
        metadata = MetadataUnpickler(io.BytesIO(data), path).load()
    except CheckpointError:
        raise
    except RecursionError:
        raise CheckpointError(f"{path}: corrupt DCP metadata: nested too deeply") from None
    except Exception as err:  # noqa: BLE001 - any failure of the parser on an untrusted file is "corrupt"
        raise CheckpointError(f"{path}: corrupt DCP metadata ({type(err).__name__}: {str(err)[:160]})") from None
    if not (isinstance(metadata, Record) and type(metadata).__name__ == "Metadata"):
        raise CheckpointError(f"{path}: not DCP metadata (it holds a {type(metadata).__name__})")
    metadata.size = len(data)
    return metadata


@dataclass(frozen=True)
class Chunk:
    """One stored piece of a tensor: where it sits in the tensor and where its bytes lie."""

    offsets: tuple[int, ...]  # elements, per dimension
    sizes: tuple[int, ...]
    file: str  # relative to the folder
    offset: int  # bytes
    length: int


@dataclass(frozen=True)
class StoredTensor:
    info: TensorInfo
    chunks: tuple[Chunk, ...]


def stored_tensors(folder: Path, metadata: Record) -> tuple[dict[str, StoredTensor], dict[str, tuple], set[str]]:
    """``{flattened name: StoredTensor}`` of every tensor in the metadata, every chunk checked
    (inside the tensor, tiling it exactly, its bytes inside its file), ``{flattened name: path in
    the nested state dict}`` from ``planner_data`` (a name it lacks: the name alone), and the
    chunk files that are safetensors shards."""
    path = folder / METADATA_FILE
    entries, storage = metadata.field("state_dict_metadata", 0), metadata.field("storage_data", 2)
    if not isinstance(entries, dict) or not isinstance(storage, dict):
        raise CheckpointError(f"{path}: corrupt DCP metadata (no state_dict_metadata or storage_data mapping)")
    size = getattr(metadata, "size", bounds.MAX_METADATA_BYTES)
    check_counts(path, size, len(storage), "storage entries")
    kept = {
        fqn: e for fqn, e in entries.items() if isinstance(e, Record) and type(e).__name__ == "TensorStorageMetadata"
    }
    # BytesStorageMetadata: a pickled object (a step counter, extra state), never read
    check_counts(
        path, size, sum(len(e.field("chunks") or ()) for e in kept.values() if isinstance(e.field("chunks"), list))
    )
    where = _chunk_locations(path, storage)
    sizes, safetensors = _shard_files(folder, path, {w[0] for w in where.values()})
    tensors = {}
    for fqn, entry in kept.items():
        _check_name(path, fqn)
        tensors[fqn] = _stored_tensor(path, fqn, entry, where, sizes)
    placed = [(c.file, fqn, c.offset, c.length) for fqn, t in tensors.items() for c in t.chunks]
    check_distinct_bytes(path, placed, safetensors)
    planner = metadata.field("planner_data", 1)
    paths = {}
    for fqn in tensors:
        found = planner.get(fqn) if isinstance(planner, dict) else None
        ok = isinstance(found, (tuple, list)) and found and all(isinstance(p, (str, int)) for p in found)
        paths[fqn] = tuple(str(p) for p in found) if ok else (fqn,)
    return tensors, paths, safetensors


def _chunk_locations(path: Path, storage: dict) -> dict[tuple, tuple[str, int, int]]:
    """``{(fqn, offsets): (file, byte offset, byte length)}`` from ``storage_data``."""
    where = {}
    for index, info in storage.items():
        if not (isinstance(index, Record) and isinstance(info, Record)):
            raise CheckpointError(f"{path}: corrupt DCP metadata (storage_data maps {type(index).__name__})")
        fqn, offsets = index.field("fqn"), index.field("offset")
        _check_name(path, fqn)
        file, start, length = info.field("relative_path"), info.field("offset"), info.field("length")
        transforms = info.field("transform_descriptors")
        if transforms:
            raise CheckpointError(
                f"{path}: tensor {fqn!r} is stored through transforms {list(transforms)[:3]} (a DCP extension, "
                "e.g. compression); divergence reads plain DCP chunks only: re-save without extensions"
            )
        if not (isinstance(file, str) and is_count(start) and is_count(length)):
            raise CheckpointError(f"{path}: corrupt DCP metadata (storage of {str(fqn)[:80]!r})")
        _check_file_name(path, fqn, file)
        where[(fqn, _dims(offsets))] = (file, start, length)
    return where


def _check_name(path: Path, fqn) -> None:
    """A tensor's flattened name is a string (anything else, a list nested 10^5 deep, is corrupt)."""
    if not isinstance(fqn, str):
        raise CheckpointError(f"{path}: corrupt DCP metadata (a tensor named by a {type(fqn).__name__}, not a string)")


def _check_file_name(path: Path, fqn, file: str) -> None:
    parts = PurePosixPath(file.replace("\\", "/")).parts
    if len(parts) != 1 or parts[0] in (".", "..") or ":" in file or file == METADATA_FILE:
        raise CheckpointError(
            f"{path}: tensor {str(fqn)[:80]!r} points at {file[:80]!r}, outside the folder; DCP chunk files "
            "must be plain file names inside it"
        )


def _shard_files(folder: Path, path: Path, files: set[str]) -> tuple[dict[str, int], set[str]]:
    """Each chunk file's size (a regular file, opened without blocking), and which are safetensors shards."""
    sizes, safetensors = {}, set()
    for file in sorted(files):
        if not (folder / file).exists():
            raise CheckpointError(f"{path}: names the chunk file {file}, which is missing from {folder}")
        try:
            with open_regular(folder / file) as f:
                sizes[file], head = os.fstat(f.fileno()).st_size, f.read(9)
        except OSError as err:
            raise CheckpointError(f"{folder / file}: cannot read: {err.strerror or err}") from None
        if is_safetensors_shard(head):
            safetensors.add(file)
    return sizes, safetensors


def is_safetensors_shard(head: bytes) -> bool:
    """A shard's first 9 bytes are a safetensors file's (an 8-byte header length, then its JSON's
    ``{``: ``FileSystemWriter(..., serialization_format=SAFETENSORS)``), not a torch.save zip's."""
    return head[:4] != b"PK\x03\x04" and head[8:9] == b"{"


def _stored_tensor(path: Path, fqn: str, entry: Record, where: dict, sizes: dict) -> StoredTensor:
    properties, shape, chunks = entry.field("properties"), _dims(entry.field("size")), entry.field("chunks")
    dtype = properties.field("dtype", 0) if isinstance(properties, Record) else None
    if not isinstance(dtype, torch.dtype) or shape is None or not isinstance(chunks, list):
        raise CheckpointError(f"{path}: corrupt DCP metadata for tensor {fqn!r} (dtype, size or chunks)")
    check_comparable(path, fqn, dtype)
    stored = []
    for chunk in chunks:
        offsets = _dims(chunk.field("offsets")) if isinstance(chunk, Record) else None
        extent = _dims(chunk.field("sizes")) if isinstance(chunk, Record) else None
        if offsets is None or extent is None or not (len(offsets) == len(extent) == len(shape)):
            raise CheckpointError(f"{path}: corrupt DCP metadata: a chunk of tensor {fqn!r} has no valid offsets")
        if any(o + s > d for o, s, d in zip(offsets, extent, shape)):
            raise CheckpointError(
                f"{path}: corrupt DCP metadata: a chunk of tensor {fqn!r} at {list(offsets)} of size "
                f"{list(extent)} lies outside its shape {list(shape)}"
            )
        file, start, length = where.get((fqn, offsets)) or _missing(path, fqn, offsets)
        if start + length > sizes[file]:
            raise CheckpointError(
                f"{path}: truncated checkpoint: tensor {fqn!r}'s chunk at {list(offsets)} ends at byte "
                f"{start + length:,} of {file}, which holds {sizes[file]:,}"
            )
        stored.append(Chunk(offsets, extent, file, start, length))
    check_tiling(path, fqn, shape, stored)
    need, held = TensorInfo(shape, dtype).numel * dtype.itemsize, sum(c.length for c in stored)
    if need > held:
        raise CheckpointError(
            f"{path}: tensor {fqn!r} declares shape {list(shape)} ({need:,} bytes) but its chunks hold "
            f"{held:,} bytes; refusing to allocate it"
        )
    return StoredTensor(TensorInfo(shape, dtype), tuple(stored))


def _missing(path: Path, fqn: str, offsets: tuple):
    raise CheckpointError(f"{path}: corrupt DCP metadata: tensor {fqn!r}'s chunk at {list(offsets)} has no storage")


def _dims(value) -> tuple[int, ...] | None:
    if isinstance(value, (tuple, list)) and all(is_count(v) for v in value):
        return tuple(value)
    return None
