"""The metrics store: the contract between training and analysis.

One append-only JSON-lines file, ``DIR/metrics.jsonl``, written step by step. A step is a
block of lines: one ``{"type": "tensor", "step": N, "tensor": ..., <metrics>}`` per
compared tensor, then one ``{"type": "step", "step": N, ...}`` line that commits the block
(whole-model summary, losses, flags). A block is written with one ``write`` and fsynced,
and readers take only committed blocks, so a crash or ``kill -9`` loses at most the step in
flight and never corrupts earlier records. Opening for append cuts an uncommitted tail.

Record schema of a paired run (what the report relies on):

- tensor record: ``step, tensor, module, kind, shape, numel, dtype_a, dtype_b``, the metrics
  of ``divergence compare`` (``wasserstein, max_abs_diff, mean_abs_diff, rms_diff, rel_l2,
  cosine, nonfinite_a, nonfinite_b``) and ``norm_a, norm_b``;
- step record, every training step: ``step, tracked`` (bool: tensors were compared at this
  step), ``tensors`` (count), ``loss_a, loss_b, loss_diff``, ``spike_a, spike_b`` (bool);
  when tracked, also the whole-model summary under the metric names (see
  ``divergence.metrics.summarize``; ``rel_l2`` is E(t) = ||theta_a - theta_b|| / ||theta_a||) and
  ``kinds``: ``{kind: {metric: value}}``; when tracked and the pair's function-space probe is on
  (``tracking.probe``, ``divergence.training.probe``), also ``probe_rel_diff`` (F(t) =
  ||out_a(Q) - out_b(Q)|| / ||out_b(Q)|| on the fixed probe set Q, both arms in fp32 with baseline
  attention and no autocast), ``probe_loss_a`` and ``probe_loss_b`` (each arm's diffusion loss on
  Q). Stores written with the probe off, or by a user's own trainer, lack the three keys.

Which steps are tracked is ``divergence.pairfolder.settings.is_tracked``; ``pair.json`` holds the
schedule under ``tracking`` and the run's ``replicate``.

Steps only move forward: appending a step at or below the last committed one is an error
(no duplicates); ``truncate_after(step)`` drops later steps when a run resumes from an
earlier checkpoint and will recompute them.

Reading is strict (``divergence.pairfolder.jsonl``): every complete line must be a record (an
object with ``type`` ``tensor`` or ``step`` and an integer ``step``), a block's tensor
records carry its step, and steps strictly increase; anything else is an error naming the
file and line (and the step), never a silent stop. A torn final line and complete records
after the last commit are the uncommitted tail of a killed writer: readers skip it and
``open_for_append`` cuts it, but nothing committed or unreadable is ever cut: that is
``divergence repair DIR``'s job (``divergence.store.repair``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

from divergence.atomic import fsync_folder
from divergence.errors import UserInputError
from divergence.pairfolder.folder import as_pair_folder
from divergence.pairfolder.jsonl import UnreadableLine, parse_object, read_records, require_step, tail_step, unreadable

TYPES = ("tensor", "step")


class MetricsStore:
    """``DIR/metrics.jsonl``: committed step blocks of tensor records and a step record."""

    def __init__(self, pair_dir: str | Path):
        self.pair_dir = Path(pair_dir)
        self.path = as_pair_folder(pair_dir).metrics
        self._last: int | None = None
        self._last_known = False

    # -- writing -------------------------------------------------------------------------
    def open_for_append(self) -> "MetricsStore":
        """Create the folder and file if needed and cut the uncommitted tail (after checking
        every committed record: an unreadable line is an error, and nothing is cut)."""
        self.pair_dir.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            end = self._committed_end()
            if end < self.path.stat().st_size:
                with open(self.path, "r+b") as f:
                    f.truncate(end)
                    os.fsync(f.fileno())
        else:
            self.path.touch()
            fsync_folder(self.pair_dir)
        return self

    def append_step(self, step: int, tensor_records: list[dict], step_record: dict) -> None:
        """Write one step's tensor records and its committing step record, atomically."""
        last = self.last_step()
        if last is not None and step <= last:
            raise ValueError(f"{self.path}: step {step} is not after the last stored step {last}")
        lines = [_dumps({"type": "tensor", "step": step, **r}) for r in tensor_records]
        lines.append(_dumps({**step_record, "type": "step", "step": step, "tensors": len(tensor_records)}))
        with open(self.path, "a") as f:
            f.write("\n".join(lines) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._last, self._last_known = step, True

    def truncate_after(self, step: int) -> int:
        """Drop every committed step after ``step``; return how many were dropped.

        The whole file is read first: an unreadable line anywhere is an error and nothing is cut.
        """
        if not self.path.exists():
            return 0
        offset, dropped = 0, 0
        for end, _, record in self._blocks():
            if record["step"] <= step:
                offset = end
            else:
                dropped += 1
        with open(self.path, "r+b") as f:
            f.truncate(offset)
            os.fsync(f.fileno())
        self._last_known = False
        return dropped

    # -- reading -------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.path.is_file()

    def check(self) -> None:
        """Read every line; raise the error of the first unreadable one (a ``UserInputError``)."""
        self._committed_end()

    def last_step(self) -> int | None:
        if not self._last_known:
            steps = self.steps()
            self._last, self._last_known = (steps[-1] if steps else None), True
        return self._last

    def steps(self) -> list[int]:
        return [r["step"] for r in self.step_records()]

    def tail_step(self, windows: tuple[int, ...] = (1 << 18, 1 << 22)) -> int | None:
        """The step of the last step record within the file's last bytes, for progress display.

        Reads the last ``windows[0]`` bytes (then ``windows[1]`` if a block is longer than
        that) instead of parsing the whole store, which grows by a block of tensor records per
        tracked step; None when there is no file or no step record there. Not a validated read:
        records come from ``step_records``.
        """
        return tail_step(self.path, windows, "step")

    def step_records(self) -> list[dict]:
        return [r for _, _, r in self._blocks()]

    def tensor_records(self) -> Iterator[dict]:
        """Every committed tensor record, in step order."""
        for _, tensors, _ in self._blocks():
            yield from tensors

    # -- internals -----------------------------------------------------------------------
    def _committed_end(self) -> int:
        return max((end for end, _, _ in self._blocks()), default=0)  # the last block's end

    def _blocks(self) -> Iterator[tuple[int, list[dict], dict]]:
        """(offset after the block, its tensor records, its step record) per committed block.

        Raises on an unreadable line, a tensor record of another step inside a block, and a
        step not after the one before it (a duplicated block).
        """
        pending: list[tuple[int, dict]] = []
        last: tuple[int, int] | None = None  # (step, line of its commit)
        for number, end, record in self._lines():
            if record["type"] == "tensor":
                pending.append((number, record))
                continue
            step = record["step"]
            if last is not None and step <= last[0]:
                what = "is stored twice" if step == last[0] else f"comes after step {last[0]}"
                raise unreadable(
                    self.path,
                    number,
                    f"step {step} {what} (committed on line {last[1]}): a duplicated or misplaced step block",
                )
            for line, tensor in pending:
                if tensor["step"] != step:
                    raise unreadable(
                        self.path,
                        line,
                        f"a tensor record of step {tensor['step']} inside the "
                        f"block of step {step} (committed on line {number})",
                    )
            yield end, [t for _, t in pending], record
            pending, last = [], (step, number)

    def _lines(self) -> Iterator[tuple[int, int, dict]]:
        """(line number, offset after the line, record) for each complete line."""
        if not self.path.exists():
            raise UserInputError(f"{self.path}: no metrics store here (was this folder written by divergence train?)")
        offset = 0
        for number, raw, record in read_records(self.path, parse_record):
            offset += len(raw)
            yield number, offset, record


def parse_record(raw: bytes) -> dict:
    """One store line as a record, or ``UnreadableLine`` saying why it is not one."""
    record = parse_object(raw)
    if record.get("type") not in TYPES:
        raise UnreadableLine(f"its type {record.get('type')!r} is not one of {', '.join(TYPES)}")
    require_step(record)
    if record["type"] == "tensor" and not isinstance(record.get("tensor"), str):
        raise UnreadableLine("a tensor record without a tensor name")
    return record


def _dumps(record: dict) -> str:
    # NaN and Infinity are written as Python's json writes them (JSON5 tokens), so a
    # rel_l2 of inf or a NaN metric reads back exactly, not as null
    return json.dumps(record, separators=(",", ":"), allow_nan=True)
