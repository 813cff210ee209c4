"""A study's verdict says what its dose predicts for the finished model, from a consequence curve of
its recipe (``analysis.consequence_file``), and only then."""

import json

import pytest
from PIL import Image

from divergence.analysis import analyze, to_summary
from divergence.analysis.calibration import recipe_identity
from divergence.analysis.consequence_file import prediction
from divergence.cli import main
from tests.analysis.synthetic import dose_study, write_dose_study

RECIPE = {"model": {"seed": 3, "unet": {"block_out_channels": [32]}}, "train": {"max_steps": 300, "lr": 1e-3}}


def curve(below=-2.0, above=-1.0, lo=0.4, recipe=RECIPE):
    return {
        "recipe": "consequence",
        "recipe_id": recipe_identity(recipe)["id"],
        "steps": 500,
        "precision_reference": "bf16-vs-fp32",
        "threshold": {"below_dex": below, "above_dex": above, "within_again": []},
        "spearman": {"score": {"rho": 0.7, "lo": lo, "hi": 0.9}, "probe": {"rho": None, "lo": None, "hi": None}},
        "seed_margin": {"score": {"value": 0.03}, "probe": {"value": 0.01}},
        "sentence": "At convergence ...",
    }


@pytest.mark.parametrize(
    "dex,said",
    [
        (-3.0, "is below that: its finished model is expected to draw as a seed change's would"),
        (-2.0, "is below that"),
        (-0.5, "is above that: the short run does not vouch for the finished model"),
        (-1.5, "lies between -2.00 and -1.00 dex, where the consequence curve's threshold lies"),
    ],
)
def test_the_dose_is_placed_against_the_threshold(dex, said):
    text = prediction(curve(), dex, "bf16 vs fp32")
    assert said in text and f"{dex:+.2f} dex vs bf16 vs fp32" in text
    assert text.endswith("(measured on this recipe only (consequence, 500 steps)).")


def test_a_curve_whose_correlation_holds_0_predicts_nothing_whatever_the_dose():
    for dex in (-5.0, 0.5):
        text = prediction(curve(lo=-0.2), dex, "bf16 vs fp32")
        assert text.startswith("What this dose means for the finished model's score is not known")
        assert "rho +0.70 [-0.20, +0.90]" in text
    no_interval = {**curve(), "spearman": {"score": {"rho": 0.7, "lo": None, "hi": None}}}
    assert "Spearman rho +0.70, without an interval" in prediction(no_interval, -3.0, "bf16")
    none = {**curve(), "spearman": {"score": {"rho": None, "lo": None, "hi": None}}}
    assert "no rank correlation could be read" in prediction(none, -3.0, "bf16")


def test_the_verdict_and_summary_say_it_for_the_same_recipe_only():
    pairs = [p.__class__(**{**p.__dict__, "recipe": RECIPE}) for p in dose_study(horizon=300)]
    analysis = analyze(pairs, n_boot=50, consequence=curve(below=-1.0, above=0.0))
    v = analysis.verdicts[0]
    assert v.dose.ratio.mean < -1.0 and v.prediction and v.headline.endswith(v.prediction)
    summary = to_summary(analysis)
    assert summary["verdicts"][0]["prediction"] == v.prediction
    assert summary["consequence"]["threshold"]["below_dex"] == -1.0 and summary["consequence"]["seed_margin"] == 0.03
    other = analyze(dose_study(horizon=300), n_boot=50, consequence=curve()).verdicts[0]
    assert other.prediction is None and any("consequence curve given is for another recipe" in c for c in other.caveats)
    elsewhere = analyze(pairs, n_boot=50, consequence={**curve(), "precision_reference": "fp16-vs-fp32"})
    assert elsewhere.verdicts[0].prediction is None
    assert to_summary(analyze(pairs, n_boot=50))["consequence"] is None


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return write_dose_study(tmp_path_factory.mktemp("study"), replicates=3, horizon=120)


def test_the_report_finds_a_curve_beside_the_study_and_states_the_prediction(study, tmp_path):
    from divergence.report.inputs import load_pairs

    runs = tmp_path / "runs"
    runs.symlink_to(study)
    recipe = load_pairs([runs])[0].recipe
    converged = {"convergence": {"sentence": "Convergence, from the seed pair's arms over their 500 steps ..."}}
    (tmp_path / "consequence.json").write_text(json.dumps({**curve(below=-1.0, above=0.0, recipe=recipe), **converged}))
    for name in ("consequence.png", "consequence-samples.png"):  # what the curve's command drew
        Image.new("RGB", (40, 20), (200, 40, 40)).save(tmp_path / name)
    assert main(["report", str(runs), "--out", str(tmp_path / "out"), "--no-wandb"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["consequence"]["convergence"] == converged["convergence"]["sentence"]
    assert {"consequence", "consequence_samples"} <= set(summary["figures"])
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "### What a dose predicts" in markdown and converged["convergence"]["sentence"] in markdown
    assert "![consequence_samples](figures/consequence-samples.png)" in markdown
    assert (tmp_path / "out" / "figures" / "consequence-samples.png").is_file()
    assert "What a dose predicts" in (tmp_path / "out" / "report.html").read_text()
    assert summary["consequence"]["source_file"] == str(tmp_path / "consequence.json")
    (verdict,) = summary["verdicts"]
    assert "At convergence" in verdict["prediction"] and verdict["headline"].endswith(verdict["prediction"])


@pytest.mark.parametrize(
    "content,message",
    [
        ("[1, 2]", "not a consequence.json (expected a JSON object)"),
        ('{"recipe": "x"}', "not a consequence.json of this version (no recipe_id)"),
        ("{", "unreadable consequence curve"),
        (json.dumps({**curve(), "threshold": {"below_dex": "low"}}), "threshold.below_dex is 'low'"),
        (json.dumps({**curve(), "spearman": {"score": {"rho": 1, "lo": True}}}), "spearman.score.lo is True"),
        (json.dumps({**curve(), "spearman": {"score": [1]}}), "spearman.score must be a JSON object"),
        (json.dumps({**curve(), "steps": "500"}), "recipe_id must be a string and steps a number"),
        (None, "no such consequence curve file; write one with divergence consequence"),
    ],
)
def test_a_bad_consequence_file_is_one_line_at_exit_2(study, tmp_path, capsys, content, message):
    bad = tmp_path / "consequence.json"
    if content is not None:
        bad.write_text(content)
    code = main(["report", str(study), "--out", str(tmp_path / "out"), "--consequence", str(bad), "--no-wandb"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err and str(bad) in err, err


def with_pictures(consequence: dict, lo: float = 0.5) -> dict:
    """``consequence`` with a sample distance ranked by dose (interval from ``lo``) and three runs on it."""
    runs = [
        {"pair": "grad-noise-0.001", "reference": None, "early_dex": -2.0, "sample_distance": {"value": 0.02}},
        {"pair": "reordering", "reference": None, "early_dex": -2.3, "sample_distance": {"value": 0.04}},
        {"pair": "grad-noise-0.1", "reference": None, "early_dex": 0.0, "sample_distance": {"value": 0.08}},
        {"pair": "seed-vs-seed", "reference": "seed", "early_dex": None, "sample_distance": {"value": 0.1}},
    ]
    spearman = {**consequence["spearman"], "distance": {"rho": 0.9, "lo": lo, "hi": 1.0}}
    return {**consequence, "runs": runs, "spearman": spearman, "sample_distance": {"seed": 0.1}}


def test_what_the_finished_model_draws_is_said_from_the_pair_runs_near_the_dose():
    text = prediction(with_pictures(curve(lo=-0.2)), -2.1, "bf16 vs fp32")
    assert text.startswith("What this dose means for the finished model's score is not known")
    assert text.endswith(
        "What it draws: the curve's 2 pair run(s) within 0.5 dex of this dose drew, from the same noises, pictures "
        "0.20x-0.40x as far apart as a seed change's (early dose ranks that distance, Spearman rho +0.90 [+0.50, +1.00])."
    )
    assert "No pair run of the curve lies within 0.5 dex" in prediction(with_pictures(curve()), -1.0, "bf16")
    assert "What it draws" not in prediction(with_pictures(curve(), lo=-0.1), -2.1, "bf16")  # not ranked by dose
    odd = {**with_pictures(curve()), "sample_distance": [0.1], "runs": "not a list"}  # parts it can do without
    assert prediction(odd, -2.1, "bf16") == prediction(curve(), -2.1, "bf16")
