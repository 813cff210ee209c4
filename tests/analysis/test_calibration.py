"""calibration.evaluate on a synthetic ladder of known doses: it passes where the statistic is
dose-like and fails where it is not; the equivalent dose of a studied pair."""

import math
import re

import pytest

from divergence.analysis.reordering import NOT_ASKED
from divergence.analysis import analyze
from divergence.analysis.calibration import equivalent_dose, evaluate, place_reference, recipe_identity
from tests.analysis.synthetic import dose_pair, dose_study

DOSES = (0.0, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5)
RECIPE = {"model": {"seed": 3, "unet": {"block_out_channels": [32]}}, "train": {"max_steps": 300, "lr": 1e-3}}


def ladder(dose_of=lambda eps: eps, replicates=4, horizon=300):
    return {
        eps: [
            dose_pair(f"grad-noise-{eps:g}", "optimization", dose_of(eps), replicate=r, horizon=horizon, recipe=RECIPE)
            for r in range(replicates)
        ]
        for eps in DOSES
    }


def seeds(replicates=4, horizon=300):
    return [dose_pair("seed-vs-seed", "seed", 0.0, replicate=r, horizon=horizon) for r in range(replicates)]


@pytest.fixture(scope="module")
def calibration():
    return evaluate(ladder(), seeds())


def test_a_dose_like_ladder_passes_every_criterion(calibration):
    criteria = calibration["criteria"]
    assert set(criteria) == {
        "monotone",
        "slope",
        "horizon_stability",
        "recovery",
        "coverage",
        "synthetic_bounded",
        "synthetic_not_bounded",
    }
    failed = {k: c for k, c in criteria.items() if not c["pass"]}
    assert not failed and calibration["passed"]
    assert 0.85 <= criteria["slope"]["value"] <= 1.15 and criteria["recovery"]["value"] <= 0.2
    assert criteria["synthetic_bounded"]["value"] == {"100": "bounded", "300": "bounded"}
    assert calibration["anchor_eps"] == 1e-7 and [d["eps"] for d in calibration["doses"]] == list(DOSES[1:])
    assert calibration["reference_exact"] is True  # eps = 0: a and b identical
    assert calibration["recipe"] == recipe_identity(RECIPE)


def test_a_ladder_that_is_not_dose_like_fails(calibration):
    # E grows like eps^0.5: ranks kept, but the slope is 0.5 and the ratios are not recovered
    bad = evaluate(ladder(lambda eps: 1e-7 * (eps / 1e-7) ** 0.5), seeds())
    assert bad["criteria"]["monotone"]["pass"]
    assert not bad["criteria"]["slope"]["pass"] and bad["criteria"]["slope"]["value"] == pytest.approx(0.5, abs=0.1)
    assert not bad["criteria"]["recovery"]["pass"] and not bad["passed"]


def test_recovery_is_checked_above_the_arithmetic_floor():
    """Rounding acts as a dose f of its own (E ~ eps + f): the lowest dose measures f, and recovery
    is checked where f adds at most 0.04 dex (the tiny recipe: f ~ 1e-6 against a ladder from 1e-6)."""
    floored = evaluate(ladder(lambda eps: eps + 2e-9 if eps else 0.0), seeds())
    recovery = floored["criteria"]["recovery"]
    assert recovery["floor_eps"] == pytest.approx(2e-9, rel=0.15)  # the synthetic ladder has its noise
    assert recovery["below_floor"] == [1e-9, 1e-8] and recovery["doses"] == [1e-7, 1e-6, 1e-5]
    assert recovery["pass"] and recovery["value"] < 0.02  # 1e-7 is 2e-9 above its truth: 0.009 dex


def test_a_ladder_without_a_floor_checks_every_dose(calibration):
    recovery = calibration["criteria"]["recovery"]
    assert recovery["floor_eps"] < 1e-10 and recovery["below_floor"] == [] and len(recovery["doses"]) == 5


def test_horizons_beyond_the_runs_are_evaluated_at_the_last_step():
    short = evaluate(ladder(replicates=3, horizon=150), seeds(3, 150), horizons=(100, 300))
    assert short["horizons_used"] == [100, 150] and "horizon 300 exceeds the runs' 150 steps" in short["notes"][0]


def test_equivalent_dose_places_a_studied_pair_on_the_ladder(calibration):
    # a reference P of dose 1e-5 and X at 1e-8: X perturbs like a gradient noise of ~1e-8
    reference = [dose_pair("bf16-vs-fp32", "precision", 1e-5, replicate=r, horizon=300) for r in range(4)]
    placed = place_reference(calibration, reference, (1, 200))
    assert placed["references"]["bf16-vs-fp32"]["log10_vs_anchor"] == pytest.approx(2.0, abs=0.15)
    eps = equivalent_dose(placed, -3.0, "bf16-vs-fp32")
    assert abs(math.log10(eps) - (-8)) < 0.2
    assert equivalent_dose(calibration, -3.0, "unknown-pair") is None


def test_the_report_states_the_equivalent_dose_for_the_same_recipe(calibration):
    pairs = [p.__class__(**{**p.__dict__, "recipe": RECIPE}) for p in dose_study(horizon=300)]
    v = analyze(pairs, n_boot=100, calibration=calibration).verdicts[0]
    assert abs(math.log10(v.dose.equivalent) - (-8)) < 0.25
    headline = v.headline.removesuffix(" " + NOT_ASKED)  # no reordering pair: the line the headline ends with
    assert re.search(r"It perturbs training like a relative gradient noise of (9e-09|1e-08) per step\.$", headline)
    other = analyze(dose_study(horizon=300), n_boot=100, calibration=calibration).verdicts[0]
    assert other.dose.equivalent is None and any("another recipe" in c for c in other.caveats)


def test_the_report_states_the_references_own_dose_and_the_floor(calibration):
    """The precision reference placed on the ladder is a dose too (1e-5 here), and the floor is said."""
    from divergence.analysis.calibration import reference_doses
    from divergence.report.content import calibration_text

    pairs = [p.__class__(**{**p.__dict__, "recipe": RECIPE}) for p in dose_study(horizon=300)]
    precision = [p for p in pairs if p.category == "precision"]
    placed = place_reference(calibration, precision, None)
    placed["criteria"] = {**placed["criteria"], "recovery": {**placed["criteria"]["recovery"], "floor_eps": 2e-9}}
    analysis = analyze(pairs, n_boot=100, calibration=placed)
    doses = reference_doses(analysis.calibration)
    assert abs(math.log10(doses[precision[0].name]) - (-5)) < 0.25
    text = "\n".join(calibration_text(analysis))
    assert f"{precision[0].name} (reference): perturbs training like a relative gradient noise of 1e-05" in text
    assert "rounding, once they differ, acts like a relative gradient noise of about 2e-09 per step" in text


def test_the_recipe_identity_leaves_out_what_the_arms_variants_set():
    ladder_arm = {**RECIPE, "train": {**RECIPE["train"], "grad_noise": 1e-3}}
    flash_arm = {**RECIPE, "attention": {"name": "sdpa-flash"}, "train": {**RECIPE["train"], "precision": "bf16-mixed"}}
    assert recipe_identity(ladder_arm) == recipe_identity(flash_arm) == recipe_identity(RECIPE)


def test_the_atlas_variants_arms_are_the_calibrated_recipe():
    """fp8 / int8 / compile / checkpointing arms, and 4 micro-batches of 4 against a batch of 16, are
    the base recipe's calibration (the first atlas had no equivalent dose for them)."""
    base = {  # every key present, as in a resolved recipe
        "model": {**RECIPE["model"], "gradient_checkpointing": False},
        "train": {**RECIPE["train"], "batch_size": 16, "accumulate": 1, "fp8": None, "compile": False},
    }
    arms = [
        {**base, "train": {**base["train"], "fp8": "tensorwise", "precision": "bf16-mixed"}},
        {**base, "train": {**base["train"], "compile": True}},
        {**base, "train": {**base["train"], "batch_size": 4, "accumulate": 4}},
        {**base, "model": {**base["model"], "gradient_checkpointing": True}},
    ]
    assert {recipe_identity(arm)["id"] for arm in arms} == {recipe_identity(base)["id"]}
    other = {**base, "train": {**base["train"], "batch_size": 4, "accumulate": 2}}  # another global batch
    assert recipe_identity(other) != recipe_identity(base)
    assert recipe_identity({**RECIPE, "train": {**RECIPE["train"], "lr": 1e-4}}) != recipe_identity(RECIPE)


def test_a_variant_registered_outside_analysis_is_read_as_the_base(monkeypatch):
    """A new variant declares the keys it sets and nothing in analysis/ changes: its arm is the base
    recipe's calibration as soon as it is registered (and not before)."""
    from divergence.config.schema import to_dict
    from divergence.recipe.run import RunRecipe
    from divergence.variants import registry

    monkeypatch.setattr(registry, "VARIANTS", dict(registry.VARIANTS))  # the registration ends with the test
    base = to_dict(RunRecipe())
    arm = {**base, "train": {**base["train"], "weight_decay": 0.05}}
    assert recipe_identity(arm) != recipe_identity(base)

    @registry.register
    class WeightDecay(registry.Variant):
        name = "decoupled-weight-decay"
        help = "another AdamW weight decay (a variant this test adds)"
        sets = ("train.weight_decay",)

    assert WeightDecay(0.05).overrides() == {"train.weight_decay": 0.05}
    assert recipe_identity(arm) == recipe_identity(base)
    assert recipe_identity({**base, "train": {**base["train"], "lr": 1e-4}}) != recipe_identity(base)


def test_a_variant_declares_every_key_it_sets():
    from divergence.variants import registry
    from divergence.variants.builtin import Attention

    with pytest.raises(ValueError, match="sets must name"):
        registry.register(type("Nothing", (registry.Variant,), {"name": "nothing"}))
    sneaky = Attention("sdpa-flash")
    with pytest.raises(RuntimeError, match="train.lr"):
        registry.check_overrides(sneaky, {**sneaky.overrides(), "train.lr": 1.0})
    assert all(cls.sets for cls in registry.VARIANTS.values())


def test_the_recipe_identity_of_the_tiny_recipe_is_the_one_calibrations_were_written_with():
    """A calibration.json written before the identity was derived from the variants still matches."""
    from divergence.config.schema import to_dict
    from divergence.recipe.run import RunRecipe

    tiny = to_dict(RunRecipe())  # recipes/tiny.yaml
    assert recipe_identity(tiny)["id"] == "23215bb33b00"


def test_a_saturated_dose_is_left_out_and_too_few_doses_are_refused():
    from divergence.errors import UserInputError

    rungs = ladder(replicates=3, horizon=150)
    rungs[0.5] = [dose_pair("grad-noise-0.5", "optimization", 0.5, replicate=r, horizon=150) for r in range(3)]
    c = evaluate(rungs, seeds(3, 150), horizons=(100, 150))
    assert c["criteria"]["horizon_stability"]["saturated"] == [0.5] and c["criteria"]["recovery"]["pass"]
    with pytest.raises(UserInputError, match="at least 3 non-zero doses"):
        evaluate({0.0: rungs[0.0], 1e-8: rungs[1e-8], 1e-7: rungs[1e-7]}, seeds(3, 150))


def test_a_section_added_later_changes_the_identity_only_when_switched_on():
    """``model.moe`` came after calibration files existed: off, the tiny recipe keeps its id; on, the
    recipe is another one."""
    from divergence.config.schema import to_dict
    from divergence.recipe.run import RunRecipe

    tiny = to_dict(RunRecipe())
    assert tiny["model"]["moe"] is None
    without = {**tiny, "model": {k: v for k, v in tiny["model"].items() if k != "moe"}}
    assert recipe_identity(without)["id"] == recipe_identity(tiny)["id"]
    moe = {**tiny, "model": {**tiny["model"], "moe": {"experts": 4, "top_k": 2}}}
    assert recipe_identity(moe)["id"] != recipe_identity(tiny)["id"]
