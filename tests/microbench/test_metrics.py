"""Error statistics, tested by their properties."""

import pytest
import torch

from divergence.microbench.metrics import bitwise_equal_fraction, error_stats


def test_identical_is_zero():
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    assert all(v == 0 for v in error_stats(x, x).values())
    assert bitwise_equal_fraction(x, x) == 1.0


def test_constant_shift_gives_its_size():
    # Every element off by c: max = mean = |c|, std = 0.
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    stats = error_stats(x + 0.25, x)
    assert stats["max_abs"] == pytest.approx(0.25) and stats["mean_abs"] == pytest.approx(0.25)
    assert stats["std_abs"] == pytest.approx(0.0, abs=1e-15)
    assert stats["max_rel"] == pytest.approx(0.25 / x.abs().max().item())


def test_permutation_invariant_and_symmetric():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(100, generator=g), torch.randn(100, generator=g)
    perm = torch.randperm(100, generator=g)
    assert error_stats(a[perm], b[perm]) == pytest.approx(error_stats(a, b))
    assert error_stats(a, b)["max_abs"] == error_stats(b, a)["max_abs"]


def test_std_is_population_std_of_abs_error():
    out, ref = torch.tensor([0.0, 0.0, 0.0, 0.0]), torch.tensor([1.0, -1.0, 3.0, -3.0])
    stats = error_stats(out, ref)
    assert stats["mean_abs"] == 2.0 and stats["std_abs"] == 1.0


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="shape"):
        error_stats(torch.zeros(3), torch.zeros(4))
