"""Processes as Linux's ``/proc`` shows them, for the tests that follow a fork server's children."""

from __future__ import annotations

from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, parent pid, ...: proc(5)),
    None once the process is gone. The name is in parentheses and may hold spaces, so the split is
    after its last ``)``."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def state(pid: int) -> str | None:
    """The process's state letter (R, S, Z, ...), None once it is gone."""
    fields = stat_fields(pid)
    return fields[0] if fields else None


def alive(pid: int) -> bool:
    """Running or sleeping: neither gone nor a zombie waiting for its parent."""
    return state(pid) not in (None, "Z", "X")


def parent(pid: int) -> int | None:
    """The parent's pid, None once the process is gone."""
    fields = stat_fields(pid)
    return int(fields[1]) if fields else None


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (zombies included)."""
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and parent(int(p.name)) == pid]
