"""The divergence callback: how far apart the two arms' weights are, step by step.

At every step it records both arms' losses (and flags spikes); at every tracked step
(``divergence.training.records.is_tracked``: step 0, the dense early schedule, every
``tracking.every`` steps, checkpoint steps and the last step) it also compares the arms'
current weights tensor by tensor with ``divergence.metrics``, on the device where they live,
aggregates per module, per kind and whole model, and, given a ``probe`` function, at the tracked
steps ``divergence.training.probe.probe_due`` picks, adds what it returns (the function-space
probe's ``probe_rel_diff, probe_loss_a, probe_loss_b``). Records go
to the metrics store (``DIR/metrics.jsonl``) and the same numbers to every Lightning logger,
with the keys of ``divergence.training.step_logging`` (shared with the comparator that
follows separate-job arms): ``divergence/model/<metric>``, ``divergence/wasserstein/<module>``,
``divergence/max_abs_diff/<module>``, ``divergence/kind/<kind>/<metric>``, ``train/loss_a``...

Resume: when a run restarts from a checkpoint at step G, records after G are dropped from
the store (they are recomputed, bitwise the same on CPU) and the spike detectors' state
comes back with the checkpoint; wandb gets the re-logged steps with its own step set, and
keeps the ones it already holds (see ``log_at_step``). This callback must run before the
resume checkpoint is written at a step, so the saved state includes that step
(``train_pair`` passes it to ``fit`` as a first callback).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

from lightning.pytorch.callbacks import Callback

from divergence.errors import TrainingDiverged
from divergence.recipe.pair import TrackingConfig
from divergence.store import MetricsStore
from divergence.tracking.records import ARMS, divergence_records, is_tracked, loss_record, probe_due
from divergence.tracking.spikes import SpikeDetector
from divergence.tracking.step_logging import is_table_step, log_step


class DivergenceTracker(Callback):
    """Compares ``pl_module.arms['a']`` with ``pl_module.arms['b']``; reads ``pl_module.last_outputs``."""

    def __init__(self, out: str | Path, tracking: TrackingConfig, checkpoint_every: int = 0,
                 probe: Callable[[object], dict] | None = None):
        """``probe(pl_module) -> {key: float}``: extra step-record keys at tracked steps (rank zero)."""
        self.out, self.tracking, self.checkpoint_every, self.probe = Path(out), tracking, checkpoint_every, probe
        self.spikes = {arm: SpikeDetector(tracking.spike_factor, tracking.spike_window) for arm in ARMS}
        self.store: MetricsStore | None = None

    # -- Lightning hooks: thin, the work is in the helpers below ---------------------------
    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            self.store = MetricsStore(self.out).open_for_append()
            self.store.truncate_after(trainer.global_step)

        if trainer.global_step == 0 and (self.store is None or self.store.last_step() is None):
            # step 0: the initial weights (a seed pair differs here already, a control does not)
            self._record(trainer, pl_module, 0, outputs=None)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._record(trainer, pl_module, trainer.global_step, pl_module.last_outputs)

    def state_dict(self) -> dict:
        return {arm: detector.state_dict() for arm, detector in self.spikes.items()}

    def load_state_dict(self, state_dict: dict) -> None:
        for arm, detector in self.spikes.items():
            detector.load_state_dict(state_dict.get(arm, {}))

    # -- helpers ----------------------------------------------------------------------------
    def _record(self, trainer, pl_module, step: int, outputs) -> None:
        losses = None if outputs is None else {arm: float(outputs[arm].loss) for arm in ARMS}
        record = loss_record(losses, self.spikes)  # every rank: the detectors' state stays identical
        if not trainer.is_global_zero:
            return  # rank zero compares, writes and logs
        tensors: list[dict] = []
        if is_tracked(step, trainer.max_steps, self.tracking, self.checkpoint_every):
            device = None if self.tracking.device == "auto" else self.tracking.device
            tensors, summary = divergence_records(pl_module.arms["a"].weights(), pl_module.arms["b"].weights(), device)
            record.update(summary, tracked=True)
            if self.probe is not None and probe_due(step, trainer.max_steps, self.tracking.probe):
                record.update(self.probe(pl_module))
        else:
            record["tracked"] = False
        self.store.append_step(step, tensors, record)
        table = is_table_step(step, trainer.max_steps, self.checkpoint_every)
        log_step(trainer.loggers, step, record, tensors, table=table)
        _stop_if_diverged(pl_module, step, losses)


def _stop_if_diverged(pl_module, step: int, losses: dict | None) -> None:
    """A non-finite loss is recorded (as a spike) and then stops the run, unless the arm's fp16
    loss scaler handles it by skipping the step."""
    for arm, loss in (losses or {}).items():
        if not math.isfinite(loss) and pl_module.arms[arm].policy.name != "16-mixed":
            raise TrainingDiverged(
                f"arm {arm}: loss is {loss} at step {step} (recorded in the store); lower train.lr, "
                "set train.grad_clip, or train in 16-mixed with loss scaling"
            )
