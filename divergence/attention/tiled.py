"""A numerical re-implementation of the FlashAttention forward pass with its knobs exposed.

This is not a fast kernel: it reproduces the kernel's *arithmetic* so the number format, the
tile sizes and the accumulation precision can be changed one at a time (Golden et al., "Is Flash
Attention Stable?", 2024, section 3). For each key/value tile ``j`` of ``Bc`` rows, every query
row keeps a running max ``m``, a running sum ``l`` and an unnormalized output ``O``
(Dao, "FlashAttention-2", 2023, Algorithm 1)::

    S     = Q K_j^T * scale                 (rows, Bc)
    m'    = max(m, rowmax(S))
    P     = exp(S - m')                     (rows, Bc)
    alpha = exp(m - m')                     rescales what earlier tiles accumulated
    l     = alpha * l + rowsum(P)
    O     = alpha * O + P V_j               (rows, D)
    m     = m'
    output = O / l

Two precision modes:

- ``accumulate=None`` (the paper's): every operation's result is stored in the input format, so
  ``S``, ``m``, ``l``, ``O`` and ``P`` are all rounded to bf16 when the inputs are bf16. A matrix
  product still sums internally in fp32 and rounds once, as every GEMM engine (and the baseline)
  does.
- ``accumulate=torch.float32`` (kernel-faithful, as FlashAttention-2 and PyTorch's CPU flash
  kernel): ``S``, ``m``, ``l``, ``O`` are fp32; ``P`` is rounded to the input format only as the
  operand of ``P V``; ``rowsum(P)`` uses the unrounded fp32 ``P``.

``unbiased=True`` is the row-maximum change of Qiu and Yao ("Why Low-Precision Transformer
Training Fails: An Analysis on Flash Attention", arXiv 2510.04212, 2025, Algorithm 1): when a
tile's row maximum ``r`` is reached by more than one score (within ``tie_tol``), the max used in
the exponent is ``beta * r`` for ``r > 0`` and ``0`` for ``r < 0``, so every ``P`` is strictly
below 1 and the ``P V`` product loses the exact 1s whose low-precision rounding errs with one
sign. The running max is still ``m' = max(m, adjusted rowmax)``; softmax is shift-invariant, so
in exact arithmetic nothing changes (docs/method.md).

Only the loop over key/value tiles is sequential; batch, heads and query tiles are one tensor
operation, so a 16k-token sequence takes seconds on a CPU. Query rows whose tiles lie entirely
above the causal diagonal skip a key/value tile, as the kernel does; a fully masked tile would
leave ``m``, ``l`` and ``O`` exactly unchanged anyway.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from divergence.attention.blocks import ordered_tile
from divergence.attention.reference import _causal_fill, default_scale, matmul
from divergence.errors import UserInputError

# Elements held per step (scores and per-tile P V); larger problems are cut into groups of query
# tiles, which changes no row's arithmetic (rows are independent).
_STEP_ELEMENTS = 2**21
# Key columns scored by one matrix product: small tiles are batched so a 16x16 tiling is not
# thousands of tiny products. Batching changes no rounding (see _fold_tiles).
_GROUP_COLUMNS = 128


def flash_attention_tiled(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    block_q: int,
    block_kv: int,
    scale: float | None = None,
    causal: bool = False,
    accumulate: torch.dtype | None = None,
    block_order: str = "default",
    attn_mask: torch.Tensor | None = None,
    unbiased: bool = False,
    beta: float = 2.0,
    tie_tol: float = 1e-3,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention forward, tiled ``block_q`` x ``block_kv``, in a chosen precision.

    Parameters
    ----------
    q : (B, H, Lq, D) tensor
    k, v : (B, H, Lk, D) tensors, same dtype as ``q``
    block_q, block_kv : query rows (Br) and key/value rows (Bc) per tile, before ``block_order``
    scale : score multiplier, ``None`` for ``1 / sqrt(D)``
    causal : query ``i`` sees keys ``j <= i`` (top-left aligned, as SDPA's ``is_causal``)
    accumulate : ``None`` stores everything in ``q.dtype`` (the paper's mode); a dtype such as
        ``torch.float32`` keeps ``S``, ``m``, ``l`` and ``O`` in it (kernel-faithful mode)
    block_order : ``"default"``, ``"swapped"`` or ``"square"`` (see :mod:`.blocks`)
    attn_mask : optional bool (True = keep) or additive mask broadcastable to (B, H, Lq, Lk)
    unbiased : the row-maximum change (module docstring): ``flash-unbiased``
    beta : the multiplier of a tied positive row maximum (the paper uses 2 to 8)
    tie_tol : scores within ``tie_tol`` of their tile's row maximum count as tied with it
    return_lse : also return the logsumexp ``L = m + log(l)``, (B, H, Lq) in the accumulation
        format, which FlashAttention-2's backward pass recomputes ``P`` from

    Returns
    -------
    (B, H, Lq, D) tensor in ``q.dtype`` (and ``L`` when ``return_lse``).

    Examples
    --------
    In fp64 the tiling changes nothing but the order of rounding:

    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(1, 2, 100, 8, generator=g, dtype=torch.float64) for _ in range(3))
    >>> from divergence.attention.reference import golden_attention
    >>> out = flash_attention_tiled(q, k, v, block_q=16, block_kv=32)
    >>> bool((out - golden_attention(q, k, v)).abs().max() < 1e-14)
    True
    """
    block_q, block_kv = ordered_tile(block_q, block_kv, block_order)
    _check(q, k, v, block_q, block_kv, accumulate)
    acc = q.dtype if accumulate is None else accumulate
    scale = default_scale(q) if scale is None else scale
    b, h, lq, _ = q.shape
    lk, dv = k.shape[-2], v.shape[-1]
    mask = None if attn_mask is None else _additive_mask(attn_mask, b, h, lq, lk, acc)
    group = max(1, _GROUP_COLUMNS // block_kv)  # key/value tiles scored per matrix product
    per_row = b * h * group * (block_kv + dv)  # score and P V elements one query row holds
    rows_per_step = max(1, _STEP_ELEMENTS // per_row // block_q) * block_q
    out = torch.empty(b, h, lq, dv, dtype=q.dtype, device=q.device)
    lse = torch.empty(b, h, lq, dtype=acc, device=q.device)
    ka, va = k.to(acc), v.to(acc)
    change = (float(beta), float(tie_tol)) if unbiased else None
    for r0 in range(0, lq, rows_per_step):
        r1 = min(lq, r0 + rows_per_step)
        out[..., r0:r1, :], lse[..., r0:r1] = _forward_rows(
            q[..., r0:r1, :],
            ka,
            va,
            r0,
            block_q,
            block_kv,
            group,
            scale,
            causal,
            None if mask is None else mask[..., r0:r1, :],
            q.dtype,
            acc,
            change,
        )
    return (out, lse) if return_lse else out


def _forward_rows(q, ka, va, row0, block_q, block_kv, group, scale, causal, mask, dtype, acc, change=None):
    """Online softmax over all key/value tiles for query rows ``row0 .. row0 + len(q)``.

    ``q`` is (B, H, r, D) in the input format, ``ka``/``va`` (B, H, Lk, D) in ``acc``; rows are
    padded to whole query tiles (zeros: harmless, cut off at the end). Returns the (B, H, r, D)
    output and the (B, H, r) logsumexp.
    """
    b, h, r, _ = q.shape
    lk = ka.shape[-2]
    pad = -r % block_q
    qa = F.pad(q.to(acc), (0, 0, 0, pad))  # (B, H, rows, D), rows = r + pad
    if mask is not None:
        mask = F.pad(mask, (0, 0, 0, pad))
    rows = r + pad
    m = torch.full((b, h, rows, 1), float("-inf"), dtype=acc, device=q.device)
    l = torch.zeros((b, h, rows, 1), dtype=acc, device=q.device)
    o = torch.zeros((b, h, rows, va.shape[-1]), dtype=acc, device=q.device)
    width = group * block_kv
    for k0 in range(0, lk, width):
        k1 = min(lk, k0 + width)
        # Causal: query tiles whose last row is above key k0 see none of these keys; skip them.
        t0 = max(0, (k0 - row0) // block_q * block_q) if causal else 0
        if t0 >= rows:
            break
        s = matmul(qa[..., t0:, :], ka[..., k0:k1, :].transpose(-2, -1)) * scale
        if causal and k1 - 1 > row0 + t0:
            s = _causal_fill(s, row0 + t0, k0)
        if mask is not None:
            s = s + mask[..., t0:, k0:k1]
        state = _fold_tiles(
            s, va[..., k0:k1, :], block_kv, m[..., t0:, :], l[..., t0:, :], o[..., t0:, :], dtype, acc, change
        )
        m, l, o = (torch.cat([old[..., :t0, :], new], dim=-2) if t0 else new for old, new in zip((m, l, o), state))
    l = torch.where(l == 0, torch.ones_like(l), l)  # fully masked rows give 0, as the kernel
    lse = (m + l.log())[..., :r, 0]
    return (o / l)[..., :r, :].to(dtype), lse


def _fold_tiles(s, v, block_kv, m, l, o, dtype, acc, change=None):
    """Fold consecutive key/value tiles into the running ``m``, ``l``, ``o``; return the new ones.

    ``s``: (B, H, rows, W) scores of ``G = ceil(W / Bc)`` tiles; ``v``: (B, H, W, D).
    Everything that does not depend on the running state (tile maxima, ``P``, ``rowsum(P)``,
    ``P V``) is computed for all ``G`` tiles at once; the running max is their cumulative max,
    which is what the sequential update ``m' = max(m, rowmax(S))`` produces. Only the
    recurrences ``l = alpha l + rowsum(P)`` and ``O = alpha O + P V`` step tile by tile, with
    each step rounded exactly as in the one-tile-at-a-time algorithm. No operation is in
    place, so autograd can differentiate it (the ``tiled`` attention variant trains).
    """
    b, h, rows, width = s.shape
    tiles = -(-width // block_kv)
    extra = tiles * block_kv - width  # a short last tile: pad with keys that get P = 0 exactly
    s = F.pad(s, (0, extra), value=float("-inf")).view(b, h, rows, tiles, block_kv)
    v = F.pad(v, (0, 0, 0, extra)).view(b, h, tiles, block_kv, v.shape[-1])
    tile_max = s.amax(dim=-1)  # (B, H, rows, G)
    if change is not None:
        tile_max = _unbiased_max(s, tile_max, *change)
    running = torch.cummax(torch.cat([m, tile_max], dim=-1), dim=-1).values  # (B, H, rows, 1 + G)
    m_new = running[..., 1:]
    # A row with every score -inf so far keeps m = -inf; subtract 0 there to avoid inf - inf.
    m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    p = (s - m_safe.unsqueeze(-1)).exp()  # (B, H, rows, G, Bc)
    alpha = (running[..., :-1] - m_safe).exp()  # (B, H, rows, G)
    rowsum = p.sum(dim=-1)  # from the unrounded P in both modes, as the kernels do
    if acc != dtype:  # kernel-faithful: P enters P V in the input format
        p = p.to(dtype).to(acc)
    pv = matmul(p.transpose(2, 3), v)  # (B, H, G, rows, D)
    for g in range(tiles):
        l = l * alpha[..., g : g + 1] + rowsum[..., g : g + 1]
        o = o * alpha[..., g : g + 1] + pv[:, :, g]
    return m_new[..., -1:], l, o


def _unbiased_max(s, tile_max, beta, tie_tol):
    """Qiu and Yao's adjusted row maximum of each tile (arXiv 2510.04212, Algorithm 1, lines 7-9).

    ``s``: (B, H, rows, G, Bc) scores, ``tile_max``: (B, H, rows, G). Where more than one score
    of a tile row lies within ``tie_tol`` of its maximum ``r``: ``beta * r`` if ``r > 0``, ``0`` if
    ``r < 0`` (so ``exp(s - m) < 1`` for every score); elsewhere ``r`` unchanged.
    """
    ties = (s >= (tile_max - tie_tol).unsqueeze(-1)).sum(dim=-1) > 1
    adjusted = torch.where(
        tile_max > 0, tile_max * beta, torch.where(tile_max < 0, torch.zeros_like(tile_max), tile_max)
    )
    return torch.where(ties & torch.isfinite(tile_max), adjusted, tile_max)


def _additive_mask(mask, b, h, lq, lk, acc):
    """A bool (True = keep) or additive mask as an additive (B|1, H|1, Lq, Lk) tensor in acc."""
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    mask = mask.expand(mask.shape[0], mask.shape[1], lq, lk)
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=acc, device=mask.device).masked_fill(~mask, float("-inf"))
    return mask.to(acc)


def _check(q, k, v, block_q, block_kv, accumulate):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise UserInputError(
            f"flash_attention_tiled takes (B, H, L, D) tensors; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype) or not q.is_floating_point():
        raise UserInputError(f"q, k, v must share one floating dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    for name, size in (("block_q", block_q), ("block_kv", block_kv)):
        if not isinstance(size, int) or size < 1:
            raise UserInputError(f"{name} must be a positive integer, got {size!r}")
    if accumulate is not None and (not isinstance(accumulate, torch.dtype) or not accumulate.is_floating_point):
        raise UserInputError(f"accumulate must be None or a floating dtype such as torch.float32, got {accumulate!r}")
    if accumulate is not None and torch.finfo(accumulate).bits < torch.finfo(q.dtype).bits:
        raise UserInputError(
            f"accumulate={accumulate} is narrower than the inputs' {q.dtype}; accumulate in a format at least as wide"
        )


def num_rescalings(seq_len_kv: int, block_kv: int) -> int:
    """Online-softmax rescaling steps per query row: one per key/value tile after the first."""
    return max(0, math.ceil(seq_len_kv / block_kv) - 1)
