"""Error statistics of one attention output against a reference, as the paper reports them.

For an output ``O`` and a reference ``R`` of the same shape, with ``E = |O - R|`` elementwise
(computed in fp64)::

    max_abs  = max E            an upper bound on any element's deviation
    mean_abs = mean E
    std_abs  = std E            (population standard deviation)

The relative versions divide by the reference's magnitude, ``max |R|`` for the max and
``mean |R|`` for the mean and std, rather than elementwise: attention outputs cross zero, where
an elementwise ratio is unbounded.

>>> import torch
>>> stats = error_stats(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1.0, 2.5, 3.0]))
>>> stats["max_abs"], stats["mean_abs"], round(stats["max_rel"], 4)
(1.0, 0.5, 0.3333)

Signed statistics (:func:`signed_stats`) say whether the error drifts one way: with
``e = O - R`` over the ``n`` elements::

    mean_signed = mean e                       the bias
    se_signed   = std(u) / sqrt(U)             its standard error, over the means u of U units
    bias_z      = mean_signed / se_signed      |z| >> 3: a bias, not chance
    rel_bias    = |mean e| / sqrt(mean e^2)    0: unbiased, 1: every element errs by the same amount
    majority_sign_frac = the share of the nonzero errors that have the majority sign (0.5 to 1)

An unbiased rounding (round-to-nearest-even on generic data) gives |z| of order 1 and
``rel_bias`` of order ``1 / sqrt(n)``; a biased one accumulates like ``t`` over ``t`` steps
instead of ``sqrt(t)`` (Qiu and Yao, arXiv 2510.04212, 2025; docs/method.md).

The units of the standard error are what errs independently. A row (the last dimension: one
query's output, one key's gradient) shares one softmax, whose rounding errs alike in all its
elements, so elements are not independent; rows are not either where inputs repeat (tied keys
make many rows share one rounded probability). The (batch, head) slices are independent draws:
with ``units`` of them (at least :data:`MIN_UNITS`) the SE is over their means; with fewer, over
the rows' means, a screen that correlated rows inflate (``se_units`` says which).

>>> s = signed_stats(torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([[0.5], [1.5], [3.0]]))
>>> s["mean_signed"], round(s["rel_bias"], 3), s["majority_sign_frac"]
(0.3333333333333333, 0.816, 1.0)
"""

from __future__ import annotations

import math

import torch


def error_stats(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """``max_abs``, ``mean_abs``, ``std_abs``, ``max_rel``, ``mean_rel``, ``std_rel`` of out vs ref."""
    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} differs from reference shape {tuple(ref.shape)}")
    ref = ref.double()
    err = (out.double() - ref).abs()
    max_ref, mean_ref = ref.abs().max().item(), ref.abs().mean().item()
    stats = {
        "max_abs": err.max().item(),
        "mean_abs": err.mean().item(),
        "std_abs": err.std(correction=0).item(),
    }
    stats["max_rel"] = stats["max_abs"] / max_ref if max_ref else float("nan")
    stats["mean_rel"] = stats["mean_abs"] / mean_ref if mean_ref else float("nan")
    stats["std_rel"] = stats["std_abs"] / mean_ref if mean_ref else float("nan")
    return stats


SIGNED_KEYS = ("mean_signed", "se_signed", "se_units", "bias_z", "rel_bias", "majority_sign_frac")
MIN_UNITS = 8  # independent slices below which the SE falls back to rows


def signed_stats(out: torch.Tensor, ref: torch.Tensor, units: int = 1) -> dict[str, float]:
    """:data:`SIGNED_KEYS` of ``out - ref`` (module docstring); NaN where undefined (no error).
    ``units``: the number of independent leading slices (B * H for (B, H, L, D) outputs)."""
    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} differs from reference shape {tuple(ref.shape)}")
    err = out.double() - ref.double()
    groups = units if units >= MIN_UNITS else (err.numel() // err.shape[-1] if err.dim() else 1)
    unit_means = err.reshape(groups, -1).mean(dim=-1)
    err = err.flatten()
    mean = err.mean().item()
    se = unit_means.std(correction=1).item() / math.sqrt(groups) if groups > 1 else float("nan")
    rms = err.square().mean().sqrt().item()
    pos, neg = int((err > 0).sum()), int((err < 0).sum())
    return {
        "mean_signed": mean,
        "se_signed": se,
        "se_units": groups,
        "bias_z": mean / se if se > 0 else float("nan"),
        "rel_bias": abs(mean) / rms if rms > 0 else float("nan"),
        "majority_sign_frac": max(pos, neg) / (pos + neg) if pos + neg else float("nan"),
    }


def bitwise_equal_fraction(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of elements where ``a`` and ``b`` are exactly equal."""
    return (a == b).double().mean().item()
