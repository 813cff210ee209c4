"""The divergence callback: how far apart the two arms' weights are, step by step.

It works on any LightningModule: what it needs comes in as functions of the module,
``losses(pl_module)`` (each arm's loss of the step, averaged over ranks) and
``weights(pl_module)`` (arm a's and arm b's weights by name), and the step is recorded by the
one writing path every tracker shares (``divergence.tracking.recorder.StepRecorder``).

At every step it records both arms' losses (and flags spikes); at every tracked step
(``divergence.pairfolder.settings.is_tracked``: step 0, the dense early schedule, every
``tracking.every`` steps, checkpoint steps and the last step) it also compares the arms'
current weights tensor by tensor with ``divergence.metrics``, on the device where they live,
aggregates per module, per kind and whole model, and, given a ``probe`` function, at the tracked
steps ``divergence.pairfolder.settings.probe_due`` picks, adds what it returns (the function-space
probe's ``probe_rel_diff, probe_loss_a, probe_loss_b``). Records go
to the metrics store (``DIR/metrics.jsonl``) and the same numbers to every Lightning logger,
with the keys of ``divergence.loggers.step_logging`` (shared with the comparator that
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

from divergence.loggers.step_logging import is_table_step, log_step
from divergence.pairfolder.folder import PairFolder, as_pair_folder
from divergence.pairfolder.settings import TrackingConfig, is_tracked, probe_due
from divergence.store import MetricsStore
from divergence.tracking.recorder import StepRecorder
from divergence.tracking.records import divergence_records


class DivergenceTracker(Callback):
    """Compares ``weights(pl_module)`` (arm a's, arm b's) at tracked steps; records ``losses(pl_module)``.

    A non-finite loss is recorded here (as a spike); the module then stops the run on every rank.
    """

    def __init__(
        self,
        pair_folder: PairFolder | str | Path,
        tracking: TrackingConfig,
        checkpoint_every: int = 0,
        probe: Callable[[object], dict] | None = None,
        *,
        losses: Callable[[object], dict[str, float]],
        weights: Callable[[object], tuple[dict, dict]],
        extras: Callable[[int], dict] | None = None,
    ):
        """``probe(pl_module) -> {key: float}``: extra step-record keys at tracked steps (rank zero);
        ``losses(pl_module)``: ``{arm: loss}`` averaged over ranks; ``weights(pl_module)``: the
        two arms' ``{name: tensor}``; ``extras(step) -> {key: value}``: keys for any step's record
        (the update error's coherence, ``callbacks.coherence``), rank zero."""
        self.pair_folder, self.tracking, self.checkpoint_every, self.probe = (
            as_pair_folder(pair_folder),
            tracking,
            checkpoint_every,
            probe,
        )
        self.losses, self.weights, self.extras = losses, weights, extras
        self.recorder = StepRecorder(None, tracking.spike_factor, tracking.spike_window)

    # -- Lightning hooks: thin, the work is in the helpers below ---------------------------
    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            self.recorder.store = MetricsStore(self.pair_folder).open_for_append()
            self.recorder.store.truncate_after(trainer.global_step)

        store = self.recorder.store
        if trainer.global_step == 0 and (store is None or store.last_step() is None):
            # step 0: the initial weights (a seed pair differs here already, a control does not)
            self._record(trainer, pl_module, 0, losses=None)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._record(trainer, pl_module, trainer.global_step, self.losses(pl_module))

    def state_dict(self) -> dict:
        return self.recorder.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.recorder.load_state_dict(state_dict)

    # -- helpers ----------------------------------------------------------------------------
    def _record(self, trainer, pl_module, step: int, losses: dict[str, float] | None) -> None:
        """``losses``: every arm's loss averaged over all ranks."""
        record = self.recorder.losses(losses)  # every rank, on the global loss: the detectors stay identical
        if not trainer.is_global_zero:
            return  # rank zero compares, writes and logs
        comparison = extra = None
        if is_tracked(step, trainer.max_steps, self.tracking, self.checkpoint_every):
            device = None if self.tracking.device == "auto" else self.tracking.device
            comparison = divergence_records(*self.weights(pl_module), device)
            if self.probe is not None and probe_due(step, trainer.max_steps, self.tracking.probe):
                extra = self.probe(pl_module)
        if self.extras is not None:
            extra = {**(extra or {}), **self.extras(step)}
        table = is_table_step(step, trainer.max_steps, self.checkpoint_every)
        self.recorder.commit(
            step, record, comparison, extra, log=lambda s, r, t: log_step(trainer.loggers, s, r, t, table=table)
        )
