"""``Planner``: rank 0's part of ``divergence watch``: what to do next, and the step recorded.

Rank 0 alone reads the arms' files and writes: it holds the arms' feeds (and the prefetch of the
next tracked step's files), the metrics store, the spike detectors (``StepRecorder``), the
loggers, the function-space probe, ``watch.json`` (the arms' attempts followed), ``tracking.keep``
(``Retention``) and the progress bar. ``plan`` looks at both arms and returns the ``Task`` of the
turn: a step both arms have written everything of, a wait, done, or a stop with its one line; ``record`` stores a step once every rank has measured it
(``comparator.distributed.measure``). The loop that joins them is ``comparator.follow.Comparator``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from divergence.atomic import read_json
from divergence.comparator.feeds import ArmFeed, Prefetch, unchanged
from divergence.comparator.distributed import Measurement
from divergence.comparator.progress import Progress, arms_line
from divergence.comparator.retention import Retention, files_lost_to
from divergence.comparator.stalls import ENDED, armless, stall
from divergence.errors import CheckpointError, UserInputError
from divergence.pairfolder.arm.lock import WatchLock
from divergence.pairfolder.arm.status import ArmStatus, batch_mismatch, restart_point
from divergence.pairfolder.folder import PairFolder
from divergence.pairfolder.layout import ARMS
from divergence.pairfolder.pair_json import finish_pair
from divergence.pairfolder.schedule import PairSchedule, how_to_start
from divergence.store import MetricsStore
from divergence.tables import write_json
from divergence.tracking.recorder import StepRecorder
from divergence.tracking.records import comparison_records

EXIT_TIMEOUT, EXIT_USAGE = 1, 2
KINDS = ("step", "wait", "done", "stop")


@dataclass
class Task:
    """What rank 0 decided for one turn of ``divergence watch``: ``kind`` is one of ``KINDS``.

    ``Ranks.broadcast`` sends it to every rank, every rank compares its share of the step's two
    weights files from it (``comparator.distributed.measure``), and rank 0 records the step from it
    and the measurement. It holds plain data only (it is pickled to the other ranks).

    ``step``: the step to record ("step"); ``tracked``: its weights are compared; ``losses``:
    ``{arm: loss}`` (None at step 0); ``paths``: ``{arm: weights file}``; ``taken``: each file's
    identity when found complete (``feeds.unchanged``); ``order``: the tensors' order (arm a's
    ``status.json``); ``message``, ``code``: why a "stop" stops and its exit code.
    """

    kind: str
    step: int = -1
    tracked: bool = False
    losses: dict | None = None
    paths: dict = field(default_factory=dict)
    taken: dict = field(default_factory=dict)
    order: list = field(default_factory=list)
    message: str = ""
    code: int = 0


class Planner:
    def __init__(
        self,
        pair_folder: PairFolder,
        pair: PairSchedule,
        device="cpu",
        log: bool = True,
        progress: bool = True,
        probe=None,
        prefetch: bool = True,
    ):
        """Open the arms' feeds, the store (every line read), the spikes, logs, probe and progress of
        the pair in ``pair_folder``, whose schedule is ``pair``; ``probe``: see ``Comparator``."""
        self.pair_folder, self.pair = pair_folder, pair
        self.lock = WatchLock(pair_folder)  # before the store is opened (and repaired) for appending
        try:
            self._open(log, progress, probe, prefetch, device)
        except BaseException:
            self.lock.release()  # now, not when the traceback that holds this object is dropped
            raise

    def _open(self, log: bool, progress: bool, probe, prefetch: bool, device) -> None:
        pair_folder, pair = self.pair_folder, self.pair
        self.planned = pair.max_steps  # the length the writers were told (None: open-ended)
        self.feeds = {arm: ArmFeed(pair_folder.arm(arm)) for arm in ARMS}
        self.prefetch = Prefetch(self.feeds, pair.tracked, pair.max_steps, pair.stride) if prefetch else None
        for feed in self.feeds.values():
            feed.loss_file.check()
        self.store = MetricsStore(pair_folder).open_for_append()
        self.retention = Retention.for_pair(pair_folder, pair)
        self.retention.recover(self.store.last_step())  # a note of a step the store does not hold
        self.recorder = StepRecorder(self.store, pair.tracking.spike_factor, pair.tracking.spike_window)
        self.recorder.replay()
        state = read_json(pair_folder.watch_state, {})
        self.attempts = state.get("attempts", {}) if isinstance(state, dict) else {}
        self.logger = self._logger() if log else None
        enabled = pair.tracking.probe.enabled and probe is not None
        self.probe = probe(pair, device) if enabled else None
        self.progress = Progress(pair, len(self.store.steps())) if progress else None
        self._idle_since, self._looked = time.monotonic(), None
        self._stall_seen: tuple | None = None  # a step that cannot come, seen on the last look
        self._fatal: str | None = None  # a permanent error found while measuring: stop every rank

    # -- what to do next ------------------------------------------------------------------------
    def plan(self, timeout: float | None) -> Task:
        """The next turn's task; a ``UserInputError`` is a "stop" every rank hears of."""
        try:
            return self._next(timeout)
        except UserInputError as err:
            return Task("stop", message=f"error: {err}", code=EXIT_USAGE)

    def _next(self, timeout: float | None) -> Task:
        if self._fatal is not None:
            raise UserInputError(self._fatal)
        statuses = {arm: ArmStatus.read(feed.arm_folder) for arm, feed in self.feeds.items()}
        self._follow_restarts(statuses)
        self._follow_length(statuses)
        # tracking.keep: delete the compared files no restart can need any more (``Retention``)
        self.retention.sweep_to(min(restart_point(status) for status in statuses.values()), self.store.last_step())
        last = self.store.last_step()
        step, task = self.pair.next_step(last), None
        if last is not None and armless(self.pair_folder):
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
            message = f"timed out: no progress for {timeout:g} s at step {step} ({arms_line(statuses)})" + "".join(
                f"; start arm {a}: {how_to_start(self.pair_folder.path, a)}" for a, s in statuses.items() if s is None
            )
            return Task("stop", message=message, code=EXIT_TIMEOUT)
        if task is not None:
            return task
        if self.progress is not None:
            self.progress.waiting(step, statuses)
        return Task("wait")

    def _stalled(self, step: int, statuses: dict) -> str | None:
        """Why ``step`` can never come, once seen on two looks in a row with the same statuses: a
        restarting arm cuts its old files before it writes its new status, so one look may fall
        between the two (``divergence.comparator.stalls``)."""
        why = stall(self.pair_folder, step, self.pair, statuses, self.feeds)
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
            self.prefetch.end_at(length, self.pair.tracked)
        if self.logger is not None:
            self.logger.end_at(length)
        if self.progress is not None:
            self.progress.end_at(length, self.pair.stride)

    def _nothing_to_follow(self, last: int) -> Task:
        """A store without arm folders: complete (done), or a one-process pair's that ended early."""
        end = self.pair.max_steps
        if end is None and self.pair.info.get("finished") or end is not None and last >= end:
            return Task("done")
        return Task(
            "stop",
            code=EXIT_USAGE,
            message=(
                f"{self.pair_folder.path}: no arm folders (a/, b/) to follow, and its store ends at step {last} of "
                f"{end or 'an open-ended run'}: a pair trained in one process or built by divergence track, not arm jobs"
            ),
        )

    def _note_progress(self, last: int | None, statuses: dict) -> None:
        """Restart the ``--timeout`` clock when a step was stored or an arm moved on; a step that
        is retried over and over is no progress."""
        mark = (last, _marks(statuses), tuple(len(feed.loss_file.losses) for feed in self.feeds.values()))
        if mark != self._looked:
            self._looked, self._idle_since = mark, time.monotonic()

    def _ready(self, step: int, statuses: dict) -> Task | None:
        """The task of ``step`` when both arms have written everything it needs, else None."""
        seen = {arm: feed.loss_file.read_new() for arm, feed in self.feeds.items()}
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
                records = self.store.step_records()
                lost = files_lost_to(arm, status, statuses, self.attempts, self.pair_folder, records)
                if lost is not None:  # keep the store as it is: nothing lost
                    raise UserInputError(f"{self.pair_folder.path}: {lost}")
                self.retention.forget_after(status.start_step)
                self.store.truncate_after(status.start_step)
                self.recorder.replay()
                if self.progress is not None:
                    self.progress.restart_at(len(self.store.steps()))
            self.feeds[arm].loss_file.reset()
            self.attempts[arm] = status.attempt
            changed = True
        if changed:
            write_json(self.pair_folder.watch_state, {"attempts": self.attempts})
        mismatch = batch_mismatch(statuses)
        if mismatch is not None:
            raise UserInputError(
                f"{self.pair_folder.path}: the arms train on {mismatch}; their batches differ, so they are not a pair"
            )

    # -- the step recorded ----------------------------------------------------------------------
    def before(self, task: Task) -> None:
        """Before every rank measures ``task``: the next tracked step's files read meanwhile."""
        if task.tracked and self.prefetch is not None:
            self.prefetch.after(task.step)

    def record(self, task: Task, measured: Measurement) -> bool:
        """Store ``task``'s step; False when a file was replaced meanwhile (retried next poll).

        Files that are still the complete ones taken but cannot be compared (a tensor missing
        in one arm, a shape that differs) are a permanent error: the next plan stops every rank.
        """
        if measured.error is not None:
            if not self._files_unchanged(task):
                return False  # an arm replaced or removed a file mid-read
            self._fatal = f"step {task.step}: the arms' checkpoints cannot be compared: {measured.error}"
            return True
        if task.tracked and not self._files_unchanged(task):
            return False  # replaced while it was read: the numbers may mix two files
        comparison = extra = None
        if task.tracked:
            comparison = comparison_records(measured.comparison)
            if self.probe is not None and self.probe.due(task.step):
                try:
                    extra = {**self.probe.record(task.paths), **self._training_drops(task.step)}
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
        )  # the noted files deleted only once the store holds the step
        if self.progress is not None:
            self.progress.stepped(task.step, record)
        return True

    def _training_drops(self, step: int) -> dict:
        """``router_drop_a``, ``router_drop_b`` of ``step`` as each arm recorded them in training (its
        ``losses.jsonl``), where it did: the probe's arms, read from files, never trained here."""
        drops = {arm: feed.loss_file.router_drops.get(step) for arm, feed in self.feeds.items()}
        return {f"router_drop_{arm}": value for arm, value in drops.items() if value is not None}

    def _files_unchanged(self, task: Task) -> bool:
        return all(unchanged(task.paths[arm], task.taken[arm]) for arm in task.paths)

    # -- logs, the end ----------------------------------------------------------------------------
    def _logger(self):
        from divergence.loggers.step_logging import StepLogger

        pair = self.pair
        return StepLogger(
            self.pair_folder,
            pair.log,
            pair.name,
            pair.checkpoint_every,
            pair.max_steps,
            pair.recipe_config or pair.info,
        )

    def finish(self) -> None:
        """The pair complete: ``pair.json`` says so (and an open pair's last step)."""
        finish_pair(self.pair_folder, self.store.last_step(), True)

    def close(self) -> None:
        self.lock.release()
        if self.prefetch is not None:
            self.prefetch.close()
        if self.logger is not None:
            self.logger.close()
        if self.progress is not None:
            self.progress.close()


def _marks(statuses: dict) -> tuple:
    """What changes when an arm moves on: its state, attempt and last step."""
    return tuple((s.state, s.attempt, s.last_step) if s else None for s in statuses.values())
