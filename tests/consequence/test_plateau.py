"""analysis.plateau: the step from which the seed pair's curves stay within their spread of the end."""

import pytest

from divergence.analysis.plateau import plateau, sentence


def test_a_curve_that_settles_plateaus_where_it_enters_the_final_spread_and_stays():
    # two arms: 0.1, 0.5, 0.7, 0.78, 0.8 (+-0.02 at the end: spread sqrt(2) * 0.02 = 0.028)
    arms = {
        "a": {0: 0.1, 100: 0.5, 200: 0.7, 300: 0.79, 400: 0.82},
        "b": {0: 0.1, 100: 0.5, 200: 0.7, 300: 0.77, 400: 0.78},
    }
    p = plateau(arms)
    assert p["final"] == pytest.approx(0.80) and p["spread"] == pytest.approx(0.0283, abs=1e-3)
    assert p["plateau_step"] == 300 and p["steps_within"] == 2 and p["arms"] == 2


def test_a_curve_that_leaves_the_band_again_plateaus_only_after_its_last_excursion():
    arms = {"a": {0: 0.8, 1: 0.5, 2: 0.8, 3: 0.81}, "b": {0: 0.8, 1: 0.5, 2: 0.8, 3: 0.79}}
    assert plateau(arms)["plateau_step"] == 2


def test_a_curve_still_moving_at_its_end_plateaus_only_there_and_says_so():
    arms = {"a": {0: 1.0, 1: 0.8, 2: 0.6}, "b": {0: 1.0, 1: 0.8, 2: 0.601}}
    p = plateau(arms)
    assert p["plateau_step"] == 2 and p["steps_within"] == 1
    assert "by step 2 (still moving at its last steps)" in sentence(p, p, 2)


def test_steps_not_every_arm_has_are_left_out_and_one_arm_says_nothing():
    p = plateau({"a": {0: 0.1, 5: 0.2, 10: 0.3}, "b": {0: 0.1, 10: 0.3}})
    assert p["steps"] == [0, 10]
    one = plateau({"a": {0: 0.1, 10: 0.3}})
    assert one["plateau_step"] is None and one["arms"] == 1
    assert "too few arms or steps" in sentence(one, one, 10)
