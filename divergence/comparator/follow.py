"""``divergence watch DIR``: the metrics store of a pair whose arms train as separate jobs.

For each step in order it waits until both arms have written what the lockstep tracker
would have had in memory at that step (both losses; at a tracked step also both complete
weights files), then builds the step's records with ``divergence.tracking.records`` (so the
store equals the lockstep store record for record), appends them and logs them. It stops
when the store holds the last step and both arms report ``finished``.

Restart-safe: the store is append-only with committed step blocks, so a killed comparator
loses at most the step in flight; started again it continues after ``MetricsStore.last_step``
and rebuilds the spike detectors from the stored losses (they saw exactly those). An arm
that restarts from an earlier checkpoint (a new ``attempt`` in its status, ``start_step`` G)
recomputes the steps after G, so the comparator drops its records after G and follows the
new attempt, as the lockstep tracker does on resume. The attempts it has followed are kept
in ``DIR/watch.json``. With ``tracking.keep`` it deletes the weights files of compared and
stored steps (``divergence.comparator.retention``).

Under torchrun, rank 0 plans and writes; every rank measures its share of each checkpoint
pair (``divergence.comparator.distributed``).

A step that can never come (an arm ended before it, or with a gap where it should be; no arm
folders at all) is stated in one line and exit code 2 (``divergence.comparator.stalls``); arms
that are running are waited for. Arms that record every ``tracking.stride``-th step are followed
at those steps. The pair's length is read from the arms at every look, never frozen: where both
arms finished (an open-ended pair, ``ArmWriter`` without ``max_steps``, or an early stop), else
the ``max_steps`` the writers were told; a step before it is taken once an arm has recorded past
it (so it is known not to be the last) or both arms have ended, and an open pair's ``pair.json``
then gets the last step as ``max_steps`` (with ``open_ended``: arms resumed after it train on,
and a later watch follows them). A ``running`` arm whose lock no process holds has died: one line.

It reads only the pair-folder contract (``divergence.pairfolder``: the schedule from ``pair.json``)
and imports nothing from the training package. The function-space probe (``tracking.probe``)
runs on rank 0 at the tracked steps ``probe_due`` picks (as in lockstep) of a pair the built-in
trainer trains (``pair.yaml`` present): both arms' weights files are loaded into two models built
from the pair's recipe and evaluated on the same probe set (the built-in trainer's ``FileProbe``, handed in by ``divergence watch``,
fp32, baseline attention), so
the store gets ``probe_rel_diff, probe_loss_a, probe_loss_b`` equal to the lockstep tracker's.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from divergence.comparator.distributed import compare_files
from divergence.comparator.feeds import ArmFeed, unchanged
from divergence.comparator.prefetch import Prefetch
from divergence.comparator.ranks import Ranks
from divergence.comparator.retention import Retention, files_lost_to
from divergence.comparator.stalls import ENDED, armless, stall
from divergence.errors import CheckpointError, UserInputError
from divergence.pairfolder.folder import PairFolder
from divergence.pairfolder.layout import ARMS
from divergence.pairfolder.pair_json import finish_pair
from divergence.pairfolder.schedule import PairSchedule, read_schedule
from divergence.pairfolder.starting import how_to_start
from divergence.store import MetricsStore
from divergence.pairfolder.arm.status import batch_mismatch, restart_point
from divergence.tracking.recorder import StepRecorder
from divergence.tracking.records import comparison_records

EXIT_TIMEOUT, EXIT_USAGE = 1, 2


@dataclass
class Task:
    """Rank 0's decision for one turn of the loop, sent to every rank."""

    kind: str  # "step", "wait", "done" or "stop"
    step: int = -1
    tracked: bool = False
    losses: dict | None = None
    paths: dict = field(default_factory=dict)
    taken: dict = field(default_factory=dict)  # identity of each path when found complete (feeds.unchanged)
    order: list = field(default_factory=list)
    message: str = ""
    code: int = 0  # exit code of a "stop"


class Comparator:
    def __init__(
        self,
        out: str | Path,
        ranks: Ranks | None = None,
        device="cpu",
        log: bool = True,
        progress: bool = True,
        probe=None,
        prefetch: bool = True,
    ):
        """``probe``: the function-space probe's factory ``(PairSchedule, device) -> probe`` (``due(step)``,
        ``record(paths)``), used when the pair's ``tracking.probe`` is enabled; ``divergence watch``
        passes the built-in trainer's ``FileProbe`` (``training.probe_files``). None: no probe."""
        self.folder, self.ranks, self.device = PairFolder(out), ranks or Ranks(), device
        self.out = self.folder.path
        self._prefetch_wanted = prefetch
        self._probe_factory = probe
        self.pair = read_schedule(self.folder)
        self.planned = self.pair.max_steps  # the length the writers were told (None: open-ended)
        failed = None
        if self.ranks.is_zero:  # the other ranks only measure
            try:
                self._open(log, progress)
            except UserInputError as err:
                failed = str(err)
        failed = self.ranks.broadcast(failed)  # every rank stops, not only rank 0
        if failed is not None:
            raise UserInputError(failed)

    def _open(self, log: bool, progress: bool) -> None:
        """Rank 0's part: the arms' feeds, the store (every line read), spikes, logs, progress."""
        self.feeds = {arm: ArmFeed(self.folder.arm(arm)) for arm in ARMS}
        pair = self.pair
        self.prefetch = (
            Prefetch(self.feeds, pair.tracked, pair.max_steps, pair.stride) if self._prefetch_wanted else None
        )
        for feed in self.feeds.values():
            feed.loss_file.check()
        self.store = MetricsStore(self.folder).open_for_append()
        self.retention = Retention.for_pair(self.folder, self.pair)
        self.retention.recover(self.store.last_step())  # a note of a step the store does not hold
        tracking = self.pair.tracking
        self.recorder = StepRecorder(self.store, tracking.spike_factor, tracking.spike_window)
        self.recorder.replay()
        self.attempts = self._read_state()
        self.logger = self._logger() if log else None
        enabled = self.pair.tracking.probe.enabled and self._probe_factory is not None
        self.probe = self._probe_factory(self.pair, self.device) if enabled else None
        self.bar = _progress_bar(self.pair, len(self.store.steps())) if progress else None
        self._idle_since, self._progress = time.monotonic(), None
        self._stall_seen: tuple | None = None  # a step that cannot come, seen on the last look
        self._fatal: str | None = None  # a permanent error found while measuring: stop every rank

    def run(self, poll: float = 5.0, timeout: float | None = None) -> int:
        """Follow the arms until the pair is complete; 0 when done, 2 on bad input (an unmatchable
        checkpoint pair, an unreadable file), 1 after ``timeout`` seconds without progress (a
        stored step, new losses, an arm's status changing), whatever else happens."""
        try:
            while True:
                task = self.ranks.broadcast(self._plan(timeout) if self.ranks.is_zero else None)
                if task.kind == "done":
                    self._finish()
                    return 0
                if task.kind == "stop":
                    if self.ranks.is_zero:
                        print(f"divergence watch: {task.message}", file=sys.stderr)
                    return task.code
                if task.kind == "wait" or not self._take(task):
                    time.sleep(poll)
        finally:
            self._close()

    # -- rank 0: what to do next --------------------------------------------------------------
    def _plan(self, timeout: float | None) -> Task:
        try:
            return self._next(timeout)
        except UserInputError as err:  # every rank must hear of it, not only rank 0
            return Task("stop", message=f"error: {err}", code=EXIT_USAGE)

    def _next(self, timeout: float | None) -> Task:
        if self._fatal is not None:
            raise UserInputError(self._fatal)
        statuses = {arm: feed.status() for arm, feed in self.feeds.items()}
        self._follow_restarts(statuses)
        self._follow_length(statuses)
        self._follow_checkpoints(statuses)
        last = self.store.last_step()
        step, task = self.pair.next_step(last), None
        if last is not None and armless(self.out):
            return self._nothing_to_follow(last)
        if self.pair.max_steps is not None and step > self.pair.max_steps:
            if all(s is not None and s.state in ENDED for s in statuses.values()):
                return Task("done")
        else:
            task = self._ready(step, statuses)
            why = self._stalled(step, statuses) if task is None else None
            if why is not None:
                return Task("stop", message=why, code=EXIT_USAGE)
        self._note_progress(last, statuses)
        if timeout is not None and time.monotonic() - self._idle_since > timeout:
            return Task(
                "stop",
                message=f"timed out: no progress for {timeout:g} s at step {step} ({_arms_line(statuses)})"
                + "".join(f"; start arm {a}: {how_to_start(self.out, a)}" for a, s in statuses.items() if s is None),
                code=EXIT_TIMEOUT,
            )
        if task is not None:
            return task
        self._show_waiting(step, statuses)
        return Task("wait")

    def _stalled(self, step: int, statuses: dict) -> str | None:
        """Why ``step`` can never come, once seen on two looks in a row with the same statuses: a
        restarting arm cuts its old files before it writes its new status, so one look may fall
        between the two (``divergence.comparator.stalls``)."""
        why = stall(self.out, step, self.pair, statuses, self.feeds)
        seen = None if why is None else (step, why, _marks(statuses))
        confirmed, self._stall_seen = seen is not None and seen == self._stall_seen, seen
        return why if confirmed else None

    def _follow_length(self, statuses: dict) -> None:
        """The pair's length, read again at every look, never frozen: where both arms finished (an
        open-ended pair's end, or an early stop), else the length the writers were told (None:
        open-ended, still running). An arm that finished before the later one is then a stall, said
        as for any pair; an arm that failed ends nothing; an arm that restarts after both finished
        (an open pair trained on) makes the length unknown again."""
        ends = [s.last_step for s in statuses.values() if s is not None and s.state == "finished"]
        both = len(ends) == len(ARMS) and all(end is not None for end in ends)
        length = max(ends) if both else self.planned
        if length == self.pair.max_steps:
            return
        self.pair = replace(self.pair, max_steps=length)
        self.retention.end_at(length)
        if self.prefetch is not None:
            self.prefetch.max_steps, self.prefetch.tracked = length, self.pair.tracked
        if self.logger is not None:
            self.logger.max_steps = length
        if self.bar is not None:
            self.bar.total = None if length is None else length // self.pair.stride + 1
            self.bar.refresh()

    def _nothing_to_follow(self, last: int) -> Task:
        """A store without arm folders: complete (done), or a one-process pair's that ended early."""
        end = self.pair.max_steps
        if end is None and self.pair.info.get("finished") or end is not None and last >= end:
            return Task("done")
        return Task(
            "stop",
            code=EXIT_USAGE,
            message=(
                f"{self.out}: no arm folders (a/, b/) to follow, and its store ends at step {last} of "
                f"{end or 'an open-ended run'}: a pair trained in one process or built by divergence track, not arm jobs"
            ),
        )

    def _note_progress(self, last: int | None, statuses: dict) -> None:
        """Restart the ``--timeout`` clock when a step was stored or an arm moved on; a step that
        is retried over and over is no progress."""
        mark = (last, _marks(statuses), tuple(len(feed.loss_file.losses) for feed in self.feeds.values()))
        if mark != self._progress:
            self._progress, self._idle_since = mark, time.monotonic()

    def _ready(self, step: int, statuses: dict) -> Task | None:
        """The task of ``step`` when both arms have written everything it needs, else None."""
        seen = {arm: feed.losses() for arm, feed in self.feeds.items()}
        if step > 0 and any(step not in seen[arm] for arm in ARMS):
            return None
        if self._may_be_last(step, seen, statuses):
            return None
        losses = {arm: seen[arm][step] for arm in ARMS} if step > 0 else None
        tracked = self.pair.tracked(step)
        found = {}
        if tracked:
            found = {
                arm: self.prefetch.checkpoint(arm, step) if self.prefetch else feed.checkpoint(step)
                for arm, feed in self.feeds.items()
            }
            if any(f is None for f in found.values()):
                return None
        order = statuses["a"].tensor_order if statuses.get("a") else []
        return Task(
            "step",
            step,
            tracked,
            losses,
            paths={arm: str(path) for arm, (path, _) in found.items()},
            taken={arm: taken for arm, (_, taken) in found.items()},
            order=order,
        )

    def _may_be_last(self, step: int, seen: dict, statuses: dict) -> bool:
        """A ``step`` before ``max_steps`` (or of an open-ended pair) may be the pair's last, a compared
        one (arms that stop early finish there), until an arm has recorded past it or both have ended."""
        if self.pair.max_steps is not None and step >= self.pair.max_steps:
            return False
        ended = all(s is not None and s.state in ENDED for s in statuses.values())
        return not ended and not any(step + self.pair.stride in seen[arm] for arm in ARMS)

    def _follow_restarts(self, statuses: dict) -> None:
        """An arm restarted from step G: drop stored steps after G (they are recomputed)."""
        changed = False
        for arm, status in statuses.items():
            if status is None or self.attempts.get(arm) == status.attempt:
                continue
            last = self.store.last_step()
            if arm in self.attempts and last is not None and status.start_step < last:
                lost = files_lost_to(arm, status, statuses, self.attempts, self.folder, self.store.step_records())
                if lost is not None:  # keep the store as it is: nothing lost
                    raise UserInputError(f"{self.out}: {lost}")
                self.retention.forget_after(status.start_step)
                self.store.truncate_after(status.start_step)
                self.recorder.replay()
                if self.bar is not None:
                    self.bar.n = len(self.store.steps())
            self.feeds[arm].loss_file.reset()
            self.attempts[arm] = status.attempt
            changed = True
        if changed:
            self._write_state()
        mismatch = batch_mismatch(statuses)
        if mismatch is not None:
            raise UserInputError(
                f"{self.out}: the arms train on {mismatch}; their batches differ, so they are not a pair"
            )

    def _follow_checkpoints(self, statuses: dict) -> None:
        """``tracking.keep``: delete the compared files no restart can need any more (``Retention``)."""
        horizon = min(restart_point(status) for status in statuses.values())
        if horizon != self.retention.horizon:
            self.retention.horizon = horizon
            self.retention.sweep(self.store.last_step())

    # -- every rank: measure; rank 0: record -----------------------------------------------------
    def _take(self, task: Task) -> bool:
        """Record ``task``'s step; False when a file was replaced meanwhile (retried next poll).

        Files that are still the complete ones taken but cannot be compared (a tensor missing
        in one arm, a shape that differs) are a permanent error: the next plan stops every rank.
        """
        result = None
        if task.tracked and self.ranks.is_zero and self.prefetch is not None:
            self.prefetch.after(task.step)  # the next tracked step's files read during this comparison
        if task.tracked:
            try:
                result = compare_files(task.paths["a"], task.paths["b"], self.ranks, self.device, task.order)
            except CheckpointError as err:  # rank 0 only
                if not self._files_unchanged(task):
                    return False  # an arm replaced or removed a file mid-read
                self._fatal = f"step {task.step}: the arms' checkpoints cannot be compared: {err}"
                return True
        if not self.ranks.is_zero:
            return True
        if task.tracked and not self._files_unchanged(task):
            return False  # replaced while it was read: the numbers may mix two files
        comparison = extra = None
        if task.tracked:
            comparison = comparison_records(result)
            if self.probe is not None and self.probe.due(task.step):
                try:
                    extra = self.probe.record(task.paths)
                except CheckpointError:
                    return False  # an arm replaced a file mid-read: retried next poll
            # tracking.keep: what this step's commit makes deletable, noted first
            self.retention.note(task.step, task.paths, task.taken)
        record = self.recorder.losses(task.losses)  # the spike detectors see a step once: when it is committed
        self.recorder.commit(
            task.step,
            record,
            comparison,
            extra,
            log=self.logger.log if self.logger else None,
            stored=self.retention.release,
        )  # released only once the store holds the step
        self._show_step(task.step, record)
        return True

    def _files_unchanged(self, task: Task) -> bool:
        return all(unchanged(task.paths[arm], task.taken[arm]) for arm in task.paths)

    # -- rank 0: state, logs, progress -------------------------------------------------------------
    def _read_state(self) -> dict:
        try:
            return json.loads(self.folder.watch_state.read_text())["attempts"]
        except (OSError, ValueError, KeyError):
            return {}

    def _write_state(self) -> None:
        from divergence.tables import write_json

        write_json(self.folder.watch_state, {"attempts": self.attempts})

    def _logger(self):
        from divergence.loggers.step_logger import StepLogger

        pair = self.pair
        return StepLogger(
            self.folder, pair.log, pair.name, pair.checkpoint_every, pair.max_steps, pair.recipe_config or pair.info
        )

    def _finish(self) -> None:
        if not self.ranks.is_zero:
            return
        finish_pair(self.folder, self.store.last_step(), True)

    def _close(self) -> None:
        if self.ranks.is_zero:
            if self.prefetch is not None:
                self.prefetch.close()
            if self.logger is not None:
                self.logger.close()
            if self.bar is not None:
                self.bar.close()

    def _show_step(self, step: int, record: dict) -> None:
        if self.bar is None:
            return
        self.bar.update(1)
        if record["tracked"]:
            self.bar.set_postfix_str(
                f"step {step}: wasserstein {record['wasserstein']:.4g}, max_abs_diff {record['max_abs_diff']:.4g}",
                refresh=False,
            )

    def _show_waiting(self, step: int, statuses: dict) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"waiting for step {step} ({_arms_line(statuses)})")


def _progress_bar(pair: PairSchedule, done: int):
    from tqdm import tqdm

    return tqdm(
        total=None if pair.open_ended else pair.max_steps // pair.stride + 1,
        initial=done,
        desc=f"watch {pair.name}",
        unit="step",
        file=sys.stderr,
        dynamic_ncols=True,
    )


def _marks(statuses: dict) -> tuple:
    """What changes when an arm moves on: its state, attempt and last step."""
    return tuple((s.state, s.attempt, s.last_step) if s else None for s in statuses.values())


def _arms_line(statuses: dict) -> str:
    parts = []
    for arm, s in statuses.items():
        parts.append(
            f"{arm}: not started"
            if s is None
            else f"{arm}: {s.state}"
            + (f" at {s.last_step}" if s.last_step is not None else "")
            + (f", attempt {s.attempt}" if s.attempt > 1 else "")
        )
    return "; ".join(parts)
