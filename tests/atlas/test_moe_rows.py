"""The MoE backbone on the atlas: its rows, its study plan, the rows of no chosen
backbone refused in one line, and the router flip fraction on the atlas page. No training."""

from pathlib import Path

import pytest

from divergence.atlas.catalog import BACKBONES, OPTIMIZATIONS, backbones, check_rows, select
from divergence.atlas.plan import backbone_study
from divergence.atlas.render import markdown, router_lines
from divergence.atlas.rows import measured_row, router_flip
from divergence.errors import UserInputError


def test_the_moe_backbone_has_the_rows_that_apply_to_it():
    assert BACKBONES["moe"] == "tiny-moe.yaml"
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


def test_the_moe_study_trains_its_pairs_on_tiny_moe_with_the_adamw_reordering():
    plan = backbone_study("moe", select(["router-bf16", "expert-grouped", "flash", "expert-parallel"]), "cpu", [])
    assert plan.pairs == {
        "flash": "flash-vs-baseline",
        "router-bf16": "router-bf16",
        "expert-grouped": "expert-grouped",
        "expert-parallel": "expert-parallel",
    }
    # 4x4 accumulation is no reordering of an MoE (capacity and balance loss per forward pass):
    # its yardstick is fused vs loop AdamW, which touches no route
    assert plan.references == ("seed-vs-seed", "bf16-vs-fp32", "control", "reordering-adamw")
    by_name = {p.name: p for p in plan.study.pairs}
    assert all(Path(p.recipe["base"]).name == "tiny-moe.yaml" for p in plan.study.pairs)
    assert by_name["router-bf16"].recipe["recipe"]["train"]["precision"] == "bf16-mixed"  # both arms bf16
    assert by_name["router-bf16"].recipe["arms"] == {"a": ["router-bf16"], "b": [{"router-bf16": False}]}
    assert by_name["expert-grouped"].recipe["arms"] == {"a": ["expert-grouped"], "b": ["expert-loop"]}
    assert "precision" not in by_name["expert-grouped"].recipe["recipe"]["train"]  # fp32: another order of sums
    reference = by_name["reordering-adamw"]
    assert reference.role == "reordering" and reference.recipe["reordering"] is True
    assert reference.recipe["arms"] == {"a": [{"adamw-impl": "fused"}], "b": [{"adamw-impl": "loop"}]}
    assert "precision" not in reference.recipe["recipe"]["train"]  # fp32
    # expert-parallel is studied beside the same references, its arms as separate 2- and 1-rank jobs
    assert by_name["expert-parallel"].recipe["arms"] == {
        "a": [{"expert-parallel": "2x8"}],
        "b": [{"expert-parallel": "1x16"}],
    }
    # the command line may set the reference back
    again = backbone_study("moe", select(["expert-grouped"]), "cpu", ["references.reordering=pairs/reordering.yaml"])
    assert again.references[-1] == "reordering"
    none = backbone_study("moe", select(["expert-grouped"]), "cpu", ["references.reordering=null"])
    assert none.references == ("seed-vs-seed", "bf16-vs-fp32", "control")


def test_an_moe_row_on_a_dense_backbone_is_one_line():
    with pytest.raises(UserInputError, match="--only router-bf16: a row of moe only, not of --backbone unet"):
        check_rows(select(["router-bf16"]), ["unet"])
    check_rows(select(["router-bf16", "flash"]), backbones("all"))  # every backbone: each row has one
    # the default is the dense backbones: the MoE rows are the MoE atlas's (--backbone moe)
    with pytest.raises(
        UserInputError, match="a row of moe only, not of --backbone unet, dit; choose --backbone moe or"
    ):
        check_rows(select(["router-bf16"]), backbones(None))


def test_the_default_backbones_are_the_dense_ones_and_all_is_every_one():
    assert backbones(None) == ["unet", "dit"]
    assert backbones("moe") == ["moe"] and backbones("all") == ["unet", "dit", "moe"]
    with pytest.raises(UserInputError, match="^--backbone ALL: unknown backbone; known: unet, dit, moe, all$"):
        backbones("ALL")


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


def _grouped_summary(windows: list[float | None], steps: list[int]) -> dict:
    """A report's summary of expert-grouped with one replicate per entry of ``windows`` (its dose
    ratio, None: no window), every pair tracked at ``steps`` of 30."""
    verdict = {
        "study": "expert-grouped",
        "status": "preliminary",
        "dose_ratio": {"log10": -3.47, "replicates": 1, "status": "bounded", "common_start": 18},
        "outcome": {"status": "undecided", "replicates": 1, "replicates_needed": None},
        "per_replicate": [{"replicate": r, "log10": w} for r, w in enumerate(windows)],
    }
    pairs = {
        f"expert-grouped-r{r}": {"name": "expert-grouped", "max_steps": 30, "trajectory": {"step": steps}}
        for r in range(len(windows))
    }
    return {"settings": {"min_window": 5}, "verdicts": [verdict], "pairs": pairs}


def test_a_row_with_under_two_windows_says_what_would_give_the_others_one():
    from divergence.atlas.render import cells

    sparse = [*range(21), 25, 30]  # every step to 20, then every 5th: 5 tracked steps from step 18
    summary = _grouped_summary([-3.47, None, None], sparse)
    row = measured_row(OPTIMIZATIONS["expert-grouped"], "moe", "expert-grouped", summary, "r")
    assert row["dose_ratio"]["windows"]["formed"] == 1 and row["dose_ratio"]["windows"]["replicates"] == 3
    assert cells(row)[7] == "1 of 3 formed a window of 5 tracked steps: tracking.every=1 or train.max_steps=60"
    every_step = measured_row(
        OPTIMIZATIONS["expert-grouped"], "moe", "expert-grouped", _grouped_summary([None, None], list(range(31))), "r"
    )
    assert cells(every_step)[7] == "0 of 2 formed a window of 5 tracked steps: train.max_steps=60"
    one = measured_row(OPTIMIZATIONS["expert-grouped"], "moe", "expert-grouped", _grouped_summary([-3.4], sparse), "r")
    assert cells(one)[7] == "1 replicate, no interval: --replicates 3"
    # two windows or more: an interval, and the verdict's own replicate count
    two = measured_row(
        OPTIMIZATIONS["expert-grouped"], "moe", "expert-grouped", _grouped_summary([-3.4, -3.5, None], sparse), "r"
    )
    assert two["dose_ratio"]["windows"] is None and "formed a window" not in cells(two)[7]


def test_the_moe_study_tracks_every_step_and_the_command_line_may_set_it_back(tmp_path):
    from divergence.study.runner import plan_jobs

    moe = backbone_study("moe", select(["expert-grouped"]), "cpu", [])
    assert all(p.recipe["tracking"]["every"] == 1 for p in moe.study.pairs)  # the references too: same steps
    dit = backbone_study("dit", select(["flash"]), "cpu", [])
    assert all(p.recipe["tracking"]["every"] == 10 for p in dit.study.pairs)
    jobs = {j.label: j for j in plan_jobs(moe.study, tmp_path, [])}
    assert "every: 1\n" in jobs["expert-grouped-r0"].recipe_text  # in the recipe the atlas writes
    assert jobs["seed-vs-seed-r0"].config["tracking"]["every"] == 1
    again = plan_jobs(moe.study, tmp_path, ["tracking.every=10"])  # the command line's pair override after it
    assert {j.config["tracking"]["every"] for j in again} == {10} and not any(tmp_path.iterdir())


def test_a_two_rank_arm_trains_alone_on_two_slots(tmp_path):
    # the expert-parallel pair's arm a is a 2-rank job: beside another pair run on 2 cores its gloo
    # ranks would share a core and wait on each other at every all-to-all
    from divergence.study.runner import fits, plan_jobs

    study = backbone_study("moe", select(["expert-parallel"]), "cpu", ["replicates=1"]).study
    jobs = {j.label: j for j in plan_jobs(study, tmp_path, [])}
    assert {label: j.cores for label, j in jobs.items()} == {
        "expert-parallel-r0": 2,
        "seed-vs-seed-r0": 1,
        "bf16-vs-fp32-r0": 1,
        "control-r0": 1,
        "reordering-adamw-r0": 1,
    }
    wide, narrow = jobs["expert-parallel-r0"], jobs["seed-vs-seed-r0"]
    assert fits(wide, [], 2) and not fits(wide, [narrow], 2) and not fits(narrow, [wide], 2)
    assert fits(narrow, [jobs["control-r0"]], 2) and not fits(narrow, [narrow, narrow], 2)
    assert fits(wide, [], 1)  # a job wider than every slot still trains, alone
    # once its 2-rank arm a finished, the pair runs arm b (1 rank), then the comparator: one slot
    from divergence.pairfolder.arm.status import ArmStatus

    assert wide.arm_cores == (2, 1) and narrow.arm_cores == () and wide.cores_now() == 2
    (wide.out / "a").mkdir(parents=True)
    ArmStatus("a", state="running", last_step=wide.max_steps - 1, max_steps=wide.max_steps).write(wide.out / "a")
    assert wide.cores_now() == 2 and not fits(narrow, [wide], 2)
    ArmStatus("a", state="finished", last_step=wide.max_steps, max_steps=wide.max_steps).write(wide.out / "a")
    assert wide.cores_now() == 1 and fits(narrow, [wide], 2) and not fits(narrow, [wide, narrow], 2)
