"""The reordering yardstick on synthetic stores with known doses (docs/method.md): X against the
reordering reference R is log10(eps_X / eps_R), read with the dose ratio's window, median and t
interval, and each status follows from where its interval lies against +REORDERING_DEX. Where X
and R do not grow alike (a bug's E adds up linearly, a reordering's sits at its floor), no window
forms and the ratio is read over the valid steps, a status holding only with every step on its side."""

import dataclasses
import math
import re

import numpy as np
from scipy import stats

from divergence.analysis import analyze, to_summary
from divergence.analysis.reordering import NOT_ASKED, REORDERING_DEX, STATUSES, decide, method_text
from divergence.analysis.replicates import pool
from divergence.report.content import method
from tests.analysis.synthetic import FLOOR, bug_study, dose_study, dense_steps

FP32_EQUIVALENT_ARMS = {"a": ["adamw-impl=fused"], "b": ["adamw-impl=loop"]}  # registered, fp32-equivalent
KEYS = {"log10", "lo", "hi", "replicates", "status", "replicates_needed"}  # the contract


def _analysis(study, reordering, *, fp32_equivalent=False, replicates=4):
    pairs = dose_study(study=study, precision=1e-5, reordering=reordering, replicates=replicates, horizon=200)
    if fp32_equivalent:
        pairs = [
            dataclasses.replace(p, arms=FP32_EQUIVALENT_ARMS, expect_identity=True)
            if p.category == "optimization"
            else p
            for p in pairs
        ]
    return analyze(pairs, n_boot=50)


def _reordering(analysis):
    return to_summary(analysis)["verdicts"][0]["reordering"]


def test_a_pair_twice_a_reordering_is_reordering_like_and_the_dose_verdict_is_unchanged():
    # eps_X / eps_R = 2: log10 0.30, whose interval (per-replicate spread ~0.07 dex) ends far below +1
    with_r, without = _analysis(1e-8, 5e-9), _analysis(1e-8, None)
    r = _reordering(with_r)
    assert KEYS <= set(r) and r["status"] == "reordering_like" and r["replicates"] == 4
    assert abs(r["log10"] - math.log10(2)) < 0.1 and r["lo"] < r["log10"] < r["hi"] <= REORDERING_DEX
    assert r["replicates_needed"] is None and r["reference"] == "reordering" and r["read_on"] == "window"
    v, v0 = with_r.verdicts[0], without.verdicts[0]
    assert (v.status, v.dose.ratio) == (v0.status, v0.dose.ratio)  # the precision verdict is read as before
    before = v0.headline.removesuffix(" " + NOT_ASKED)
    assert v.headline.startswith(before + " Against a reordering of fp32 sums (4x4 vs 1x16 accumulation)")
    assert "reordering-like, no more than 10x a reordering." in v.headline


def test_a_pair_a_thousand_times_a_reordering_is_beyond_and_an_fp32_equivalent_one_says_look_for_a_bug():
    # eps_X / eps_R = 1000: log10 +3, lower end far above +1; still bounded against bf16 (-3 dex)
    plain, identity = _analysis(1e-8, 1e-11), _analysis(1e-8, 1e-11, fp32_equivalent=True)
    r = _reordering(identity)
    assert r["status"] == "beyond_reordering" and r["fp32_equivalent"] and r["lo"] > REORDERING_DEX
    assert abs(r["log10"] - 3.0) < 0.15 and identity.verdicts[0].status == "bounded"
    n = re.search(r"perturbs training (\d+)x more than a reordering of fp32 sums", identity.verdicts[0].headline)
    assert n and 10**2.85 < int(n.group(1)) < 10**3.15
    assert "if flash vs baseline should be the identity, look for a bug." in identity.verdicts[0].headline
    assert _reordering(plain)["status"] == "beyond_reordering" and not _reordering(plain)["fp32_equivalent"]
    assert "look for a bug" not in plain.verdicts[0].headline and "beyond reordering." in plain.verdicts[0].headline


def test_a_pair_ten_times_a_reordering_is_inconclusive_with_the_replicates_that_would_decide():
    # eps_X / eps_R = 10**1.05: the interval (+-0.11 dex at 4 replicates) holds +1
    r = _reordering(_analysis(10**1.05 * 1e-9, 1e-9, fp32_equivalent=True))
    assert r["status"] == "inconclusive" and r["lo"] <= REORDERING_DEX < r["hi"]
    values = [x["log10"] for x in r["per_replicate"]]
    s, gap = np.std(values, ddof=1), abs(np.mean(values) - REORDERING_DEX)
    expected = next(n for n in range(2, 1001) if stats.t.ppf(0.975, n - 1) * s / math.sqrt(n) < gap)
    assert expected > 4 and r["replicates_needed"] == expected
    headline = _analysis(10**1.05 * 1e-9, 1e-9).verdicts[0].headline
    assert f"inconclusive, the interval holds +1 dex (10x a reordering); about {expected} replicates would decide." in (
        headline
    )


def test_wandb_summary_keys_carry_the_reordering_reading():
    from divergence.report.wandb_log import flat_summary

    flat = flat_summary(to_summary(_analysis(1e-8, 5e-9)))
    assert flat["report/reordering/flash_vs_baseline/status"] == "reordering_like"
    assert flat["report/reordering/flash_vs_baseline/replicates"] == 4
    assert not any(k.startswith("report/reordering/") for k in flat_summary(to_summary(_analysis(1e-8, None))))


def test_without_a_reordering_reference_the_key_is_null_and_the_headline_and_warnings_say_it_was_not_asked():
    analysis = _analysis(1e-8, None)
    v = analysis.verdicts[0]
    assert v.reordering is None and v.headline.endswith(" " + NOT_ASKED)
    assert "Against a reordering" not in v.headline and NOT_ASKED.startswith("Bug or noise was not asked")
    summary = to_summary(analysis)
    assert summary["verdicts"][0]["reordering"] is None and NOT_ASKED in summary["warnings"]
    assert summary["settings"]["reordering_reference"] is None
    assert NOT_ASKED not in to_summary(_analysis(1e-8, 5e-9))["warnings"]


def test_one_replicate_reads_the_point_estimate_and_plans_nothing():
    r = _reordering(_analysis(1e-8, 1e-11, replicates=1))
    assert (r["status"], r["replicates"], r["lo"], r["hi"], r["replicates_needed"]) == (
        "beyond_reordering",
        1,
        None,
        None,
        None,
    )


def test_arms_bitwise_equal_are_reordering_like_and_a_zero_reordering_pair_gives_no_reading():
    pairs = dose_study(study=1e-8, precision=1e-5, reordering=1e-9, replicates=2, horizon=100)
    zero = [dataclasses.replace(p, rel_l2=np.zeros_like(p.rel_l2)) for p in pairs]
    equal = [z if p.category == "optimization" else p for p, z in zip(pairs, zero)]
    r = _reordering(analyze(equal, n_boot=50))
    assert r["status"] == "reordering_like" and r["log10"] is None and "bitwise equal" in r["reason"]
    flat = [z if p.category == "reordering" else p for p, z in zip(pairs, zero)]
    r = _reordering(analyze(flat, n_boot=50))
    assert r["status"] is None and r["reason"].startswith("reordering's arms are bitwise equal")


def test_the_threshold_is_one_constant_the_summary_and_the_method_text_state():
    assert REORDERING_DEX == 1.0 and STATUSES == ("reordering_like", "beyond_reordering", "inconclusive")
    assert to_summary(_analysis(1e-8, 5e-9))["settings"]["reordering_threshold_dex"] == REORDERING_DEX
    assert method_text() in method() and f"+{REORDERING_DEX:g} dex" in method_text()


def _bug(eps_x, *, fp32_equivalent=True, horizon=40):
    pairs = bug_study(eps_x, horizon=horizon)
    if fp32_equivalent:
        pairs = [
            dataclasses.replace(p, arms=FP32_EQUIVALENT_ARMS, expect_identity=True)
            if p.category == "optimization"
            else p
            for p in pairs
        ]
    analysis = analyze(pairs, n_boot=50)
    return _reordering(analysis), analysis.verdicts[0].headline


def test_a_bug_like_pair_growing_unlike_the_reordering_is_read_on_the_valid_steps_and_beyond_it():
    # E_X = 1e-5 t against a flat E_R = 1e-7: log10(E_X/E_R) = 2 + log10 t, +2.0 to +3.6 over steps 1-40,
    # no window (R does not grow); per replicate the median over the 24 tracked steps 1-20, 25, ..., 40 is
    # 2 + (log10 12 + log10 13) / 2 = +3.10 (within the replicates' amplitude, 0.05 dex each)
    r, headline = _bug(1e-5)
    valid = [t for t in dense_steps(40) if t >= 1]
    expected = math.log10(1e-5 / FLOOR) + float(np.median(np.log10(valid)))
    assert (r["status"], r["read_on"], r["replicates"], r["replicates_needed"]) == (
        "beyond_reordering",
        "valid_steps",
        3,
        None,
    )
    assert abs(r["log10"] - expected) < 0.2 and r["lo"] > REORDERING_DEX
    assert all(x["window"] == [1, 40] for x in r["per_replicate"])
    assert "read over the valid steps 1-40, as X and R do not grow alike): if flash vs baseline should be the " in (
        headline
    )
    assert headline.endswith("look for a bug.")
    # a pair 100x below it, also growing unlike R: reordering-like at every step
    r, headline = _bug(1e-9)
    assert (r["status"], r["read_on"]) == ("reordering_like", "valid_steps") and r["hi"] <= REORDERING_DEX
    assert "reordering-like, no more than 10x a reordering, as an fp32-equivalent transformation should be." in headline


def test_a_drifting_ratio_that_crosses_one_dex_is_inconclusive_whatever_its_median():
    # E_X = 10**0.2 1e-7 t: log10(E_X/E_R) = 0.2 + log10 t rises from +0.2 to +1.8, through +1 at t ~ 6;
    # its medians (~+1.3) alone would call it beyond reordering
    r, headline = _bug(10**0.2 * FLOOR)
    medians = [x["log10"] for x in r["per_replicate"]]
    assert decide(pool(medians)) == "beyond_reordering" and r["lo"] > REORDERING_DEX
    assert (r["status"], r["read_on"], r["replicates_needed"]) == ("inconclusive", "valid_steps", None)
    assert r["reason"].startswith("log10(E_X/E_R) crosses +1 dex over the valid steps (+0.")
    assert "inconclusive: log10(E_X/E_R) crosses +1 dex" in headline and "which more replicates do not decide" in (
        headline
    )


def test_too_few_valid_steps_give_no_reading_with_the_reason():
    # horizon 4: steps 1-4 valid, under MIN_WINDOW = 5
    r, headline = _bug(1e-5, horizon=4)
    assert r["status"] is None and r["read_on"] is None and r["log10"] is None
    assert "no reading: too few tracked steps" in headline


def test_a_reordering_yardstick_of_another_global_batch_is_a_caveat_naming_both():
    """A pair file fixes the yardstick's batch (4x4 vs 1x16) whatever the study's recipe sets: at another
    global batch it is a reordering of another training's sums, and the verdict says so."""
    from divergence.analysis.reordering import global_batch

    pairs = dose_study(study=1e-8, precision=1e-5, reordering=5e-9, replicates=2, horizon=200)
    batches = {"reordering": {"batch_size": 4, "accumulate": 4}, "flash-vs-baseline": {"batch_size": 32}}
    with_recipes = [dataclasses.replace(p, recipe={"train": batches.get(p.name, {"batch_size": 32})}) for p in pairs]
    (v,) = analyze(with_recipes, n_boot=20).verdicts
    assert (
        "the reordering yardstick reordering trained on a global batch of 16, flash-vs-baseline on 32: a reordering "
        "of another training's sums (give its arms grad-accumulation KxB with K x B = 32 to read it at this one)"
    ) in v.caveats
    same = [dataclasses.replace(p, recipe={"train": {"batch_size": 4, "accumulate": 4}}) for p in pairs]
    assert not any("global batch" in c for c in analyze(same, n_boot=20).verdicts[0].caveats)
    assert not any("global batch" in c for c in analyze(pairs, n_boot=20).verdicts[0].caveats)  # recipes silent
    # data-parallel replicas count, tensor-parallel ranks share theirs
    assert global_batch({"train": {"batch_size": 4, "devices": 4, "tensor_parallel": 2, "accumulate": 2}}) == 16
    assert global_batch({"train": {"batch_size": True}}) is None and global_batch({"train": "x"}) is None
