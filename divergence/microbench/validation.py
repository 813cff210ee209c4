"""Check the re-implementation against a real flash kernel: PyTorch's CPU flash attention.

In kernel-faithful mode (``accumulate`` fp32 for bf16/fp16/fp32 inputs, fp64 for fp64) and on
the kernel's own tile (:func:`~divergence.attention.blocks.cpu_flash_tile`), the re-implementation
performs the kernel's operations in the kernel's precisions. What can still differ is the order
of summation inside each matrix product and the kernel's vectorized ``exp``, so agreement is
judged against the size of an error everyone accepts: the baseline's own error against the
golden value (the tolerance rule of flash-attention's tests).
"""

from __future__ import annotations

import torch

from divergence.attention.blocks import cpu_flash_tile
from divergence.attention.tiled import flash_attention_tiled
from divergence.microbench.metrics import bitwise_equal_fraction, error_stats

COLUMNS = (
    "precision",
    "seq_len",
    "block_q",
    "block_kv",
    "max_abs_diff",
    "mean_abs_diff",
    "bitwise_equal",
    "kernel_max_abs_err",
    "flash_max_abs_err",
    "baseline_max_abs_err",
    "diff_over_baseline_err",
)


def compare_with_kernel(precision: str, kernel_out, q, k, v, golden, baseline, *, causal: bool) -> dict:
    """One row of ``validation.csv``: re-implementation vs ``kernel_out`` (sdpa-flash on CPU), the
    re-implementation configured as PyTorch's CPU flash kernel (its tile, fp32 or fp64 accumulators)."""
    block_q, block_kv = cpu_flash_tile(q.shape[-2], k.shape[-2])
    accumulate = torch.float64 if q.dtype == torch.float64 else torch.float32
    ours = flash_attention_tiled(q, k, v, block_q=block_q, block_kv=block_kv, causal=causal, accumulate=accumulate)
    diff = error_stats(ours, kernel_out)
    base_err = error_stats(baseline, golden)["max_abs"]
    return {
        "precision": precision,
        "seq_len": q.shape[-2],
        "block_q": block_q,
        "block_kv": block_kv,
        "max_abs_diff": diff["max_abs"],
        "mean_abs_diff": diff["mean_abs"],
        "bitwise_equal": bitwise_equal_fraction(ours, kernel_out),
        "kernel_max_abs_err": error_stats(kernel_out, golden)["max_abs"],
        "flash_max_abs_err": error_stats(ours, golden)["max_abs"],
        "baseline_max_abs_err": base_err,
        "diff_over_baseline_err": diff["max_abs"] / base_err if base_err else float("nan"),
    }
