"""Reading the append-only JSON-lines files of a run folder (the store, losses), strictly.

A line is complete when it ends with a newline. The one incomplete line a file may hold is
its last: a writer killed mid-line leaves it, and it is "not written yet", never an error.
Every complete line must parse, or the file is refused with its line number: a reader that
stopped there would silently drop the records after it, and a writer resuming there would
delete them (``divergence repair DIR`` moves such lines aside and keeps the rest).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from divergence.errors import UserInputError
from divergence.pairfolder.layout import METRICS_FILE

STEP_LIMIT = 1 << 63  # steps are int64 wherever they are computed on (numpy, Parquet)


class UnreadableLine(ValueError):
    """A complete line that is not a record of its file; the message says why."""


def read_records(path: Path, parse, offset: int = 0, number: int = 0) -> Iterator[tuple[int, bytes, dict]]:
    """(line number, raw line with its newline, record) for each complete line of ``path`` from byte
    ``offset`` (``number``: the lines before it), parsed by ``parse``; stops before a torn final line.
    An unreadable line or file is a one-line ``UserInputError``."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            for raw in f:
                if not raw.endswith(b"\n"):
                    return
                number += 1
                try:
                    record = parse(raw)
                except UnreadableLine as err:
                    raise unreadable(path, number, str(err)) from None
                yield number, raw, record
    except OSError as err:
        raise UserInputError(f"{path}: cannot read: {err.strerror or err}") from None


def tail_step(path: Path, windows: tuple[int, ...], kind: str | None = None) -> int | None:
    """The step of the last record (of type ``kind``, when given) among the complete lines within the
    last ``windows[0]`` bytes of ``path`` (then the next window while the file is longer; the first
    line of a window that starts mid-file is left out: it may be cut); None when there is none or
    the file cannot be read. For progress display only, never a validated read."""
    for window in windows:
        try:
            size = path.stat().st_size
            with open(path, "rb") as f:
                f.seek(max(0, size - window))
                lines = f.read().split(b"\n")[:-1]  # the piece after the last newline is not a line yet
        except OSError:
            return None
        for raw in lines[::-1] if size <= window else lines[:0:-1]:
            try:
                record = parse_object(raw)
                step = require_step(record)
            except UnreadableLine:
                continue
            if kind is None or record.get("type") == kind:
                return step
        if size <= window:
            return None
    return None


def parse_object(raw: bytes) -> dict:
    """The JSON object on one line (NaN and infinities as JSON5 tokens, as the writers write them)."""
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise UnreadableLine(f"not JSON ({str(err).splitlines()[0][:80]})") from None
    if not isinstance(record, dict):
        raise UnreadableLine(f"a JSON {type(record).__name__}, not a record object")
    return record


def require_step(record: dict) -> int:
    """The record's step: an integer in [0, 2**63), as the analysis and Parquet hold it (int64)."""
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise UnreadableLine(f"its step {step!r} is not a non-negative integer")
    if step >= STEP_LIMIT:
        raise UnreadableLine(f"its step {step} does not fit in a 64-bit integer")
    return step


def unreadable(path: Path, number: int, reason: str) -> UserInputError:
    """The one-line error for line ``number`` of ``path``, with the command that repairs it (which takes
    the pair folder: the store lives in ``DIR``, the losses in ``DIR/<arm>/``)."""
    folder = path.parent if path.name == METRICS_FILE else path.parent.parent
    return UserInputError(
        f"{path}: line {number}: {reason}; nothing was changed. Run `divergence repair "
        f"{folder}` to keep every committed record and move such lines aside"
    )
