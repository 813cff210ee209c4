"""The writers of a pair folder: ``<pair>/writer.lock`` and ``<arm>/writer.lock``, held by the writing process.

Two processes writing one pair folder would interleave their records (two lockstep runs append
every step twice; a restarted run truncates the store while an orphan appends; ``track`` rewrites
``pair.json`` under a live arm), and every later step would pair one process's numbers with the
other's. So every writer of a pair folder takes ``flock(2)`` locks before it writes anything and
holds them for its lifetime. There are two kinds of writer:

- an *arm writer* writes one arm (``ArmWriter`` and the callbacks built on it, ``divergence train
  --arm``): ``ArmLock`` takes an exclusive lock on ``<arm>/writer.lock`` and a shared one on
  ``<pair>/writer.lock`` (the other arm's writer shares it);
- a *pair writer* writes the whole folder (the lockstep ``divergence train``, ``LockstepPair``,
  ``divergence track``, ``divergence pair``): ``PairLock`` takes an exclusive lock on
  ``<pair>/writer.lock``, so it is refused while an arm writer or another pair writer lives, and
  refuses them while it lives.

A refused writer gets one line naming the folder and the holder's pid (each exclusive holder
writes ``pid host`` into its lock file). The operating system releases a lock when the holder's
file is closed, which includes the process ending in any way (a crash, ``kill -9``, a node reboot
on a local disk), so a crashed writer never leaves it stuck. The files stay (they hold the last
holder's pid and host); a file is not a sign of a running writer: ``ArmLock.is_held(arm_dir)``
and ``PairLock.is_held(pair_dir)`` are (the liveness rule of ``docs/pair-folder.md``).

Only global rank zero writes, so only rank zero takes a lock. ``flock`` works between processes
of one machine and, on Linux, across NFS clients (emulated with byte-range locks).
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from divergence.errors import UserInputError
from divergence.pairfolder.folder import as_arm_folder, as_pair_folder
from divergence.pairfolder.layout import ARMS, WRITER_LOCK_FILE

# A liveness probe (``is_held``) holds a shared lock for microseconds; a writer that meets one
# tries again this often, this far apart, before it calls the lock held.
ATTEMPTS = 5
ATTEMPT_SECONDS = 0.02


class _Held:
    """Lock files held open until ``release()``, the end of a ``with`` block, or the process's end."""

    _handles: tuple = ()

    @property
    def held(self) -> bool:
        return bool(self._handles)

    def release(self) -> None:
        for handle in self._handles:
            handle.close()  # closing the last descriptor drops the flock
        self._handles = ()

    def __del__(self):
        self.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class ArmLock(_Held):
    """An arm writer's locks on arm folder ``arm_dir`` (created); ``release()`` or the process's end frees them."""

    def __init__(self, arm_dir: str | Path):
        arm = as_arm_folder(arm_dir)
        pair_lock = as_pair_folder(arm.path.parent).writer_lock
        shared = _take(pair_lock, arm.path, False, lambda: _arm_refused_by_pair(arm.path, _holder(pair_lock)))
        try:
            own = _take(arm.writer_lock, arm.path, True, lambda: _refusal(arm.path, _holder(arm.writer_lock)))
        except UserInputError:
            shared.close()
            raise
        self._handles = (own, shared)

    @staticmethod
    def is_held(arm_dir: str | Path) -> bool:
        """Whether a live process writes arm folder ``arm_dir``: an arm writer holds its lock, or a
        pair writer holds the pair's. Reads the locks only (a writer starting meanwhile still gets
        them); False for an arm nobody ever locked."""
        arm = as_arm_folder(arm_dir)
        return _probe(arm.writer_lock) or _probe(as_pair_folder(arm.path.parent).writer_lock)


class PairLock(_Held):
    """A pair writer's exclusive lock on pair folder ``pair_dir`` (created); ``release()`` or the process's end frees it."""

    def __init__(self, pair_dir: str | Path):
        pair = as_pair_folder(pair_dir)
        self._handles = (_take(pair.writer_lock, pair.path, True, lambda: _pair_refusal(pair.path)),)

    @staticmethod
    def is_held(pair_dir: str | Path) -> bool:
        """Whether a live process writes pair folder ``pair_dir`` or one of its arms (reads the locks only)."""
        pair = as_pair_folder(pair_dir)
        return _probe(pair.writer_lock) or any(_probe(arm.writer_lock) for arm in pair.arms.values())

    @staticmethod
    def holder(pair_dir: str | Path) -> tuple[int, str] | None:
        """``(pid, host)`` the last pair writer wrote into ``<pair>/writer.lock``, None when unknown."""
        return _holder(as_pair_folder(pair_dir).writer_lock)

    @staticmethod
    def writer(pair_dir: str | Path) -> str | None:
        """The live writer of pair folder ``pair_dir`` in words (``another process (pid 12 on node3)``), None if none."""
        pair = as_pair_folder(pair_dir)
        for path in (pair.writer_lock, *(arm.writer_lock for arm in pair.arms.values())):
            if _probe(path):
                return _who(_holder(path))
        return None


class WatchLock:
    """The comparator's exclusive ``flock`` on the pair folder itself: one ``divergence watch`` per
    pair folder, since two would append every step to the store twice. Arm writers go on beside it
    (they lock files, not the folder), and no file is written: a refused watch leaves the folder as
    it was. Where the file system cannot lock a folder (an NFS client emulates flock with POSIX
    locks, which a folder opened read-only cannot take), the watch runs unlocked, as before."""

    def __init__(self, pair_dir: str | Path):
        self.pair_dir = as_pair_folder(pair_dir).path
        self._fd = None
        try:
            fd = os.open(self.pair_dir, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return  # no folder: nothing to follow, which the caller says
        try:
            locked = _flock(fd, fcntl.LOCK_EX, held=BlockingIOError)
        except OSError:
            locked = None  # this file system locks no folder: unlocked
        if locked:
            self._fd = fd
            return
        os.close(fd)
        if locked is False:
            raise UserInputError(
                f"{self.pair_dir}: another divergence watch already follows this pair and writes its store; two "
                "would store every step twice: let it finish, or stop it and run this again"
            )

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __del__(self):
        self.release()


def _take(path: Path, folder: Path, exclusive: bool, refusal) -> object:
    """The lock file ``path`` in ``folder`` (created), opened and locked; an exclusive holder signs it.
    Held by another: a ``UserInputError`` saying ``refusal()``."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+")
    except OSError as err:
        raise UserInputError(
            f"{folder}: cannot create {WRITER_LOCK_FILE} there ({err.strerror or err}); "
            "choose a folder you can write to"
        ) from None
    if not _flock(handle.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH):
        handle.close()
        raise UserInputError(refusal())
    if exclusive:
        _sign(handle)
    return handle


def _flock(fd: int, operation: int, held: type[OSError] = OSError) -> bool:
    """Take the lock without waiting (a few tries, see ATTEMPTS); False when another holds it (the
    error ``held`` says so: any, for a lock file; another is raised)."""
    for attempt in range(ATTEMPTS):
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return True
        except held:
            if attempt + 1 < ATTEMPTS:
                time.sleep(ATTEMPT_SECONDS)
    return False


def _sign(handle) -> None:
    """An exclusive holder writes ``pid host`` into its lock file (named by the refusals)."""
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()} {socket.gethostname()}\n")
    handle.flush()


def _probe(path: Path) -> bool:
    """Whether an exclusive lock on ``path`` is held: a shared one cannot be taken (and is dropped at once)."""
    try:
        handle = open(path)
    except OSError:
        return False  # never created: never locked
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        return False  # closing the file drops the probe's lock


def _holder(path: Path) -> tuple[int, str] | None:
    """``(pid, host)`` the holder wrote, None when unreadable (it may not have written it yet)."""
    try:
        pid, host = path.read_text().split()[:2]
        return int(pid), host
    except (OSError, ValueError):
        return None


def _who(holder: tuple[int, str] | None) -> str:
    if holder is None:
        return "another process"
    if holder == (os.getpid(), socket.gethostname()):
        return f"an earlier writer of this process (pid {holder[0]})"
    return f"another process (pid {holder[0]} on {holder[1]})"


def _refusal(arm_dir: Path, holder: tuple[int, str] | None) -> str:
    if holder == (os.getpid(), socket.gethostname()):
        return (
            f"{arm_dir}: an earlier writer of this process (pid {holder[0]}) still writes this arm; call its "
            "finish() first (one writer per arm)"
        )
    return (
        f"{arm_dir}: {_who(holder)} is writing this arm; one writer per arm at a time: stop it first, or train into "
        "another pair folder"
    )


def writer_alive(arm_dir: str | Path) -> bool | None:
    """Whether a live process writes arm folder ``arm_dir`` (``ArmLock.is_held``): True; False when its
    ``writer.lock`` is free (its last writer ended, in any way: a ``kill -9`` too); None when there is
    no lock file (a writer that takes none). Reads the locks only."""
    if not as_arm_folder(arm_dir).writer_lock.exists():
        return None
    return ArmLock.is_held(arm_dir)


def _arm_refused_by_pair(arm_dir: Path, holder: tuple[int, str] | None) -> str:
    return (
        f"{arm_dir}: {_who(holder)} is writing the whole pair folder {arm_dir.parent} (a lockstep run or divergence "
        "track); one writer per arm at a time: stop it first (or wait for it to end), or train into another pair "
        "folder"
    )


def _pair_refusal(pair_dir: Path) -> str:
    """A pair writer refused: by a live arm writer (named with its arm) or by another pair writer."""
    for name in ARMS:
        arm = as_pair_folder(pair_dir).arm(name)
        if _probe(arm.writer_lock):
            return (
                f"{pair_dir}: {_who(_holder(arm.writer_lock))} still writes arm {name} of this pair folder; one "
                "writer of a pair folder at a time: stop it first (or wait for it to end), or use another folder"
            )
    return (
        f"{pair_dir}: {_who(_holder(as_pair_folder(pair_dir).writer_lock))} is writing this pair folder; one writer of a pair "
        "folder at a time: stop it first (or wait for it to end), or use another folder"
    )
