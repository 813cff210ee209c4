"""Checks of the machine a run starts on, run where it starts (``train_run``, ``train_pair``, ``train_arm``):
never in a recipe's constructor, so ``launch`` on a login node and ``watch`` on a comparator node do
not judge a GPU recipe by their own machine.

**Memory.** A number such as ``train.batch_size: 1e8`` is a valid integer that no machine can
train: the run would build its model, start, and die of ``MemoryError`` minutes later. Before
anything is built, ``check_memory`` compares a *lower bound* on what each part of the run must
hold at once against this machine's memory (physical RAM, or the container's limit if lower),
and refuses a part whose floor alone does not fit, naming its key and the largest value that
would. The floors count only what certainly exists, in fp32 (4 bytes a number), so a refusal is
never a guess; passing the check does not promise the run fits (activations cost many times more):

- a training batch: per example the latent input x (C x H x W), its noise, the noisy input and
  the prediction (4 tensors of C x H x W) and the UNet's first feature map (c0 x H x W), plus
  with a VAE the RGB image and the encoder's first feature map at full resolution;
- the weights: one 3x3 convolution per UNet level (9 c_l^2) and the text encoder's layers
  (4 h^2 + 2 h i each) and position table, with gradient and AdamW's two moments (x4) when trained,
  and one more fp32 copy of the trained ones with ``train.ema`` (x5);
- a sample grid (per_prompt x prompts images, x2 with guidance), the epoch permutation of the
  shapes dataset (8 bytes an example) and the noise schedule (about 20 bytes a timestep).
"""

from __future__ import annotations

import os
from pathlib import Path

from divergence.errors import RecipeError
from divergence.recipe.run import latent_shape


def check_host(*recipes) -> None:
    """Refuse, before anything is built, a run this machine cannot hold (``check_memory`` of each recipe)."""
    for recipe in recipes:
        check_memory(recipe)


FP32 = 4


def machine_memory() -> int | None:
    """Bytes of memory this process may use: physical RAM, or the cgroup (container) limit if lower."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total


def memory_floors(recipe) -> list[tuple[str, int, int, str]]:
    """``[(key, value, bytes_per_unit, what), ...]``: each part's floor is ``value x bytes_per_unit``."""
    model, data, train, sample = recipe.model, recipe.data, recipe.train, recipe.sample
    channels, side, _ = latent_shape(recipe)
    c0 = model.unet.block_out_channels[0]
    example = FP32 * side * side * (4 * channels + c0)
    if model.vae is not None:
        example += FP32 * data.resolution**2 * (3 + model.vae.block_out_channels[0])
    shape = f"{channels}x{side}x{side}"
    text = model.text_encoder
    unet_params = sum(9 * c * c for c in model.unet.block_out_channels)
    text_params = (
        text.num_layers * (4 * text.hidden_size**2 + 2 * text.hidden_size * text.intermediate_size)
        + model.tokenizer.max_length * text.hidden_size
    )
    trained = 4 + (train.ema is not None)  # weights, gradients, AdamW's two moments (and the EMA)
    weights = trained * FP32 * unet_params + (trained if text.train else 1) * FP32 * text_params
    floors = [
        (
            "model",
            1,
            weights,
            "model (one 3x3 convolution per UNet level and the text encoder's layers, "
            "with gradients and AdamW state" + (" and the EMA)" if train.ema else ")"),
        ),
        (
            "train.batch_size",
            train.batch_size,
            example,
            f"examples of {shape} (inputs, noise, prediction and the UNet's first {c0}-channel feature map, fp32)",
        ),
        ("noise.num_train_timesteps", recipe.noise.num_train_timesteps, 20, "timesteps of the noise schedule"),
    ]
    if sample.enabled:
        images = sample.per_prompt * len(sample.prompts) * (2 if sample.guidance_scale > 1 else 1)
        floors.append(
            (
                "sample.per_prompt",
                sample.per_prompt,
                example * images // sample.per_prompt,
                f"images per prompt of the sample grid ({len(sample.prompts)} prompts)",
            )
        )
    if data.source == "shapes":
        floors.append(("data.num_examples", data.num_examples, 8, "examples (the epoch permutation, int64)"))
    return floors


def check_memory(recipe, memory: int | None = None) -> None:
    """Refuse a recipe part whose memory floor alone exceeds ``memory`` (default: this machine's)."""
    memory = machine_memory() if memory is None else memory
    if not memory:
        return
    for key, value, unit, what in memory_floors(recipe):
        need = value * unit
        if need > memory:
            largest = memory // unit
            fix = (
                f"use at most {largest}"
                if key != "model" and largest >= 1
                else "lower data.resolution or model.unet.block_out_channels"
                if key != "model"
                else "make the model smaller (model.unet.block_out_channels, model.text_encoder sizes)"
            )
            raise RecipeError(
                f"{key}: {value} {what} need at least {_size(need)}, more than this machine's {_size(memory)} "
                f"of memory; {fix} (the rule: a lower bound on what the run must hold at once fits in memory)"
            )


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.3g} {unit}" if unit == "PB" else f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
