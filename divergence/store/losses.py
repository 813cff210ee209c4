"""``DIR/<arm>/losses.jsonl``: the per-step losses of one arm trained as its own job.

A comparator following two separate arm jobs needs each arm's loss at every step to build
the store's step records (``loss_a``, ``loss_b``, spikes). One line per optimizer step,
written by global rank zero, flushed and fsynced before the next step starts::

    {"step": 1, "loss": 1.137965440750122}

``step`` counts completed optimizer steps (the loss of the N-th step is on line ``step: N``,
the convention of the store). Floats go through ``repr`` and back, so the comparator reads
exactly the float the arm computed; NaN and infinities are written as JSON5 tokens, as the
store writes them. Readers take complete lines only: a torn final line of a killed writer is
not there yet. A resumed arm cuts the lines after the step it resumes from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

FILENAME = "losses.jsonl"


class LossFile:
    """Append and read one arm's losses; reading is incremental (``read_new``)."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / FILENAME
        self._offset = 0
        self.losses: dict[int, float] = {}

    # -- writing (the arm's rank zero) ------------------------------------------------------
    def append(self, step: int, loss: float) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, "loss": float(loss)}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def truncate_after(self, step: int) -> None:
        """Keep the complete lines of steps ``<= step`` (a resumed arm recomputes the rest)."""
        if not self.path.exists():
            return
        keep = 0
        with open(self.path, "rb") as f:
            for raw in f:
                if not raw.endswith(b"\n") or json.loads(raw)["step"] > step:
                    break
                keep += len(raw)
        with open(self.path, "r+b") as f:
            f.truncate(keep)

    # -- reading (the comparator) -----------------------------------------------------------
    def read_new(self) -> dict[int, float]:
        """Parse the complete lines written since the last call; return every loss seen."""
        if not self.path.exists():
            return self.losses
        if self.path.stat().st_size < self._offset:  # cut by a resumed arm: read again
            self.reset()
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            for raw in f:
                if not raw.endswith(b"\n"):
                    break  # torn tail: the writer is mid-line
                record = json.loads(raw)
                self.losses[record["step"]] = record["loss"]
                self._offset += len(raw)
        return self.losses

    def reset(self) -> None:
        self._offset, self.losses = 0, {}
