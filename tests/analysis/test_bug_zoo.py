"""The bug zoo in 3 cases (benchmarks/bug_zoo.py): a bug that shows in one step, a legitimate change, and a
bug only the trajectory check catches, each a short pair written through ArmWriter, with the anchors' rules;
the built-in UNet's cases; FSDP2 and ZeRO-1 against DDP on 2 gloo ranks."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bug_zoo  # noqa: E402
import zoo_distributed  # noqa: E402

from tests.gloo_runs import ZOO_CASES, ZOO_STEPS  # noqa: E402

THREE = ["unreduced-param", "data-parallel-2", "scheduler-per-micro-batch"]
STEPS = 5  # the scheduler's bug is decided at step 4: its LR differs from step 2, then 3 steps in a row


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """The 3-case zoo, ``STEPS`` steps: (its folder, its rows by case, what ``run_zoo`` returned)."""
    out = tmp_path_factory.mktemp("zoo")
    result = bug_zoo.run_zoo(out, THREE, steps=STEPS)
    return out, {r["case"]: r for r in result["rows"]}, result


def test_a_bug_that_shows_in_one_step(three):
    bug = three[1]["unreduced-param"]
    assert bug["one_step"]["status"] == "beyond_reordering" and bug["one_step"]["lo"] > 3.0
    assert (bug["status"], bug["decided_step"]) == ("beyond_reordering", 1)
    assert bug["trajectory"]["status"] == "beyond_reordering"  # the weights say it too
    # the step-1 loss precedes every update: torchtitan's step-1 rule cannot see a gradient bug
    assert bug["rules"]["titan_step1_rtol"]


def test_a_legitimate_change(three):
    legit = three[1]["data-parallel-2"]
    assert legit["one_step"]["status"] == "reordering_like" and legit["one_step"]["hi"] <= 1.0
    assert (legit["status"], legit["decided_step"]) == ("reordering_like", STEPS)
    assert all(legit["rules"].values())


def test_a_bug_only_the_trajectory_catches(three):
    """The scheduler stepped per micro-batch leaves step 1's gradient as it was; the weights show it from
    step 2, when the learning rate differs."""
    late = three[1]["scheduler-per-micro-batch"]
    assert late["one_step"]["status"] == "reordering_like"
    assert late["trajectory"]["status"] == "beyond_reordering" and late["status"] == "beyond_reordering"
    assert 2 < late["decided_step"] <= STEPS
    assert late["rules"]["titan_step1_rtol"]


def test_the_zoo_writes_its_table_and_pairs(three):
    out, _, result = three
    assert result["counts"]["divergence"] == {"misses": 0, "false_alarms": 0, "undecided": 0}
    assert result["counts"]["titan_step1_rtol"]["misses"] == 2
    written = json.loads((out / "zoo.json").read_text())
    # the table keeps the zoo's order of cases, not the order asked
    assert [r["case"] for r in written["rows"]] == ["unreduced-param", "scheduler-per-micro-batch", "data-parallel-2"]
    assert "| unreduced-param | GPT-2 | bug |" in (out / "zoo.md").read_text()
    assert json.loads((out / "unreduced-param" / "pair.json").read_text())["name"] == "unreduced-param"
    assert json.loads((out / "reference" / "pair.json").read_text())["category"] == "reordering"


def test_the_unet_backbone(tmp_path):
    """Cases on divergence's own UNet + text encoder (benchmarks/zoo_unet.py), read by the same checks against
    the UNet's own reordering pair: a parameter left out of the all-reduce beyond, 2 ranks reordering-like."""
    result = bug_zoo.run_zoo(tmp_path, ["unet-unreduced-param", "unet-data-parallel-2"], steps=2)
    rows = {r["case"]: r for r in result["rows"]}
    bug, legit = rows["unet-unreduced-param"], rows["unet-data-parallel-2"]
    assert bug["backbone"] == "unet" and (bug["status"], bug["decided_step"]) == ("beyond_reordering", 1)
    assert bug["one_step"]["lo"] > 2.0  # 100x a reordering of the UNet's sums at least
    assert legit["status"] == "reordering_like" and legit["one_step"]["status"] == "reordering_like"
    assert json.loads((tmp_path / "reference-unet" / "pair.json").read_text())["category"] == "reordering"
    weights = json.loads((tmp_path / "unet-unreduced-param" / "a" / "status.json").read_text())
    assert weights["last_step"] == 2
    assert not (tmp_path / "reference").exists()  # no GPT-2 case asked: no GPT-2 runs
    assert "| unet-unreduced-param | UNet | bug |" in (tmp_path / "zoo.md").read_text()


@pytest.mark.slow
def test_fsdp_and_zero1_on_two_gloo_ranks(gloo_runs):
    """FSDP2 vs DDP and ZeRO-1 vs DDP trained as real 2-rank gloo arms (in the session's one gloo spawn,
    tests.gloo_runs), written by rank 0 through ArmWriter, read by the same checks: each a reordering of
    DDP's sums, never a bug."""
    out = gloo_runs / "zoo"
    result = bug_zoo.run_zoo(out, ZOO_CASES, steps=ZOO_STEPS, ranked=zoo_distributed.load(out))
    rows = {r["case"]: r for r in result["rows"]}
    assert sorted(rows) == sorted(ZOO_CASES)
    for name, row in rows.items():
        assert row["truth"] == "legitimate" and row["status"] == "reordering_like", name
        assert row["one_step"]["status"] == "reordering_like" and row["trajectory"]["steps"] == ZOO_STEPS
        for arm in "ab":
            status = json.loads((out / name / arm / "status.json").read_text())
            assert (status["state"], status["world_size"], status["last_step"]) == ("finished", 2, ZOO_STEPS)
            assert len((out / name / arm / "losses.jsonl").read_text().splitlines()) == ZOO_STEPS
    # arm b of both pairs is the one DDP run, written to both folders
    assert (out / "zero-1" / "b" / "losses.jsonl").read_text() == (
        out / "fsdp-vs-ddp" / "b" / "losses.jsonl"
    ).read_text()
    assert all(rows["zero-1"]["rules"].values()) and all(rows["fsdp-vs-ddp"]["rules"].values())
