"""Growth rates: exact on exact data, recovered on noisy data, reproducible."""

import numpy as np
import pytest

from divergence.analysis import estimate_growth, growth_rate, layer_mean, ols_slope
from tests.analysis.synthetic import LAYERS, make_pair


def test_ols_slope_of_a_line_and_of_constant_x():
    x = np.array([0.0, 10, 20, 30])
    assert ols_slope(x, 3 * x + 7) == pytest.approx(3.0)
    assert np.isnan(ols_slope([5, 5, 5], [1, 2, 3]))  # no spread in x: no slope


def test_growth_rate_is_the_numel_weighted_mean_of_layer_slopes():
    # OLS is linear in y, so the slope of the weighted mean is the weighted mean of the slopes
    rng = np.random.default_rng(0)
    steps = np.arange(0, 100, 7)
    values = rng.random((5, len(steps))).cumsum(axis=1)
    weights = np.array([1.0, 10, 100, 3, 7])
    slopes = [float(ols_slope(steps, v)) for v in values]
    assert growth_rate(steps, values, weights) == pytest.approx(np.average(slopes, weights=weights))


def test_growth_rate_is_the_slope_of_the_whole_model_wasserstein():
    # the store's whole-model Wasserstein is the numel-weighted layer mean: the same curve
    pair = make_pair("p", "optimization", 2e-4)
    assert np.allclose(layer_mean(pair, "wasserstein"), pair.model["wasserstein"])
    g = estimate_growth(pair, "wasserstein")
    assert g.value == pytest.approx(float(ols_slope(pair.steps, pair.model["wasserstein"])))


@pytest.mark.parametrize("rate", [1e-5, 3e-4, 2e-2])
def test_recovers_a_known_rate_with_an_interval_around_it(rate):
    pair = make_pair("p", "optimization", rate, noise=0.05, seed=3)
    for metric, scale in (("wasserstein", 1), ("max_abs_diff", 3)):  # synthetic max = 3 * W
        g = estimate_growth(pair, metric)
        assert g.value == pytest.approx(scale * rate, rel=0.05)
        assert g.lo < scale * rate < g.hi
        assert g.hi - g.lo < 0.2 * scale * rate  # 12 layers x 21 steps of 5% noise: a tight interval
        assert (g.n_steps, g.n_layers, g.n_boot) == (21, len(LAYERS), 2000)


def test_no_noise_gives_a_degenerate_interval():
    g = estimate_growth(make_pair("p", "optimization", 1e-3, noise=0.0), "wasserstein")
    assert g.value == pytest.approx(1e-3) and g.lo == pytest.approx(1e-3) and g.hi == pytest.approx(1e-3)


def test_relative_trajectory_starts_at_zero():
    pair = make_pair("s", "seed", 1e-4, offset=0.01, noise=0.0)
    assert pair.model["wasserstein"][0] == pytest.approx(0.01)
    rel = pair.relative("wasserstein")
    assert rel[0] == 0 and rel[-1] == pytest.approx(1e-4 * 200)


def test_bootstrap_is_seeded_and_reproducible():
    pair = make_pair("p", "optimization", 1e-4)
    first, again = estimate_growth(pair, "wasserstein", seed=0), estimate_growth(pair, "wasserstein", seed=0)
    other = estimate_growth(pair, "wasserstein", seed=1)
    assert first == again
    assert other.value == first.value and (other.lo, other.hi) != (first.lo, first.hi)


def test_non_finite_layers_are_left_out():
    pair = make_pair("p", "optimization", 1e-4, nan_layer=0)
    g = estimate_growth(pair, "wasserstein")
    assert g.n_layers == len(LAYERS) - 1 and g.value == pytest.approx(1e-4, rel=0.05)
