"""Durable atomic file writes: the one way divergence replaces a file another process may read.

A file is written under a hidden temporary name in its own folder, flushed and fsynced, renamed
over the final name with ``os.replace`` (atomic on POSIX: a reader sees the old file or the new
one, never half of one), and then the folder itself is fsynced, because the rename lives in the
folder's entry table: without that fsync a power loss after the rename can bring back the old
file, or no file at all (see ``fsync(2)``: "Calling fsync() does not necessarily ensure that the
entry in the directory containing the file has also reached disk"). The temporary file is
removed on every failure, so an interrupted write leaves nothing behind.

Used for resume state, weights, ``pair.json``, ``status.json``, ``watch.json``, the pair and
run recipes and every JSON/CSV a command writes.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator


def temp_path(path: str | Path) -> Path:
    """The hidden temporary name of ``path`` for this process: ``.NAME.tmp-PID`` beside it."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def fsync_folder(folder: str | Path) -> None:
    """Make the folder's entries (a created, renamed or removed file) durable."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_target(path: str | Path) -> Iterator[Path]:
    """A temporary path for a library that writes a file by name (``torch.save``); on a normal
    exit the complete file is fsynced, renamed to ``path`` and the folder fsynced, on an error
    it is removed."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)  # fsync through any descriptor flushes the file
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_folder(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_file(path: str | Path, mode: str = "wb", **open_args) -> Iterator[IO]:
    """Write ``path`` through the yielded file object; it appears complete when the block ends.

    >>> with atomic_file("out/summary.json", "w") as f:  # doctest: +SKIP
    ...     f.write("{}")
    """
    with atomic_target(path) as tmp, open(tmp, mode, **open_args) as f:
        yield f


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Replace ``path`` with ``data`` (text is written as UTF-8), durably and atomically."""
    with atomic_file(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return Path(path)


def read_json(path: str | Path, default=None):
    """The JSON in ``path``, or ``default`` when it is missing, unreadable or not JSON (yet)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return default
