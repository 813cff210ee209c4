"""16-bit autocast on a CPU, computed as a GPU's tensor cores compute it (``train.cpu_autocast: emulate``).

Under bf16 or fp16 autocast a GPU runs a convolution or a linear layer on 16-bit inputs with
fp32 accumulation and rounds the result to 16 bits:

    y = rnd16( sum_k rnd16(x)_k * rnd16(w)_k + rnd16(b) )      (accumulated in fp32)

PyTorch's CPU kernels compute the same rounding model, but on a CPU without AVX512-BF16 (or
AMX) its bf16 convolution falls back to ``_slow_conv2d`` and its bf16 matmuls to a generic
GEMM: a bf16 step of the tiny recipe costs many times the fp32 step there, mostly in
``_slow_conv2d`` (docs/measurements.md, "The emulated CPU autocast"). This module computes the formula above with fp32 kernels instead: the inputs are
rounded to the autocast dtype and widened back (exact), the op runs in fp32 with autocast off,
and the output is rounded to the autocast dtype, as autocast's own output is. The backward
follows the same casts, so gradients are rounded to 16 bits where autocast rounds them:

    d rnd16(x).float() / dx  ->  grad.to(dtype16).to(x.dtype)

Measured on that CPU (one thread, the tiny UNet at batch 16): 1.7x the fp32 step instead of
10.8x; op by op the emulated and the native results agree in 99.99% of the elements bitwise and
differ by one unit in the last place in the rest (both are the correctly rounded exact value up to
the order of the fp32 sums; ``tests/training/test_emulated_autocast.py``). Attention is not
touched here: SDPA and the other kernels a flash-vs-baseline pair studies run as PyTorch runs them,
and the baseline's own products (``divergence.attention.reference.matmul``) follow the same
formula on a CPU, with fp32 kernels, by their own rule.

Only modules of exactly ``torch.nn.Conv2d`` and ``torch.nn.Linear`` are changed (their class is
swapped for a subclass whose ``forward`` applies the formula when CPU autocast is on; otherwise
the parent's ``forward`` runs unchanged, so fp32 steps, the probe and CUDA autocast are bitwise
as before). Weights, state dicts and checkpoints are unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MODES = ("emulate", "native")


def _cpu_autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The 16-bit dtype CPU autocast casts ``x``'s op to, or None when it is off (or not on a CPU)."""
    if x.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
        return None
    dtype = torch.get_autocast_dtype("cpu")
    return dtype if dtype in (torch.bfloat16, torch.float16) else None


def _widened(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``t`` rounded to ``dtype`` and widened back to fp32 (exact): differentiable."""
    return None if t is None else t.to(dtype).float()


class EmulatedConv2d(torch.nn.Conv2d):
    """``nn.Conv2d`` whose CPU-autocast forward is rnd16(conv_fp32(rnd16(x), rnd16(w), rnd16(b)))."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, C_in, H, W)
        dtype = _cpu_autocast_dtype(x)
        if dtype is None:
            return super().forward(x)
        with torch.autocast("cpu", enabled=False):
            y = self._conv_forward(_widened(x, dtype), _widened(self.weight, dtype), _widened(self.bias, dtype))
        return y.to(dtype)  # (B, C_out, H', W')


class EmulatedLinear(torch.nn.Linear):
    """``nn.Linear`` whose CPU-autocast forward is rnd16(linear_fp32(rnd16(x), rnd16(w), rnd16(b)))."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (..., in_features)
        dtype = _cpu_autocast_dtype(x)
        if dtype is None:
            return super().forward(x)
        with torch.autocast("cpu", enabled=False):
            y = F.linear(_widened(x, dtype), _widened(self.weight, dtype), _widened(self.bias, dtype))
        return y.to(dtype)  # (..., out_features)


_EMULATED = {torch.nn.Conv2d: EmulatedConv2d, torch.nn.Linear: EmulatedLinear}


def emulates_cpu_autocast(train) -> bool:
    """Whether an arm of ``train`` (a ``TrainConfig``) computes its CPU autocast with this module."""
    return train.precision != "32-true" and train.cpu_autocast == "emulate"


def emulate_cpu_autocast(model: torch.nn.Module) -> int:
    """Swap every ``nn.Conv2d`` and ``nn.Linear`` of ``model`` (exact types) for its emulated
    subclass; return how many modules now compute the emulated formula (already swapped included).

    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    >>> emulate_cpu_autocast(net), type(net[0]).__name__
    (2, 'EmulatedLinear')
    """
    count = 0
    for module in model.modules():
        if type(module) in _EMULATED:
            module.__class__ = _EMULATED[type(module)]
        count += isinstance(module, (EmulatedConv2d, EmulatedLinear))
    return count
