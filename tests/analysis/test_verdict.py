"""The verdict on synthetic stores with a known dose ratio (docs/method.md): right number, right status,
the same at every horizon; and every way a study cannot carry a verdict."""

import dataclasses
import math
import re

import numpy as np
import pytest

from divergence.analysis import analyze, to_summary
from tests.analysis.synthetic import dose_study

HORIZONS = (100, 200, 400, 800)


def verdict(**kwargs):
    analysis = analyze(dose_study(**kwargs), n_boot=100)
    assert len(analysis.verdicts) == 1
    return analysis.verdicts[0]


@pytest.mark.parametrize("probe", [True, False], ids=["probe", "weight-space"])
def test_recovers_the_dose_ratio_at_every_horizon_and_keeps_its_status(probe):
    # flash injects 1000x less per step than bf16: log10 = -3 while both grow alike, at any horizon
    verdicts = [verdict(study=1e-8, precision=1e-5, horizon=h, probe=probe) for h in HORIZONS]
    for h, v in zip(HORIZONS, verdicts):
        assert abs(v.dose.ratio.mean - (-3.0)) < 0.2, (h, v.dose)
        assert v.dose.ratio.lo < -3.0 < v.dose.ratio.hi and v.dose.ratio.n == 4
        assert v.status == "bounded", (h, v.headline)
        assert {e.space for e in v.dose.estimates} == {"function" if probe else "weight"}
        assert v.outcome.source == ("probe" if probe else "training")
    assert re.match(
        r"Bounded: flash vs baseline perturbs training 1\d\d\dx less than bf16 vs fp32 "
        r"\(log10 dose ratio -3\.\d\d, 95% CI -3\.\d\d to -[23]\.\d\d, 4 replicates",
        verdicts[0].headline,
    )


def test_the_window_ends_where_the_reference_saturates():
    # E_P = u / (1 + u), u = 1e-5 * exp(0.02 t), reaches 0.1 E_S at u = 1/9: t = ln(11111) / 0.02 ~ 466
    v = verdict(horizon=800)
    assert all(440 <= e.window[1] <= 480 for e in v.dose.estimates), [e.window for e in v.dose.estimates]
    # phi_P = F_P / F_S = K_F * 1e-5 * exp(0.02 t) reaches 0.1 at t = ln(5000) / 0.02 ~ 426
    assert all(e.t10["reference"] is not None and 410 <= e.t10["reference"] <= 450 for e in v.dose.estimates)
    # phi_X = K_F * 1e-8 * exp(0.02 t) reaches 0.1 only at ~771
    assert all(e.t10["study"] is not None and 750 <= e.t10["study"] <= 800 for e in v.dose.estimates)
    assert all(e.t50["study"] is None for e in v.dose.estimates)  # not reached by 800: censored
    assert v.dose.estimates[0].lam["reference"] == pytest.approx(0.02, rel=0.1)


@pytest.mark.parametrize("horizon", [100, 400])
def test_a_pair_ten_times_above_the_precision_dose_is_not_bounded(horizon):
    v = verdict(study=1e-4, precision=1e-5, horizon=horizon)
    assert v.status == "not_bounded" and abs(v.dose.ratio.mean - 1.0) < 0.2 and v.dose.ratio.lo > 0
    factor = float(re.search(r"perturbs training ([0-9.]+)x more than bf16 vs fp32", v.headline).group(1))
    assert 10**0.8 < factor < 10**1.2


def test_one_replicate_is_preliminary_with_what_the_point_estimates_say():
    v = verdict(replicates=1)
    assert v.status == "preliminary" and v.indicative == "bounded"
    assert v.dose.ratio.lo is None and v.dose.ratio.hi is None and abs(v.dose.ratio.mean + 3) < 0.2
    assert v.headline.startswith("Preliminary (single replicate, no interval): flash vs baseline perturbs")
    assert "The point estimates alone read bounded" in v.headline


def test_a_control_larger_than_the_pair_gives_no_verdict():
    v = verdict(study=1e-8, control=1e-7)
    assert v.status == "no_verdict" and v.floor < 1
    assert "control pair control (two identical arms) differs as much as or more than" in v.headline


def test_a_smaller_non_zero_control_is_the_floor_the_pair_is_stated_against():
    v = verdict(study=1e-8, control=1e-10)
    assert v.status == "bounded"
    n = float(re.search(r"deviation is ([0-9.e+]+) times the run-to-run floor of this hardware", v.headline).group(1))
    assert 50 < n < 200 and v.floor == pytest.approx(n, rel=0.05)  # eps_X / eps_C = 100


def test_an_exact_control_says_nothing_about_a_floor():
    v = verdict(control=0.0)
    assert v.floor is None and "floor" not in v.headline


def test_a_reference_saturated_from_the_start_gives_no_verdict_saying_what_was_measured():
    v = verdict(precision=0.5, horizon=100)  # E_P = 0.5 E_S at step 1: no step before it can be tracked
    assert v.status == "no_verdict" and "track earlier" not in v.headline
    assert "saturated at once: at step 1 bf16-vs-fp32's difference" in v.headline
    assert "only 0 step(s) come before it from step 1 (need 5), so no tracking gives a window" in v.headline
    assert "start from the same weights" not in v.headline  # this seed pair's arms start apart


def test_too_few_tracked_steps_is_named_as_the_cause():
    v = verdict(horizon=3)
    assert v.status == "no_verdict"
    assert "too few tracked steps" in v.headline and "share 3 tracked step(s)" in v.headline
    assert "track earlier and densely" in v.headline and "saturated" not in v.headline


def test_pairs_that_do_not_grow_alike_are_not_told_to_track_densely():
    """A reference that stays flat while the pair under study grows: tracked densely, the rates differ."""
    pairs = [
        dataclasses.replace(p, rel_l2=np.full(len(p.rel_l2), 1e-4)) if p.category == "precision" else p
        for p in dose_study()
    ]
    v = analyze(pairs, n_boot=100).verdicts[0]
    # below the flat reference at every valid step: read as the bound it is, the missing window said
    assert (v.status, v.dose.read_on, v.dose.bound_side) == ("bounded", "valid_steps", "below")
    (why,) = [c for c in v.caveats if c.startswith("read on every valid step")]
    assert "flash-vs-baseline and bf16-vs-fp32 do not grow alike" in why
    assert "at most 0 in a row (need 5)" in why and "track earlier" not in why


def test_no_precision_pair_gives_no_verdict():
    v = verdict(precision=None)
    assert v.status == "no_verdict" and "no precision pair" in v.headline


def test_a_ratio_that_drifts_is_not_dose_like():
    pairs = dose_study(horizon=200)
    pairs = [
        dataclasses.replace(p, rel_l2=p.rel_l2 * 10 ** (p.steps / 200)) if p.category == "optimization" else p
        for p in pairs
    ]  # X grows 0.0115/step faster than P: 1 dex across the window
    v = analyze(pairs, n_boot=100).verdicts[0]
    assert v.status == "inconclusive" and not v.dose.dose_like
    assert "is not dose-like" in v.headline and v.dose.drift > 0.5


def test_an_outcome_outside_the_seed_margin_is_not_bounded():
    pairs = dose_study(horizon=200)
    pairs = [
        dataclasses.replace(p, probe=p.probe | {"probe_loss_a": p.probe["probe_loss_b"] * 1.05})
        if p.category == "optimization"
        else p
        for p in pairs
    ]
    v = analyze(pairs, n_boot=100).verdicts[0]
    assert v.dose.ratio.hi < 0 and v.outcome.delta.mean == pytest.approx(0.05) and v.status == "not_bounded"


def test_no_seed_pair_leaves_the_outcome_undecided_and_the_status_to_the_dose():
    v = verdict(seed=False)
    assert v.outcome.status == "undecided" and any("no seed pair" in r for r in v.reasons)
    assert v.dose.status == "bounded" and v.status == "bounded" and "outcome undecided" in v.headline
    assert {e.space for e in v.dose.estimates} == {"weight"}  # phi needs the seed pair's F


def test_function_space_twin_agrees_on_the_synthetic_stores():
    v = verdict()
    assert abs(v.dose.function.mean - v.dose.ratio.mean) < 0.1 and not any("disagree" in c for c in v.caveats)


def test_summary_schema_2():
    analysis = analyze(dose_study(horizon=200), n_boot=100)
    summary = to_summary(analysis)
    assert summary["schema"] == 2
    v = summary["verdicts"][0]
    assert {"status", "headline", "dose_ratio", "outcome", "reasons"} <= set(v)
    assert set(v["dose_ratio"]) == {
        "reference",
        "metric",
        "log10",
        "lo",
        "hi",
        "replicates",
        "window",
        "common_start",
        "status",
        "replicates_needed",
        "read_on",
        "statistic",
        "left_out",
    }
    assert (v["dose_ratio"]["read_on"], v["dose_ratio"]["statistic"], v["dose_ratio"]["left_out"]) == (
        "window",
        "median",
        [],
    )
    assert v["dose_ratio"]["status"] == "bounded" and v["outcome"]["status"] == "within"
    assert set(v["dose_ratio"]["replicates_needed"]) == {"exclude_0", "exclude_0.3_dex"}
    assert 2 <= v["dose_ratio"]["replicates_needed"]["exclude_0.3_dex"] <= 4  # -3 dex, 4 tight replicates
    assert {"status", "replicates_needed", "margin_factor", "saturated"} <= set(v["outcome"])
    assert v["dose_ratio"]["reference"] == "bf16-vs-fp32" and v["dose_ratio"]["replicates"] == 4
    assert v["dose_ratio"]["window"][0] >= 1 and v["dose_ratio"]["window"][1] <= 200
    assert {"mean", "lo", "hi", "margin"} <= set(v["outcome"])
    assert v["lambda"]["reference"] == pytest.approx(0.02, rel=0.1)
    assert v["t10"]["study"]["censored"] == 4 and v["flatness"]["dose_like"] is True
    assert "legacy_slope_ratio" not in summary  # the horizon-dependent slope ratio is gone
    assert "flash-vs-baseline#3" in summary["pairs"] and summary["pairs"]["flash-vs-baseline#3"]["replicate"] == 3


def test_one_replicate_summary_has_no_interval():
    v = to_summary(analyze(dose_study(replicates=1, horizon=100), n_boot=100))["verdicts"][0]
    assert v["status"] == "preliminary" and v["dose_ratio"]["lo"] is None and math.isfinite(v["dose_ratio"]["log10"])


def test_no_pair_under_study_gives_no_verdict_but_a_warning():
    pairs = [p for p in dose_study(horizon=100) if p.category != "optimization"]
    analysis = analyze(pairs, n_boot=100)
    assert analysis.verdicts == () and any("no pair under study" in w for w in analysis.warnings)


def test_replicates_are_common_random_numbers_across_horizons():
    # the same replicate cut at a shorter horizon is the same run: the estimate only gains steps
    short, long = verdict(horizon=100), verdict(horizon=400)
    assert np.allclose([e.log10 for e in short.dose.estimates], [e.log10 for e in long.dose.estimates], atol=0.05)


def test_a_pair_whose_arms_stay_bitwise_equal_is_bounded_in_words():
    """Gradient checkpointing on CPU: E_X = 0 at every step, so log10(E_X/E_P) is -inf; said in words."""
    pairs = [
        dataclasses.replace(p, rel_l2=p.rel_l2 * 0) if p.category == "optimization" else p
        for p in dose_study(horizon=100)
    ]
    v = analyze(pairs, n_boot=100).verdicts[0]
    assert v.status == "bounded" and "does not perturb training at all" in v.headline
    assert to_summary(analyze(pairs, n_boot=100))["verdicts"][0]["dose_ratio"]["log10"] is None


def test_a_reference_that_never_drifts_and_a_pair_that_does_not_grow_are_named():
    pairs = dose_study(horizon=100)
    zero_ref = [dataclasses.replace(p, rel_l2=p.rel_l2 * 0) if p.category == "precision" else p for p in pairs]
    v = analyze(zero_ref, n_boot=100).verdicts[0]
    assert v.status == "no_verdict" and "cannot serve as the yardstick" in v.headline
    flat = [
        dataclasses.replace(p, rel_l2=np.full(len(p.steps), 1e-3)) if p.category == "optimization" else p for p in pairs
    ]
    v = analyze(flat, n_boot=100).verdicts[0]  # above P at every valid step: not bounded, read as a bound
    assert (v.status, v.dose.read_on, v.dose.bound_side) == ("not_bounded", "valid_steps", "above")
    assert "is at least 10^" in v.headline and any("does not grow over training" in c for c in v.caveats)


def test_no_control_and_an_unfinished_run_are_caveats():
    pairs = [
        dataclasses.replace(p, finished=False) if p.key == "flash-vs-baseline" else p
        for p in dose_study(horizon=100, control=None)
    ]
    v = analyze(pairs, n_boot=100).verdicts[0]
    assert v.status == "bounded"
    assert any("no control pair" in c for c in v.caveats) and any("is unfinished" in c for c in v.caveats)
