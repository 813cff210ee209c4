"""The divergence callback: how far apart the two arms' weights are, step by step.

At every step it records both arms' losses (and flags spikes); every ``tracking.every``
steps, at every checkpoint step, at step 0 (the initial weights) and at the last step, it
also compares the arms' current weights tensor by tensor with ``divergence.metrics``, on
the device where they live, and aggregates per module, per kind and whole model. Records go
to the metrics store (``DIR/metrics.jsonl``) and the same numbers to every Lightning logger:

    divergence/model/<metric>                  whole-model summary, each of the six metrics
    divergence/wasserstein/<module>            per module (parent path of the tensors)
    divergence/max_abs_diff/<module>
    divergence/kind/<kind>/<metric>            per kind of layer (attn_q, conv, norm, ...)
    train/loss_a, train/loss_b, train/loss_diff, train/spike_a, train/spike_b
    divergence/layers                          a wandb Table of the latest per-module values
                                               (at checkpoint steps and the last step)

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

from lightning.pytorch.callbacks import Callback

from divergence.errors import TrainingDiverged
from divergence.metrics import METRICS, aggregate
from divergence.recipe.pair import TrackingConfig
from divergence.store import MetricsStore
from divergence.training.records import ARMS, divergence_records, is_tracked, loss_record
from divergence.training.spikes import SpikeDetector

TABLE_COLUMNS = ["module", "kind", "tensors", "numel", *METRICS]


class DivergenceTracker(Callback):
    """Compares ``pl_module.arms['a']`` with ``pl_module.arms['b']``; reads ``pl_module.last_outputs``."""

    def __init__(self, out: str | Path, tracking: TrackingConfig, checkpoint_every: int = 0):
        self.out, self.tracking, self.checkpoint_every = Path(out), tracking, checkpoint_every
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
        if is_tracked(step, trainer.max_steps, self.tracking.every, self.checkpoint_every):
            device = None if self.tracking.device == "auto" else self.tracking.device
            tensors, summary = divergence_records(pl_module.arms["a"].weights(), pl_module.arms["b"].weights(), device)
            record.update(summary, tracked=True)
        else:
            record["tracked"] = False
        self.store.append_step(step, tensors, record)
        self._log(trainer, step, record, tensors)
        _stop_if_diverged(pl_module, step, losses)

    def _log(self, trainer, step: int, record: dict, tensors: list[dict]) -> None:
        if not trainer.loggers:
            return
        metrics = {f"train/{k}": float(record[k]) for k in ("loss_a", "loss_b", "loss_diff", "spike_a", "spike_b")
                   if not (isinstance(record[k], float) and math.isnan(record[k]))}
        modules = []
        if record.get("tracked"):
            metrics.update({f"divergence/model/{m}": record[m] for m in METRICS})
            for kind, values in record["kinds"].items():
                metrics.update({f"divergence/kind/{kind}/{m}": values[m] for m in ("wasserstein", "max_abs_diff")})
            modules = aggregate([dict(r, name=r["tensor"]) for r in tensors], "module")
            kind_of = {r["module"] or "(root)": r["kind"] for r in tensors if r["tensor"].endswith("weight")}
            for row in modules:
                row["kind"] = kind_of.get(row["group"], "")
                metrics[f"divergence/wasserstein/{row['group']}"] = row["wasserstein"]
                metrics[f"divergence/max_abs_diff/{row['group']}"] = row["max_abs_diff"]
        for logger in trainer.loggers:
            log_at_step(logger, metrics, step)
        if modules and self._table_step(step, trainer.max_steps):
            self._log_table(trainer, step, modules)

    def _table_step(self, step: int, max_steps: int) -> bool:
        return step == max_steps or bool(self.checkpoint_every and step % self.checkpoint_every == 0)

    def _log_table(self, trainer, step: int, modules: list[dict]) -> None:
        from lightning.pytorch.loggers import WandbLogger

        rows = [[r["group"], r.get("kind", ""), r["tensors"], r["numel"], *[r[m] for m in METRICS]] for r in modules]
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                import wandb

                table = wandb.Table(columns=TABLE_COLUMNS, data=rows)
                logger.experiment.log({"divergence/layers": table, "trainer/global_step": step}, step=step)


def _stop_if_diverged(pl_module, step: int, losses: dict | None) -> None:
    """A non-finite loss is recorded (as a spike) and then stops the run, unless the arm's fp16
    loss scaler handles it by skipping the step."""
    for arm, loss in (losses or {}).items():
        if not math.isfinite(loss) and pl_module.arms[arm].policy.name != "16-mixed":
            raise TrainingDiverged(
                f"arm {arm}: loss is {loss} at step {step} (recorded in the store); lower train.lr, "
                "set train.grad_clip, or train in 16-mixed with loss scaling"
            )


def log_at_step(logger, metrics: dict, step: int) -> None:
    """Log ``metrics`` at training step ``step``; to wandb with its own step set to ``step``.

    wandb keeps a run's steps strictly increasing and ignores a step at or below the last
    one it has: when a killed run resumes from an earlier checkpoint and logs the steps after
    it again, the ones wandb already holds are dropped and the ones lost with the crash are
    filled in, so each step is in wandb exactly once. (Lightning's WandbLogger logs without
    a wandb step, which would append the re-logged steps as duplicates.)
    """
    from lightning.pytorch.loggers import WandbLogger

    if isinstance(logger, WandbLogger):
        logger.experiment.log({**metrics, "trainer/global_step": step}, step=step)
    else:
        logger.log_metrics(metrics, step=step)
