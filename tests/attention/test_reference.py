"""Baseline and golden attention: the formula, fp64 output, and chunking that changes nothing."""

import math

import torch
import torch.nn.functional as F

from divergence.attention import reference
from divergence.attention.reference import baseline_attention, golden_attention


def _qkv(lq=40, lk=40, d=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(2, 3, lq, d, generator=g, dtype=dtype),
        torch.randn(2, 3, lk, d, generator=g, dtype=dtype),
        torch.randn(2, 3, lk, d, generator=g, dtype=dtype),
    )


def test_baseline_is_the_textbook_formula():
    q, k, v = _qkv()
    expected = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1) @ v
    torch.testing.assert_close(baseline_attention(q, k, v), expected, rtol=0, atol=1e-15)


def test_causal_and_masks_match_sdpa_math():
    q, k, v = _qkv(lq=30, lk=30)
    torch.testing.assert_close(
        baseline_attention(q, k, v, causal=True), F.scaled_dot_product_attention(q, k, v, is_causal=True)
    )
    keep = torch.rand(30, 30, generator=torch.Generator().manual_seed(1)) > 0.3
    keep[:, 0] = True  # no fully masked row
    torch.testing.assert_close(
        baseline_attention(q, k, v, attn_mask=keep), F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    )


def test_golden_is_fp64_and_stays_fp64():
    q, k, v = _qkv(dtype=torch.bfloat16)
    gold = golden_attention(q, k, v)
    assert gold.dtype == torch.float64
    torch.testing.assert_close(gold, baseline_attention(q.double(), k.double(), v.double()), rtol=0, atol=0)


def test_chunking_query_rows_changes_no_bit(monkeypatch):
    q, k, v = _qkv(lq=37, lk=50, dtype=torch.bfloat16)
    whole = baseline_attention(q, k, v, causal=True)
    monkeypatch.setattr(reference, "_CHUNK_ELEMENTS", 2 * 3 * 50 * 4)  # 4 rows at a time
    assert torch.equal(baseline_attention(q, k, v, causal=True), whole)


def _ulps_apart(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """How many bf16 units in the last place apart each element of two bf16 tensors is (same sign)."""
    return (x.view(torch.int16).int() - y.view(torch.int16).int()).abs()


def test_a_bf16_product_on_a_cpu_is_the_native_16bit_gemm_up_to_the_order_of_fp32_sums():
    # the widened fp32 kernel against PyTorch's own bf16 GEMM (fp32 accumulation, rounded once)
    q, k, v = _qkv(lq=64, lk=64, d=8, dtype=torch.bfloat16)
    s = reference.matmul(q, k.transpose(-2, -1))
    assert s.dtype == torch.bfloat16
    # sums of 8 exact products: their fp32 rounding, in either order, stays below bf16's here
    assert torch.equal(s, torch.matmul(q, k.transpose(-2, -1)))
    p = torch.softmax(s, dim=-1)
    o, native = reference.matmul(p, v), torch.matmul(p, v)
    assert (o == native).float().mean() > 0.999
    assert _ulps_apart(o, native).max() <= 1


def test_under_cpu_autocast_the_product_is_rounded_to_autocast_s_format_and_so_is_its_gradient():
    a = torch.randn(4, 16, 8, dtype=torch.float32, requires_grad=True)
    b = torch.randn(4, 8, 16, dtype=torch.float32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mine = reference.matmul(a, b)
        theirs = torch.matmul(a, b)
    assert mine.dtype == theirs.dtype == torch.bfloat16
    assert torch.equal(mine, theirs)
    grad = torch.randn(4, 16, 16).bfloat16()
    (ga_mine,) = torch.autograd.grad(mine, a, grad)
    (ga_theirs,) = torch.autograd.grad(theirs, a, grad)
    assert ga_mine.dtype == torch.float32  # autocast's own cast back to the leaf's format
    assert _ulps_apart(ga_mine.bfloat16(), ga_theirs.bfloat16()).max() <= 1
    assert torch.equal(ga_mine, ga_mine.bfloat16().float())  # rounded to bf16 once, as autocast's


def test_fp32_and_fp64_products_are_torch_s_own_even_under_autocast():
    q, k, _ = _qkv(dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        gold = reference.matmul(q, k.transpose(-2, -1))
    assert gold.dtype == torch.float64
    assert torch.equal(gold, q @ k.transpose(-2, -1))
    x = q.float()
    assert torch.equal(reference.matmul(x, x.transpose(-2, -1)), x @ x.transpose(-2, -1))
