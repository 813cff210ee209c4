"""The verdict on clear data (right words, right direction) and on each ambiguous case."""

import re

import pytest

from divergence.analysis import analyze, noise_floor, to_summary
from tests.analysis.synthetic import make_pair, study_pairs

NUM = r"[0-9.]+"


def verdict(**kwargs):
    analysis = analyze(study_pairs(**kwargs))
    assert len(analysis.verdicts) == 1
    return analysis.verdicts[0]


def test_bounded_sentence_matches_the_paper_form():
    v = verdict(study=1e-4, precision=4e-4, seed_rate=1.25e-4)
    assert v.status == "bounded" and v.reasons == () and v.caveats == ()
    pattern = (rf"Bounded: flash vs baseline drifts ({NUM})x \(({NUM})-({NUM})\) slower than fp16 vs fp32 and "
               rf"({NUM})x \(({NUM})-({NUM})\) the rate of a seed change, by Wasserstein distance\.")
    match = re.fullmatch(pattern, v.headline)
    assert match, v.headline
    slower, lo, hi, seed, seed_lo, seed_hi = map(float, match.groups())
    assert slower == pytest.approx(4.0, abs=0.3) and lo < 4 < hi  # 4x slower: 1 / (study / precision)
    assert seed == pytest.approx(0.8, abs=0.05) and seed_lo < 0.8 < seed_hi
    assert v.metrics["max_abs_diff"].status == "bounded"
    assert v.metrics["max_abs_diff"].sentence.endswith("by max difference")


def test_study_faster_than_low_precision_is_not_bounded_and_says_faster():
    v = verdict(study=8e-4, precision=2e-4, seed_rate=1e-3)
    assert v.status == "not_bounded"
    assert re.search(rf"drifts ({NUM})x \({NUM}-{NUM}\) faster than fp16 vs fp32", v.headline)
    assert float(re.search(rf"drifts ({NUM})x", v.headline).group(1)) == pytest.approx(4.0, abs=0.3)


def test_study_clearly_faster_than_a_seed_change_is_not_bounded():
    v = verdict(study=1e-4, precision=4e-4, seed_rate=2.5e-5)
    assert v.status == "not_bounded"
    assert re.search(rf"and ({NUM})x \(({NUM})-{NUM}\) the rate of a seed change", v.headline)


def test_comparable_to_a_seed_change_is_still_bounded():
    v = verdict(study=1e-4, precision=4e-4, seed_rate=1e-4)
    ratio = v.metrics["wasserstein"].ratios[1].estimate
    assert ratio.lo < 1 < ratio.hi and v.status == "bounded"


def test_overlapping_intervals_are_inconclusive():
    v = verdict(study=4e-4, precision=4.1e-4, seed_rate=1e-3)
    assert v.status == "inconclusive"
    assert v.headline.startswith("Inconclusive: flash vs baseline drifts")
    assert "the rate of fp16 vs fp32 (no detectable difference) and" in v.headline
    assert any("holds 1" in r for r in v.reasons)


def test_too_few_tracked_steps_give_no_verdict():
    names = ("flash-vs-baseline", "fp16-vs-fp32", "seed-vs-seed", "control")
    v = verdict(overrides={name: {"steps": range(0, 31, 10)} for name in names})
    assert v.status == "no_verdict"
    assert v.headline.startswith("No verdict: only 4 tracked steps shared by flash-vs-baseline and fp16-vs-fp32")


def test_control_not_zero_is_inconclusive_and_warned():
    analysis = analyze(study_pairs(control=1e-6))
    v = analysis.verdicts[0]
    assert v.status == "inconclusive" and any("control pair control is not zero" in r for r in v.reasons)
    assert not analysis.noise_floors[0].exact and analysis.noise_floors[0].first_nonzero_step == 10
    assert any("not exactly zero" in w for w in analysis.warnings)


def test_exact_control_is_the_noise_floor():
    floor = noise_floor(make_pair("control", "control", 0.0, noise=0.0))
    assert floor.exact and floor.peak == {"wasserstein": 0.0, "max_abs_diff": 0.0} and floor.first_nonzero_step is None


def test_missing_control_is_a_caveat_only():
    v = verdict(control=None)
    assert v.status == "bounded" and any("no control pair" in c for c in v.caveats)


@pytest.mark.parametrize("missing,reason", [("precision", "no precision pair"), ("seed_rate", "no seed pair")])
def test_a_missing_reference_pair_is_inconclusive(missing, reason):
    v = verdict(**{missing: None})
    assert v.status == "inconclusive" and any(reason in r for r in v.reasons)
    assert "drifts" in v.headline  # the comparison that can be made is still stated


def test_no_reference_pair_at_all_gives_no_verdict():
    v = verdict(precision=None, seed_rate=None)
    assert v.status == "no_verdict" and "no reference pair" in v.headline


def test_unfinished_runs_are_inconclusive():
    v = verdict(overrides={"fp16-vs-fp32": {"finished": False, "max_steps": 1000}})
    assert v.status == "inconclusive"
    assert any("fp16-vs-fp32 is unfinished (last step 200 of 1000)" in r for r in v.reasons)


def test_a_reference_that_does_not_grow_gives_no_verdict():
    v = verdict(seed_rate=0.0)
    assert v.status == "no_verdict" and "seed-vs-seed's Wasserstein distance does not clearly grow" in v.headline


def test_no_pair_under_study_gives_no_verdict_but_a_warning():
    analysis = analyze(study_pairs(study=None))
    assert analysis.verdicts == () and any("no pair under study" in w for w in analysis.warnings)


def test_summary_holds_every_number_of_the_verdict():
    analysis = analyze(study_pairs())
    summary = to_summary(analysis)
    v = summary["verdicts"][0]
    assert v["status"] == "bounded" and v["headline"] == analysis.verdicts[0].headline
    ratio = v["metrics"]["wasserstein"]["ratios"][0]
    assert ratio["reference"] == "fp16-vs-fp32" and ratio["lo"] < ratio["ratio"] < ratio["hi"]
    assert ratio["ratio"] == pytest.approx(ratio["study_rate"] / ratio["reference_rate"])
    g = summary["pairs"]["fp16-vs-fp32"]["growth_rate"]["wasserstein"]
    assert g["value"] == pytest.approx(ratio["reference_rate"])
    assert summary["pairs"]["control"]["top_layers"][0]["final_wasserstein"] == 0
    assert summary["noise_floor"][0]["exact"] is True
    assert summary["settings"]["bootstrap_replicates"] == 2000


def test_a_study_pair_that_does_not_drift_at_all_is_bounded_in_words():
    """Gradient checkpointing on CPU: the arms stay bitwise equal, so every ratio is exactly 0."""
    v = verdict(study=0.0, precision=4e-4, seed_rate=1.25e-4)
    assert v.status == "bounded"
    assert "drifts not at all, where fp16 vs fp32 does" in v.headline
    assert "0x (0-0) the rate of a seed change" in v.headline
