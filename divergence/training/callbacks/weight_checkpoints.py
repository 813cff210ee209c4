"""Weights-only safetensors of every arm: ``<root>/<prefix>/checkpoints/step_NNNNNN.safetensors``.

One callback for every kind of run. Which steps: step 0 (the initial weights), every
``checkpoint_every`` steps and the last step; given a pair's ``tracking`` (a separate arm, whose
comparator reads its weights from files), also every step the lockstep tracker compares
(``divergence.pairfolder.settings.is_tracked``: the dense early schedule and every
``tracking.every`` steps). Steps count completed optimizer steps. Each file is written
atomically (temporary name, then ``os.replace``: a reader sees a complete file or none); a
step's file that exists is kept when training starts again at that step.

Ranks: under FSDP the weights are sharded, so every rank takes part in gathering the full state
dict (``strategy.lightning_module_state_dict``, offloaded to CPU on rank zero) and rank zero
writes it; under DDP and on one device rank zero writes its own replica. Must come before the
resumable checkpoint in the callback list, so a step's weights exist before a ``last.ckpt``
that resumes after that step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from lightning.pytorch.callbacks import Callback

from divergence.pairfolder.folder import RunFolder
from divergence.pairfolder.arm.weights_file import save_weights
from divergence.config.schema import to_dict
from divergence.pairfolder.settings import is_tracked

NETWORKS = ("unet.", "text_encoder.")


class WeightCheckpoint(Callback):
    """Saves each arm of ``arms(pl_module)`` (``{prefix: Arm}``) to ``root/prefix/checkpoints``."""

    def __init__(self, root: str | Path, checkpoint_every: int, tracking=None, *, arms: Callable[[object], dict]):
        """``tracking``: a pair's ``TrackingConfig`` (its ``every`` and ``dense`` schedule), or None;
        ``arms(pl_module)``: the arms to save, ``{folder prefix: Arm}``."""
        self.root, self.every, self.tracking, self.arms = Path(root), checkpoint_every, tracking, arms

    def on_train_start(self, trainer, pl_module) -> None:
        if self._tracked(trainer, trainer.global_step):  # also after a crash between files
            self._save(trainer, pl_module, overwrite=False)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._tracked(trainer, trainer.global_step):
            self._save(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._save(trainer, pl_module, overwrite=False)

    def _tracked(self, trainer, step: int) -> bool:
        if self.tracking is not None:
            return is_tracked(step, trainer.max_steps, self.tracking, self.every)
        return step == 0 or step == trainer.max_steps or bool(self.every and step % self.every == 0)

    def _save(self, trainer, pl_module, overwrite: bool = True) -> None:
        step, arms = trainer.global_step, self.arms(pl_module)
        paths = {folder: RunFolder(self.root / folder).weights(step) for folder in arms}
        needed = overwrite or not all(p.exists() for p in paths.values())
        if not trainer.strategy.broadcast(needed):  # rank zero's view decides: a gather is collective
            return
        weights = gather_weights(trainer, pl_module, arms)
        if weights is None:
            return
        for folder, arm in arms.items():
            save_weights(paths[folder], weights[folder], step=step, arm=arm.name, recipe=to_dict(arm.recipe))


def gather_weights(trainer, pl_module, arms: dict) -> dict[str, dict] | None:
    """``{prefix: weights}`` of ``arms`` (``{prefix: Arm}``, submodules of ``pl_module``) on global
    rank zero, None elsewhere.

    Collective under FSDP (every rank must call it); a local read otherwise.
    """
    if tensor_parallel(trainer.strategy):  # every rank gathers the DTensors it holds shards of
        from divergence.training.tensor_parallel import full_tensors

        full = {folder: full_tensors(arm.weights()) for folder, arm in arms.items()}
        return full if trainer.is_global_zero else None
    if not is_sharded(trainer.strategy):
        return {folder: arm.weights() for folder, arm in arms.items()} if trainer.is_global_zero else None
    full = trainer.strategy.lightning_module_state_dict()  # (name -> full tensor) on rank zero only
    if not trainer.is_global_zero:
        return None
    paths = {id(module): name for name, module in pl_module.named_modules()}
    return {folder: _subtree(full, paths[id(arm)]) for folder, arm in arms.items()}


def tensor_parallel(strategy) -> bool:
    from lightning.pytorch.strategies import ModelParallelStrategy

    return isinstance(strategy, ModelParallelStrategy)


def is_sharded(strategy) -> bool:
    from lightning.pytorch.strategies import FSDPStrategy

    return isinstance(strategy, FSDPStrategy)


def _subtree(state: dict, module_path: str) -> dict:
    """The arm's weights out of the whole module's state dict, named as ``Arm.weights`` names them."""
    prefix = f"{module_path}." if module_path else ""
    out = {}
    for key, value in state.items():
        name = key[len(prefix) :] if key.startswith(prefix) else None
        if name is not None and name.startswith(NETWORKS):
            out[name] = value
    return out
