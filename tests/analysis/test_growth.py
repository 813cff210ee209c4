"""Growth rates and ratios: exact on exact data, recovered on noisy data, reproducible."""

import dataclasses

import numpy as np
import pytest

from divergence.analysis import compare_growth, estimate_growth, growth_rate, layer_mean, ols_slope
from tests.analysis.synthetic import LAYERS, make_pair, study_pairs


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


def test_ratio_recovers_known_ratios():
    study, precision, seed, _ = study_pairs(study=1e-4, precision=4e-4, seed_rate=1.25e-4)
    for reference, truth in ((precision, 0.25), (seed, 0.8)):
        r = compare_growth(study, reference, "wasserstein")
        assert r.reference_growing and r.estimate.lo < truth < r.estimate.hi
        assert r.estimate.value == pytest.approx(truth, rel=0.08)
        assert r.estimate.value == pytest.approx(r.study_rate / r.reference_rate)


def test_joint_bootstrap_keeps_the_correlation_between_pairs():
    # the reference is exactly twice the study, noise included: every joint replicate has
    # ratio 1/2, while independent draws would give a wide interval
    study = make_pair("a", "optimization", 1e-4, noise=0.3)
    double = {m: 2 * v for m, v in study.layer_values.items()}
    reference = dataclasses.replace(study, name="b", category="precision", layer_values=double)
    r = compare_growth(study, reference, "wasserstein")
    assert r.estimate.lo == pytest.approx(0.5) and r.estimate.hi == pytest.approx(0.5)


def test_ratio_uses_the_steps_both_pairs_reached():
    study = make_pair("a", "optimization", 1e-4, steps=range(0, 101, 10), finished=False, max_steps=200)
    reference = make_pair("b", "precision", 4e-4)
    r = compare_growth(study, reference, "wasserstein")
    assert r.estimate.n_steps == 11
    assert r.estimate.value == pytest.approx(0.25, rel=0.1)


def test_a_reference_that_does_not_grow_gives_no_interval():
    r = compare_growth(make_pair("a", "optimization", 1e-4), make_pair("b", "seed", 0.0, offset=0.01), "wasserstein")
    assert not r.reference_growing and np.isnan(r.estimate.value) and not r.estimate.defined


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
