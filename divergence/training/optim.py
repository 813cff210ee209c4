"""An arm's optimizer and LR schedule, and the step counter that drives Lightning's global step.

Lightning counts ``global_step`` in manual optimization by calls of ``LightningOptimizer.step``.
Arms step their own optimizers through their loss scalers (which may skip an overflowing fp16
step), so that count would depend on the arms and their precisions. Instead the module hands
Lightning one ``StepCounter`` and ticks it once per batch: ``global_step`` is the number of
batches trained, for one arm or two.
"""

from __future__ import annotations

import math

import torch

from divergence.recipe.run import TrainConfig


class StepCounter(torch.optim.Optimizer):
    """An optimizer over no parameters whose ``step`` does nothing; Lightning counts its steps."""

    def __init__(self):
        super().__init__([{"params": []}], {})

    def step(self, closure=None):
        return None


# train.adamw_impl -> AdamW's (foreach, fused) arguments; None lets torch choose.
ADAMW_IMPLS = {"default": (None, None), "loop": (False, False), "foreach": (True, False), "fused": (False, True)}


def build_optimizer(params, config: TrainConfig) -> torch.optim.Optimizer:
    foreach, fused = ADAMW_IMPLS[config.adamw_impl]
    return torch.optim.AdamW(params, lr=config.lr, betas=tuple(config.betas), eps=config.eps,
                             weight_decay=config.weight_decay, foreach=foreach, fused=fused)


def build_lr_schedule(optimizer: torch.optim.Optimizer, config: TrainConfig):
    """Linear warmup from zero over ``warmup_steps``, then constant, cosine or linear decay to zero."""
    warmup, total, kind = config.warmup_steps, config.max_steps, config.lr_schedule

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * progress)) if kind == "cosine" else 1.0 - progress

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
