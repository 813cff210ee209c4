"""One writer per arm: ``<arm>/writer.lock``, held by the process writing the arm folder.

Two processes writing arm ``a`` of one pair folder would interleave their loss lines and
weights files (and the second's restart would cut the first's records), and every later
step would pair one process's losses with the other's weights. So every writer of an arm
folder (``ArmWriter`` and the callbacks built on it, ``divergence train --arm``) takes an
exclusive ``flock(2)`` on ``<arm>/writer.lock`` before it writes anything, and holds it for
its lifetime; a second writer is refused in one line naming the arm folder and the holder's
pid. The operating system releases the lock when the holder's file is closed, which includes
the process ending in any way (a crash, ``kill -9``, a node reboot on a local disk), so a
crashed writer never leaves it stuck. The file itself stays (it holds the last holder's
pid and host); it is not a sign of a running writer.

Only global rank zero writes, so only rank zero takes the lock. ``flock`` works between
processes of one machine and, on Linux, across NFS clients (emulated with byte-range locks).
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

from divergence.errors import UserInputError
from divergence.pairfolder.folder import arm_folder
from divergence.pairfolder.layout import WRITER_LOCK_FILE


class ArmLock:
    """An exclusive lock on arm folder ``folder`` (created); ``release()`` or the process's end frees it."""

    def __init__(self, folder: str | Path):
        self.folder = arm_folder(folder).path
        self.path = arm_folder(folder).writer_lock
        self._file = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            handle = open(self.path, "a+")
        except OSError as err:
            raise UserInputError(
                f"{self.folder}: cannot create {WRITER_LOCK_FILE} there ({err.strerror or err}); "
                "choose a folder you can write to"
            ) from None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _holder(self.path)
            handle.close()
            raise UserInputError(_refusal(self.folder, holder)) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()} {socket.gethostname()}\n")
        handle.flush()
        self._file = handle

    @property
    def held(self) -> bool:
        return self._file is not None

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the last descriptor drops the flock
            self._file = None

    def __del__(self):
        self.release()


def _holder(path: Path) -> tuple[int, str] | None:
    """``(pid, host)`` the holder wrote, None when unreadable (it may not have written it yet)."""
    try:
        pid, host = path.read_text().split()[:2]
        return int(pid), host
    except (OSError, ValueError):
        return None


def _refusal(folder: Path, holder: tuple[int, str] | None) -> str:
    if holder is None:
        who = "another process"
    elif holder == (os.getpid(), socket.gethostname()):
        return (
            f"{folder}: an earlier writer of this process (pid {holder[0]}) still writes this arm; call its "
            "finish() first (one writer per arm)"
        )
    else:
        who = f"another process (pid {holder[0]} on {holder[1]})"
    return (
        f"{folder}: {who} is writing this arm; one writer per arm at a time: stop it first, or train into "
        "another pair folder"
    )


def writer_alive(folder: str | Path) -> bool | None:
    """Whether a live process holds arm folder ``folder``'s ``writer.lock``: True; False when the lock
    is free (its last writer ended, in any way: a ``kill -9`` too); None when there is no lock file
    (a writer that takes none). Reads only: a shared lock is tried without waiting and dropped at
    once (a writer starting in those microseconds is refused as if another held it)."""
    try:
        fd = os.open(arm_folder(folder).writer_lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # drops the shared lock, if taken
    return False
