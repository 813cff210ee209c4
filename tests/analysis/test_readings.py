"""Which reading a verdict uses, on stores of real short runs (``tests/analysis/tiny_lm_runs.py``):
the growth-rate window where it forms in every replicate, else every valid step (``every_step``).

A fine-tune with a rounding-level fp32 optimizer change: both differences creep (nothing amplifies),
no window forms, and the curves say plainly that the change stays about 4 dex below bf16's at
every step: read as that bound. A gradient-accumulation bug that saturates within 6-13 steps keeps
every replicate in its reordering reading. Pairs that declare their change the identity
(``ArmWriter(expect_identity=True)``) under free-form labels get "look for a bug" beyond a
reordering and "as an fp32-equivalent transformation should be" within it.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from divergence.analysis import analyze, to_summary
from divergence.analysis.reordering import NOT_ASKED, REORDERING_DEX
from divergence.errors import UserInputError
from divergence.report.inputs import load_pairs
from divergence.writers import write_pair_files
from tests.analysis import tiny_lm_runs


@pytest.fixture(scope="module")
def finetune(tmp_path_factory):
    return load_pairs([tiny_lm_runs.finetune_study(tmp_path_factory.mktemp("finetune-lm"))])


@pytest.fixture(scope="module")
def accumulation(tmp_path_factory):
    root = tiny_lm_runs.accumulation_study(tmp_path_factory.mktemp("accumulation-lm"))
    return root, load_pairs([root])


def _largest_log_ratios(pairs, study: str, reference: str) -> list[float]:
    """Per replicate, the largest log10(E_X / E_P) over the steps both tracked with both E > 0."""
    out = []
    for x in (p for p in pairs if p.name == study):
        (p,) = [q for q in pairs if q.name == reference and q.replicate == x.replicate]
        _, i, j = np.intersect1d(x.steps, p.steps, return_indices=True)
        ok = (x.rel_l2[i] > 0) & (p.rel_l2[j] > 0)
        out.append(float(np.max(np.log10(x.rel_l2[i][ok] / p.rel_l2[j][ok]))))
    return out


def test_a_finetune_four_dex_below_bf16_reads_bounded_at_every_valid_step(finetune):
    analysis = analyze(finetune, n_boot=20)
    (v,) = analysis.verdicts
    largest = _largest_log_ratios(finetune, "loss-scale", "bf16-vs-fp32")
    assert all(-5.0 < m < -3.5 for m in largest)  # about 4 dex below bf16 at its closest
    assert (v.status, v.dose.read_on, v.dose.bound_side, v.dose.ratio.n) == ("bounded", "valid_steps", "below", 3)
    assert v.dose.ratio.mean == pytest.approx(np.mean(largest)) and v.dose.ratio.hi < 0
    assert (
        f"Bounded: loss-scale's difference is at most 10^{v.dose.ratio.mean:.1f} of bf16-vs-fp32's at every valid step"
        in (v.headline)
    )
    assert "valid steps 1-30 in every replicate; read on every valid step" in v.headline
    assert any("no replicate forms a growth-rate window" in c and "do not grow alike" in c for c in v.caveats)
    dose = to_summary(analysis)["verdicts"][0]["dose_ratio"]
    assert (dose["read_on"], dose["statistic"], dose["left_out"], dose["status"]) == (
        "valid_steps",
        "max",
        [],
        "bounded",
    )
    # no reordering pair: said once in the headline, and as a warning
    assert v.headline.endswith(" " + NOT_ASKED) and NOT_ASKED in analysis.warnings


def test_a_fast_saturating_bug_keeps_every_replicate_in_its_reordering_reading(accumulation):
    _, pairs = accumulation
    v = next(v for v in analyze(pairs, n_boot=20).verdicts if v.study == "ga-bug")
    r = v.reordering
    assert all(e.saturated_at is not None and e.saturated_at <= 15 for e in r.estimates)  # fast: at steps 6-13
    assert (r.status, r.read_on, r.ratio.n) == ("beyond_reordering", "valid_steps", 3)
    assert r.ratio.lo > REORDERING_DEX + 3  # some 5 dex above the reversed batch, at every step
    assert all(e.usable for e in r.estimates) and "left out" not in v.headline
    assert v.status == "not_bounded" and v.dose.read_on == "valid_steps"  # above bf16 too, at every valid step


def test_a_declared_identity_with_free_form_labels_says_look_for_a_bug_beyond_a_reordering(accumulation):
    root, pairs = accumulation
    saved = json.loads((root / "ga-bug-r0" / "pair.json").read_text())
    assert saved["expect_identity"] is True and saved["arms"]["a"] == ["loss=ga-buggy"]
    verdicts = {v.study: v for v in analyze(pairs, n_boot=20).verdicts}
    assert verdicts["ga-bug"].headline.endswith("if ga-bug should be the identity, look for a bug.")
    fix = verdicts["ga-fix"]
    assert fix.reordering.status == "reordering_like" and fix.reordering.fp32_equivalent
    assert fix.headline.endswith(
        "reordering-like, no more than 10x a reordering, as an fp32-equivalent transformation should be."
    )
    summary = to_summary(analyze(pairs, n_boot=20))
    assert [v["reordering"]["fp32_equivalent"] for v in summary["verdicts"]] == [True, True]
    # the same runs undeclared: the labels name no variant, so nothing is expected of them
    undeclared = [dataclasses.replace(p, expect_identity=None) for p in pairs]
    bug = next(v for v in analyze(undeclared, n_boot=20).verdicts if v.study == "ga-bug")
    assert bug.headline.endswith(": beyond reordering.") and "look for a bug" not in bug.headline


def test_expect_identity_is_a_bool_or_absent(tmp_path):
    assert "expect_identity" not in write_pair_files(tmp_path / "plain", max_steps=4)
    assert write_pair_files(tmp_path / "same", max_steps=4, expect_identity=True)["expect_identity"] is True
    with pytest.raises(UserInputError, match="expect_identity='yes': must be True"):
        write_pair_files(tmp_path / "bad", max_steps=4, expect_identity="yes")


@pytest.mark.parametrize(
    ("name", "expected"), [("reordering", True), ("flash-vs-baseline", None), ("bf16-vs-fp32", None)]
)
def test_the_builtin_trainer_declares_the_fp32_equivalent_variants_identity(name, expected):
    from divergence.training.pair_setup import pair_info
    from divergence.variants.pair_recipe import load_pair_recipe

    info = pair_info(load_pair_recipe(f"recipes/pairs/{name}.yaml"))
    assert info.expect_identity is expected and (("expect_identity" in info.to_json()) is bool(expected))


def test_a_replicate_left_out_of_a_window_reading_is_counted_in_its_sentence():
    """Replicate 0's X crosses P (10^-1 to 10^+1 of it, growing unlike it): no window there, and its valid
    steps lie on both sides of 0, so the other three are read on their windows and the headline counts it."""
    from tests.analysis.synthetic import dose_study

    pairs = dose_study(horizon=100)
    (p0,) = [p for p in pairs if p.category == "precision" and p.replicate == 0]
    crossing = p0.rel_l2 * 10 ** np.linspace(-1, 1, len(p0.rel_l2))
    pairs = [
        dataclasses.replace(p, rel_l2=crossing) if p.category == "optimization" and p.replicate == 0 else p
        for p in pairs
    ]
    v = analyze(pairs, n_boot=20).verdicts[0]
    assert (v.dose.read_on, v.dose.ratio.n) == ("window", 3) and ", 4 replicates," not in v.headline
    assert "3 replicates; 1 of 4 replicates left out (no window of 5 steps), window" in v.headline
    assert to_summary(analyze(pairs, n_boot=20))["verdicts"][0]["dose_ratio"]["left_out"] == [0]
