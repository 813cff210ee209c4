"""``compare_tensors`` written plainly: each metric its own pass, one pair at a time.

This is the arithmetic the records have always had (the engine before its passes were fused
and spread over threads), kept readable to check the fast path against, bit for bit:

    d = a - b in float64, chunk by chunk (CHUNK elements, numpy's pairwise sum per chunk,
    chunk sums added with math.fsum); W1 = (1/n) sum_i |a_(i) - b_(i)| over the sorted
    values, summed the same way; a pair holding a NaN or an infinity gets NaN metrics, an empty
    pair the values of two equal all-zero tensors.
"""

import math

import numpy as np
import torch

from divergence.metrics import METRIC_NAMES, comparable
from divergence.metrics.tensors import CHUNK


def float64_values(x: torch.Tensor) -> np.ndarray:
    """x's values as a flat float64 numpy array (exact for every dtype the engine takes)."""
    return x.detach().reshape(-1).double().numpy()


def nonfinite(x: np.ndarray) -> int:
    return int(np.count_nonzero(~np.isfinite(x)))


def reference_record(a: torch.Tensor, b: torch.Tensor) -> dict:
    a, b = comparable(a), comparable(b)
    x, y = float64_values(a), float64_values(b)
    n = x.size
    record = {
        "numel": n,
        "nonfinite_a": nonfinite(x) if a.is_floating_point() else 0,
        "nonfinite_b": nonfinite(y) if b.is_floating_point() else 0,
    }
    if record["nonfinite_a"] or record["nonfinite_b"]:
        return record | {m: math.nan for m in METRIC_NAMES} | {"norm_a": math.nan, "norm_b": math.nan}
    if n == 0:  # two equal all-zero tensors' values
        return record | {m: 0.0 for m in METRIC_NAMES} | {"cosine": 1.0, "norm_a": 0.0, "norm_b": 0.0}
    max_abs, sums = 0.0, []
    for start in range(0, n, CHUNK):
        xc, yc = x[start : start + CHUNK], y[start : start + CHUNK]
        d = xc - yc
        max_abs = max(max_abs, float(np.abs(d).max()))
        sums.append(
            [float(v) for v in (np.abs(d).sum(), (d * d).sum(), (xc * xc).sum(), (yc * yc).sum(), (xc * yc).sum())]
        )
    sum_abs, sum_sq, sum_aa, sum_bb, sum_ab = (math.fsum(s[i] for s in sums) for i in range(5))
    sx, sy = np.sort(x), np.sort(y)
    w1 = math.fsum(float(np.abs(sx[i : i + CHUNK] - sy[i : i + CHUNK]).sum()) for i in range(0, n, CHUNK)) / n
    rel_l2 = math.sqrt(sum_sq / sum_aa) if sum_aa > 0 else (0.0 if sum_sq == 0 else math.inf)
    if sum_aa == 0 or sum_bb == 0:
        cosine = 1.0 if sum_aa == sum_bb else 0.0
    else:
        cosine = max(-1.0, min(1.0, sum_ab / math.sqrt(sum_aa * sum_bb)))
    return record | {
        "wasserstein": w1,
        "max_abs_diff": max_abs,
        "mean_abs_diff": sum_abs / n,
        "rms_diff": math.sqrt(sum_sq / n),
        "rel_l2": rel_l2,
        "cosine": cosine,
        "norm_a": math.sqrt(sum_aa),
        "norm_b": math.sqrt(sum_bb),
    }
