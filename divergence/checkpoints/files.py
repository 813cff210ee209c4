"""What a checkpoint path is before anything opens it: a regular file, a folder, or a clear error.

``open()`` on a FIFO blocks until a writer appears, and ``Path.exists()`` calls a symlink
loop "missing"; every reader asks ``check_path`` first, so both are one line instead.
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


def _reason(err: OSError) -> str:
    if err.errno == errno.ENOENT:
        return "no such file or folder"
    if err.errno == errno.ELOOP:
        return "symbolic link loop (a link that points back to itself); fix or remove the link"
    return f"cannot read: {err.strerror or err}"
