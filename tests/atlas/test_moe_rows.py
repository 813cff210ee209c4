"""The MoE backbone on the atlas (issue 31): its rows, its study plan, the rows of no chosen
backbone refused in one line, and the router flip fraction on the atlas page. No training."""

from pathlib import Path

import pytest

from divergence.atlas.catalog import BACKBONES, OPTIMIZATIONS, backbones, check_rows, select
from divergence.atlas.plan import backbone_study
from divergence.atlas.render import markdown, router_lines
from divergence.atlas.rows import measured_row, router_flip
from divergence.errors import UserInputError


def test_the_moe_backbone_has_the_rows_that_apply_to_it():
    assert BACKBONES["moe"] == "tiny-moe.yaml" and backbones(None) == ["unet", "dit", "moe"]
    on_moe = [o.name for o in OPTIMIZATIONS.values() if o.applies("moe")]
    assert on_moe == [
        "fp8-tensorwise",
        "fp8-rowwise",
        "compile",
        "grad-accumulation",
        "cpu-threads",
        "flash",
        "router-bf16",
        "expert-grouped",
        "expert-parallel",
    ]
    assert not any(OPTIMIZATIONS[n].applies(b) for n in ("router-bf16", "expert-grouped") for b in ("unet", "dit"))
    assert OPTIMIZATIONS["expert-parallel"].unavailable("cpu", "moe") is None  # measured: separate 2-rank jobs
    assert OPTIMIZATIONS["expert-parallel"].unavailable("cpu", "dit").startswith("moe only: ")


def test_the_moe_study_trains_its_pairs_on_tiny_moe_without_the_accumulation_reordering():
    plan = backbone_study("moe", select(["router-bf16", "expert-grouped", "flash"]), "cpu", [])
    assert plan.pairs == {
        "flash": "flash-vs-baseline",
        "router-bf16": "router-bf16",
        "expert-grouped": "expert-grouped",
    }
    # 4x4 accumulation is no reordering of an MoE (capacity and balance loss per forward pass)
    assert plan.references == ("seed-vs-seed", "bf16-vs-fp32", "control")
    by_name = {p.name: p for p in plan.study.pairs}
    assert all(Path(p.recipe["base"]).name == "tiny-moe.yaml" for p in plan.study.pairs)
    assert by_name["router-bf16"].recipe["recipe"]["train"]["precision"] == "bf16-mixed"  # both arms bf16
    assert by_name["router-bf16"].recipe["arms"] == {"a": ["router-bf16"], "b": [{"router-bf16": False}]}
    assert by_name["expert-grouped"].recipe["arms"] == {"a": ["expert-grouped"], "b": ["expert-loop"]}
    assert "precision" not in by_name["expert-grouped"].recipe["recipe"]["train"]  # fp32: another order of sums
    # the command line may set the reference back
    again = backbone_study("moe", select(["expert-grouped"]), "cpu", ["references.reordering=pairs/reordering.yaml"])
    assert again.references[-1] == "reordering"


def test_an_moe_row_on_a_dense_backbone_is_one_line():
    with pytest.raises(UserInputError, match="--only router-bf16: a row of moe only, not of --backbone unet"):
        check_rows(select(["router-bf16"]), ["unet"])
    check_rows(select(["router-bf16", "flash"]), backbones(None))  # every backbone: each row has one


def test_the_router_flip_fraction_is_on_the_row_and_the_page():
    runs = [
        {"name": "router-bf16", "router": {"step": [0, 10, 20], "flip": [0.0, 0.02, 0.03]}},
        {"name": "router-bf16", "router": {"step": [0, 10, 20], "flip": [0.0, 0.01, 0.05]}},
    ]
    assert router_flip(runs) == {"step": 20, "final": 0.04, "replicates": [0.03, 0.05]}
    assert router_flip([{"name": "flash", "router": None}]) is None
    summary = {"pairs": {str(i): r for i, r in enumerate(runs)}, "verdicts": []}
    row = measured_row(OPTIMIZATIONS["router-bf16"], "moe", "router-bf16", summary, "moe/reports/router-bf16")
    assert row["router_flip"]["final"] == 0.04
    dense = measured_row(OPTIMIZATIONS["flash"], "unet", "flash-vs-baseline", {"pairs": {}}, "r")
    atlas = {"device": "cpu", "backbones": {}, "rows": [row, dense]}
    assert router_lines({**atlas, "rows": [dense]}) == []  # no MoE row: no router lines
    assert "- router-bf16 (moe): 4% at step 20 (3%, 5%)" in markdown(atlas)
    atlas["backbones"] = {"moe": {"router_flip": {"bf16-vs-fp32": {"step": 20, "final": 0.1, "replicates": [0.1]}}}}
    assert "- reference bf16-vs-fp32 (moe): 10% at step 20 (10%)" in markdown(atlas)
