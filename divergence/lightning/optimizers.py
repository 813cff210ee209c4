"""What a LightningModule's ``configure_optimizers`` returned, as optimizers and schedulers.

Lightning accepts an optimizer; a list or tuple of them; ``([optimizers], [schedulers])``;
a dict ``{"optimizer": ..., "lr_scheduler": scheduler or {"scheduler": ..., "interval":
"step" | "epoch"}}``; or a list of such dicts. ``split_optimizers`` reads all of them.
"""

from __future__ import annotations

import torch

from divergence.errors import UserInputError


def split_optimizers(output, owner: str) -> tuple[list, list[tuple[object, str]]]:
    """``(optimizers, [(scheduler, interval), ...])``; interval ``step`` or ``epoch`` (Lightning's default)."""
    if isinstance(output, torch.optim.Optimizer):
        return [output], []
    if isinstance(output, dict):
        return _from_dicts([output], owner)
    if isinstance(output, (list, tuple)):
        if len(output) == 2 and all(isinstance(x, (list, tuple)) for x in output):
            return list(output[0]), [_scheduler(s, owner) for s in output[1]]
        if all(isinstance(x, dict) for x in output):
            return _from_dicts(output, owner)
        if all(isinstance(x, torch.optim.Optimizer) for x in output):
            return list(output), []
    raise UserInputError(
        f"{owner}.configure_optimizers returned {type(output).__name__}; return an optimizer, "
        "a list of them, ([optimizers], [schedulers]) or {'optimizer': ..., 'lr_scheduler': ...}"
    )


def _from_dicts(dicts, owner: str):
    optimizers, schedulers = [], []
    for d in dicts:
        if "optimizer" not in d:
            raise UserInputError(f"{owner}.configure_optimizers: a dict without 'optimizer' ({sorted(d)})")
        optimizers.append(d["optimizer"])
        if d.get("lr_scheduler") is not None:
            schedulers.append(_scheduler(d["lr_scheduler"], owner))
    return optimizers, schedulers


def _scheduler(spec, owner: str) -> tuple[object, str]:
    if isinstance(spec, dict):
        interval = spec.get("interval", "epoch")
        if interval not in ("step", "epoch"):
            raise UserInputError(
                f"{owner}.configure_optimizers: lr_scheduler interval {interval!r}; must be 'step' or 'epoch'"
            )
        return spec["scheduler"], interval
    return spec, "epoch"
