"""What a checkpoint path is before anything opens it: a regular file, a folder, or a clear error.

``open()`` on a FIFO blocks until a writer appears, and ``Path.exists()`` calls a symlink
loop "missing"; every reader asks ``check_path`` first, so both are one line instead.

A file named from inside a folder (a DCP ``.metadata`` and its chunk files, Megatron's
``metadata.json``, DeepSpeed's ``latest``) is opened with ``open_regular``: without blocking, and
checked on the open descriptor (so a file swapped for a FIFO after ``check_path`` is still
refused) to be a regular file once symbolic links are followed; ``read_regular`` also refuses
one larger than the reader's bound (``bounds``) before reading a byte, so ``/dev/zero`` or a
sparse file of terabytes costs nothing.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from divergence.errors import CheckpointError

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def check_path(path: Path, folder_ok: bool = True) -> os.stat_result:
    """``os.stat(path)`` of a regular file (or folder when ``folder_ok``), else a ``CheckpointError``."""
    try:
        info = os.stat(path)
    except OSError as err:
        raise CheckpointError(f"{path}: {_reason(err)}") from None
    if stat.S_ISREG(info.st_mode) or (folder_ok and stat.S_ISDIR(info.st_mode)):
        return info
    if stat.S_ISDIR(info.st_mode):
        raise CheckpointError(f"{path}: is a folder, expected a checkpoint file")
    kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
    raise CheckpointError(f"{path}: is {kind}, not a checkpoint file; copy the checkpoint to a regular file")


def open_regular(path: Path):
    """``path`` opened for binary reading, refused unless it is a regular file (links followed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once instead of waiting
    except OSError as err:
        raise CheckpointError(f"{path}: {_reason(err)}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        check_path(path, folder_ok=False)  # names the kind (FIFO, device, folder)
        raise CheckpointError(f"{path}: not a regular file")  # pragma: no cover - swapped back meanwhile
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_regular(path: Path, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path``, refused unread when it holds more than ``limit``
    (``what`` says what it should be: "a DCP .metadata")."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise CheckpointError(f"{path}: {size:,} bytes, more than the {limit:,} of the largest {what}; refused")
        try:
            data = f.read(size + 1)  # read(n) allocates n bytes first: the size, not the limit
        except OSError as err:
            raise CheckpointError(f"{path}: cannot read: {err.strerror or err}") from None
    if len(data) > size:
        raise CheckpointError(f"{path}: grew while being read; refused")
    return data


def _reason(err: OSError) -> str:
    if err.errno == errno.ENOENT:
        return "no such file or folder"
    if err.errno == errno.ELOOP:
        return "symbolic link loop (a link that points back to itself); fix or remove the link"
    return f"cannot read: {err.strerror or err}"
