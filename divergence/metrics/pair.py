"""All metrics of one tensor pair, as the record ``divergence compare`` and the stores use."""

from __future__ import annotations

import math

import numpy as np
import torch

from divergence.metrics.difference import difference_sums
from divergence.metrics.tensors import as_tensor, check_same_shape
from divergence.metrics.wasserstein import wasserstein

# The metric keys of a record, in display order. A contract: the JSON, CSV and the
# metrics store use exactly these names.
METRICS = ("wasserstein", "max_abs_diff", "mean_abs_diff", "rms_diff", "rel_l2", "cosine")
NAN = float("nan")


def count_nonfinite(x: torch.Tensor) -> int:
    """Number of NaN and +-inf values in ``x``."""
    if not x.is_floating_point():
        return 0
    if x.device.type == "cpu" and x.dtype in (torch.float16, torch.float32, torch.float64):
        flat = x.detach().contiguous().numpy().reshape(-1)  # numpy's isfinite is ~20x faster on CPU
        return int(flat.size - np.count_nonzero(np.isfinite(flat)))
    return int(x.numel() - torch.isfinite(x).sum())


def comparable(x: torch.Tensor) -> torch.Tensor:
    """``x`` in a dtype every metric supports, with the same values.

    A complex tensor becomes ``torch.view_as_real(x)``, shape ``(*x.shape, 2)``: its real and
    imaginary parts side by side, so a complex pair is measured as the 2n real numbers it
    holds (rel_l2 and cosine are then exactly the complex ||a - b|| / ||a|| and
    Re<a, b> / (||a|| ||b||); max_abs_diff is the largest difference of one part). float8
    tensors (e4m3, e5m2), which torch cannot test for NaN, are widened to float32 exactly.
    """
    if x.is_complex():
        return torch.view_as_real(x.to(torch.complex64) if x.dtype == torch.complex32 else x)
    if x.is_floating_point() and x.element_size() == 1:
        return x.float()
    return x


def compare_tensors(a, b) -> dict:
    """Every metric of the pair (a, b), same shape, computed in float64 on a's device.

    Complex tensors are compared on their real and imaginary parts (see ``comparable``), so
    ``numel`` is then 2n, the count of real numbers measured, which keeps every aggregate
    exact; integer and bool tensors are compared as float64 values.

    Returns a dict with ``numel``, each name in ``METRICS``, ``nonfinite_a``/``nonfinite_b``
    (count of NaN/inf values) and ``norm_a``/``norm_b`` (L2 norms, which let aggregates such
    as a global rel_l2 be exact). A pair holding any non-finite value gets NaN metrics: no
    finite number would be honest, and aggregates skip such pairs and count them instead.

    An empty pair (0 elements, e.g. a ``(0, 3)`` buffer) holds no value that differs: every
    difference is 0 (``wasserstein``, ``max_abs_diff``, ``mean_abs_diff``, ``rms_diff``,
    ``rel_l2``), ``cosine`` is 1 and both norms 0, the values of two equal all-zero tensors.
    It weighs nothing in the numel-weighted aggregates, so it changes none of them.
    """
    a, b = as_tensor(a), as_tensor(b)
    check_same_shape(a, b, "compare_tensors")
    if a.is_complex() != b.is_complex():
        raise ValueError(f"compare_tensors: cannot compare {a.dtype} with {b.dtype} (one is complex)")
    a, b = comparable(a), comparable(b).to(a.device)
    record = {"numel": a.numel(), "nonfinite_a": count_nonfinite(a), "nonfinite_b": count_nonfinite(b)}
    if record["nonfinite_a"] or record["nonfinite_b"]:
        record.update({m: NAN for m in METRICS}, norm_a=NAN, norm_b=NAN)
        return record
    if a.numel() == 0:
        record.update({m: 0.0 for m in METRICS}, cosine=1.0, norm_a=0.0, norm_b=0.0)
        return record
    sums = difference_sums(a, b)
    record.update(
        wasserstein=wasserstein(a, b),
        max_abs_diff=sums.max_abs_diff,
        mean_abs_diff=sums.mean_abs_diff,
        rms_diff=sums.rms_diff,
        rel_l2=sums.rel_l2,
        cosine=sums.cosine,
        norm_a=math.sqrt(sums.sum_aa),
        norm_b=math.sqrt(sums.sum_bb),
    )
    return record
