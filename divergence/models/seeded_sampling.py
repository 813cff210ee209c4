"""Images for (caption, sampling seed) pairs, each from its own starting noise: what a sample score reads.

``sampling.generate`` draws one noise tensor for a whole grid, so an image depends on the grid
it is in. A score compares arms and runs image by image, so here the image of caption ``c`` and
seed ``s`` starts from noise of its own CPU generator, seeded by ``derive_seed("sample-noise", s,
c)``, and DDPM's per-step noise comes from that same generator: the image is a function of the
weights, the caption and the seed alone (up to the batch's float arithmetic), the same in every
arm and run sampled with that seed. The sampler (DDIM, deterministic given its start, or
ancestral DDPM) shares the training scheduler's noise schedule, with classifier-free guidance
``eps = eps_uncond + w (eps_cond - eps_uncond)`` (Ho & Salimans 2022), the empty caption as
unconditional, as ``sampling.generate``.

Cost: ``steps`` forward passes of the denoiser per image, twice with guidance (one batch of
``2 b``), plus the text encoder once per batch.
"""

from __future__ import annotations

import contextlib

import torch

from divergence.models.denoiser import denoise
from divergence.models.sampling import sampler_for
from divergence.recipe.seeds import derive_seed

SAMPLERS = ("ddim", "ddpm")


@torch.no_grad()
def sample_images(
    unet,
    text_encoder,
    tokenize,
    noise_scheduler,
    captions: list[str],
    seeds: list[int],
    latent_shape: tuple[int, int, int],
    *,
    steps: int = 25,
    sampler: str = "ddim",
    guidance_scale: float = 3.0,
    batch_size: int = 64,
    decode=None,
    autocast=contextlib.nullcontext,
) -> torch.Tensor:
    """(S, N, H, W, 3) uint8 on the CPU: image ``[s, n]`` of ``captions[n]`` from ``seeds[s]``.

    ``decode`` maps final latents to pixels in [-1, 1] (a VAE); ``None``: pixel space.
    ``autocast``: the arm's precision context."""
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler: {sampler!r} is not one of {', '.join(SAMPLERS)}")
    if steps < 1 or batch_size < 1 or guidance_scale < 1.0 or not captions or not seeds:
        raise ValueError(
            f"sample_images: need steps, batch_size >= 1, guidance_scale >= 1 and some captions and seeds "
            f"(got {steps}, {batch_size}, {guidance_scale}, {len(captions)} captions, {len(seeds)} seeds)"
        )
    jobs = [(caption, seed) for seed in seeds for caption in captions]
    device = next(unet.parameters()).device
    guided = guidance_scale > 1.0
    images = []
    for start in range(0, len(jobs), batch_size):
        batch = jobs[start : start + batch_size]
        # each image's CPU generator, seeded by (seed, caption), not by its batch (module docstring)
        generators = [torch.Generator().manual_seed(derive_seed("sample-noise", s, c)) for c, s in batch]
        # one batch from pure noise to final latents (B, C, h, w), each image with its own generator
        schedule = sampler_for(noise_scheduler, sampler)
        schedule.set_timesteps(steps)
        x = torch.stack([torch.randn(latent_shape, generator=g) for g in generators]).to(device)
        x = x * schedule.init_noise_sigma
        names = [c for c, _ in batch]
        ids = tokenize(names + [""] * len(names) if guided else names).to(device)
        with autocast():
            text = text_encoder(ids)  # (hidden states, pooled)
            for t in schedule.timesteps:
                model_in = torch.cat([x, x]) if guided else x
                out = denoise(unet, schedule.scale_model_input(model_in, t), t, text).float()
                if guided:
                    cond, uncond = out.chunk(2)
                    out = uncond + guidance_scale * (cond - uncond)
                # DDPM's step noise: diffusers draws image i's from generators[i] (on the CPU) given a list
                x = schedule.step(out, t, x, generator=generators if sampler == "ddpm" else None).prev_sample
        pixels = decode(x) if decode is not None else x
        images.append(((pixels.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).cpu())
    return torch.cat(images).reshape(len(seeds), len(captions), *images[0].shape[1:])
