"""Two answers, each decided on its own (docs/method.md, "The two answers"): the dose from its interval, the outcome
from its interval against the seed margin; the status follows the dose, a shifted outcome makes it not
bounded, an undecided one is said with the replicates that would decide it."""

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from divergence.analysis import analyze, to_summary
from divergence.analysis.replicates import pool, replicates_to_clear
from divergence.report.content import notes
from tests.analysis.synthetic import dose_study

SEED_DELTAS = (0.02, -0.02, 0.01, -0.01)  # sigma_S = 0.0183: margin m = 0.0091, saturated 0.0183
SIGMA_S = float(np.std(SEED_DELTAS, ddof=1))


def _with_deltas(pairs, study_deltas, seed_deltas=SEED_DELTAS):
    """The pairs with each replicate's final probe-loss difference Delta set exactly."""
    deltas = {"optimization": study_deltas, "seed": seed_deltas}
    out = []
    for p in pairs:
        if p.category in deltas:
            d = deltas[p.category][p.replicate]
            p = dataclasses.replace(p, probe=p.probe | {"probe_loss_a": p.probe["probe_loss_b"] * (1 + d)})
        out.append(p)
    return out


def _verdict(pairs):
    return analyze(pairs, n_boot=50).verdicts[0]


def _needed(values, gap):
    """The replicates count by brute force: the first n whose t half-width at this spread is under gap."""
    s = np.std(values, ddof=1)
    return next(n for n in range(2, 1000) if stats.t.ppf(0.975, n - 1) * s / math.sqrt(n) < gap)


def test_an_outcome_inside_the_margin_is_within():
    v = _verdict(_with_deltas(dose_study(horizon=200), [0.001, -0.001, 0.0005, -0.0005]))
    assert v.outcome.margin == pytest.approx(0.5 * SIGMA_S) and not v.outcome.saturated
    assert (v.dose.status, v.outcome.status, v.status) == ("bounded", "within", "bounded")
    assert "outcome within the seed margin" in v.headline and v.outcome.replicates_needed is None


def test_a_shifted_outcome_makes_a_bounded_dose_not_bounded_and_is_said():
    v = _verdict(_with_deltas(dose_study(horizon=200), [0.05, 0.051, 0.049, 0.05]))
    assert (v.dose.status, v.outcome.status, v.status) == ("bounded", "shifted", "not_bounded")
    assert v.headline.startswith("Not bounded:") and "outcome shifted: final probe-loss difference +5%" in v.headline
    summary = to_summary(analyze(_with_deltas(dose_study(horizon=200), [0.05, 0.051, 0.049, 0.05]), n_boot=50))
    assert summary["verdicts"][0]["dose_ratio"]["status"] == "bounded"
    assert summary["verdicts"][0]["outcome"]["status"] == "shifted"


def test_an_undecided_outcome_says_how_many_replicates_decide_and_leaves_the_status_to_the_dose():
    m = 0.5 * SIGMA_S
    deltas = [0.9 * m, -0.5 * m, 0.6 * m, -0.2 * m]
    v = _verdict(_with_deltas(dose_study(horizon=200), deltas))
    expected = _needed(deltas, m - abs(np.mean(deltas)))
    assert expected > 4  # the four replicates there are do not decide
    assert (v.outcome.status, v.outcome.replicates_needed) == ("undecided", expected)
    assert (v.dose.status, v.status) == ("bounded", "bounded")  # undecided alone is not inconclusive
    assert "outcome undecided: final probe-loss difference" in v.headline
    assert f"about {expected} replicates would decide" in v.headline
    outcome = to_summary(analyze(_with_deltas(dose_study(horizon=200), deltas), n_boot=50))["verdicts"][0]["outcome"]
    assert (outcome["status"], outcome["replicates_needed"], outcome["margin_factor"]) == ("undecided", expected, 0.5)


def test_a_saturated_pair_is_held_to_a_seed_changes_spread_not_half_of_it():
    deltas = [0.008, -0.008, 0.004, -0.004]  # 95% interval +-0.0116: over 0.5 sigma_S, under sigma_S
    pairs = _with_deltas(dose_study(horizon=200), deltas)
    unsaturated = _verdict(pairs)
    assert (unsaturated.outcome.status, unsaturated.outcome.saturated) == ("undecided", False)

    def saturate(p):  # phi = F_X / F_S = 1 at the last tracked step: a different-seed model by the end
        seed = next(s for s in pairs if s.category == "seed" and s.replicate == p.replicate)
        f = p.probe["probe_rel_diff"].copy()
        f[-1] = seed.probe["probe_rel_diff"][-1]
        return dataclasses.replace(p, probe=p.probe | {"probe_rel_diff": f})

    v = _verdict([saturate(p) if p.category == "optimization" else p for p in pairs])
    assert v.outcome.saturated and v.outcome.margin == pytest.approx(SIGMA_S) and v.outcome.margin_factor == 1.0
    assert (v.outcome.status, v.status) == ("within", "bounded")
    assert "outcome no larger than a seed change's" in v.headline and "a seed change's spread" in v.headline
    assert v.dose.ratio.mean == pytest.approx(unsaturated.dose.ratio.mean)  # the dose reads the same window


def test_an_inconclusive_dose_says_how_many_replicates_would_exclude_zero():
    offsets = (-0.35, 0.1, -0.3, 0.05)  # each replicate's plateau, around a dose ratio of 1

    def spread(p):
        return (
            dataclasses.replace(p, rel_l2=p.rel_l2 * 10 ** offsets[p.replicate]) if p.category == "optimization" else p
        )

    pairs = [spread(p) for p in dose_study(study=1e-5, precision=1e-5, horizon=200)]
    analysis = analyze(pairs, n_boot=50)
    v = analysis.verdicts[0]
    zero = _needed(v.dose.ratio.values, abs(v.dose.ratio.mean))
    assert (v.dose.status, v.status) == ("inconclusive", "inconclusive") and zero > 4
    assert v.dose.replicates_needed["exclude_0"] == zero
    assert f"the interval holds 0; about {zero} replicates would exclude it" in v.headline
    assert any(f"would exclude 0 from {zero} replicates" in n for n in notes(v))
    dose = to_summary(analysis)["verdicts"][0]["dose_ratio"]
    assert dose["status"] == "inconclusive" and dose["replicates_needed"]["exclude_0"] == zero
    # |mean| < 0.3 dex: no number of replicates puts the interval beyond +-0.3 at this mean
    assert abs(v.dose.ratio.mean) < 0.3 and dose["replicates_needed"]["exclude_0.3_dex"] is None
    side = "below -0.3" if v.dose.ratio.mean < 0 else "above +0.3"
    assert any(f"not lie {side} dex (a factor 2) from any number, its mean being within it" in n for n in notes(v))


@pytest.mark.parametrize("values,gap", [((-0.33, -0.56, -0.04), 0.31), ((1.0, 1.2, 0.9, 1.1), 0.5), ((0.1, 0.4), 0.05)])
def test_replicates_to_clear_is_the_first_count_whose_half_width_is_under_the_gap(values, gap):
    p = pool(values)
    n = replicates_to_clear(p, gap)
    s = np.std(values, ddof=1)
    half = lambda k: stats.t.ppf(0.975, k - 1) * s / math.sqrt(k)  # noqa: E731
    assert half(n) < gap and (n == 2 or half(n - 1) >= gap)
    assert replicates_to_clear(p, 0.0) is None and replicates_to_clear(pool(values[:1]), gap) is None
