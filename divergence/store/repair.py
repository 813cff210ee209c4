"""``divergence repair DIR``: keep every committed record, move the unreadable lines aside.

Readers refuse a store or loss file with an unreadable line (``divergence.pairfolder.jsonl``), and
writers never cut one. This is the way out that loses nothing: each file is split into

- the lines kept, in their order: every committed step block of ``metrics.jsonl`` (the
  block's readable tensor records of its own step and its step record), every readable loss
  line, and the uncommitted tail (a writer resuming cuts it, as always);
- the lines moved aside, byte for byte, into ``<file>.unreadable-<UTC time>`` beside it:
  lines that are not records, tensor records of another step inside a block, and a
  duplicated or misplaced block (a step not after the one before it: the first block of a
  step is kept, a later one moved) or loss line.

The side file is written first and both are written atomically and durably
(``divergence.atomic``), so a crash at any point leaves either the old file or the repaired
one plus its side file. Run it while no job writes to ``DIR``.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field
from pathlib import Path

from divergence.atomic import write_atomic
from divergence.errors import UserInputError
from divergence.pairfolder.folder import as_pair_folder
from divergence.pairfolder.layout import LOSSES_FILE, METRICS_FILE
from divergence.pairfolder.jsonl import UnreadableLine
from divergence.pairfolder.arm.losses import parse_loss
from divergence.store.metrics_store import MetricsStore, parse_record


@dataclass
class Repair:
    """What ``repair_file`` did to one file: lines kept, lines moved (number, reason), the side file."""

    path: Path
    kept: int = 0
    committed: int = 0
    moved: list[tuple[int, str]] = field(default_factory=list)
    side_file: Path | None = None


def repair_folder(folder: str | Path) -> list[Repair]:
    """Repair ``DIR/metrics.jsonl`` and each arm's ``DIR/<arm>/losses.jsonl`` that exist."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserInputError(f"{folder}: no such folder")
    pair = as_pair_folder(folder)
    paths = [p for p in (pair.metrics, *(arm.losses for arm in pair.arms.values())) if p.is_file()]
    if not paths:
        raise UserInputError(f"{folder}: holds no {METRICS_FILE} and no <arm>/{LOSSES_FILE}; give a pair folder")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return [repair_file(path, stamp) for path in paths]


def repair_file(path: Path, stamp: str) -> Repair:
    try:
        lines = list(io.BytesIO(path.read_bytes()))  # split at b"\n" only, as the readers split
    except OSError as err:
        raise UserInputError(f"{path}: cannot read: {err.strerror or err}") from None
    split = _split_store if path.name == METRICS_FILE else _split_losses
    keep, aside, committed = split(lines)
    result = Repair(path, kept=len(keep), committed=committed, moved=[(n, why) for n, why in aside])
    if aside:
        side = _side_file(path, stamp)
        write_atomic(side, b"".join(lines[n - 1] for n, _ in aside))  # all complete lines
        write_atomic(path, b"".join(lines[n - 1] for n in keep))
        result.side_file = side
        if path.name == METRICS_FILE:
            MetricsStore(path.parent).check()  # the repaired store reads: a bug here must not pass silently
    return result


def _split_store(lines: list[bytes]) -> tuple[list[int], list[tuple[int, str]], int]:
    """(line numbers kept, (line number, reason) moved aside, committed blocks kept)."""
    keep, aside, pending, last, committed = [], [], [], None, 0
    for number, raw in enumerate(lines, 1):
        if not raw.endswith(b"\n"):
            keep.append(number)  # the torn final line: the uncommitted tail
            continue
        try:
            record = parse_record(raw)
        except UnreadableLine as err:
            aside.append((number, str(err)))
            continue
        if record["type"] == "tensor":
            pending.append((number, record["step"]))
            continue
        step = record["step"]
        if last is not None and step <= last:
            why = f"a second block of step {step}" if step == last else f"a block of step {step} after step {last}"
            aside += [(n, why) for n, _ in pending] + [(number, why)]
        else:
            for n, tensor_step in pending:
                (
                    keep.append(n)
                    if tensor_step == step
                    else aside.append((n, f"a tensor record of step {tensor_step} in the block of step {step}"))
                )
            keep.append(number)
            last, committed = step, committed + 1
        pending = []
    keep += [n for n, _ in pending]  # complete records of the uncommitted tail
    return sorted(keep), sorted(aside), committed


def _split_losses(lines: list[bytes]) -> tuple[list[int], list[tuple[int, str]], int]:
    keep, aside, last = [], [], None
    for number, raw in enumerate(lines, 1):
        if not raw.endswith(b"\n"):
            keep.append(number)
            continue
        try:
            step = parse_loss(raw)["step"]
        except UnreadableLine as err:
            aside.append((number, str(err)))
            continue
        if last is not None and step <= last:
            aside.append((number, f"step {step} after step {last}"))
            continue
        keep.append(number)
        last = step
    return keep, aside, len(keep)


def _side_file(path: Path, stamp: str) -> Path:
    side = path.with_name(f"{path.name}.unreadable-{stamp}")
    serial = 1
    while side.exists():
        serial += 1
        side = path.with_name(f"{path.name}.unreadable-{stamp}-{serial}")
    return side
