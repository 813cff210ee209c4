"""What the UNet denoises: pixels in [-1, 1], or the latents of a frozen VAE.

The codec is shared input machinery, not part of an arm: a pair encodes each batch once, in
fp32 and outside any arm's autocast, so both arms train on bitwise identical latents whatever
their precision. Latents are the posterior sample ``(mean + std * posterior_noise) * scaling``,
with ``posterior_noise`` drawn from the step's seeded stream (``StepBatch.posterior``).
"""

from __future__ import annotations

import torch


class LatentCodec:
    """Pixels <-> what the UNet sees. Holds the VAE outside any module tree (not checkpointed)."""

    def __init__(self, vae=None, scaling_factor: float = 1.0):
        self.vae, self.scaling_factor = vae, scaling_factor

    @property
    def latent_space(self) -> bool:
        return self.vae is not None

    def to(self, device: torch.device) -> "LatentCodec":
        if self.vae is not None:
            self.vae.to(device)
        return self

    @torch.no_grad()
    def encode(self, pixels: torch.Tensor, posterior_noise: torch.Tensor | None) -> torch.Tensor:
        """(B, 3, H, W) in [-1, 1] -> (B, C, h, w): the pixels themselves, or scaled VAE latents."""
        if self.vae is None:
            return pixels
        with torch.autocast(pixels.device.type, enabled=False):
            posterior = self.vae.encode(pixels.float()).latent_dist
            return (posterior.mean + posterior.std * posterior_noise) * self.scaling_factor

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """(B, C, h, w) -> (B, 3, H, W) pixels in about [-1, 1]."""
        if self.vae is None:
            return latents
        with torch.autocast(latents.device.type, enabled=False):
            return self.vae.decode(latents.float() / self.scaling_factor).sample
