"""What one arm job has written so far: its status, its losses, its complete checkpoints.

The comparator only ever takes a checkpoint whose writer says it is complete: the exact name
``step_NNNNNN.safetensors``, metadata naming the step asked for, and the completion marker
``save_weights`` records in it (the data's length and CRC-32, see
``divergence.pairfolder.arm.weights_file``) matching the bytes there. A file being copied in, preallocated
at full size and then filled, or rewritten in place fails the marker and is "not there yet",
looked at again at the next poll; it is never read half-written. An arm written as DCP
(``step_NNNNNN.dcp/``) is taken once its ``complete.json`` is there (``pairfolder.arm.weights_dcp``). The identity of the file taken
(inode, size, mtime) is kept, so a file replaced while it was being compared is noticed.

Before the comparator takes a tracked step it checks both files complete
(``pairfolder.arm.weights_file.completed``: their CRC-32 over every byte, a full read; 3.4 GB a file
at SD 1.5 size). ``Prefetch`` runs that check for the next tracked step in a background thread
while the current step's comparison runs, so the read overlaps the comparison and the files are
in the page cache when they are compared. What it found is used only while the file is still the
one checked (same inode, size and mtime: ``unchanged``); otherwise, or when the file was
not complete yet, the check runs again as without prefetch. The comparison itself is untouched:
the records are the same bit for bit.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from divergence.pairfolder.folder import as_arm_folder
from divergence.pairfolder.arm.weights_file import completed, identity
from divergence.pairfolder.arm.losses import LossFile


class ArmFeed:
    """An arm's folder (``arm_folder``), its losses read so far (``loss_file``) and its complete checkpoints."""

    def __init__(self, arm_dir: str | Path):
        self.arm_folder = as_arm_folder(arm_dir)
        self.loss_file = LossFile(self.arm_folder)

    def checkpoint(self, step: int) -> tuple[Path, tuple] | None:
        """The complete weights file (or DCP folder) of ``step`` and its identity, or None while it is not complete."""
        path = self.arm_folder.saved_weights(step)
        found = completed(path, step, self.arm_folder.arm)  # a DCP folder copied from the other arm: refused
        return None if found is None else (path, found)


def unchanged(path: str | Path, taken: tuple) -> bool:
    """``path`` is still the file taken (same inode, size and modification time)."""
    return identity(path) == tuple(taken)


LOOKAHEAD = 100_000  # records searched for an open-ended pair's next tracked step (every <= this)


class Prefetch:
    def __init__(self, feeds: dict[str, ArmFeed], tracked, max_steps: int | None, stride: int = 1):
        """``tracked(step) -> bool``: the pair's schedule; ``feeds``: the arms' ``ArmFeed``;
        ``max_steps``: the last step (None: open-ended, the schedule's next step is looked for)."""
        self.feeds, self.tracked, self.max_steps, self.stride = feeds, tracked, max_steps, stride
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="divergence-prefetch")
        self._pending: dict[tuple[str, int], Future] = {}

    def end_at(self, max_steps: int | None, tracked) -> None:
        """The pair's length changed (``max_steps``, None: open-ended again) and with it its schedule."""
        self.max_steps, self.tracked = max_steps, tracked

    def after(self, step: int) -> None:
        """Start checking the files of the first tracked step after ``step`` (once per step)."""
        end = step + self.stride * LOOKAHEAD if self.max_steps is None else self.max_steps
        following = next((s for s in range(step + self.stride, end + 1, self.stride) if self.tracked(s)), None)
        if following is None:
            return
        for arm, feed in self.feeds.items():
            if (arm, following) not in self._pending:
                self._pending[(arm, following)] = self._pool.submit(feed.checkpoint, following)

    def checkpoint(self, arm: str, step: int):
        """``ArmFeed.checkpoint(step)`` of ``arm``: the prefetched answer while still valid, else read now."""
        future = self._pending.pop((arm, step), None)
        if future is not None:
            try:
                found = future.result()
            except Exception:  # noqa: BLE001 - the check again raises it where it belongs
                found = None
            if found is not None and unchanged(found[0], found[1]):
                return found
        return self.feeds[arm].checkpoint(step)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
