"""``tracking.keep``: bounded disk for separate arm jobs, whose tracked weights are full fp32 files.

Each arm writes its weights at every tracked step (about 3.9 GB a file for an SD-1.5-sized
recipe), which the comparator needs only until it has compared them. With ``tracking.keep: k``
the comparator deletes both arms' files of a tracked step once the step is compared AND
committed to the store, keeping the files of every k-th tracked step (the 0th, k-th, 2k-th, ...
in the tracked schedule, ``divergence.pairfolder.settings.is_tracked``) and of the last step.
An open-ended pair (``max_steps`` null: writers not told their length) has its last step known
only when both arms finish; the comparator holds each step back until an arm is past it (or
both have finished), so a step it deletes is never the last.

Never a file a restarted arm could need: an arm that restarts from its checkpoint of step G
recomputes the steps after G, and the comparator compares them again, with the OTHER arm's
files of those steps. So the files of a step are deleted only once the step is no later than
both arms' restart points (``divergence.pairfolder.arm.status.restart_point``: an arm's newest
resumable checkpoint, which its writer reports in ``status.json``, or its last step once
finished); until then they wait in the note (``horizon``). An arm restarted from a checkpoint
older than the one it reported may still find a file gone: the comparator then refuses that
restart in one line and keeps its store (``Planner._follow_restarts``).

Never before the commit, and nothing but the file compared: before committing the step, the
comparator adds what it will delete (paths and file identities: inode, size, mtime) to
``DIR/retention.json``, durably; after the commit (and at each look, as the arms' checkpoints
move on) it deletes each noted file of a step at or before the horizon that is still identical
to the one compared (an arm that restarted and rewrote it keeps its new file), then drops it
from the note. A comparator killed anywhere in between loses nothing: started again, it keeps
the noted steps the store holds and drops the ones it does not (they are compared again, and
noted again).

Nothing but an arm's weights of the noted step: every entry of the note must name arm ``a`` or
``b``'s ``checkpoints/step_NNNNNN.safetensors`` or ``step_NNNNNN.dcp`` of the entry's own step
(the names the writers make), in this pair folder; an entry naming anything else (a file or
folder outside the pair, an arm's losses, another step's weights) was not written by the
comparator, and the note is refused in one line naming it (exit 2) before anything is deleted.
"""

from __future__ import annotations

import bisect
import json
import os
from pathlib import Path

from divergence.atomic import read_json
from divergence.errors import UserInputError
from divergence.pairfolder.layout import ARMS, CHECKPOINTS_DIR, weights_dcp_name, weights_name
from divergence.tables import write_json
from divergence.pairfolder.folder import as_pair_folder
from divergence.pairfolder.arm.weights_dcp import remove_weights
from divergence.pairfolder.arm.weights_file import identity


class Retention:
    def __init__(self, out: str | Path, keep: int | None, tracked_steps: list[int], schedule=None):
        """``tracked_steps``: every tracked step of the pair, increasing (the last is kept). An
        open-ended pair's: ``schedule`` (``step -> tracked``) lists them as far as asked, and the
        last is set by ``end_at`` once known."""
        self.folder = as_pair_folder(out)
        self.path, self.keep, self.tracked = self.folder.retention, keep or 0, list(tracked_steps)
        self.schedule = schedule
        self.planned_last = None if schedule is not None else (self.tracked[-1] if self.tracked else -1)
        self.last = self.planned_last
        self.horizon = -1  # the latest step no restart of either arm recomputes (``sweep_to``)

    @classmethod
    def for_pair(cls, out: str | Path, pair) -> Retention:
        """``pair``: a ``PairSchedule`` (its tracking config, ``max_steps`` and schedule)."""
        keep = pair.tracking.keep or 0
        if pair.max_steps is None:
            return cls(out, keep, [], schedule=pair.tracked)
        steps = [s for s in range(pair.max_steps + 1) if pair.tracked(s)] if keep else []
        return cls(out, keep, steps)

    def end_at(self, last: int | None) -> None:
        """The pair's last step, once both arms have finished there (its files are kept); None: the
        planned one again (an arm restarted)."""
        self.last = self.planned_last if last is None else last

    def kept(self, step: int) -> bool:
        """The files of ``step`` stay: keep-all, the last tracked step, or every keep-th tracked step."""
        if not self.keep or (self.last is not None and step >= self.last):
            return True
        if self.schedule is not None:  # an open-ended pair: the tracked steps up to ``step`` listed
            start = self.tracked[-1] + 1 if self.tracked else 0
            self.tracked.extend(s for s in range(start, step + 1) if self.schedule(s))
        index = bisect.bisect_left(self.tracked, step)
        return index >= len(self.tracked) or self.tracked[index] != step or index % self.keep == 0

    def note(self, step: int, paths: dict, taken: dict) -> None:
        """Before the commit of ``step``: what its commit makes deletable (nothing if it is kept)."""
        if not self.kept(step):
            files = {arm: [str(Path(paths[arm]).absolute()), list(taken[arm])] for arm in paths}
            self._write([e for e in self._pending() if e["step"] != step] + [{"step": step, "files": files}])

    def release(self, step: int) -> list[Path]:
        """After the commit of ``step``: delete the noted files that are due (``sweep``)."""
        return self.sweep(step)

    def sweep_to(self, horizon: int, stored: int | None) -> list[Path]:
        """The latest step no restart of either arm recomputes is now ``horizon`` (the arms'
        ``restart_point``): when it moved, delete what became due (``sweep``)."""
        if horizon == self.horizon:
            return []
        self.horizon = horizon
        return self.sweep(stored)

    def sweep(self, stored: int | None) -> list[Path]:
        """Delete the noted files of the steps the store holds (``stored``: its last step) that no
        restart recomputes (at or before ``horizon``), if still the files compared."""
        pending = self._pending()
        due = [e for e in pending if stored is not None and e["step"] <= min(stored, self.horizon)]
        if not due:
            return []
        removed = []
        for entry in due:
            for path, taken in entry["files"].values():
                if identity(path) == tuple(taken):
                    remove_weights(path)  # a file, or an arm's DCP folder
                    removed.append(Path(path))
        self._write([e for e in pending if e not in due])
        return removed

    def forget_after(self, step: int | None) -> None:
        """Drop the notes of the steps after ``step`` (None: all): not in the store (a kill between
        note and commit), or dropped from it (an arm restarted): they are compared, and noted, again."""
        pending = self._pending()
        kept = [e for e in pending if step is not None and e["step"] <= step]
        if len(kept) != len(pending):
            self._write(kept)

    def recover(self, last_stored: int | None) -> None:
        """At start: keep the notes of the steps the store holds, for ``sweep``; forget the others, and
        the ones whose files were all rewritten or removed since (nothing of them will be deleted).
        Deletes nothing itself (the arms' restart points are not known yet)."""
        self.forget_after(last_stored)
        pending = self._pending()
        live = [e for e in pending if any(identity(p) == tuple(t) for p, t in e["files"].values())]
        if len(live) != len(pending):
            self._write(live)

    def _write(self, pending: list[dict]) -> None:
        if pending:
            write_json(self.path, {"pending": pending})
        else:
            self.path.unlink(missing_ok=True)

    def _pending(self) -> list[dict]:
        """The noted steps, ``[{"step": S, "files": {arm: [path, identity]}}]`` (a note of an earlier
        version, one step's ``{"step", "files"}``, read as one)."""
        data = read_json(self.path)  # none, or a note cut short: deleting nothing loses nothing
        entries = data.get("pending", [data]) if isinstance(data, dict) else []
        pending = [
            e
            for e in entries
            if isinstance(e, dict) and isinstance(e.get("step"), int) and isinstance(e.get("files"), dict)
        ]
        for entry in pending:
            self._check(entry)
        return pending

    def _check(self, entry: dict) -> None:
        """Refuse (one line) an entry naming anything but an arm's weights of the entry's step."""
        step = entry["step"]
        for arm, noted in entry["files"].items():
            ok = arm in ARMS and isinstance(noted, list) and len(noted) == 2 and isinstance(noted[0], str)
            ok = ok and isinstance(noted[1], list) and all(type(v) is int for v in noted[1])
            if ok and self._weights_of(arm, Path(noted[0]), step):
                continue
            shown = json.dumps(entry)
            shown = shown if len(shown) <= 300 else shown[:300] + "..."
            raise UserInputError(
                f"{self.path}: its entry of step {step} names {str(noted)[:200]} for arm {str(arm)[:20]!r}, which is "
                f"not that arm's {CHECKPOINTS_DIR}/{weights_name(step)} or {weights_dcp_name(step)} in {self.folder} "
                f"(the only files watch deletes); nothing was deleted. Remove the entry, or the file, then run watch "
                f"again. The entry: {shown}"
            )

    def _weights_of(self, arm: str, path: Path, step: int) -> bool:
        """``path`` is arm ``arm``'s weights file or DCP folder of ``step`` in this pair folder."""
        if path.name not in (weights_name(step), weights_dcp_name(step)) or step < 0:
            return False
        return os.path.realpath(path.parent) == os.path.realpath(self.folder.arm(arm).checkpoints_dir)


def files_lost_to(arm: str, status, statuses: dict, followed: dict, folder, records: list[dict]) -> str | None:
    """Why the restart of arm ``arm`` (its ``status``: from step G) cannot be followed, in one line;
    None when it can. The steps after G are compared again with the other arm's weights files of
    them; one deleted (the arm restarted from a checkpoint older than the one it reported) cannot be.

    ``statuses``: every arm's status; ``followed``: the attempt of each arm the comparator followed;
    ``folder``: the ``PairFolder``; ``records``: the store's step records.
    """
    start = status.start_step
    for other, seen in statuses.items():
        if other == arm or seen is None:
            continue
        if followed.get(other) != seen.attempt and seen.start_step <= start:
            continue  # restarted too, from G or earlier: it writes those files again
        gone = [
            r["step"]
            for r in records
            if r["step"] > start and r.get("tracked") and not folder.arm(other).saved_weights(r["step"]).exists()
        ]
        if gone:
            return (
                f"arm {arm} restarted from step {start}, but arm {other}'s weights files of the compared steps "
                f"{', '.join(map(str, gone))} after it are gone (tracking.keep deletes them once both arms' "
                "checkpoints are past them), so those steps cannot be compared again; the store keeps them. "
                f"Restart arm {arm} from a checkpoint of step {max(gone)} or later, or arm {other} too, from step "
                f"{start} or earlier"
            )
    return None
