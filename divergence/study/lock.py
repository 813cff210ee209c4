"""One study at a time in a study folder.

``study_lock``: ``divergence study``, ``calibrate``, ``consequence`` and ``atlas`` hold an exclusive
``fcntl.flock`` on ``OUT/.study.lock`` while they write and train there, so a second one on the
same folder is refused (naming the holder's pid, which the holder writes into the file) instead
of training the same pair folders twice at once. The kernel drops the lock when its holder exits,
however it exits (SIGKILL, a crash, a power cut of the node), so it never stays stuck. (What a
stopped study does with the children it started: ``training.stop_signals``.)
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from divergence.errors import UserInputError

LOCK_FILE = ".study.lock"


@contextmanager
def study_lock(out: Path) -> Iterator[None]:
    """Hold ``out``'s study lock (creating ``out``); a one-line UserInputError if another process holds it."""
    path = Path(out) / LOCK_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise UserInputError(f"{out}: cannot use it as a study folder: {err.strerror or err}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise UserInputError(
                f"{out}: another study or calibration (pid {holder or 'unknown'}) is training in "
                "this folder; wait for it to end or stop it, or give another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # drops the lock
