"""wasserstein against scipy (the oracle) and its defining properties."""

import numpy as np
import pytest
import scipy.stats
import torch

from divergence.metrics import wasserstein

RTOL = 1e-9


def _scipy(a, b):
    return scipy.stats.wasserstein_distance(np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel())


def _cases():
    rng = np.random.default_rng(0)
    n = 20_000
    yield "normal", rng.standard_normal(n), rng.standard_normal(n) * 1.1 + 0.05
    yield "heavy-tailed", rng.standard_cauchy(n), rng.standard_t(2, n)
    yield "constant", np.full(n, 0.25), np.full(n, -3.0)
    yield "ties", rng.integers(0, 5, n).astype(float), rng.integers(0, 7, n).astype(float)
    yield "nearly-equal", (x := rng.standard_normal(n)), x + 1e-7 * rng.standard_normal(n)
    yield "identical", (y := rng.standard_normal(n)), y.copy()
    yield "matrix", rng.standard_normal((64, 33)), rng.standard_normal((64, 33)) ** 3
    yield "tiny-scale", rng.standard_normal(n) * 1e-30, rng.standard_normal(n) * 2e-30


@pytest.mark.parametrize("name,a,b", list(_cases()), ids=[c[0] for c in _cases()])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_agrees_with_scipy(name, a, b, dtype):
    ta, tb = torch.from_numpy(a).to(dtype), torch.from_numpy(b).to(dtype)
    if not (torch.isfinite(ta).all() and torch.isfinite(tb).all()):
        pytest.skip("values overflow this dtype")
    # the oracle sees exactly the values the tensors hold
    expected = _scipy(ta.double().numpy(), tb.double().numpy())
    assert wasserstein(ta, tb) == pytest.approx(expected, rel=RTOL, abs=0 if expected else 1e-300)


def test_numpy_input_and_return_type():
    a, b = np.arange(10.0, dtype=np.float32), np.arange(10.0, dtype=np.float32)[::-1] + 2
    result = wasserstein(a, b)
    assert type(result) is float and result == pytest.approx(2.0)


def test_unequal_sizes_use_the_cdf_form():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(1000), rng.standard_normal(1500) + 0.3
    assert wasserstein(a, b) == pytest.approx(_scipy(a, b), rel=RTOL)


def test_properties():
    """identical -> 0; shift by c -> |c|; permutation invariant; symmetric."""
    x = torch.randn(5000, dtype=torch.float64)
    assert wasserstein(x, x) == 0.0
    assert wasserstein(x, x + 0.75) == pytest.approx(0.75, rel=1e-12)
    assert wasserstein(x, x[torch.randperm(x.numel())]) == 0.0
    y = torch.randn(5000, dtype=torch.float64)
    assert wasserstein(x, y) == wasserstein(y, x)


def test_nonfinite_returns_nan_not_an_exception():
    a = torch.tensor([0.0, float("nan"), 1.0])
    assert np.isnan(wasserstein(a, torch.zeros(3)))
    assert np.isnan(wasserstein(torch.zeros(3), torch.tensor([float("inf"), 0, 0])))


def test_empty_is_an_error():
    with pytest.raises(ValueError, match="at least one value"):
        wasserstein(torch.zeros(0), torch.zeros(3))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensor_sorted_on_gpu():
    a, b = torch.randn(100_000, device="cuda"), torch.randn(100_000, device="cuda")
    assert wasserstein(a, b) == pytest.approx(_scipy(a.cpu().numpy(), b.cpu().numpy()), rel=RTOL)
