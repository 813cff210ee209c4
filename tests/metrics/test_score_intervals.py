"""Wilson's interval and the bootstrap over sampling seeds of a sample score."""

import pytest
import torch

from divergence.metrics.score_intervals import paired_seed_bootstrap, seed_bootstrap, wilson_interval


@pytest.mark.parametrize(
    ("hits", "total", "expected"),
    # Wilson's 95% interval as published (Newcombe 1998, Table I: 81/263; Brown, Cai & DasGupta)
    [(0, 10, (0.0, 0.2775)), (5, 10, (0.2366, 0.7634)), (81, 263, (0.2553, 0.3662)), (10, 10, (0.7225, 1.0))],
)
def test_wilson_interval_matches_published_values(hits, total, expected):
    assert wilson_interval(hits, total) == pytest.approx(expected, abs=5e-4)
    low, high = wilson_interval(hits, total)
    assert low <= hits / total <= high


def test_wilson_interval_refuses_impossible_counts():
    with pytest.raises(ValueError, match="hits, total"):
        wilson_interval(11, 10)
    with pytest.raises(ValueError, match="confidence"):
        wilson_interval(1, 10, confidence=1.0)


def test_seed_bootstrap_brackets_the_rate_within_the_seeds_range():
    gen = torch.Generator().manual_seed(0)
    hits = torch.rand(8, 50, generator=gen) < torch.linspace(0.2, 0.8, 8)[:, None]  # seeds of unequal rates
    rate, low, high = seed_bootstrap(hits)
    per_seed = hits.double().mean(dim=1)
    assert rate == pytest.approx(float(per_seed.mean()))
    assert float(per_seed.min()) <= low < rate < high <= float(per_seed.max())
    assert seed_bootstrap(hits) == (rate, low, high)  # seeded: the same interval every call


def test_equal_seeds_have_no_spread_and_identical_arms_no_difference():
    hits = torch.tensor([[True, False, True, True]] * 5)
    assert seed_bootstrap(hits) == pytest.approx((0.75, 0.75, 0.75))
    assert paired_seed_bootstrap(hits, hits) == pytest.approx((0.0, 0.0, 0.0))


def test_paired_bootstrap_resamples_both_arms_together():
    """Arm a hits exactly one caption more than arm b on every seed: the difference is that one
    caption's share whatever the seeds' own rates, because both arms are resampled together."""
    gen = torch.Generator().manual_seed(1)
    b = torch.rand(6, 10, generator=gen) < torch.linspace(0.1, 0.6, 6)[:, None]
    b[:, 0] = False
    a = b.clone()
    a[:, 0] = True
    assert paired_seed_bootstrap(a, b) == pytest.approx((0.1, 0.1, 0.1))
    with pytest.raises(ValueError, match="shapes differ"):
        paired_seed_bootstrap(a, b[:, :5])
