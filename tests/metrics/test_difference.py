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


@pytest.mark.parametrize("power", [-900, -600, 600, 1000])
def test_values_near_the_ends_of_float64_measure_like_the_same_values_near_1(power):
    """Values near 1e300 squared to inf, giving cosine 1.0 (true: -0.86), rel_l2 NaN and a
    non-finite warning for finite tensors. Scaling by 2^power is exact, so the scale-free metrics
    must be the same bits and the others the same bits times 2^power, tensor and model alike."""
    from divergence.metrics import summarize

    g = torch.Generator().manual_seed(3)
    a = torch.randn(3000, generator=g, dtype=torch.float64)
    b = a + 0.5 * torch.randn(3000, generator=g, dtype=torch.float64)
    base = compare_tensors(a, b)
    far = compare_tensors(a * 2.0**power, b * 2.0**power)
    assert far["nonfinite_a"] == far["nonfinite_b"] == 0
    assert far["cosine"] == base["cosine"] < 0.95 and far["rel_l2"] == base["rel_l2"]
    for key in ("wasserstein", "max_abs_diff", "mean_abs_diff", "rms_diff", "norm_a", "norm_b"):
        assert far[key] == math.ldexp(base[key], power), key
    records = [dict(r, dtype_a="float64", dtype_b="float64") for r in (base, far)]
    model, model_far = summarize(records[:1]), summarize(records[1:])
    assert model_far["tensors_nonfinite"] == 0
    assert model_far["cosine"] == model["cosine"] and model_far["rel_l2"] == model["rel_l2"]
    assert model_far["rms_diff"] == math.ldexp(model["rms_diff"], power)


def test_the_issue_case_three_values_near_1e300():
    a = torch.tensor([1e300, 2e300, -3e300], dtype=torch.float64)
    b = torch.tensor([1e300, -2e300, 3e300], dtype=torch.float64)
    record = compare_tensors(a, b)
    assert record["cosine"] == pytest.approx(-6 / 7, rel=1e-15)  # (1 - 4 - 9) / 14
    assert record["rel_l2"] == pytest.approx(math.sqrt(52 / 14), rel=1e-15)
    assert record["norm_a"] == pytest.approx(math.sqrt(14) * 1e300, rel=1e-15)


def test_a_tensor_with_one_chunk_near_1e300_adds_its_chunks_at_one_scale():
    """Chunks measured at different scales (one rescaled, the others not) are added at the largest:
    the same metrics as the whole tensor divided by 2^900 first, in one pass or split on threads."""
    from divergence.metrics.pair import compare_pairs
    from divergence.metrics.parallel import SPAN
    from divergence.metrics.tensors import CHUNK

    g = torch.Generator().manual_seed(4)
    n = max(3 * CHUNK, SPAN + CHUNK) + 5
    a = torch.randn(n, generator=g, dtype=torch.float64)
    b = a + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    a[CHUNK : 2 * CHUNK] *= 2.0**900
    b[CHUNK : 2 * CHUNK] *= 2.0**900
    scaled = compare_tensors(a * 2.0**-900, b * 2.0**-900)
    (record,) = compare_pairs([(a, b)])
    assert record["nonfinite_a"] == 0 and 0 < record["rel_l2"] < 0.2
    for key in ("cosine", "rel_l2"):
        assert record[key] == pytest.approx(scaled[key], rel=1e-12), key
    for key in ("rms_diff", "mean_abs_diff", "max_abs_diff", "norm_a"):
        assert record[key] == pytest.approx(math.ldexp(scaled[key], 900), rel=1e-12), key


@pytest.mark.parametrize("power", [-900, 0, 1000])
def test_the_torch_pass_a_gpu_runs_gives_the_numpy_pass_sums(power):
    """The pass a CUDA pair takes (``torch_chunk_sums``), run here on CPU tensors, rescales as the
    numpy pass does: the same k and sums equal to a few ulps (the two sum in different orders)."""
    from divergence.metrics.difference import DifferenceSums, chunk_sums, torch_chunk_sums
    from divergence.metrics.tensors import CHUNK

    g = torch.Generator().manual_seed(5)
    a = torch.randn(2 * CHUNK + 3, generator=g, dtype=torch.float64) * 2.0**power
    b = a + torch.randn(2 * CHUNK + 3, generator=g, dtype=torch.float64) * 2.0 ** (power - 3)
    on_torch = DifferenceSums.from_chunks(a.numel(), torch_chunk_sums(a, b))
    on_numpy = DifferenceSums.from_chunks(a.numel(), chunk_sums(a.numpy(), b.numpy()))
    assert on_torch.k == on_numpy.k == (0 if power == 0 else power + 3)
    for name in ("max_abs_diff", "mean_abs_diff", "rms_diff", "rel_l2", "cosine", "norm_a", "norm_b"):
        assert getattr(on_torch, name) == pytest.approx(getattr(on_numpy, name), rel=1e-12), name
