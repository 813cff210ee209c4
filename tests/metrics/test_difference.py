"""Elementwise difference metrics against numpy in float64, and their edge cases."""

import math

import numpy as np
import pytest
import torch

from divergence.metrics import compare_tensors, cosine, max_abs_diff, mean_abs_diff, rel_l2, rms_diff


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_against_numpy(dtype):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(300, 70, generator=g).to(dtype)
    b = (a.double() + 0.01 * torch.randn(300, 70, generator=g, dtype=torch.float64)).to(dtype)
    x, y = a.double().numpy().ravel(), b.double().numpy().ravel()
    d = x - y
    assert max_abs_diff(a, b) == pytest.approx(np.abs(d).max(), rel=1e-12)
    assert mean_abs_diff(a, b) == pytest.approx(np.abs(d).mean(), rel=1e-12)
    assert rms_diff(a, b) == pytest.approx(np.sqrt((d * d).mean()), rel=1e-12)
    assert rel_l2(a, b) == pytest.approx(np.linalg.norm(d) / np.linalg.norm(x), rel=1e-12)
    assert cosine(a, b) == pytest.approx(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)), rel=1e-12)


def test_docstring_examples():
    assert max_abs_diff([1.0, 2.0], [1.5, 0.0]) == 2.0
    assert mean_abs_diff([1.0, 2.0], [1.5, 0.0]) == 1.25
    assert rel_l2([3.0, 4.0], [3.0, 0.0]) == pytest.approx(0.8)
    assert cosine([1.0, 0.0], [1.0, 1.0]) == pytest.approx(math.sqrt(0.5))


def test_zero_tensors():
    z = torch.zeros(4)
    assert rel_l2(z, z) == 0.0 and cosine(z, z) == 1.0
    assert rel_l2(z, torch.ones(4)) == math.inf
    assert cosine(z, torch.ones(4)) == 0.0


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shapes differ"):
        max_abs_diff(torch.zeros(2, 3), torch.zeros(3, 2))


def test_record_counts_nonfinite_and_never_raises():
    a = torch.tensor([1.0, float("nan"), float("inf"), 2.0])
    record = compare_tensors(a, torch.ones(4))
    assert record["nonfinite_a"] == 2 and record["nonfinite_b"] == 0
    assert all(math.isnan(record[m]) for m in ("wasserstein", "max_abs_diff", "rel_l2"))


def test_record_is_float64_exact_for_low_precision_inputs():
    a = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    b = torch.tensor([1.0078125, 2.0], dtype=torch.bfloat16)  # one bf16 ulp at 1.0
    record = compare_tensors(a, b)
    assert record["max_abs_diff"] == 0.0078125
    assert type(record["wasserstein"]) is float


def test_an_empty_pair_has_no_difference():
    """0 elements: nothing differs, so every difference is 0 and cosine 1 (the issue's case: NaN,
    counted as a tensor holding NaN/inf). It weighs nothing in an aggregate."""
    from divergence.metrics import summarize

    empty = compare_tensors(torch.zeros(0, 3), torch.ones(0, 3))
    assert empty["numel"] == 0 and empty["nonfinite_a"] == empty["nonfinite_b"] == 0
    assert [empty[m] for m in ("wasserstein", "max_abs_diff", "mean_abs_diff", "rms_diff", "rel_l2")] == [0.0] * 5
    assert empty["cosine"] == 1.0 and empty["norm_a"] == empty["norm_b"] == 0.0
    full = compare_tensors(torch.tensor([1.0, 2.0]), torch.tensor([1.5, 0.0]))
    with_empty, without = summarize([full, empty]), summarize([full])
    assert with_empty["tensors_nonfinite"] == 0 and with_empty["tensors"] == 2
    assert {k: v for k, v in with_empty.items() if k != "tensors"} == {
        k: v for k, v in without.items() if k != "tensors"
    }
    alone = summarize([empty])
    assert alone["max_abs_diff"] == alone["wasserstein"] == alone["rel_l2"] == 0.0 and alone["cosine"] == 1.0
