"""Intervals for a hit rate of generated samples, and for the difference of two, over sampling seeds.

A sample score (``divergence.data.shape_check``) is a table of hits, ``(S, N)`` bool: sampling
seed ``s`` by caption ``n``, each image drawn from its own starting noise. Two intervals:

- ``wilson_interval``: Wilson's score interval (Wilson 1927; Brown, Cai & DasGupta 2001 for its
  coverage) for a binomial proportion: with ``p = k / n`` and ``z`` the normal quantile,
  ``(p + z^2 / 2n -+ z sqrt(p (1 - p) / n + z^2 / 4n^2)) / (1 + z^2 / n)``. It treats the ``S N``
  images as independent draws of the model's hit probability on the fixed caption set, which
  they are when every image has its own noise.
- ``seed_bootstrap`` / ``paired_seed_bootstrap``: the percentile bootstrap over seeds (Efron &
  Tibshirani 1993): seeds resampled with replacement, the captions kept, the rate (or the rate
  difference of two arms sampled from the same noises, resampled together) recomputed. It makes
  no independence assumption between the captions of one seed; with few seeds it is coarse.
"""

from __future__ import annotations

import math

import torch

CONFIDENCE = 0.95
RESAMPLES = 2000


def normal_quantile(confidence: float) -> float:
    """``z`` with ``P(|Z| <= z) = confidence`` for a standard normal ``Z``."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence: must be in (0, 1), got {confidence}")
    return float(torch.special.ndtri(torch.tensor(0.5 + confidence / 2, dtype=torch.float64)))


def wilson_interval(hits: int, total: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson's interval for the proportion ``hits / total`` (module docstring); (0, 1) when total is 0."""
    if total < 0 or not 0 <= hits <= max(total, 0):
        raise ValueError(f"hits, total: need 0 <= hits <= total, got {hits}, {total}")
    if total == 0:
        return 0.0, 1.0
    z, p = normal_quantile(confidence), hits / total
    centre = p + z * z / (2 * total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total))
    scale = 1 + z * z / total
    low = 0.0 if hits == 0 else max(0.0, (centre - half) / scale)  # exact at the ends, not 1e-17 off
    high = 1.0 if hits == total else min(1.0, (centre + half) / scale)
    return low, high


def seed_bootstrap(
    hits: torch.Tensor, confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float, float]:
    """``(rate, low, high)``: the hit rate of ``hits`` (S seeds, N captions) and its percentile
    bootstrap interval over the seeds."""
    return bootstrap_mean(_per_seed(hits, "hits"), confidence, resamples, seed)


def paired_seed_bootstrap(
    hits_a: torch.Tensor,
    hits_b: torch.Tensor,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``(difference, low, high)``: rate(a) - rate(b) for two arms' hits on the same seeds and
    captions (same starting noises), and its bootstrap interval resampling the seeds of both together."""
    if hits_a.shape != hits_b.shape:
        raise ValueError(f"hits_a, hits_b: shapes differ, {tuple(hits_a.shape)} vs {tuple(hits_b.shape)}")
    return bootstrap_mean(_per_seed(hits_a, "hits_a") - _per_seed(hits_b, "hits_b"), confidence, resamples, seed)


def _per_seed(hits: torch.Tensor, name: str) -> torch.Tensor:
    if hits.ndim != 2 or hits.shape[0] < 1 or hits.shape[1] < 1:
        raise ValueError(f"{name}: expected (seeds, captions) with both >= 1, got {tuple(hits.shape)}")
    return hits.to(torch.float64).mean(dim=1)


def bootstrap_mean(
    values: torch.Tensor, confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float, float]:
    """The mean of ``values`` (S,) and the percentile interval of the means of ``resamples``
    resamples of them with replacement (one CPU generator seeded by ``seed``)."""
    normal_quantile(confidence)  # checks the confidence
    if resamples < 1:
        raise ValueError(f"resamples: must be >= 1, got {resamples}")
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, values.shape[0], (resamples, values.shape[0]), generator=gen)
    means = values[picks].mean(dim=1)
    tail = (1 - confidence) / 2
    low, high = torch.quantile(means, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return float(values.mean()), low, high
