"""One step of a pair, recorded: the one writing path of every tracker.

The lockstep tracker (``pair_tracker``: the built-in trainer's pairs, ``LockstepPair``,
``divergence.Pair``), ``divergence watch`` (separate arm jobs) and ``divergence track`` (two
checkpoint series) all record a step here, so their stores are identical record for record:

1. ``losses``: on every rank, the step's losses and spike flags (``loss_record``); the
   detectors see the global loss, so they stay identical on every rank;
2. ``commit``: on the rank that writes, the comparison's summary (``tracked`` true) or
   ``tracked`` false, the extra keys (the function-space probe's), the store's step block
   (``MetricsStore.append_step``), then the loggers.

The key order of a step record is part of what makes two stores byte for byte the same:
``loss_a, loss_b, loss_diff, spike_a, spike_b``, the summary, ``tracked``, the extras.

The non-finite-loss rule (``diverged``) is here too: every tracker stops a pair whose loss is
NaN or infinite after the step is recorded, with one message.
"""

from __future__ import annotations

import math
from typing import Callable

from divergence.errors import TrainingDiverged
from divergence.pairfolder.layout import ARMS
from divergence.pairfolder.settings import SPIKE_FACTOR, SPIKE_WINDOW
from divergence.tracking.records import loss_record
from divergence.tracking.spikes import SpikeDetector

# (step, record, tensors) -> None: where a committed step goes after the store (the loggers)
StepLog = Callable[[int, dict, list], None]


class StepRecorder:
    """Builds and commits a pair's step records into ``store`` (a ``MetricsStore`` open for
    appending; None on the ranks that do not write)."""

    def __init__(self, store=None, spike_factor: float = SPIKE_FACTOR, spike_window: int = SPIKE_WINDOW):
        self.store = store
        self.spike_factor, self.spike_window = spike_factor, spike_window
        self.spikes = self._detectors()

    def losses(self, losses: dict[str, float] | None) -> dict:
        """The record's loss part (NaN losses and no spikes at step 0, ``losses`` None); every rank."""
        return loss_record(losses, self.spikes)

    def commit(
        self,
        step: int,
        record: dict,
        comparison: tuple[list, dict] | None = None,
        extra: dict | None = None,
        log: StepLog | None = None,
        stored: Callable[[int], None] | None = None,
    ) -> None:
        """Finish ``record`` (from ``losses``) and write step ``step``: ``comparison`` is
        ``(tensor records, summary)`` at a tracked step, None at an untracked one; ``extra``
        adds keys after ``tracked`` (the probe's at tracked steps, the update error's coherence at
        any); ``stored(step)`` runs once the store holds the step, before ``log``."""
        tensors: list[dict] = []
        if comparison is not None:
            tensors, summary = comparison
            record.update(summary, tracked=True)
        else:
            record["tracked"] = False
        record.update(extra or {})
        self.store.append_step(step, tensors, record)
        if stored is not None:
            stored(step)
        if log is not None:
            log(step, record, tensors)

    def replay(self) -> None:
        """The detectors after the stored steps: they saw exactly the stored losses, in order
        (a comparator that restarts, or follows an arm's restart, rebuilds them so)."""
        self.spikes = self._detectors()
        for record in self.store.step_records():
            if record["step"] > 0:
                for arm in ARMS:
                    self.spikes[arm].update(record[f"loss_{arm}"])

    def state_dict(self) -> dict:
        return {arm: detector.state_dict() for arm, detector in self.spikes.items()}

    def load_state_dict(self, state: dict) -> None:
        for arm, detector in self.spikes.items():
            detector.load_state_dict(state.get(arm, {}))

    def _detectors(self) -> dict[str, SpikeDetector]:
        return {arm: SpikeDetector(self.spike_factor, self.spike_window) for arm in ARMS}


def first_nonfinite(losses: dict[str, float] | None, exempt: tuple[str, ...] = ()) -> str | None:
    """The first arm (or run) whose loss is NaN or infinite, ``exempt`` ones aside (a loss-scaled
    arm skips such a step itself); None when every loss is finite."""
    return next((name for name, loss in (losses or {}).items() if not math.isfinite(loss) and name not in exempt), None)


def diverged(what: str, loss: float, step: int, where: str, advice: str) -> TrainingDiverged:
    """The one message of a pair (or run) stopped for a non-finite loss: ``what`` (``arm a``,
    ``run tiny``), its loss and step, where the step was recorded, and what to change."""
    return TrainingDiverged(f"{what}: loss is {loss} at step {step} (recorded{where}); {advice}")
