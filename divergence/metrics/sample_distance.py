"""How far apart two models' pictures are, drawn from the same noises: the paired sample distance.

Two arms sample the same captions from the same starting noises (``training.sample_score.draw``);
for image pair n (uint8, H x W x 3, scaled to [0, 1]) its root-mean-square pixel difference

    d_n = sqrt(mean over pixels and channels of (a_n - b_n)^2),

and the distance D = mean_n d_n, with the percentile bootstrap over the image pairs (Efron &
Tibshirani 1993; each image has its own noise, so the pairs are independent draws). D is 0 for
models that draw the same pictures and about a seed change's D_S for models that share nothing but
the data: the hit rate of a sample score moves only when a shape crosses the checker's line, D
moves with every pixel, so it resolves shifts a score cannot.
"""

from __future__ import annotations

import torch

from divergence.metrics.score_intervals import bootstrap_mean


def sample_distance(images_a: torch.Tensor, images_b: torch.Tensor, seed: int = 0) -> dict:
    """``{"value", "lo", "hi", "images"}``: D of two arms' (N, H, W, 3) uint8 images of the same
    captions and noises, and its 95% bootstrap interval over the N pairs."""
    if images_a.shape != images_b.shape or images_a.ndim != 4 or images_a.shape[0] < 1:
        raise ValueError(
            f"images_a, images_b: expected two (N, H, W, C) stacks of one shape, got "
            f"{tuple(images_a.shape)} and {tuple(images_b.shape)}"
        )
    diff = (images_a.to(torch.float64) - images_b.to(torch.float64)) / 255.0
    per_image = diff.pow(2).flatten(1).mean(dim=1).sqrt()
    value, lo, hi = bootstrap_mean(per_image, seed=seed)
    return {"value": value, "lo": lo, "hi": hi, "images": int(per_image.numel())}
