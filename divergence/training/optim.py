"""An arm's optimizer and LR schedule, and the step counter that drives Lightning's global step.

Lightning counts ``global_step`` in manual optimization by calls of ``LightningOptimizer.step``.
Arms step their own optimizers through their loss scalers (which may skip an overflowing fp16
step), so that count would depend on the arms and their precisions. Instead the module hands
Lightning one ``StepCounter`` and ticks it once per optimizer step (one step's batch, all its
``train.accumulate`` micro-batches): ``global_step`` is the number of optimizer steps, for one
arm or two.
"""

from __future__ import annotations

import sys

import torch

from divergence.recipe.run import ADAMW_IMPLS, TrainConfig


class StepCounter(torch.optim.Optimizer):
    """An optimizer over no parameters whose ``step`` does nothing; Lightning counts its steps."""

    def __init__(self):
        super().__init__([{"params": []}], {})

    def step(self, closure=None):
        return None


# train.adamw_impl -> AdamW's (foreach, fused) arguments; None lets torch choose.
# (default: torch chooses, loop, foreach, fused), in the order of ADAMW_IMPLS
ADAMW_FLAGS = dict(zip(ADAMW_IMPLS, ((None, None), (False, False), (True, False), (False, True)), strict=True))


def build_optimizer(params, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW as the recipe says; with ``train.shard_optimizer`` wrapped in
    ``torch.distributed.optim.ZeroRedundancyOptimizer`` (ZeRO stage 1: rank r keeps the moments of
    its partition of the parameters, steps them, and broadcasts them to the other ranks; Rajbhandari
    et al. 2020, "ZeRO", section 5.1). The update of every weight is the one AdamW computes."""
    foreach, fused = ADAMW_FLAGS[config.adamw_impl]
    adamw = dict(
        lr=config.lr,
        betas=tuple(config.betas),
        eps=config.eps,
        weight_decay=config.weight_decay,
        foreach=foreach,
        fused=fused,
    )
    if config.shard_optimizer:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(list(params), optimizer_class=torch.optim.AdamW, **adamw)
    return torch.optim.AdamW(params, **adamw)


def build_lr_schedule(optimizer: torch.optim.Optimizer, config: TrainConfig):
    """``diffusers.optimization.get_scheduler`` as diffusers' training scripts call it.

    ``train.lr_schedule`` is the scheduler's name, ``train.warmup_steps`` its
    ``num_warmup_steps``, ``train.lr_num_cycles`` and ``train.lr_power`` its ``num_cycles``
    (hard restarts of ``cosine_with_restarts``) and ``power`` (``polynomial``); all return a
    ``LambdaLR`` whose factor at optimizer step ``s`` (``W`` warm-up steps, ``T`` training steps,
    ``p = (s - W) / max(1, T - W)``) is, after ``s / max(1, W)`` while ``s < W``:

    - ``constant``: 1 (no warm-up at all); ``constant_with_warmup``: 1;
    - ``linear``: ``max(0, (T - s) / max(1, T - W))``;
    - ``cosine``: ``max(0, (1 + cos(pi p)) / 2)``;
    - ``cosine_with_restarts``: ``max(0, (1 + cos(pi ((c p) mod 1))) / 2)``, 0 once ``p >= 1``;
    - ``polynomial``: ``((lr - 1e-7) (1 - p)^power + 1e-7) / lr``.

    ``num_training_steps`` is ``train.max_steps``, not ``max_steps x num_processes`` as in
    diffusers' accelerate scripts: there the scheduler is stepped by ``accelerator.prepare``'s
    wrapper once per process per optimizer step, so it counts ``num_processes`` ticks a step;
    here every rank steps its own scheduler exactly once per optimizer step (after the last
    micro-batch of an accumulated step), so the schedule spans ``max_steps`` ticks. Warm-up
    starts from an LR of exactly 0 at step 0, as diffusers' does.
    """
    from diffusers.optimization import get_scheduler

    return get_scheduler(
        config.lr_schedule,
        optimizer,
        num_warmup_steps=config.warmup_steps,
        num_training_steps=config.max_steps,
        num_cycles=config.lr_num_cycles,
        power=config.lr_power,
    )


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's whole state for a resume file: a ``ZeroRedundancyOptimizer``'s partitions
    gathered on rank 0 first (a collective: every rank calls it when Lightning saves; the other
    ranks return ``{}``, which only rank 0's file holds anyway)."""
    # A ZeRO-1 optimizer exists only once ``build_optimizer`` imported its module: not imported here
    # for every other optimizer (torch.distributed.optim imports its ten functional optimizers, ~0.4 s of CPU
    # in every run that saves a resume checkpoint)
    zero = sys.modules.get("torch.distributed.optim")
    if zero is None or not isinstance(optimizer, zero.ZeroRedundancyOptimizer):
        return optimizer.state_dict()
    optimizer.consolidate_state_dict(to=0)
    return optimizer.state_dict() if torch.distributed.get_rank() == 0 else {}
