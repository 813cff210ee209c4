"""torchao's INT8 matmul on a CPU, computed exactly with fp32 kernels (the ``int8-mixed`` arms).

torchao's INT8 mixed-precision training (``torchao.prototype.quantized_training``) quantizes a
linear layer's operands rowwise to int8 and computes, without Triton,

    out = _int_mm(A, B) * col_scale * row_scale        A: (M, K) int8, B: (K, N) int8

where ``torch._int_mm`` sums the int8 products in int32. On a CPU without AVX512-VNNI (or AMX)
PyTorch's ``_int_mm`` is a generic loop, many times slower than an fp32 GEMM of the same shape
(docs/measurements.md, "Exact products on an AVX2 CPU").

The int32 sum is exact, and so is an fp32 GEMM of the same int8 values while no partial sum
leaves the integers fp32 holds exactly (|n| <= 2**24): every product is at most 128 * 128 = 2**14
in magnitude, so any K <= 2**10 keeps every partial sum, in any order and with or without fused
multiply-adds, within 2**24. Beyond that fp64 holds them (K <= 2**39). The product is then the
same integers as ``_int_mm``'s, converted to fp32 exactly as ``_int_mm(A, B) * col_scale``
converts them, so the layer's output and gradients are bitwise those of torchao's own path
(``tests/models/test_int8_matmul.py``). On other devices torchao's function runs unchanged.
"""

from __future__ import annotations

import torch

EXACT_IN_FP32 = 2**10  # the longest int8 dot product whose every partial sum fp32 holds exactly


def exact_int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch._int_mm(a, b)`` of int8 ``a`` (M, K) and ``b`` (K, N) as exact float products:
    fp32 for K <= ``EXACT_IN_FP32``, else fp64; returns (M, N) in that float format.

    >>> a = torch.full((1, 1024), -128, dtype=torch.int8)
    >>> exact_int_mm(a, a.T).item() == 2**24, exact_int_mm(a.repeat(1, 2), a.T.repeat(2, 1)).dtype
    (True, torch.float64)
    """
    wide = torch.float32 if a.shape[-1] <= EXACT_IN_FP32 else torch.float64
    return a.to(wide) @ b.to(wide)


def scaled_int8_mm(a: torch.Tensor, b: torch.Tensor, row_scale: torch.Tensor, col_scale: torch.Tensor):
    """torchao's ``scaled_int8_mm`` with the int8 product from :func:`exact_int_mm` on a CPU."""
    if a.device.type != "cpu":
        return _TORCHAO[0](a, b, row_scale, col_scale)
    # _int_mm's int32 times the scales promotes to the scales' format (fp32, or bf16 under autocast)
    dtype = torch.promote_types(torch.int32, col_scale.dtype)
    product = exact_int_mm(a, b)
    if product.dtype == torch.float64:
        product = product.to(torch.int32)
    return product.to(dtype) * col_scale.view(-1) * row_scale.view(-1, 1)


_TORCHAO: list = []  # torchao's own scaled_int8_mm, once replaced


def use_exact_cpu_int8_mm() -> None:
    """Make torchao's INT8 mixed-precision training call :func:`scaled_int8_mm` (once per process)."""
    from torchao.prototype.quantized_training import int8_mixed_precision as torchao_int8

    if not _TORCHAO:
        _TORCHAO.append(torchao_int8.scaled_int8_mm)
        torchao_int8.scaled_int8_mm = scaled_int8_mm
