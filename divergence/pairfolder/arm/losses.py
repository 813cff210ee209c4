"""``DIR/<arm>/losses.jsonl``: the per-step losses of one arm trained as its own job.

A comparator following two separate arm jobs needs each arm's loss at every step to build
the store's step records (``loss_a``, ``loss_b``, spikes). One line per optimizer step,
written by global rank zero, flushed and fsynced before the next step starts::

    {"step": 1, "loss": 1.137965440750122}
    {"step": 1, "loss": 1.137965440750122, "router_drop": 0.171875}     (a mixture of experts)

``router_drop`` (optional, a number in [0, 1]): the fraction of (token, slot) choices the arm's
capacity limit dropped in the step's last training forward, over every MoE layer and every rank
(``divergence.training.probe.training_drops``), so a comparator stores a separate arm's drops from
its training, as the lockstep tracker stores them (``router_drop_a``, ``router_drop_b``).

``step`` counts completed optimizer steps (the loss of the N-th step is on line ``step: N``,
the convention of the store). Floats go through ``repr`` and back, so the comparator reads
exactly the float the arm computed; NaN and infinities are written as JSON5 tokens, as the
store writes them. Readers take complete lines only: a torn final line of a killed writer is
not there yet. Every complete line must be ``{"step": int, "loss": number}`` (and an optional
``router_drop``) with steps strictly increasing, or the file is refused naming its line
(``divergence repair DIR`` moves such lines aside). A resumed arm cuts the lines after
the step it resumes from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from divergence.pairfolder.folder import as_arm_folder
from divergence.atomic import fsync_folder
from divergence.pairfolder import jsonl
from divergence.pairfolder.jsonl import UnreadableLine, parse_object, read_records, require_step, unreadable


class LossFile:
    """Append and read one arm's losses; reading is incremental (``read_new``)."""

    def __init__(self, arm_dir: str | Path):
        self.path = as_arm_folder(arm_dir).losses
        self.reset()

    # -- writing (the arm's rank zero) ------------------------------------------------------
    def append(self, step: int, loss: float, router_drop: float | None = None) -> None:
        record = {"step": step, "loss": float(loss)}
        if router_drop is not None:
            record["router_drop"] = float(router_drop)
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
            fsync_folder(self.path.parent)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def truncate_after(self, step: int) -> None:
        """Keep the complete lines of steps ``<= step`` (a resumed arm recomputes the rest).

        Every line is read first: an unreadable one is an error and nothing is cut.
        """
        if not self.path.exists():
            return
        keep, cut = 0, False
        for _, raw, record in self._records(0, 0):
            cut = cut or record["step"] > step
            keep += 0 if cut else len(raw)
        with open(self.path, "r+b") as f:
            f.truncate(keep)
            os.fsync(f.fileno())

    # -- reading (the comparator) -----------------------------------------------------------
    def check(self) -> None:
        """Read every line; raise the error of the first unreadable one (a ``UserInputError``)."""
        if self.path.exists():
            for _ in self._records(0, 0):
                pass

    def read_new(self) -> dict[int, float]:
        """Parse the complete lines written since the last call; return every loss seen."""
        if not self.path.exists():
            return self.losses
        if not self._still_there():  # cut by a resumed arm: read again
            self.reset()
        for number, raw, record in self._records(self._offset, self._lines, self._last_step):
            self.losses[record["step"]] = record["loss"]
            if "router_drop" in record:
                self.router_drops[record["step"]] = record["router_drop"]
            self._offset, self._lines, self._tail = self._offset + len(raw), number, raw
            self._last_step = record["step"]
        return self.losses

    def reset(self) -> None:
        self._offset, self._lines, self._tail, self._last_step = 0, 0, b"", None
        self.losses: dict[int, float] = {}
        self.router_drops: dict[int, float] = {}  # step -> the arm's training drop fraction (MoE arms)

    def _still_there(self) -> bool:
        """The last line read is still where it was (a cut file is shorter, or holds new lines there)."""
        if not self._offset:
            return True
        with open(self.path, "rb") as f:
            f.seek(self._offset - len(self._tail))
            return f.read(len(self._tail)) == self._tail

    def _records(self, offset: int, lines: int, last: int | None = None):
        """(line number, raw line, record) of each complete line from byte ``offset`` (after
        ``lines`` lines, the last of step ``last``) on."""
        for number, raw, record in read_records(self.path, parse_loss, offset, lines):
            if last is not None and record["step"] <= last:
                raise unreadable(
                    self.path,
                    number,
                    f"step {record['step']} does not follow step {last} of "
                    "the line before (a duplicated or misplaced line)",
                )
            last = record["step"]
            yield number, raw, record


def parse_loss(raw: bytes) -> dict:
    """One loss line as ``{"step": int, "loss": float}`` (with ``router_drop`` where the line has
    one), or ``UnreadableLine`` saying why not."""
    record = parse_object(raw)
    require_step(record)
    loss = record.get("loss")
    if isinstance(loss, bool) or not isinstance(loss, (int, float)):
        raise UnreadableLine(f"its loss {loss!r} is not a number")
    parsed = {"step": record["step"], "loss": float(loss)}
    if "router_drop" in record:
        drop = record["router_drop"]
        if isinstance(drop, bool) or not isinstance(drop, (int, float)) or not 0.0 <= drop <= 1.0:
            raise UnreadableLine(f"its router_drop {drop!r} is not a fraction in [0, 1]")
        parsed["router_drop"] = float(drop)
    return parsed


def tail_step(arm_dir: str | Path, window: int = 4096) -> int:
    """The step of the last complete loss line within the file's last ``window`` bytes, 0 when none
    (``jsonl.tail_step``: for progress display only)."""
    return jsonl.tail_step(as_arm_folder(arm_dir).losses, (window,)) or 0
