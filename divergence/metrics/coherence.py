"""Coherence of a sequence of errors: does it drift (one direction) or wander (random directions)?

For per-step error vectors ``e_1 .. e_T`` (for example the gradient with an optimization on
minus the gradient with it off, on the same weights and batch)::

    C(T)       = ||sum_t e_t|| / sqrt(sum_t ||e_t||^2)
    mean_cos   = mean over t of cos(e_t, e_{t+1})

Independent zero-mean errors add like a random walk: ``E ||sum e_t||^2 = sum ||e_t||^2``, so
C stays near 1. Errors with a common direction (a bias) add like ``t``: for identical ``e_t``,
C = sqrt(T). Between the two, with ``e_t = b + n_t`` (a bias ``b`` and independent noise of
energy ``s^2`` per step), ``C^2`` tends to ``1 + (T - 1) ||b||^2 / (||b||^2 + s^2)``. This is why a
biased rounding (Qiu and Yao, arXiv 2510.04212, 2025) matters more than its size suggests, and
what a magnitude ratio cannot tell (docs/method.md). ``mean_cos`` says the same per step:
near 0 for wandering errors, near 1 for drifting ones.

Pure functions: errors are tensors or arrays of one shape (flattened), sums in float64.

>>> import torch
>>> e = [torch.tensor([1.0, 0.0])] * 4
>>> coherence(e)["coherence"], coherence(e)["mean_cos"]
(2.0, 1.0)
"""

from __future__ import annotations

import math

import torch


def coherence(errors) -> dict[str, float]:
    """``{"coherence": C(T), "mean_cos": ..., "steps": T}`` of a sequence of error vectors
    (module docstring); C is NaN when every error is zero, mean_cos NaN for fewer than 2 steps."""
    errors = [torch.as_tensor(e).detach().double().flatten() for e in errors]
    if not errors:
        raise ValueError("coherence needs at least one error vector")
    if len({e.numel() for e in errors}) != 1:
        raise ValueError(f"error vectors differ in size: {sorted({e.numel() for e in errors})}")
    total = torch.zeros_like(errors[0])
    energy = 0.0
    for e in errors:
        total += e
        energy += float(e.square().sum())
    cosines = [_cos(a, b) for a, b in zip(errors, errors[1:])]
    cosines = [c for c in cosines if not math.isnan(c)]
    return {
        "coherence": float(total.norm()) / math.sqrt(energy) if energy > 0 else float("nan"),
        "mean_cos": sum(cosines) / len(cosines) if cosines else float("nan"),
        "steps": len(errors),
    }


def coherence_curve(errors) -> list[float]:
    """``C(1), C(2), .. C(T)``: the coherence of every prefix, in one pass."""
    total, energy, out = None, 0.0, []
    for e in errors:
        e = torch.as_tensor(e).detach().double().flatten()
        total = e.clone() if total is None else total + e
        energy += float(e.square().sum())
        out.append(float(total.norm()) / math.sqrt(energy) if energy > 0 else float("nan"))
    return out


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    na, nb = float(a.norm()), float(b.norm())
    return float(a @ b) / (na * nb) if na > 0 and nb > 0 else float("nan")
