"""The one tracker of a pair whose two arms live in one process: ``DIR/metrics.jsonl`` written step by step.

Its clients: the built-in trainer (``divergence train`` of a pair, the study, the atlas) and
``divergence.lightning``'s ``LockstepPair`` drive it from a Trainer's hooks through one callback
(``divergence.lightning.tracker.DivergenceTracker``); ``divergence.Pair`` (``writers.pair``) drives
it from a plain PyTorch loop. It needs no Trainer: the ranks it runs on are an object with
``is_zero`` and ``broadcast(obj)`` (rank zero's ``obj`` on every rank; ``ALONE`` for one
process), and the loggers a list of Lightning loggers (none outside Lightning).

At every step it records both arms' losses (and flags spikes, on every rank from the losses
averaged over ranks, so the detectors stay identical everywhere); at every tracked step
(``divergence.pairfolder.settings.is_tracked``: step 0, the dense early schedule, every
``tracking.every`` steps, checkpoint steps and the last step) it compares the arms' weights tensor
by tensor (``divergence.tracking.records``, the functions ``divergence watch`` uses, so its store
holds the records ``watch`` builds from the same two arms trained as separate jobs), adds the
``probe``'s keys at the tracked steps ``probe_due`` picks and ``extras(step)``'s at any step, and
commits the step (``recorder.StepRecorder``) to the store and to the loggers, under the keys of
``divergence.loggers.step_logging`` (``divergence/model/<metric>``, ``train/loss_a``, ...).

The folder. Given ``pair`` (``pair.json``'s fields), the tracker owns the folder: rank zero holds
its ``PairLock`` from ``start`` to ``finish`` (or ``release``), so a second writer is refused naming
the holder's pid; a folder whose ``pair.json`` names another pair (a given ``name``, ``category``,
``arms`` or ``replicate`` differs) is refused, and so is a fresh run (step 0) into a folder whose
store holds steps, unless ``resume`` says to train the pair again from step 0 (its stored steps
are then replaced); ``pair.json`` is written at ``start`` and finished at ``finish``. Given no
``pair`` (the built-in trainer), the caller has checked the folder, holds its lock and writes
``pair.json`` itself.

Resume: a run started again at step G > 0 continues the pair: the stored steps after G are dropped
and computed again (bitwise the same on CPU); the spike detectors' state comes back with the
checkpoint (``state_dict``). A non-finite loss is recorded; the client then calls ``stop_if_diverged``
once every record of the step is written.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Sequence

from divergence.errors import UserInputError
from divergence.loggers.step_logging import is_table_step, log_step
from divergence.pairfolder.arm.lock import PairLock
from divergence.pairfolder.arm.steps import check_tensor_names
from divergence.pairfolder.folder import as_pair_folder
from divergence.pairfolder.pair_json import IDENTITY, check_same_pair, finish_pair, read_pair_json
from divergence.pairfolder.pair_json import schedule_config, tracking_schedule, write_pair_files
from divergence.pairfolder.settings import TrackingConfig, is_tracked, probe_due
from divergence.store import MetricsStore
from divergence.tracking.recorder import StepRecorder, diverged, first_nonfinite
from divergence.tracking.records import divergence_records


ALONE = SimpleNamespace(is_zero=True, broadcast=lambda obj: obj)  # one process: rank zero of one
ADVICE = "lower the learning rate or clip the gradients"  # what a user's loop changes after a non-finite loss


class PairTracker:
    """``out``'s store, written at each step ``record`` is given, on ``tracking``'s schedule.

    ``pair``: ``pair.json``'s fields when the tracker owns the folder, None when the caller does;
    ``checkpoint_every``: checkpoint steps are tracked too; ``probe() -> {key: float}``: keys for the
    tracked steps ``probe_due`` picks; ``extras(step) -> {key: value}``: keys for any step's record
    (both rank zero); ``restart_advice``: how the pair's writer continues a pair or trains it again
    from step 0 (said when a fresh run into a folder holding steps is refused)."""

    def __init__(
        self,
        out: str | Path,
        tracking: TrackingConfig,
        pair: dict | None = None,
        *,
        checkpoint_every: int = 0,
        resume: bool = False,
        restart_advice: str = "",
        probe: Callable[[], dict] | None = None,
        extras: Callable[[int], dict] | None = None,
    ):
        self.pair_folder, self.tracking, self.pair = as_pair_folder(out), tracking, pair
        self.out = self.pair_folder.path
        self.checkpoint_every, self.resume, self.restart_advice = checkpoint_every, resume, restart_advice
        self.probe, self.extras = probe, extras
        self.device = None if tracking.device == "auto" else tracking.device
        self.recorder = StepRecorder(None, tracking.spike_factor, tracking.spike_window)
        self.max_steps = 0
        self.names: list[str] | None = None  # the tensors of the first tracked step compared here
        self.lock: PairLock | None = None  # rank zero's, while it trains (when the tracker owns the folder)
        self.ranks, self.loggers = ALONE, ()  # set by ``start``

    @classmethod
    def of_pair(cls, out: str | Path, every: int, pair: dict, **options) -> "PairTracker":
        """The tracker of a pair a user's code writes: ``every`` and ``pair``'s ``spike_factor``,
        ``spike_window`` and ``dense`` checked as ``pair.json``'s ``tracking`` is (one line each)."""
        schedule = tracking_schedule(
            every, **{k: pair[k] for k in ("spike_factor", "spike_window", "dense") if k in pair}
        )
        spikes = {k: schedule[k] for k in ("spike_factor", "spike_window")}
        return cls(out, replace(schedule_config(schedule), **spikes), pair, **options)

    def tracked(self, step: int) -> bool:
        return is_tracked(step, self.max_steps, self.tracking, self.checkpoint_every)

    def start(self, step: int, max_steps: int, weights: Callable, ranks=ALONE, loggers: Sequence = ()) -> None:
        """Check the folder and write ``pair.json`` (given ``pair``), open the store, drop the steps after
        ``step`` (a resumed run's; all of them at step 0); record step 0 into a fresh store. ``ranks``:
        ``is_zero``, ``broadcast``; ``loggers``: where each committed step is logged besides the store."""
        self.max_steps, self.ranks, self.loggers = max_steps, ranks, loggers
        self._on_zero(lambda: self._open(step))
        store = self.recorder.store
        fresh = ranks.broadcast(store is None or store.last_step() is None)
        if step == 0 and fresh:
            self.record(0, None, weights)  # the initial weights (a seed pair differs here already, a control not)

    def _open(self, step: int) -> None:
        """Rank 0: take the folder's lock, refuse another pair's folder or a re-run over stored steps; then
        write and cut."""
        self.release()
        if self.pair is not None:
            self.lock = PairLock(self.pair_folder)  # one writer of a pair folder: a second one is refused
        try:
            store = MetricsStore(self.pair_folder)
            if self.pair is not None:
                self._check_and_write(step, store)
            self.recorder.store = store.open_for_append()
            self.recorder.store.truncate_after(step if step > 0 else -1)  # from step 0: every step again
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Drop the folder's lock (at the end of training, or when it fails)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def _check_and_write(self, step: int, store: MetricsStore) -> None:
        saved = read_pair_json(self.pair_folder) if self.pair_folder.pair_json.is_file() else None
        if saved is not None:
            check_same_pair(self.out, saved, self.pair)
        last = store.last_step() if store.exists() else None  # every line read: an unreadable one is an error
        if last is not None and step == 0 and not self.resume:
            raise UserInputError(
                f"{self.out}: already holds pair {(saved or {}).get('name')!r} with steps 0 to {last} stored; a new "
                f"run would cut them. {self.restart_advice}; or choose a new out folder"
            )
        kept = {k: saved[k] for k in (*IDENTITY, "description", "log") if k in saved} if saved else {}
        write_pair_files(self.pair_folder, max_steps=self.max_steps, every=self.tracking.every, **{**kept, **self.pair})

    def record(self, step: int, losses: dict | None, weights: Callable) -> None:
        """One step's records; ``losses`` already reduced over ranks; ``weights()`` (the two arms'
        ``{name: tensor}``, None off rank zero) may be collective: every rank calls it at a tracked step."""
        record = self.recorder.losses(losses)  # every rank: the detectors stay identical
        tracked = self.tracked(step)
        pair_weights = weights() if tracked else None
        self._check_names(step, pair_weights)
        if not self.ranks.is_zero:
            return  # rank zero compares, writes and logs
        comparison = extra = None
        if tracked:
            comparison = divergence_records(*pair_weights, self.device)
            if self.probe is not None and probe_due(step, self.max_steps, self.tracking.probe):
                extra = self.probe()
        if self.extras is not None:
            extra = {**(extra or {}), **self.extras(step)}
        table = is_table_step(step, self.max_steps, self.checkpoint_every)
        log = lambda s, r, t: log_step(self.loggers, s, r, t, table=table)  # noqa: E731
        self.recorder.commit(step, record, comparison, extra, log=log)

    def stop_if_diverged(self, step: int, losses: dict | None, advice: str = ADVICE) -> None:
        """Stop the run when an arm's loss is NaN or infinite (the same on every rank: a clean stop everywhere)."""
        arm = first_nonfinite(losses)
        if arm is not None:
            raise diverged(f"arm {arm}", losses[arm], step, f" in {self.out}", advice)

    def _check_names(self, step: int, pair_weights) -> None:
        """The tracked steps compare the tensors of the first one (every rank hears of a change)."""
        if self.tracked(step):
            self.names = self.names or (list(pair_weights[0]) if self.ranks.is_zero else None)
            self._on_zero(lambda: check_tensor_names(list(pair_weights[0]), self.names, step, str(self.out)))

    def _on_zero(self, check: Callable[[], None]) -> None:
        """``check()`` on rank zero; its ``UserInputError`` raised on every rank (every rank stops, not rank 0 alone)."""
        error = None
        if self.ranks.is_zero:
            try:
                check()
            except UserInputError as err:
                error = str(err)
        error = self.ranks.broadcast(error)
        if error is not None:
            raise UserInputError(error)

    def finish(self) -> None:
        """Rank zero, given ``pair``: ``pair.json`` says the last stored step and whether the pair is complete;
        the lock is dropped."""
        try:
            if self.pair is None or not self.ranks.is_zero or self.recorder.store is None:
                return
            last = self.recorder.store.last_step()
            finish_pair(self.pair_folder, last, last is not None and last >= self.max_steps)
        finally:
            self.release()

    def state_dict(self) -> dict:
        return self.recorder.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.recorder.load_state_dict(state)
