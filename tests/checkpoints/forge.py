"""Hand-made malformed checkpoint files: the bytes an attacker or a broken writer produces."""

from __future__ import annotations

import json
import os
import pickle
import struct
import zipfile
from pathlib import Path

import torch


def write_safetensors(path: Path, header, data: bytes = b"") -> Path:
    """An 8-byte length, ``header`` (bytes as given, or a dict dumped as JSON), then ``data``."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def rewrite_torch_zip(source: Path, target: Path, pickle=None, records: dict | None = None) -> Path:
    """Copy a ``torch.save`` zip, replacing ``data.pkl`` with ``pickle(old_bytes)`` and the
    records named in ``records`` (``{"data/0": new_bytes}``)."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as new:
        for info in old.infolist():
            data = old.read(info.filename)
            tail = info.filename.split("/", 1)[1]
            if tail == "data.pkl" and pickle is not None:
                data = pickle(data)
            elif records and tail in records:
                data = records[tail]
            new.writestr(info.filename, data)
    return target


def nested_model_pickle(depth: int):
    """A ``pickle`` transform for ``rewrite_torch_zip``: the state dict under ``depth`` levels of
    ``{"model": ...}`` (protocol 2: EMPTY_DICT, BINUNICODE "model", ..., SETITEM)."""
    key = b"X" + struct.pack("<I", 5) + b"model"
    return lambda body: b"\x80\x02" + (b"}" + key) * depth + body[2:-1] + b"s" * depth + b"."


class RunsCode:
    """Unpickling this calls ``os.mkdir(marker)``: proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def evil_pickle(path: Path, marker: Path, protocol: int, zip_format: bool = True) -> Path:
    torch.save(
        {"w": torch.ones(2), "payload": RunsCode(marker)},
        path,
        pickle_protocol=protocol,
        _use_new_zipfile_serialization=zip_format,
    )
    return path


def append_saved(path: Path, tensor: torch.Tensor) -> tuple[int, int]:
    """``torch.save(tensor)`` appended to ``path`` as DCP writes a chunk: its (byte offset, length)."""
    with open(path, "ab") as f:
        start = f.tell()
        torch.save(tensor, f)
        return start, f.tell() - start


def write_dcp_metadata(folder: Path, tensors: dict, planner: dict | None = None) -> Path:
    """A ``.metadata`` built from torch's own DCP classes, as ``dcp.save`` pickles it.

    ``tensors``: ``{fqn: (shape, dtype, [(offsets, sizes, file, byte offset, byte length), ...])}``;
    ``planner``: ``planner_data`` (default: each name at the top level)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    entries, storage = {}, {}
    for fqn, (shape, dtype, chunks) in tensors.items():
        stored = []
        for offsets, sizes, file, start, length in chunks:
            stored.append(ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)))
            storage[MetadataIndex(fqn, torch.Size(offsets))] = _StorageInfo(file, start, length)
        entries[fqn] = TensorStorageMetadata(TensorProperties(dtype=dtype), torch.Size(shape), stored)
    planner = {fqn: (fqn,) for fqn in tensors} if planner is None else planner
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(Metadata(entries, planner_data=planner, storage_data=storage), f)
    return folder
