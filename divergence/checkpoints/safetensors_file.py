"""A streaming reader for one ``.safetensors`` file: one tensor in memory at a time.

Format (https://github.com/huggingface/safetensors#format): an 8-byte little-endian header
length N, N bytes of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]},
"__metadata__": {str: str}}``, then the tensor bytes, offsets relative to the data start.

The header is validated as strictly as the reference library (``safetensors`` 0.4+,
``Metadata::validate``) does, and refused, with the file and the rule named, when:

- N exceeds 100,000,000 bytes (the reference's ``MAX_HEADER_SIZE``), checked before reading
  it, or runs past the end of the file;
- the header is not a UTF-8 JSON object, nests too deeply to parse, holds a name twice, or
  uses NaN/Infinity;
- an entry's dtype is unknown, its shape is not a list of non-negative integers below 2^63,
  or its offsets are not two integers ``begin <= end``;
- the product of its dimensions, taken left to right, passes 2^63-1 at any point (the
  reference's ``checked_mul`` fold; ``[2^62, 2^62, 0]`` holds no element but no tensor
  library can build that shape);
- ``end - begin`` differs from ``prod(shape) * itemsize``;
- the tensors, sorted by offset, do not tile the data exactly: a gap or an overlap between
  two tensors, or bytes after the last one (the reference's ``InvalidOffset`` and
  ``MetadataIncompleteBuffer``); a file shorter than its header declares is "truncated".

Each tensor is read with ``readinto`` into a fresh buffer rather than through a memory
map, so the memory a comparison holds is the tensors it is working on, not the file's
pages.
"""

from __future__ import annotations

import json
import math
import operator
import struct
from itertools import accumulate
from pathlib import Path

import torch

from divergence.checkpoints.files import check_path
from divergence.checkpoints.source import TensorInfo, TensorSource, is_count
from divergence.checkpoints.tied import read_ties
from divergence.errors import CheckpointError

# Every dtype the reference library knows (safetensors 0.8, ``safetensors.torch._TYPES``).
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
    "C64": torch.complex64,
}
MAX_HEADER = 100_000_000  # the reference's MAX_HEADER_SIZE, in bytes
MAX_DIM = 2**63 - 1  # torch sizes are int64
_ENTRY_KEYS = ("dtype", "shape", "data_offsets")


class SafetensorsFile(TensorSource):
    """Tensors of one safetensors file, read lazily; ``prefix`` is prepended to names."""

    def __init__(self, path: str | Path, prefix: str = ""):
        self.path = Path(path)
        file_size = check_path(self.path, folder_ok=False).st_size
        header, self._data_start = _read_header(self.path, file_size)
        metadata = header.pop("__metadata__", None)
        self.metadata = {} if metadata is None else metadata
        if not isinstance(self.metadata, dict) or not all(isinstance(v, str) for v in self.metadata.values()):
            raise CheckpointError(f"{self.path}: corrupt safetensors header: __metadata__ must map strings to strings")
        parsed = {name: _parse_entry(self.path, name, entry) for name, entry in header.items()}
        _check_layout(self.path, parsed, file_size - self._data_start)
        self._offsets = {prefix + name: offsets for name, (_, offsets) in parsed.items()}
        super().__init__({prefix + name: info for name, (info, _) in parsed.items()})
        ties = read_ties(self.metadata).items()  # saved once by pairfolder.weights_file
        self.tied = {prefix + k: [prefix + n for n in v] for k, v in ties if prefix + k in self._offsets}

    def load(self, name: str) -> torch.Tensor:
        info = self.info(name)
        begin, end = self._offsets[name]
        buffer = torch.empty(end - begin, dtype=torch.uint8)
        try:
            with open(self.path, "rb") as f:
                f.seek(self._data_start + begin)
                read = f.readinto(memoryview(buffer.numpy()))
        except OSError as err:
            raise CheckpointError(f"{self.path}: cannot read tensor {name!r}: {err.strerror or err}") from None
        if read != end - begin:
            raise CheckpointError(f"{self.path}: tensor {name!r} is truncated ({read} of {end - begin} bytes)")
        tensor = buffer.view(info.torch_dtype) if end > begin else torch.empty(0, dtype=info.torch_dtype)
        return tensor.reshape(info.shape)


def _read_header(path: Path, file_size: int) -> tuple[dict, int]:
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
            (length,) = struct.unpack("<Q", raw)
            if length > MAX_HEADER:
                raise CheckpointError(
                    f"{path}: corrupt safetensors file: header length {length:,} bytes exceeds the format's "
                    f"limit of {MAX_HEADER:,}"
                )
            if length + 8 > file_size:
                raise CheckpointError(
                    f"{path}: corrupt or truncated safetensors file (header length {length} but the file "
                    f"has {file_size} bytes)"
                )
            text = f.read(length)
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read: {err.strerror or err}") from None
    if not text.startswith(b"{"):
        raise CheckpointError(f"{path}: corrupt safetensors file (its header is not JSON: it must start with '{{')")
    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _Duplicate as dup:
        raise CheckpointError(f"{path}: corrupt safetensors header: the name {dup.args[0]!r} appears twice") from None
    except RecursionError:
        raise CheckpointError(f"{path}: corrupt safetensors header: JSON nested too deeply") from None
    except (UnicodeDecodeError, ValueError):
        raise CheckpointError(f"{path}: corrupt safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors file (header is not a JSON object)")
    return header, 8 + length


class _Duplicate(Exception):
    pass


def _no_duplicates(pairs: list) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _parse_entry(path: Path, name: str, entry) -> tuple[TensorInfo, tuple[int, int]]:
    where = f"{path}: corrupt safetensors header for tensor {name!r}"
    if not isinstance(entry, dict) or any(k not in entry for k in _ENTRY_KEYS):
        raise CheckpointError(f"{where}: expected an object with {', '.join(_ENTRY_KEYS)}")
    dtype, shape, offsets = (entry[k] for k in _ENTRY_KEYS)
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise CheckpointError(
            f"{path}: tensor {name!r} has dtype {str(dtype)[:40]!r}, which divergence cannot read "
            f"(known: {', '.join(DTYPES)})"
        )
    if not isinstance(shape, list) or not all(is_count(d) for d in shape):
        raise CheckpointError(f"{where}: shape must be a list of integers from 0 to 2^63-1, got {str(shape)[:80]}")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(is_count(o, 2**64 - 1) for o in offsets)
        and offsets[0] <= offsets[1]
    ):
        raise CheckpointError(f"{where}: data_offsets must be two integers begin <= end, got {str(offsets)[:80]}")
    if any(n > MAX_DIM for n in accumulate(shape, operator.mul)):  # in order: a later 0 does not undo it
        raise CheckpointError(
            f"{where}: shape {str(shape)[:80]} overflows: the product of its dimensions passes 2^63-1"
        )
    torch_dtype = DTYPES[dtype]
    expected = math.prod(shape) * torch_dtype.itemsize
    if offsets[1] - offsets[0] != expected:
        raise CheckpointError(
            f"{where}: {offsets[1] - offsets[0]} bytes for shape {shape} {dtype} (expected {expected})"
        )
    return TensorInfo(tuple(shape), torch_dtype), (offsets[0], offsets[1])


def _check_layout(path: Path, parsed: dict, data_size: int) -> None:
    """The tensors, in offset order, must tile the data region exactly, as the reference requires."""
    position, previous = 0, None
    for name, (_, (begin, end)) in sorted(parsed.items(), key=lambda item: item[1][1]):
        if begin != position:
            what = f"overlaps tensor {previous!r}" if begin < position else f"leaves a gap after byte {position}"
            raise CheckpointError(f"{path}: corrupt safetensors header: tensor {name!r} at byte {begin} {what}")
        position, previous = end, name
    if position > data_size:
        raise CheckpointError(
            f"{path}: truncated file: tensor {previous!r} ends at byte {position} of {data_size} data bytes"
        )
    if position < data_size:
        raise CheckpointError(
            f"{path}: corrupt safetensors file: {data_size - position} bytes after the last tensor "
            "(the format allows none)"
        )
