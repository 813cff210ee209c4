"""The metrics store of a pair trained in one process: ``DIR/pair.json`` and ``DIR/metrics.jsonl``.

The one tracker of a pair whose two arms live in one process: ``divergence.lightning``'s
``LockstepPair`` drives it from its Trainer hooks, ``divergence.Pair`` (``writers.pair``) from a
plain PyTorch loop. It needs no Trainer: the ranks it runs on are an object with ``is_zero`` and
``broadcast(obj)`` (rank zero's ``obj`` on every rank; ``ALONE`` for one process), and the loggers
a list of Lightning loggers (none outside Lightning).

Records are built with ``divergence.tracking.records`` (the functions ``divergence watch`` uses),
so its store has the same records as the store ``watch`` builds from the same two arms trained
as separate jobs. The same numbers go to the loggers under the keys of
``divergence.loggers.step_logging``: ``divergence/model/<metric>``, ``divergence/kind/<kind>/<metric>``,
``divergence/wasserstein/<module>``, ``train/loss_a``, ``train/loss_b``, ...

One process writes the folder at a time: rank zero holds its ``PairLock``
(``divergence.pairfolder.arm.lock``) from ``start`` to ``finish`` (or ``release``), so a second
writer on it is refused naming the holder's pid.

A folder holds one pair: one whose ``pair.json`` names another pair (a given ``name``,
``category``, ``arms`` or ``replicate`` differs) is refused, and so is a fresh run (step 0)
into a folder whose store holds steps, unless ``resume`` says to train the pair again from step 0
(its stored steps are then replaced). A run started again at step G > 0 (a Trainer resumed from
its checkpoint) continues the pair: the stored steps after G are dropped and computed again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from divergence.errors import UserInputError
from divergence.pairfolder.arm.lock import PairLock
from divergence.pairfolder.arm.steps import check_tensor_names
from divergence.pairfolder.folder import as_pair_folder
from divergence.pairfolder.pair_json import (
    IDENTITY,
    check_same_pair,
    finish_pair,
    read_pair_json,
    schedule_config,
    tracking_schedule,
    write_pair_files,
)
from divergence.pairfolder.settings import DENSE_DEFAULT
from divergence.store import MetricsStore
from divergence.pairfolder.settings import is_tracked
from divergence.tracking.recorder import StepRecorder, diverged, first_nonfinite
from divergence.tracking.records import divergence_records
from divergence.loggers.step_logging import log_step


class Alone:
    """One process: rank zero of one (``broadcast`` hands its argument back)."""

    is_zero = True

    def broadcast(self, obj):
        return obj


ALONE = Alone()


class PairTracker:
    """``out``'s store, written at each step ``record`` is given; ``pair``: ``pair.json``'s fields.
    ``restart_advice``: how the pair's writer continues a pair or trains it again from step 0 (said
    when a fresh run into a folder holding steps is refused)."""

    def __init__(self, out: str | Path, every: int, pair: dict, resume: bool = False, restart_advice: str = ""):
        self.pair_folder, self.pair, self.resume = as_pair_folder(out), pair, resume
        self.restart_advice = restart_advice
        self.out = self.pair_folder.path
        self.schedule = tracking_schedule(
            every, pair.get("spike_factor", 3.0), pair.get("spike_window", 20), pair.get("dense", DENSE_DEFAULT)
        )
        self.recorder = StepRecorder(None, self.schedule["spike_factor"], self.schedule["spike_window"])
        self.max_steps = 0
        self.names: list[str] | None = None  # the tensors of the first tracked step compared here
        self.lock: PairLock | None = None  # rank zero's, while it trains
        self.ranks, self.loggers = ALONE, ()  # set by ``start``

    def tracked(self, step: int) -> bool:
        return is_tracked(step, self.max_steps, schedule_config(self.schedule), 0)

    def start(self, step: int, max_steps: int, weights: Callable, ranks=ALONE, loggers: Sequence = ()) -> None:
        """Check the folder, write ``pair.json``, open the store, drop steps after ``step`` (a resumed run's);
        record step 0 into a fresh store. ``ranks``: ``is_zero``, ``broadcast``; ``loggers``: where each
        committed step is logged besides the store."""
        self.max_steps, self.ranks, self.loggers = max_steps, ranks, loggers
        error = None
        if ranks.is_zero:
            try:
                self._open(step)
            except UserInputError as err:
                error = str(err)
        error = ranks.broadcast(error)  # every rank stops, not only rank 0
        if error is not None:
            raise UserInputError(error)
        store = self.recorder.store
        fresh = ranks.broadcast(store is None or store.last_step() is None)
        if step == 0 and fresh:
            self.record(0, None, weights)

    def _open(self, step: int) -> None:
        """Rank 0: take the folder's lock, refuse another pair's folder or a re-run over stored steps; then
        write and cut."""
        self.release()
        self.lock = PairLock(self.pair_folder)  # one writer of a pair folder: a second LockstepPair is refused
        try:
            self._check_and_cut(step)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Drop the folder's lock (at the end of training, or when it fails)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def _check_and_cut(self, step: int) -> None:
        saved = read_pair_json(self.pair_folder) if self.pair_folder.pair_json.is_file() else None
        if saved is not None:
            check_same_pair(self.out, saved, self.pair)
        store = MetricsStore(self.pair_folder)
        last = store.last_step() if store.exists() else None  # every line read: an unreadable one is an error
        if last is not None and step == 0 and not self.resume:
            raise UserInputError(
                f"{self.out}: already holds pair {(saved or {}).get('name')!r} with steps 0 to {last} stored; a new "
                f"run would cut them. {self.restart_advice}; or choose a new out folder"
            )
        kept = {k: saved[k] for k in (*IDENTITY, "description", "log") if k in saved} if saved else {}
        write_pair_files(
            self.pair_folder, max_steps=self.max_steps, every=self.schedule["every"], **{**kept, **self.pair}
        )
        self.recorder.store = store.open_for_append()
        self.recorder.store.truncate_after(step if step > 0 else -1)  # from step 0 (resume=True): every step again

    def record(self, step: int, losses: dict | None, weights: Callable) -> None:
        """One step's records; ``losses`` already reduced over ranks; ``weights()`` is collective."""
        record = self.recorder.losses(losses)  # every rank: the detectors stay identical
        pair_weights = weights() if self.tracked(step) else None
        self._check_names(step, pair_weights)
        if self.ranks.is_zero:
            comparison = divergence_records(*pair_weights) if pair_weights is not None else None
            table = step == self.max_steps
            self.recorder.commit(
                step, record, comparison, log=lambda s, r, t: log_step(self.loggers, s, r, t, table=table)
            )
        arm = first_nonfinite(losses)  # the same on every rank: a clean stop everywhere
        if arm is not None:
            raise diverged(
                f"arm {arm}", losses[arm], step, f" in {self.out}", "lower the learning rate or clip the gradients"
            )

    def _check_names(self, step: int, pair_weights) -> None:
        """The tracked steps compare the tensors of the first one (every rank hears of a change)."""
        if not self.tracked(step):
            return
        error = None
        if self.ranks.is_zero:
            names = list(pair_weights[0])
            self.names = self.names or names
            try:
                check_tensor_names(names, self.names, step, str(self.out))
            except UserInputError as err:
                error = str(err)
        error = self.ranks.broadcast(error)
        if error is not None:
            raise UserInputError(error)

    def finish(self) -> None:
        """Rank zero: ``pair.json`` says the last stored step and whether the pair is complete; the lock is dropped."""
        try:
            if not self.ranks.is_zero or self.recorder.store is None:
                return
            last = self.recorder.store.last_step()
            finish_pair(self.pair_folder, last, last is not None and last >= self.max_steps)
        finally:
            self.release()

    def state_dict(self) -> dict:
        return self.recorder.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.recorder.load_state_dict(state)
