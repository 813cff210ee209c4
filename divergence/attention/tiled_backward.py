"""FlashAttention-2's backward pass in a chosen precision, and an autograd function around it.

FlashAttention-2 (Dao, 2023, Algorithm 2) stores only the output ``O`` and the logsumexp
``L = m + log(l)`` of the forward pass and recomputes the probabilities from them::

    delta = rowsum(dO * O)                      (rows,)   from the stored, rounded O
    P     = exp(S - L),  S = Q K^T * scale      (rows, Lk)
    dV    = P^T dO
    dP    = dO V^T
    dS    = P * (dP - delta)
    dQ    = dS K * scale,   dK = dS^T Q * scale

``delta`` is where a biased error of the stored ``O`` enters every gradient (Qiu and Yao, arXiv
2510.04212, 2025, section 3.2: "failure is linked to the computation of delta"), which autograd
through the forward's operations would not reproduce: it differentiates ``o / l`` before the
output is rounded. So the microbenchmark's and the ``flash-unbiased`` variant's gradients come
from this function, not from autograd.

Precision modes as in :mod:`.tiled`: ``accumulate=None`` stores every result in the input
format (matrix products sum in fp32 and round once); ``accumulate=torch.float32`` (the kernel's)
keeps ``S``, ``P``, ``dP``, ``dS``, ``delta`` and the gradient accumulators in fp32 and rounds
``P`` and ``dS`` to the input format only as operands of the matrix products, as the kernel's
tensor-core GEMMs take them. The key/value tiles of the kernel change only the summation order
of fp32 accumulators, so rows are processed in chunks of whole rows (docs/method.md).
"""

from __future__ import annotations

import torch

from divergence.attention.reference import _causal_fill, default_scale, matmul
from divergence.attention.tiled import _additive_mask, flash_attention_tiled

_CHUNK_ELEMENTS = 2**22  # score elements held per chunk of query rows


def flash_attention_tiled_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = False,
    accumulate: torch.dtype | None = None,
    attn_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dQ, dK, dV)`` in ``q.dtype`` from the forward's ``out`` and ``lse`` (module docstring).

    ``q`` (B, H, Lq, D), ``k``/``v`` (B, H, Lk, D), ``out``/``dout`` (B, H, Lq, D) in the input
    format, ``lse`` (B, H, Lq) as :func:`~.tiled.flash_attention_tiled` returns it.

    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v, do = (torch.randn(1, 1, 40, 8, generator=g, dtype=torch.float64) for _ in range(4))
    >>> o, lse = flash_attention_tiled(q, k, v, block_q=8, block_kv=16, return_lse=True)
    >>> dq, dk, dv = flash_attention_tiled_backward(q, k, v, o, lse, do)
    >>> _ = q.requires_grad_(); from divergence.attention.reference import golden_attention
    >>> (golden_attention(q, k, v) * do).sum().backward()
    >>> bool((dq - q.grad).abs().max() < 1e-12)
    True
    """
    dtype = q.dtype
    acc = dtype if accumulate is None else accumulate
    scale = default_scale(q) if scale is None else scale
    b, h, lq, _ = q.shape
    lk = k.shape[-2]
    mask = None if attn_mask is None else _additive_mask(attn_mask, b, h, lq, lk, acc)
    rows = max(1, _CHUNK_ELEMENTS // max(1, b * h * lk))
    delta = (dout.to(acc) * out.to(acc)).sum(dim=-1, keepdim=True).to(acc)  # (B, H, Lq, 1)
    dq = torch.empty_like(q)
    dk = torch.zeros(k.shape, dtype=acc, device=q.device)
    dv = torch.zeros(v.shape, dtype=acc, device=q.device)
    for r0 in range(0, lq, rows):
        r1 = min(lq, r0 + rows)
        qc, doc = q[..., r0:r1, :], dout[..., r0:r1, :]
        s = _mm(qc, k.transpose(-2, -1), dtype, acc) * scale
        if causal:
            s = _causal_fill(s, r0, 0)
        if mask is not None:
            s = s + mask[..., r0:r1, :]
        p = (s - lse[..., r0:r1, None].to(acc)).exp()  # masked scores give exp(-inf) = 0
        dv = dv + _mm(p.transpose(-2, -1), doc, dtype, acc)
        dp = _mm(doc, v.transpose(-2, -1), dtype, acc)
        ds = p * (dp - delta[..., r0:r1, :])
        dq[..., r0:r1, :] = (_mm(ds, k, dtype, acc) * scale).to(dtype)
        dk = dk + _mm(ds.transpose(-2, -1), qc, dtype, acc) * scale
    return dq, dk.to(dtype), dv.to(dtype)


def _mm(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, acc: torch.dtype) -> torch.Tensor:
    """A matrix product whose operands are in ``dtype`` and whose result is in ``acc``: rounded
    once to the input format when ``acc`` is it, else the exact products summed in ``acc``."""
    if acc == dtype:
        return matmul(a.to(dtype), b.to(dtype))
    return torch.matmul(a.to(dtype).to(acc), b.to(dtype).to(acc))


class TiledFlashAttention(torch.autograd.Function):
    """:func:`~.tiled.flash_attention_tiled` forward, :func:`flash_attention_tiled_backward`
    backward: a trainable FlashAttention whose gradients see the stored output's rounding."""

    @staticmethod
    def forward(ctx, q, k, v, attn_mask, options: dict):
        with torch.autocast(q.device.type, enabled=False):  # the kernel does its own rounding
            out, lse = flash_attention_tiled(q, k, v, attn_mask=attn_mask, return_lse=True, **options)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.attn_mask = attn_mask
        ctx.backward_options = {
            key: options[key] for key in ("scale", "causal", "accumulate") if options.get(key) is not None
        }
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        with torch.autocast(q.device.type, enabled=False):
            grads = flash_attention_tiled_backward(
                q, k, v, out, lse, dout.to(q.dtype), attn_mask=ctx.attn_mask, **ctx.backward_options
            )
        return (*grads, None, None)


def trainable_flash_attention(q, k, v, *, scale=None, causal=False, attn_mask=None, **options) -> torch.Tensor:
    """Kernel-call form (as :mod:`.kernels` calls kernels) of :class:`TiledFlashAttention`.

    Under autocast the inputs are cast to its 16-bit format first, as autocast casts SDPA's;
    otherwise to their common dtype.
    """
    if torch.is_autocast_enabled(q.device.type):
        dtype = torch.get_autocast_dtype(q.device.type)
    else:
        dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    return TiledFlashAttention.apply(q, k, v, attn_mask, {"scale": scale, "causal": causal, **options})
