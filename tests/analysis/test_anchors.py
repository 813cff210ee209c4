"""The anchors' rules as published (analysis.anchors): torchtitan's --assert-equal on the logged losses, its
CI's step-1 rtol, Megatron's golden values and its compute_golden_statistics band."""

from divergence.analysis.anchors import (
    band_rtol,
    megatron_band,
    megatron_golden,
    titan_assert_equal,
    titan_step1_rtol,
)

BASE = {1: 4.0, 2: 3.5, 3: 3.0, 4: 2.8, 5: 2.6, 6: 2.5, 7: 2.4}


def test_titan_assert_equal_compares_the_logged_4_decimals():
    near = {s: v + 4e-5 for s, v in BASE.items()}  # prints the same at :7.4f
    assert titan_assert_equal(near, BASE) and not titan_assert_equal(near, BASE, decimals=None)
    assert not titan_assert_equal({**BASE, 3: 3.0001}, BASE)
    assert not titan_assert_equal({k: v for k, v in BASE.items() if k != 7}, BASE)  # the steps must match


def test_titan_step1_reads_the_first_step_only():
    assert titan_step1_rtol({**BASE, 1: 4.0 * (1 + 9e-6), 5: 9.0}, BASE)
    assert not titan_step1_rtol({**BASE, 1: 4.0 * (1 + 2e-5)}, BASE)


def test_megatron_golden_reads_every_5th_step_within_5_percent():
    assert megatron_golden({**BASE, 2: 9.0}, BASE)  # steps 1 and 6 are read (list indices 0 and 5)
    assert not megatron_golden({**BASE, 6: 2.5 * 1.06}, BASE)
    assert megatron_golden({**BASE, 6: 2.5 * 1.04}, BASE)


def test_megatron_band_is_1_5x_the_worst_spread_with_a_floor():
    assert band_rtol([BASE, BASE]) == 0.001  # identical repeats: the 0.1% floor
    wide = {s: v * 1.01 for s, v in BASE.items()}  # 1% apart: each 0.5% from the mean, x 1.5
    assert band_rtol([BASE, wide]) == round(1.5 * 0.01 / 2.01, 4)
    assert megatron_band({s: v * 1.006 for s, v in BASE.items()}, [BASE, wide])
    assert not megatron_band({s: v * 1.002 for s, v in BASE.items()}, [BASE, BASE])
