"""Deployment numerics: a variant states where it is used; a study trains its pair there; pair.json and
the report say what each arm trained in, and in one line when a pair is studied outside them."""

import dataclasses
import json
from pathlib import Path

import pytest

from divergence.analysis import analyze, to_summary
from divergence.errors import RecipeError
from divergence.report.inputs import load_pair
from divergence.study import load_study
from divergence.training.pair_setup import pair_info
from divergence.variants import parse_variant
from divergence.variants.deployment import deployment_precision
from tests.analysis.synthetic import dose_study
from tests.pairs.helpers import pair_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def _variants(*specs):
    return [parse_variant(s, "test") for s in specs]


def test_flash_kernels_are_used_under_low_precision_autocast():
    flash = _variants({"attention": "sdpa-flash"}, {"attention": "baseline"})
    assert deployment_precision(flash, "32-true") == "bf16-mixed"  # bf16 first: no loss scaler
    assert deployment_precision(flash, "16-mixed") is None  # a GPU recipe already in fp16 keeps it
    assert deployment_precision(_variants({"attention": "flash-attn"}), "32-true") == "bf16-mixed"
    assert deployment_precision(_variants({"attention": "flash-unbiased"}), "32-true") == "bf16-mixed"
    assert deployment_precision(_variants({"adamw-impl": "fused"}, {"attention": "baseline"}), "32-true") is None
    assert parse_variant({"tf32": True}, "t").deployment().devices == ("cuda",)
    assert parse_variant({"tf32": False}, "t").deployment() is None


def test_the_default_study_trains_the_flash_pair_in_bf16_and_the_references_on_the_base():
    study = load_study(RECIPES / "study.yaml", device_type="cpu")
    by_role = {p.role: p for p in study.pairs}
    assert by_role["study"].recipe["recipe"]["train"]["precision"] == "bf16-mixed"
    assert "bf16-mixed" in by_role["study"].note and "sdpa-flash" in by_role["study"].note
    for role in ("seed", "precision", "control", "reordering"):  # the base's fp32; precision sets its own arms
        assert "precision" not in by_role[role].recipe["recipe"]["train"]
    base = load_study(RECIPES / "study.yaml", ["numerics=base"], device_type="cpu")
    assert "precision" not in base.pairs[0].recipe["recipe"]["train"] and not base.pairs[0].note
    with pytest.raises(RecipeError, match="numerics: expected one of deployment, base"):
        load_study(RECIPES / "study.yaml", ["numerics=fp32"])


def test_pair_json_records_each_arms_numerics_and_an_arm_outside_its_deployment():
    fp32 = pair_info(pair_recipe("flash-vs-baseline"))
    assert fp32.numerics["a"] == {
        "device": "cpu",
        "precision": "32-true",
        "attention": "sdpa-flash",
        "tf32": False,
        "deterministic": True,
        "cpu_threads": 1,
        "cpu_autocast": None,
    }
    assert fp32.numerics["b"]["attention"] == "baseline"
    assert fp32.outside_deployment == (
        "sdpa-flash is used under bf16-mixed or 16-mixed autocast, but trains here in 32-true (arm a)"
    )
    bf16 = pair_info(pair_recipe("flash-vs-baseline", "train.precision=bf16-mixed"))
    assert bf16.outside_deployment is None and {bf16.numerics[a]["precision"] for a in "ab"} == {"bf16-mixed"}
    assert {bf16.numerics[a]["cpu_autocast"] for a in "ab"} == {"emulate"}  # 16-bit on a CPU: how it was computed
    tf32 = pair_info(pair_recipe("tf32-vs-fp32"))
    assert (
        "tf32 is a cuda setting, but trains here on a cpu, where it changes nothing (arm a)" == tf32.outside_deployment
    )
    assert json.loads(json.dumps(bf16.to_json()))["numerics"]["a"]["cpu_threads"] == 1


def test_the_report_says_a_pair_outside_its_deployment_in_one_caveat_line():
    line = "sdpa-flash is used under bf16-mixed or 16-mixed autocast, but trains here in 32-true (arm a)"
    pairs = [
        dataclasses.replace(p, outside_deployment=line) if p.category == "optimization" else p
        for p in dose_study(horizon=100)
    ]
    analysis = analyze(pairs, n_boot=50)
    caveats = [c for c in analysis.verdicts[0].caveats if "deployment" in c]
    assert caveats == [f"studied outside its deployment numerics: {line}"]
    summary = to_summary(analysis)
    assert summary["verdicts"][0]["outside_deployment"] == caveats[0]
    assert summary["pairs"]["flash-vs-baseline"]["outside_deployment"] == line
    assert to_summary(analyze(dose_study(horizon=100), n_boot=50))["verdicts"][0]["outside_deployment"] is None


def test_a_pair_folder_written_before_numerics_reads_with_defaults(tmp_path):
    from tests.analysis.synthetic import write_pair

    folder = write_pair(tmp_path / "old", "flash-vs-baseline", "optimization", 1e-4, steps=range(0, 31, 10))
    data = json.loads((folder / "pair.json").read_text())
    for key in ("numerics", "outside_deployment"):
        data.pop(key)
    (folder / "pair.json").write_text(json.dumps(data))
    pair = load_pair(folder)
    assert pair.numerics == {} and pair.outside_deployment is None
