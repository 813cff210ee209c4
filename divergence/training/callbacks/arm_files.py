"""The built-in trainer's arm files, written by the public writer: ``ArmCheckpoints`` over ``ArmWriter``.

One ``TrainerArm`` per arm of the ``ArmsModule``, placed before the resumable checkpoint in the
callback list, so a step's weights and loss exist before a ``last.ckpt`` that resumes after it.

- An arm that others read (a separate arm, ``divergence train --arm``; a study's lent arm, written
  by a lockstep pair) keeps the whole arm journal (``divergence.pairfolder.arm.journal``): its
  weights at every step the pair compares (``pair.json``'s schedule and every
  ``train.checkpoint_every`` steps), ``losses.jsonl`` and ``status.json``. The process that trains
  it holds the arm's lock (``train_arm``'s ``ArmLock``, ``train_pair``'s ``PairLock``) and wrote
  ``pair.json`` before training starts.
- A single run's arm and a lockstep pair's own arms keep the weights files alone (their losses are
  the tracker's and the loggers'), at step 0, every ``train.checkpoint_every`` steps and the last.

What differs from a module of a user's own: the step's loss is the module's, already averaged over
ranks (``ArmsModule.step_losses``); the weights are ``Arm.weights`` (LoRA deltas, EMA shadows;
under FSDP, the networks' entries of the gathered state dict); each file's metadata holds the
arm's label and recipe; the MoE capacity drops are written beside the loss.
"""

from __future__ import annotations

from divergence.config.schema import to_dict
from divergence.lightning.arm_checkpoints import ArmCheckpoints
from divergence.pairfolder.arm.steps import MAX_STEP

NETWORKS = ("unet.", "text_encoder.")


class TrainerArm(ArmCheckpoints):
    """Arm ``name`` of the ``ArmsModule`` into ``out/folder`` (``folder`` ``""``: ``out`` itself).

    ``tracking``: the pair's ``TrackingConfig`` for an arm that keeps its journal (``out`` the pair
    folder, ``folder`` the arm's name), None for the weights files alone; ``per_rank_batch``:
    examples per optimizer step on one rank, whose product with the data-parallel replicas
    ``status.json`` records as the global batch.
    """

    def __init__(self, out, name: str, folder: str, arm, tracking=None, per_rank_batch: int | None = None):
        train, self.name, self.per_rank_batch = arm.recipe.train, name, per_rank_batch
        self.journal = tracking is not None
        every = tracking.every if self.journal else train.checkpoint_every or MAX_STEP
        options = dict(label=arm.name, recipe=to_dict(arm.recipe), checkpoint_every=train.checkpoint_every)
        if self.journal:
            options.update(dense=[list(d) for d in tracking.dense], locked=True)
        else:
            options.update(dense=[], records=False)
        super().__init__(out, folder, every, f"arms.{name}", resume=True, weights=arm_weights, **options)

    def on_train_start(self, trainer, pl_module) -> None:
        from divergence.training.tensor_parallel import data_parallel

        if self.per_rank_batch:
            self.options["global_batch"] = self.per_rank_batch * data_parallel(trainer)[1]
        super().on_train_start(trainer, pl_module)

    def step_loss(self, trainer, pl_module, outputs):
        return pl_module.step_losses[self.name]  # averaged over ranks by the module

    def router_drop(self, pl_module) -> float | None:
        from divergence.training.probe import training_drops

        return training_drops(pl_module.arms[self.name], across_ranks=True) if self.journal else None


def arm_weights(arm) -> dict:
    """``Arm.weights()`` of a live arm; of a state dict gathered under FSDP, the networks' entries."""
    if isinstance(arm, dict):
        return {name: value for name, value in arm.items() if name.startswith(NETWORKS)}
    return arm.weights()


def arm_callbacks(module, out, tracking=None, per_rank_batch: int | None = None) -> list[TrainerArm]:
    """A ``TrainerArm`` for each arm of ``module`` (an ``ArmsModule``): with ``tracking``, each arm's
    journal in pair folder ``out``; without, its weights files in ``out/<its folder prefix>``."""
    return [
        TrainerArm(out, name, name if tracking is not None else module.folders[name], arm, tracking, per_rank_batch)
        for name, arm in module.arms.items()
    ]
