"""One tensor written by ``torch.save``, read from a byte range of a larger file, safely.

A ``torch.distributed.checkpoint`` shard (``__R_I.distcp``) is a run of ``torch.save``
archives back to back, one per tensor chunk, each found by its (offset, length) in the
checkpoint's metadata. ``load_saved_tensor`` reads one such archive without handing it to
``torch.load``:

- the byte range is seen through ``FileRange``, a read-only window: nothing before or after
  it can be read, so a chunk cannot reach into its neighbours;
- the archive's ``data.pkl`` is unpickled by torch's own weights-only unpickler
  (``torch._weights_only_unpickler``, what ``torch.load(weights_only=True)`` uses): only
  tensors and plain containers are rebuilt, and a pickle naming any other global is refused
  with that global named (``pickle_scan``); a ``data.pkl`` that is compressed (``torch.save``
  never compresses; a few hundred bytes of bzip2 can inflate to gigabytes) or larger than
  ``bounds.MAX_CHUNK_PICKLE_BYTES`` is refused before it is read, and every member of the
  archive must lie inside the chunk's byte range (a zip directory may claim any size);
- it is unpickled twice: first onto ``meta`` (sizes only), where every storage it asks for
  must be a stored (uncompressed) ``data/KEY`` record of exactly its declared size, and torch
  checks, when it builds the view, that the view fits its storage; then for real, each
  record read with ``readinto`` from its offset in the file straight into a fresh tensor
  (or into the caller's ``out``, see ``load_saved_tensor``), never through ``zipfile``'s
  buffered reader (which copies the bytes twice and CRCs them).
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile

import torch

from divergence.checkpoints import bounds
from divergence.checkpoints.pickle_scan import refusal
from divergence.errors import CheckpointError

_WHAT = "torch.save archive"


class FileRange(io.RawIOBase):
    """Bytes ``[offset, offset + length)`` of an open binary file, as a seekable read-only file."""

    def __init__(self, file, offset: int, length: int):
        super().__init__()
        self._file, self._start, self._length, self._pos = file, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._length}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._length - self._pos))
        if n == 0:
            return 0
        self._file.seek(self._start + self._pos)
        got = self._file.readinto(view[:n])
        self._pos += got
        return got


def load_saved_tensor(file, offset: int, length: int, where: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """The tensor that ``torch.save`` wrote at ``[offset, offset + length)`` of ``file``.

    ``where`` names the chunk in errors (``ckpt/__0_0.distcp: chunk of 'layers.0.weight'``).
    With ``out`` (a contiguous tensor, e.g. the rows of the full tensor this chunk fills), a
    saved tensor of exactly ``out``'s dtype and shape that fills its storage is read straight
    into ``out``, which is returned: one read from disk, no copy.
    """
    window, data = FileRange(file, offset, length), b""
    try:
        with zipfile.ZipFile(window) as archive:
            data, records = pickle_and_records(archive, where, _WHAT, length)
        used: list[zipfile.ZipInfo] = []
        meta = unpickle(data, lambda saved_id: meta_storage(saved_id, records, where, used=used))
        if not isinstance(meta, torch.Tensor):
            raise CheckpointError(f"{where}: holds a {type(meta).__name__}, not a tensor")
        if out is not None and len(used) == 1 and _fills(meta, out):
            _read_record(window, used[0], out, where)
            return out
        read = {}
        return unpickle(data, lambda saved_id: _storage(saved_id, window, records, read, where))
    except CheckpointError:
        raise
    except pickle.UnpicklingError as err:
        raise refusal(where, err, data) or CheckpointError(
            f"{where}: corrupt torch.save archive ({str(err).splitlines()[0][:160] if str(err) else ''})"
        ) from None
    except Exception as err:  # noqa: BLE001 - any failure of the parser on untrusted bytes is "corrupt"
        raise CheckpointError(f"{where}: corrupt torch.save archive ({type(err).__name__}: {str(err)[:160]})") from None


def pickle_and_records(
    archive: zipfile.ZipFile, where: str, what: str, length: int | None = None
) -> tuple[bytes, dict[str, zipfile.ZipInfo]]:
    """``data.pkl``'s bytes (stored uncompressed) and the ``data/KEY`` records of a torch zip archive
    (``what`` names it in errors). For a chunk, ``length``: every member must lie inside its first
    ``length`` bytes, and ``data.pkl`` within ``bounds.MAX_CHUNK_PICKLE_BYTES``."""
    pickles = [n for n in archive.namelist() if n.endswith("data.pkl") and n.count("/") == 1]
    if len(pickles) != 1:
        raise CheckpointError(f"{where}: not a {what} (no single data.pkl)")
    if length is not None:
        beyond = next((i for i in archive.infolist() if i.header_offset + _stored_size(i) > length), None)
        if beyond is not None:
            raise CheckpointError(
                f"{where}: corrupt chunk: its member {beyond.filename[:80]} ends past the chunk's bytes"
            )
    info = archive.getinfo(pickles[0])
    if info.compress_type != zipfile.ZIP_STORED:
        raise CheckpointError(f"{where}: not a {what} (its data.pkl is compressed); refused uninflated")
    if length is not None and info.file_size > bounds.MAX_CHUNK_PICKLE_BYTES:
        raise CheckpointError(
            f"{where}: corrupt chunk: its data.pkl of {info.file_size:,} bytes is larger than the "
            f"{bounds.MAX_CHUNK_PICKLE_BYTES:,} of one tensor's"
        )
    root = pickles[0][: -len("data.pkl")]
    records = {i.filename[len(root) + 5 :]: i for i in archive.infolist() if i.filename.startswith(root + "data/")}
    return archive.read(pickles[0]), records


def _stored_size(info: zipfile.ZipInfo) -> int:
    """Bytes a member takes in the archive: a stored member's size is also what is read into memory."""
    return max(info.compress_size, info.file_size) if info.compress_type == zipfile.ZIP_STORED else info.compress_size


def unpickle(data: bytes, persistent_load):
    """``data`` unpickled by torch's weights-only unpickler, storages from ``persistent_load``."""
    from torch import _weights_only_unpickler as weights_only

    unpickler = weights_only.Unpickler(io.BytesIO(data), encoding="utf-8")
    unpickler.persistent_load = persistent_load
    return unpickler.load()


def _checked(saved_id, records: dict, where: str, what: str) -> tuple[torch.dtype, int, zipfile.ZipInfo]:
    """A persistent id's dtype, byte size and record, which must be stored uncompressed at exactly that size."""
    if not (isinstance(saved_id, tuple) and len(saved_id) == 5 and saved_id[0] == "storage"):
        raise CheckpointError(f"{where}: corrupt {what} (a persistent id {str(saved_id)[:60]})")
    _, storage_type, key, _, numel = saved_id
    dtype = torch.uint8 if storage_type is torch.UntypedStorage else getattr(storage_type, "dtype", None)
    if not isinstance(dtype, torch.dtype) or type(numel) is not int or numel < 0:
        raise CheckpointError(f"{where}: corrupt {what} (storage {str(key)[:40]!r})")
    nbytes = numel * dtype.itemsize
    record = records.get(str(key))
    if record is None:
        raise CheckpointError(f"{where}: corrupt {what}: storage data/{key} is missing from the archive")
    if record.compress_type != zipfile.ZIP_STORED:
        raise CheckpointError(f"{where}: corrupt {what}: storage data/{key} is compressed; refused uninflated")
    if record.file_size != nbytes:
        raise CheckpointError(
            f"{where}: corrupt or truncated {what}: storage data/{key} declares {nbytes} bytes "
            f"but the archive holds {record.file_size}"
        )
    return dtype, nbytes, record


def meta_storage(saved_id, records: dict, where: str, what: str = "torch.save archive", used: list | None = None):
    """``persistent_load`` of a first pass: a storage on ``meta`` (sizes only, no bytes read) of the
    declared size, checked against its record (appended to ``used``)."""
    dtype, nbytes, record = _checked(saved_id, records, where, what)
    if used is not None:
        used.append(record)
    storage = torch.UntypedStorage(nbytes, device="meta")
    return torch.storage.TypedStorage(wrap_storage=storage, dtype=dtype, _internal=True)


def _storage(saved_id, window: FileRange, records: dict, read: dict, where: str):
    """``persistent_load``: the record ``data/KEY`` read into a fresh buffer (once per key)."""
    dtype, nbytes, record = _checked(saved_id, records, where, _WHAT)
    if record.filename not in read:
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        _read_record(window, record, buffer, where)
        read[record.filename] = buffer.untyped_storage()
    return torch.storage.TypedStorage(wrap_storage=read[record.filename], dtype=dtype, _internal=True)


def _fills(meta: torch.Tensor, out: torch.Tensor) -> bool:
    """The saved tensor is ``out``'s dtype and shape, contiguous, and its storage is exactly its bytes."""
    return (
        meta.dtype == out.dtype
        and meta.shape == out.shape
        and meta.is_contiguous()
        and out.is_contiguous()
        and meta.storage_offset() == 0
        and meta.untyped_storage().nbytes() == out.numel() * out.element_size()
    )


_LOCAL_HEADER = 30  # bytes of a zip local file header before its name and extra field


def _read_record(window: FileRange, record: zipfile.ZipInfo, out: torch.Tensor, where: str) -> None:
    """A stored record's bytes, read straight into ``out`` (its bytes, any dtype) from the file."""
    window.seek(record.header_offset)
    header = window.read(_LOCAL_HEADER)
    if len(header) != _LOCAL_HEADER or header[:4] != b"PK\x03\x04":
        raise CheckpointError(f"{where}: corrupt torch.save archive (record {record.filename} has no local header)")
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    window.seek(record.header_offset + _LOCAL_HEADER + name_length + extra_length)
    nbytes = out.numel() * out.element_size()
    if nbytes == 0:
        return
    target = memoryview(out.reshape(-1).view(torch.uint8).numpy())
    got = 0
    while got < nbytes:
        n = window.readinto(target[got:])
        if not n:
            raise CheckpointError(f"{where}: truncated chunk: record {record.filename} has {got} of {nbytes} bytes")
        got += n
