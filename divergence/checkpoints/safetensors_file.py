"""A streaming reader for one ``.safetensors`` file: one tensor in memory at a time.

Format (https://github.com/huggingface/safetensors#format): an 8-byte little-endian header
length N, N bytes of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]},
"__metadata__": {str: str}}``, then the tensor bytes, offsets relative to the data start.

Each tensor is read with ``readinto`` into a fresh buffer rather than through a memory
map, so the memory a comparison holds is the tensors it is working on, not the file's
pages; every offset is checked against the file size first, so a truncated or corrupt
file is a clear error instead of garbage numbers.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import torch

from divergence.checkpoints.source import TensorInfo, TensorSource
from divergence.errors import CheckpointError

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
_MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's own limit


class SafetensorsFile(TensorSource):
    """Tensors of one safetensors file, read lazily; ``prefix`` is prepended to names."""

    def __init__(self, path: str | Path, prefix: str = ""):
        self.path = Path(path)
        header, self._data_start = _read_header(self.path)
        self.metadata = header.pop("__metadata__", None) or {}
        self._offsets: dict[str, tuple[int, int]] = {}
        infos = {}
        size = self.path.stat().st_size - self._data_start
        for name, entry in header.items():
            info, offsets = _parse_entry(self.path, name, entry, size)
            infos[prefix + name] = info
            self._offsets[prefix + name] = offsets
        super().__init__(infos)

    def load(self, name: str) -> torch.Tensor:
        info = self.info(name)
        begin, end = self._offsets[name]
        buffer = torch.empty(end - begin, dtype=torch.uint8)
        with open(self.path, "rb") as f:
            f.seek(self._data_start + begin)
            read = f.readinto(memoryview(buffer.numpy()))
        if read != end - begin:
            raise CheckpointError(f"{self.path}: tensor {name!r} is truncated ({read} of {end - begin} bytes)")
        tensor = buffer.view(info.torch_dtype) if end > begin else torch.empty(0, dtype=info.torch_dtype)
        return tensor.reshape(info.shape)


def _read_header(path: Path) -> tuple[dict, int]:
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
            (length,) = struct.unpack("<Q", raw)
            if length > _MAX_HEADER or length + 8 > path.stat().st_size:
                raise CheckpointError(f"{path}: corrupt or truncated safetensors file (header length {length})")
            header = json.loads(f.read(length))
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read: {err.strerror or err}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{path}: corrupt safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors file (header is not a JSON object)")
    return header, 8 + length


def _parse_entry(path: Path, name: str, entry, size: int) -> tuple[TensorInfo, tuple[int, int]]:
    try:
        dtype = DTYPES[entry["dtype"]]
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (int(o) for o in entry["data_offsets"])
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{path}: corrupt header entry for tensor {name!r}: {entry!r}") from None
    expected = math.prod(shape) * dtype.itemsize
    if end - begin != expected or begin < 0:
        raise CheckpointError(
            f"{path}: corrupt header for tensor {name!r}: {end - begin} bytes for shape {list(shape)} {entry['dtype']}"
        )
    if end > size:
        raise CheckpointError(f"{path}: truncated file: tensor {name!r} ends at byte {end} of {size} data bytes")
    return TensorInfo(shape, dtype), (begin, end)
