"""``tracking.keep``: bounded disk for separate arm jobs, whose tracked weights are full fp32 files.

Each arm writes its weights at every tracked step (about 3.9 GB a file for an SD-1.5-sized
recipe), which the comparator needs only until it has compared them. With ``tracking.keep: k``
the comparator deletes both arms' files of a tracked step once the step is compared AND
committed to the store, keeping the files of every k-th tracked step (the 0th, k-th, 2k-th, ...
in the tracked schedule, ``divergence.pairfolder.settings.is_tracked``) and of the last step.
An open-ended pair (``max_steps`` null: writers not told their length) has its last step known
only when both arms finish; the comparator holds each step back until an arm is past it (or
both have finished), so a step it deletes is never the last.

Never before the commit, and nothing but the file compared: before committing the step, the
comparator writes what it will delete (paths and file identities: inode, size, mtime) to
``DIR/retention.json``, durably; after the commit it deletes each file still identical to the
one compared (an arm that restarted and rewrote it meanwhile keeps its new file), then clears
the note. A comparator killed anywhere in between loses nothing: started again, it finishes
the noted deletion if the store holds that step, and drops the note if it does not (the step
is compared again, and noted again).
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path

from divergence.tables import write_json
from divergence.pairfolder.folder import PairFolder
from divergence.pairfolder.weights_dcp import remove_weights
from divergence.pairfolder.weights_file import identity


class Retention:
    def __init__(self, out: str | Path, keep: int | None, tracked_steps: list[int], schedule=None):
        """``tracked_steps``: every tracked step of the pair, increasing (the last is kept). An
        open-ended pair's: ``schedule`` (``step -> tracked``) lists them as far as asked, and the
        last is set by ``end_at`` once known."""
        self.path, self.keep, self.tracked = PairFolder(out).retention, keep or 0, list(tracked_steps)
        self.schedule = schedule
        self.last = None if schedule is not None else (self.tracked[-1] if self.tracked else -1)

    @classmethod
    def for_pair(cls, out: str | Path, pair) -> Retention:
        """``pair``: a ``PairSchedule`` (its tracking config, ``max_steps`` and schedule)."""
        keep = pair.tracking.keep or 0
        if pair.max_steps is None:
            return cls(out, keep, [], schedule=pair.tracked)
        steps = [s for s in range(pair.max_steps + 1) if pair.tracked(s)] if keep else []
        return cls(out, keep, steps)

    def end_at(self, last: int) -> None:
        """An open-ended pair's last step, once both arms have finished (its files are kept)."""
        self.last = last

    def kept(self, step: int) -> bool:
        """The files of ``step`` stay: keep-all, the last tracked step, or every keep-th tracked step."""
        if not self.keep or (self.last is not None and step >= self.last):
            return True
        self._list_to(step)
        index = bisect.bisect_left(self.tracked, step)
        return index >= len(self.tracked) or self.tracked[index] != step or index % self.keep == 0

    def _list_to(self, step: int) -> None:
        """An open-ended pair: the tracked steps up to ``step`` listed."""
        if self.schedule is not None:
            start = self.tracked[-1] + 1 if self.tracked else 0
            self.tracked.extend(s for s in range(start, step + 1) if self.schedule(s))

    def note(self, step: int, paths: dict, taken: dict) -> None:
        """Before the commit of ``step``: what its commit makes deletable (nothing if it is kept)."""
        if not self.kept(step):
            files = {arm: [str(paths[arm]), list(taken[arm])] for arm in paths}
            write_json(self.path, {"step": step, "files": files})

    def release(self, step: int) -> list[Path]:
        """After the commit of ``step``: delete the files noted for it (if still the ones compared)."""
        pending = self._pending()
        if pending is None or pending.get("step") != step:
            return []
        removed = []
        for path, taken in pending["files"].values():
            if identity(path) == tuple(taken):
                remove_weights(path)  # a file, or an arm's DCP folder
                removed.append(Path(path))
        self.path.unlink(missing_ok=True)
        return removed

    def recover(self, last_stored: int | None) -> list[Path]:
        """At start: finish a deletion whose step the store holds; forget one whose step it does not."""
        pending = self._pending()
        if pending is None:
            return []
        if last_stored is not None and isinstance(pending.get("step"), int) and pending["step"] <= last_stored:
            return self.release(pending["step"])
        self.path.unlink(missing_ok=True)
        return []

    def _pending(self) -> dict | None:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None  # none, or a note cut short: deleting nothing loses nothing
        return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else None
