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
