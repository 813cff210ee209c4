"""The divergence callback: how far apart the two arms' weights are, step by step.

At every step it records both arms' losses (and flags spikes); at every tracked step
(``divergence.tracking.records.is_tracked``: step 0, the dense early schedule, every
``tracking.every`` steps, checkpoint steps and the last step) it also compares the arms'
current weights tensor by tensor with ``divergence.metrics``, on the device where they live,
aggregates per module, per kind and whole model, and, given a ``probe`` function, at the tracked
steps ``divergence.tracking.records.probe_due`` picks, adds what it returns (the function-space
probe's ``probe_rel_diff, probe_loss_a, probe_loss_b``). Records go
to the metrics store (``DIR/metrics.jsonl``) and the same numbers to every Lightning logger,
with the keys of ``divergence.tracking.step_logging`` (shared with the comparator that
follows separate-job arms): ``divergence/model/<metric>``, ``divergence/wasserstein/<module>``,
``divergence/max_abs_diff/<module>``, ``divergence/kind/<kind>/<metric>``, ``train/loss_a``...

Resume: when a run restarts from a checkpoint at step G, records after G are dropped from
the store (they are recomputed, bitwise the same on CPU) and the spike detectors' state
comes back with the checkpoint; wandb gets the re-logged steps with its own step set, and
keeps the ones it already holds (see ``log_at_step``). This callback must run before the
resume checkpoint is written at a step, so the saved state includes that step
(``train_pair`` passes it to ``fit`` as a first callback). The losses are each arm's loss
averaged over ranks, so under DDP the detectors see the global loss, identically on every rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from lightning.pytorch.callbacks import Callback

from divergence.pairfolder.settings import TrackingConfig
from divergence.store import MetricsStore
from divergence.tracking.records import ARMS, divergence_records, loss_record
from divergence.pairfolder.settings import is_tracked, probe_due
from divergence.tracking.spikes import SpikeDetector
from divergence.tracking.step_logging import is_table_step, log_step


class DivergenceTracker(Callback):
    """Compares ``pl_module.arms['a']`` with ``pl_module.arms['b']``; reads ``pl_module.step_losses``.

    A non-finite loss is recorded here (as a spike); the module then stops the run on every rank.
    """

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
            self._record(trainer, pl_module, 0, losses=None)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._record(trainer, pl_module, trainer.global_step, pl_module.step_losses)

    def state_dict(self) -> dict:
        return {arm: detector.state_dict() for arm, detector in self.spikes.items()}

    def load_state_dict(self, state_dict: dict) -> None:
        for arm, detector in self.spikes.items():
            detector.load_state_dict(state_dict.get(arm, {}))

    # -- helpers ----------------------------------------------------------------------------
    def _record(self, trainer, pl_module, step: int, losses: dict[str, float] | None) -> None:
        """``losses``: every arm's loss averaged over all ranks (``ArmsModule.step_losses``)."""
        record = loss_record(losses, self.spikes)  # every rank, on the global loss: the detectors stay identical
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
