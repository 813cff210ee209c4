"""Weights-only checkpoints at every step a pair's divergence is measured, for a separate arm job.

An arm trained as its own job (``divergence train --arm``) cannot hand its weights to the
other arm in memory; a comparator (``divergence watch``) reads them from files instead. So
the arm writes ``<root>/checkpoints/step_NNNNNN.safetensors`` at exactly the steps the
lockstep tracker compares (``divergence.training.records.is_tracked``: step 0, the dense
early schedule, every ``tracking.every`` steps, checkpoint steps and the last), each file atomically (temporary
name, then ``os.replace``: a reader sees a complete file or none).

Under FSDP the weights are sharded across ranks: every rank takes part in gathering the full
state dict (``strategy.lightning_module_state_dict``, offloaded to CPU on rank zero), and
rank zero writes it. Under DDP and on one device, rank zero writes its own replica.

Given to ``fit`` it replaces the run's default ``WeightCheckpoint``; it must come before the
resumable checkpoint in the callback list, so a step's weights exist before a ``last.ckpt``
that resumes after that step.
"""

from __future__ import annotations

from pathlib import Path

from divergence.recipe.schema import to_dict
from divergence.training.callbacks.weights import WeightCheckpoint
from divergence.tracking.records import is_tracked
from divergence.pairfolder.weights_file import save_weights, weights_path

NETWORKS = ("unet.", "text_encoder.")


class TrackedWeights(WeightCheckpoint):
    def __init__(self, root: str | Path, tracking, checkpoint_every: int):
        """``tracking``: the pair's ``TrackingConfig`` (its ``every`` and ``dense`` schedule)."""
        super().__init__(root, checkpoint_every)
        self.tracking = tracking

    def on_train_start(self, trainer, pl_module) -> None:
        if self._tracked(trainer, trainer.global_step):  # also after a crash between files
            self._save(trainer, pl_module, overwrite=False)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._tracked(trainer, trainer.global_step):
            self._save(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._save(trainer, pl_module, overwrite=False)

    def _tracked(self, trainer, step: int) -> bool:
        return is_tracked(step, trainer.max_steps, self.tracking, self.every)

    def _save(self, trainer, pl_module, overwrite: bool = True) -> None:
        step, arms = trainer.global_step, pl_module.checkpoint_arms()
        paths = {folder: weights_path(self.root / folder / "checkpoints", step) for folder in arms}
        needed = overwrite or not all(p.exists() for p in paths.values())
        if not trainer.strategy.broadcast(needed):  # rank zero's view decides: a gather is collective
            return
        weights = gather_weights(trainer, pl_module)
        if weights is None:
            return
        for folder, arm in arms.items():
            save_weights(paths[folder], weights[folder], step=step, arm=arm.name, recipe=to_dict(arm.recipe))


def gather_weights(trainer, pl_module) -> dict[str, dict] | None:
    """``{prefix: weights}`` of ``pl_module.checkpoint_arms()`` on global rank zero, None elsewhere.

    Collective under FSDP (every rank must call it); a local read otherwise.
    """
    arms = pl_module.checkpoint_arms()
    if not is_sharded(trainer.strategy):
        return {folder: arm.weights() for folder, arm in arms.items()} if trainer.is_global_zero else None
    full = trainer.strategy.lightning_module_state_dict()  # (name -> full tensor) on rank zero only
    if not trainer.is_global_zero:
        return None
    paths = {id(module): name for name, module in pl_module.named_modules()}
    return {folder: _subtree(full, paths[id(arm)]) for folder, arm in arms.items()}


def is_sharded(strategy) -> bool:
    from lightning.pytorch.strategies import FSDPStrategy

    return isinstance(strategy, FSDPStrategy)


def _subtree(state: dict, module_path: str) -> dict:
    """The arm's weights out of the whole module's state dict, named as ``Arm.weights`` names them."""
    prefix = f"{module_path}." if module_path else ""
    out = {}
    for key, value in state.items():
        name = key[len(prefix):] if key.startswith(prefix) else None
        if name is not None and name.startswith(NETWORKS):
            out[name] = value
    return out
