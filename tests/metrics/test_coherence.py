"""Coherence C(T): about sqrt(T) for an error sequence with a bias, about 1 for an unbiased one."""

import math

import pytest
import torch

from divergence.metrics.coherence import coherence, coherence_curve


def _errors(steps: int, bias: float, seed: int = 0, size: int = 1000) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    direction = torch.randn(size, generator=g, dtype=torch.float64)
    direction /= direction.norm()
    return [
        bias * direction + torch.randn(size, generator=g, dtype=torch.float64) / math.sqrt(size) for _ in range(steps)
    ]


def test_a_biased_sequence_reads_about_sqrt_t_and_an_unbiased_one_about_1():
    for steps in (16, 100):
        drifting = coherence(_errors(steps, bias=10.0))  # bias energy 100x the noise's
        wandering = coherence(_errors(steps, bias=0.0))
        assert drifting["coherence"] == pytest.approx(math.sqrt(steps), rel=0.05)
        assert wandering["coherence"] == pytest.approx(1.0, abs=0.2)
        assert drifting["mean_cos"] > 0.95 and abs(wandering["mean_cos"]) < 0.1
    # part bias, part noise: C^2 -> 1 + (T - 1) |b|^2 / (|b|^2 + s^2), here |b|^2 = s^2 = 1
    mixed = coherence(_errors(400, bias=1.0))["coherence"]
    assert mixed**2 == pytest.approx(1 + 399 / 2, rel=0.15)


def test_the_curve_ends_at_the_whole_sequence_and_bad_input_is_an_error():
    errors = _errors(10, bias=1.0)
    curve = coherence_curve(errors)
    assert curve[0] == pytest.approx(1.0) and curve[-1] == pytest.approx(coherence(errors)["coherence"])
    assert math.isnan(coherence([torch.zeros(3)] * 2)["coherence"])
    with pytest.raises(ValueError, match="differ in size"):
        coherence([torch.zeros(3), torch.zeros(4)])
    with pytest.raises(ValueError, match="at least one"):
        coherence([])
