"""A module's full weights on global rank zero, under any strategy (FSDP shards included)."""

from __future__ import annotations

import math
from typing import Callable

from divergence.errors import UserInputError


def gather_state(trainer, pl_module, path: str = "", weights: Callable | None = None) -> dict | None:
    """``weights`` of ``pl_module``'s submodule ``path`` ("" for the whole) on rank zero, else None.

    ``weights``: ``module or state dict -> {name: tensor}`` (``ArmWriter``'s option; default the
    state dict itself). Collective under FSDP (every rank must call it: the shards are gathered,
    offloaded to CPU on rank zero); a local read of rank zero's replica otherwise. Names are relative
    to the submodule, as ``submodule.state_dict()`` names them. Under a model-parallel strategy a
    ``weights`` function reads the live submodule on every rank and each DTensor it returns is
    gathered in turn (the built-in trainer's ``Arm.weights``, whose names a state dict lacks).
    """
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

    weights = weights or (lambda state: state)
    if isinstance(trainer.strategy, ModelParallelStrategy):  # FSDP2 / tensor parallel: DTensors
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        from divergence.writers.arm_writer import state_weights

        if weights is not state_weights:  # the module's own names: every rank reads them, gathered one by one
            full = {
                k: v.full_tensor() if hasattr(v, "full_tensor") else v
                for k, v in weights(submodule(pl_module, path)).items()
            }
            return full if trainer.is_global_zero else None
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # full on rank zero only
        full = get_model_state_dict(trainer.strategy.model, options=options)
        return weights(_relative(pl_module, path, full)) if trainer.is_global_zero else None
    if isinstance(trainer.strategy, FSDPStrategy):
        full = trainer.strategy.lightning_module_state_dict()
        return weights(_relative(pl_module, path, full)) if trainer.is_global_zero else None
    if not trainer.is_global_zero:
        return None
    return weights(submodule(pl_module, path))


def sharded_state(trainer, pl_module, path: str = "") -> dict:
    """Every rank: ``{name: tensor}`` of ``pl_module``'s submodule ``path``, each rank holding its own
    shards (DTensors under FSDP / ``ModelParallelStrategy``; whole tensors when not sharded), for a
    DCP save (``ArmWriter(format="dcp")``): nothing is gathered.

    ``torch.distributed.checkpoint.state_dict.get_model_state_dict`` of the strategy's (wrapped)
    model, names as the LightningModule's ``state_dict()`` gives them (wrapper prefixes dropped),
    then relative to the submodule.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(trainer.strategy.model, options=StateDictOptions(full_state_dict=False))
    return _relative(pl_module, path, state)


def _relative(pl_module, path: str, state: dict) -> dict:
    """The entries of ``state`` (named from ``pl_module``) inside submodule ``path``, named from it."""
    target = submodule(pl_module, path)  # inside pl_module: named_modules holds it (its first name)
    module_path = next(name for name, module in pl_module.named_modules() if module is target)
    prefix = f"{module_path}." if module_path else ""
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def submodule(pl_module, path: str):
    if not path:
        return pl_module
    try:
        return pl_module.get_submodule(path)
    except AttributeError:
        children = ", ".join(name for name, _ in pl_module.named_children()) or "none"
        raise UserInputError(
            f"module={path!r}: {type(pl_module).__name__} has no submodule {path!r} (its children: {children})"
        ) from None


def max_steps(trainer, per_batch: int = 1, required: bool = True) -> int | None:
    """The run's last step: ``Trainer(max_steps=...)`` or the end of its epochs, whichever comes first.

    ``required=False``: None for a Trainer with no finite length (an infinite iterable dataset and
    no ``max_steps``) instead of an error. ``per_batch``: how far ``global_step`` moves per batch (1; a manual-optimization module that
    steps each of its k optimizers once per batch moves it by k). ``Trainer(max_steps=10,
    max_epochs=1)`` on 4 batches ends at step 4, so 4 is the pair's last step, not 10.
    """
    steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else math.inf
    epochs, batches = trainer.max_epochs, trainer.num_training_batches
    if epochs is not None and epochs >= 0 and batches != math.inf:
        epoch_steps = math.ceil(batches / trainer.accumulate_grad_batches) * max(epochs, 1) * per_batch
        steps = min(steps, epoch_steps)
    if steps == math.inf or steps < 1:
        if not required:
            return None  # open-ended: the last step is where training ends (``ArmWriter`` without max_steps)
        raise UserInputError(
            "the Trainer has no finite length: give Trainer(max_steps=N) or max_epochs "
            "with a sized dataloader, so both arms know their last step"
        )
    return int(steps)
