"""flash-unbiased (Qiu and Yao's row-maximum change) and FlashAttention-2's backward pass."""

import pytest
import torch

from divergence.attention.kernels import get_kernel
from divergence.attention.reference import golden_attention
from divergence.attention.tiled import _unbiased_max, flash_attention_tiled
from divergence.attention.tiled_backward import flash_attention_tiled_backward
from divergence.errors import UserInputError


def _qkv(l=192, d=16, dtype=torch.float64, seed=0, heads=2):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, heads, l, d, generator=g, dtype=torch.float64).to(dtype) for _ in range(3)]


def test_the_adjusted_maximum_keeps_every_probability_below_one_only_where_scores_tie():
    s = torch.tensor([[2.0, 2.0, 1.0], [-1.0, -1.0005, -3.0], [3.0, 1.0, 0.0], [0.0, 0.0, -1.0]]).view(1, 1, 4, 1, 3)
    m = _unbiased_max(s, s.amax(dim=-1), 2.0, 1e-3)[0, 0, :, 0]
    assert m.tolist() == [4.0, 0.0, 3.0, 0.0]  # tied positive: 2m; tied negative: 0; single max: m
    p = (s[0, 0, :, 0] - m[:, None]).exp()
    assert float(p[:2].max()) < 1.0 and float(p[2].max()) == 1.0


def test_flash_unbiased_matches_flash_to_the_golden_tolerance_without_ties():
    q, k, v = _qkv()
    gold = golden_attention(q, k, v)
    for causal in (False, True):  # fp64: shift-invariance, the change is exact
        out = flash_attention_tiled(q, k, v, block_q=32, block_kv=64, causal=causal, unbiased=True)
        assert float((out - golden_attention(q, k, v, causal=causal)).abs().max()) < 1e-13
    for acc in (None, torch.float32):
        lo = [x.to(torch.bfloat16) for x in (q, k, v)]
        flash = flash_attention_tiled(*lo, block_q=32, block_kv=64, accumulate=acc)
        unbiased = flash_attention_tiled(*lo, block_q=32, block_kv=64, accumulate=acc, unbiased=True)
        tolerance = float((flash.double() - gold).abs().max())
        assert float((unbiased.double() - flash.double()).abs().max()) <= tolerance
    plain = flash_attention_tiled(q, k, v, block_q=32, block_kv=64)  # no two scores within 0: bitwise flash
    assert torch.equal(plain, flash_attention_tiled(q, k, v, block_q=32, block_kv=64, unbiased=True, tie_tol=0.0))


def test_on_tied_scores_the_change_moves_the_bf16_result_but_not_the_fp64_one():
    q, k, v = _qkv()
    k = k[..., torch.arange(192) % 4, :]  # four distinct keys: every row ties at its maximum
    gold = golden_attention(q, k, v)
    exact = flash_attention_tiled(q, k, v, block_q=32, block_kv=64, unbiased=True)
    assert float((exact - gold).abs().max()) < 1e-13
    lo = [x.to(torch.bfloat16) for x in (q, k, v)]
    assert not torch.equal(
        flash_attention_tiled(*lo, block_q=32, block_kv=64),
        flash_attention_tiled(*lo, block_q=32, block_kv=64, unbiased=True),
    )


@pytest.mark.parametrize("causal", [False, True])
def test_flashattention2_backward_in_fp64_is_the_golden_gradient(causal):
    q, k, v = _qkv(l=100)
    dout = _qkv(l=100, seed=1)[0]
    out, lse = flash_attention_tiled(q, k, v, block_q=16, block_kv=32, causal=causal, return_lse=True)
    grads = flash_attention_tiled_backward(q, k, v, out, lse, dout, causal=causal)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    golden = torch.autograd.grad(golden_attention(*leaves, causal=causal), leaves, dout)
    for mine, gold in zip(grads, golden):
        assert float((mine - gold).abs().max()) < 1e-12


def test_the_kernel_trains_its_gradients_come_from_the_flashattention2_backward():
    kernel = get_kernel("flash-unbiased", block_q=16, block_kv=32)
    assert kernel.options["accumulate"] is torch.float32 and kernel.options["unbiased"]
    q, k, v = (x.float().requires_grad_() for x in _qkv(l=64))
    kernel(q, k, v).sum().backward()
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    golden_attention(*leaves).sum().backward()
    for x, gold in zip((q, k, v), leaves):
        assert float((x.grad.double() - gold.grad).abs().max()) < 1e-4
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as a variant trains: autocast's 16-bit inputs
        q16 = q.detach().clone().requires_grad_()
        out = kernel(q16, k.detach(), v.detach())
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert q16.grad is not None and q16.grad.dtype == torch.float32 and bool(torch.isfinite(q16.grad).all())
    with pytest.raises(UserInputError, match="kernel 'flash-unbiased': unknown option 'tile'"):
        get_kernel("flash-unbiased", tile=4)
