"""The bug zoo's cases on divergence's built-in diffusion backbone: the tiny recipe's UNet and text encoder.

The model is the package's own arm (``divergence.training.arm.Arm``) built from ``recipes/tiny.yaml``
(a ~1.5M-parameter UNet with cross-attention and a 2-layer text encoder over byte tokens, both trained,
built from ``model.seed``; nothing downloaded) at 16x16 pixels, and its batches are the package's own:
``Inputs(recipe)`` draws step ``s``'s 8 captioned shapes, noise and timesteps from the data seed, and
noises them with the recipe's DDPM schedule, so every arm sees the same batch at a step. The loss is the
arm's training loss (``Arm._accumulate``): the mean squared error of the predicted noise,

    L = mean over (example, channel, pixel) of (eps_theta(x_t, t, caption) - eps)^2,

a mean over equal-sized examples, so a micro-batch or rank of n of the N examples contributes
(n / N) L_part and the parts' gradients add up to the batch's. The rest is the zoo's (``zoo_cases``):
clipping at ``CLIP``, AdamW foreach with its linear warm-up stepped once per optimizer step; ranks and
micro-batches are emulated in one process, each part's gradient computed on its own and summed in rank
order, as the all-reduce would.

A backbone module of the zoo gives ``make_model``, ``make_batch``, ``baseline`` (the reference path, over
``micro`` micro-batches, last first if ``reverse``), ``train`` and ``one_step_args``, and its ``CASES``.
"""

from __future__ import annotations

import copy
from dataclasses import fields, replace
from functools import lru_cache, partial
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from zoo_cases import REFERENCE_SPLITS, SCALE, Arm, Case, _gradient_only, all_reduce, clip, make_optimizer, warmup

NAME = "unet"
RECIPE_OVERRIDES = ("data.resolution=16", "train.batch_size=8", "data.num_examples=256")
THREADS = 1  # the tiny recipe's train.cpu_threads: its runs' numbers are those of one thread
UNREDUCED = "unet.conv_norm_out.weight"  # the parameter left out of the all-reduce: the UNet's last norm


@lru_cache(maxsize=1)
def _built():
    """The recipe, its inputs and the initial arm (built once; ``make_model`` hands out copies)."""
    import divergence
    from divergence.recipe.run import load_run_recipe
    from divergence.training.arm import Arm as DiffusionArm
    from divergence.training.inputs import Inputs

    recipe = load_run_recipe(Path(divergence.__file__).parent / "recipes" / "tiny.yaml", RECIPE_OVERRIDES)
    inputs = Inputs(recipe)
    arm = DiffusionArm(recipe, inputs.tokenizer)
    arm.setup(torch.device("cpu"))  # fp32 on the CPU: predict() runs under no autocast
    return recipe, inputs, arm.train()


def make_model() -> torch.nn.Module:
    """The tiny recipe's arm (UNet + text encoder) at its initial weights, a fresh copy every call."""
    return copy.deepcopy(_built()[2])


@lru_cache(maxsize=64)
def _batch(step: int):
    _, inputs, _ = _built()
    return inputs.prepare(inputs.batches.batch(step))


def make_batch(step: int):
    """Step ``step``'s ``DiffusionInputs``: 8 noisy 16x16 images, their timesteps, captions and noise."""
    return _batch(step)


def rows(batch) -> int:
    return batch.noisy.shape[0]


def rows_of(batch, parts: int) -> list:
    """The batch's examples cut into ``parts`` consecutive slices (ranks or micro-batches)."""
    cut = {f.name: getattr(batch, f.name) for f in fields(batch) if isinstance(getattr(batch, f.name), torch.Tensor)}
    split = {k: v.tensor_split(parts) for k, v in cut.items()}
    return [replace(batch, **{k: v[i] for k, v in split.items()}) for i in range(parts)]


def mse(model, batch) -> torch.Tensor:
    """The arm's diffusion loss on ``batch``: the mean squared error of its noise prediction."""
    return F.mse_loss(model.predict(batch).float(), batch.target.float())


def baseline(model, batch, micro: int = 1, reverse: bool = False) -> float:
    """The reference path: the batch's mean loss, over ``micro`` micro-batches each weighted n_i / N (last
    first if ``reverse``); ``micro`` 4 is the arm's gradient accumulation (``train.accumulate``)."""
    loss, parts = 0.0, rows_of(batch, micro)
    for part in reversed(parts) if reverse else parts:
        part_loss = mse(model, part) * (rows(part) / rows(batch))
        part_loss.backward()
        loss += float(part_loss.detach())
    clip(model)
    return loss


def ranks(model, batch, world: int, keep_local: str | None = None) -> float:
    """Data parallel over ``world`` emulated ranks: each rank's mean loss on its examples, the gradients
    averaged in rank order; ``keep_local``: that parameter keeps rank 0's gradient (left out of the
    all-reduce)."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    grads, loss = [], 0.0
    for part in rows_of(batch, world):
        model.zero_grad(set_to_none=True)
        part_loss = mse(model, part)
        part_loss.backward()
        grads.append({n: p.grad.clone() for n, p in params.items()})
        loss += float(part_loss.detach()) / world
    all_reduce(params, grads, world, keep_local)
    clip(model)
    return loss


def clip_before_unscale(model, batch) -> float:
    """fp16-style loss scaling with the still-scaled gradients clipped, then unscaled (exact in fp32: the
    scale is a power of two, so only the clip's order differs)."""
    loss = mse(model, batch)
    (loss * SCALE).backward()
    clip(model)
    for p in model.parameters():
        if p.grad is not None:
            p.grad /= SCALE
    return float(loss.detach())


def train(arm: Arm, steps: int, on_step: Callable) -> None:
    """Train a fresh arm ``steps`` optimizer steps with ``arm.grad``; ``on_step(step, model, loss)`` after
    each (step 0: the initial weights, loss None). The zoo's optimizer and warm-up, stepped ``micro_steps``
    times per step."""
    if arm.fused or arm.restart_at is not None or arm.checkpointing or arm.compile:
        raise ValueError("the UNet backbone trains gradient paths and scheduler steps only")
    model = make_model()
    optimizer = make_optimizer(model, False)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup)
    on_step(0, model, None)
    for step in range(1, steps + 1):
        optimizer.zero_grad(set_to_none=True)
        loss = arm.grad(model, make_batch(step))
        optimizer.step()
        for _ in range(arm.micro_steps):
            scheduler.step()
        on_step(step, model, loss)


def one_step_args(case: Case) -> dict:
    """``one_step_check``'s arguments for ``case``: its gradient and the baseline's on the initial weights and
    step 1's batch, against the baseline over 2, 4 and 8 micro-batches summed last to first."""
    refs = [partial(baseline, micro=k, reverse=True) for k in REFERENCE_SPLITS]
    return {
        "change": _gradient_only(case.arm.grad),
        "baseline": _gradient_only(baseline),
        "reordered": [_gradient_only(r) for r in refs],
        "model": make_model(), "batch": make_batch(1), "kind": "gradient",
    }  # fmt: skip


CASES = [
    Case("unet-unreduced-param", True, "divergence's injected bug (variants.parallel, train.inject_bug) on its "
         "own UNet: the UNet's last GroupNorm weight left out of the 2 ranks' gradient all-reduce",
         Arm(grad=partial(ranks, world=2, keep_local=UNREDUCED)), backbone=NAME),
    Case("unet-clip-before-unscale", True, "PyTorch AMP examples, 'Gradient clipping': unscale_ before clipping; "
         "the UNet's still-scaled gradients clipped", Arm(grad=clip_before_unscale), backbone=NAME),
    Case("unet-data-parallel-2", False, "2 ranks of 4 examples, each rank's mean diffusion loss, the gradients "
         "averaged: the same mean gradient", Arm(grad=partial(ranks, world=2)), backbone=NAME),
    Case("unet-grad-accumulation-4", False, "4 micro-batches of 2 examples, each loss / 4, as divergence's own "
         "train.accumulate (Arm._accumulate)", Arm(grad=partial(baseline, micro=4)), backbone=NAME),
]  # fmt: skip
