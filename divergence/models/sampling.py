"""Generate images from prompts with classifier-free guidance, and tile them into a grid.

The sampler (DDIM or ancestral DDPM) shares the training scheduler's noise schedule. Starting
noise comes from a CPU generator seeded by the recipe, so every call, step and arm starts from
the same noise and grids are comparable across a run and across arms. Guidance (Ho & Salimans,
2022): ``eps = eps_uncond + w * (eps_cond - eps_uncond)`` with the empty caption as unconditional.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
from PIL import Image

from divergence.models.denoiser import denoise
from divergence.recipe.run import SampleConfig


def sampler_for(noise_scheduler, name: str):
    """A fresh sampler (it keeps per-call state) with the training schedule's configuration."""
    from diffusers import DDIMScheduler, DDPMScheduler

    cls = DDIMScheduler if name == "ddim" else DDPMScheduler
    return cls.from_config(noise_scheduler.config)


@torch.no_grad()
def generate(
    unet,
    text_encoder,
    tokenize,
    noise_scheduler,
    config: SampleConfig,
    latent_shape: tuple[int, int, int],
    decode=None,
    autocast=contextlib.nullcontext,
) -> torch.Tensor:
    """Images for ``config.prompts`` (``per_prompt`` each): (N, H, W, 3) uint8 on the CPU.

    ``decode`` maps final latents to pixels in [-1, 1] (the VAE); ``None`` means pixel space.
    ``autocast`` is the arm's precision context.
    """
    device = next(unet.parameters()).device
    prompts = [p for p in config.prompts for _ in range(config.per_prompt)]
    sampler = sampler_for(noise_scheduler, config.sampler)
    sampler.set_timesteps(config.steps)
    gen = torch.Generator().manual_seed(config.seed)
    x = torch.randn((len(prompts), *latent_shape), generator=gen).to(device) * sampler.init_noise_sigma
    ids = tokenize(prompts + [""] * len(prompts)).to(device)
    guided = config.guidance_scale > 1.0
    with autocast():
        text = text_encoder(ids if guided else ids[: len(prompts)])  # (hidden states, pooled)
        for t in sampler.timesteps:
            model_in = torch.cat([x, x]) if guided else x
            out = denoise(unet, sampler.scale_model_input(model_in, t), t, text).float()
            if guided:
                cond, uncond = out.chunk(2)
                out = uncond + config.guidance_scale * (cond - uncond)
            x = sampler.step(out, t, x, generator=gen if config.sampler == "ddpm" else None).prev_sample
    pixels = decode(x) if decode is not None else x
    return ((pixels.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).cpu()


def image_grid(images: torch.Tensor, columns: int) -> Image.Image:
    """Tile (N, H, W, 3) uint8 images into rows of ``columns``."""
    n, h, w, _ = images.shape
    rows = math.ceil(n / columns)
    grid = np.zeros((rows * h, columns * w, 3), dtype=np.uint8)
    for i, image in enumerate(images.numpy()):
        r, c = divmod(i, columns)
        grid[r * h : (r + 1) * h, c * w : (c + 1) * w] = image
    return Image.fromarray(grid)
