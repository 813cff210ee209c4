"""Baseline attention and the fp64 golden value every implementation is measured against.

Baseline attention is the textbook formula, one operation at a time, each result stored in the
input's number format (as a PyTorch model computes it)::

    S = Q K^T * scale          (B, H, Lq, Lk)
    P = softmax(S, dim=-1)     (B, H, Lq, Lk)
    O = P V                    (B, H, Lq, D)

The golden value is the same formula in fp64 (Golden et al., "Is Flash Attention Stable?", 2024,
arXiv 2405.02803, section 3). Query rows are independent, so both are evaluated over chunks of
query rows to keep the (Lq, Lk) score matrix small; chunking changes no row's arithmetic.
"""

from __future__ import annotations

import math

import torch

# Score-matrix elements held at once (B*H*chunk*Lk); 2**25 floats is 128 MiB in fp32.
_CHUNK_ELEMENTS = 2**25
_HALF = (torch.float16, torch.bfloat16)


def baseline_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = False,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Standard attention ``softmax(Q K^T * scale) V`` in the inputs' number format.

    Parameters
    ----------
    q : (B, H, Lq, D) tensor
    k, v : (B, H, Lk, D) tensors, same dtype and device as ``q``
    scale : multiplier of the scores; ``None`` means ``1 / sqrt(D)``
    causal : mask key ``j > i`` for query ``i`` (top-left aligned, as SDPA's ``is_causal``)
    attn_mask : optional bool mask (True = keep) or additive float mask broadcastable to
        (B, H, Lq, Lk), as ``scaled_dot_product_attention`` takes it

    Returns
    -------
    (B, H, Lq, D) tensor in ``q.dtype``.

    Examples
    --------
    >>> q = torch.ones(1, 1, 2, 4); v = torch.arange(8.).view(1, 1, 2, 4)
    >>> baseline_attention(q, q, v)[0, 0, 0]   # equal scores: the mean of the values
    tensor([2., 3., 4., 5.])
    """
    scale = default_scale(q) if scale is None else scale
    lq, lk = q.shape[-2], k.shape[-2]
    rows = max(1, _CHUNK_ELEMENTS // max(1, q.shape[0] * q.shape[1] * lk))
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
    for r0 in range(0, lq, rows):
        r1 = min(lq, r0 + rows)
        s = matmul(q[..., r0:r1, :], k.transpose(-2, -1)) * scale  # (B, H, r, Lk)
        s = _apply_masks(s, r0, causal, attn_mask)
        p = torch.softmax(s, dim=-1)
        out[..., r0:r1, :] = matmul(p, v)
    return out


def golden_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = False,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The golden value: :func:`baseline_attention` on the inputs upcast to fp64.

    Shapes as in :func:`baseline_attention`; returns a (B, H, Lq, D) **fp64** tensor (not cast
    back), so the error of any implementation can be measured without rounding the reference.
    """
    scale = default_scale(q) if scale is None else scale
    if attn_mask is not None and attn_mask.is_floating_point():
        attn_mask = attn_mask.double()
    return baseline_attention(q.double(), k.double(), v.double(), scale=scale, causal=causal, attn_mask=attn_mask)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` in the operands' format: summed in fp32 (or wider), rounded once.

    A 16-bit product on a CPU (fp16 or bf16 operands, or CPU autocast to a 16-bit format, which
    casts fp32 operands as it casts ``torch.matmul``'s) is computed as GPUs and PyTorch's own
    16-bit GEMM compute it, with fp32 kernels:

        rnd16( rnd16(a) @ rnd16(b) )      (the exact products summed in fp32)

    PyTorch has no fast 16-bit GEMM on a CPU without AVX512-BF16/FP16 or AMX: its fallback is
    many times slower than fp32 for attention's shapes (docs/measurements.md, "Exact products on
    an AVX2 CPU"). Widening a 16-bit value to fp32
    is exact, so the two differ only in the order of the fp32 sums: at the tiny models' head dim
    8, Q K^T bitwise equal and P V in 99.99% of the elements, one unit in the last place in the rest
    (``tests/attention/test_reference.py``). Autograd follows the casts, so the gradients are
    16-bit products rounded once as well.
    """
    dtype = _cpu_16bit(a, b)
    if dtype is None:
        return torch.matmul(a, b)
    with torch.autocast("cpu", enabled=False):
        return torch.matmul(a.to(dtype).float(), b.to(dtype).float()).to(dtype)


def _cpu_16bit(a: torch.Tensor, b: torch.Tensor) -> torch.dtype | None:
    """The 16-bit format ``torch.matmul(a, b)`` computes in on a CPU (autocast's, else the operands'
    promoted format), or None for fp32, fp64 (which autocast leaves alone) and other devices."""
    if a.device.type != "cpu" or not (a.is_floating_point() and b.is_floating_point()):
        return None
    if torch.float64 in (a.dtype, b.dtype):
        return None
    if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") in _HALF:
        return torch.get_autocast_dtype("cpu")
    dtype = torch.promote_types(a.dtype, b.dtype)
    return dtype if dtype in _HALF else None


def default_scale(q: torch.Tensor) -> float:
    """``1 / sqrt(D)`` for a (..., D) query, SDPA's default."""
    return 1.0 / math.sqrt(q.shape[-1])


def _apply_masks(s: torch.Tensor, row0: int, causal: bool, attn_mask: torch.Tensor | None) -> torch.Tensor:
    """Mask a score block ``s`` (B, H, r, c) whose first row is query ``row0``, keys from 0."""
    if causal:
        s = _causal_fill(s, row0, 0)
    if attn_mask is not None:
        m = attn_mask[..., row0 : row0 + s.shape[-2], :] if attn_mask.shape[-2] > 1 else attn_mask
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.to(s.dtype)
    return s


def _causal_fill(s, first_row, first_col):
    """Set scores of keys after their query to -inf; ``s`` (B, H, rows, cols) from (row, col)."""
    rows = torch.arange(first_row, first_row + s.shape[-2], device=s.device)[:, None]
    cols = torch.arange(first_col, first_col + s.shape[-1], device=s.device)[None, :]
    return s.masked_fill(cols > rows, float("-inf"))
