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
"""

from __future__ import annotations

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


def bitwise_equal_fraction(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of elements where ``a`` and ``b`` are exactly equal."""
    return (a == b).double().mean().item()
