"""The bug zoo in 3 cases (benchmarks/bug_zoo.py): a bug that shows in one step, a legitimate change, and a
bug only the trajectory check catches, each a short pair written through ArmWriter, with the anchors' rules."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bug_zoo  # noqa: E402


def test_three_cases_of_the_zoo(tmp_path):
    result = bug_zoo.run_zoo(tmp_path, ["unreduced-param", "data-parallel-2", "scheduler-per-micro-batch"], steps=8)
    rows = {r["case"]: r for r in result["rows"]}
    bug, legit, late = rows["unreduced-param"], rows["data-parallel-2"], rows["scheduler-per-micro-batch"]
    assert bug["one_step"]["status"] == "beyond_reordering" and (bug["status"], bug["decided_step"]) == (
        "beyond_reordering",
        1,
    )
    assert bug["trajectory"]["status"] == "beyond_reordering"  # the weights say it too
    assert legit["status"] == "reordering_like" and legit["one_step"]["status"] == "reordering_like"
    # the scheduler's bug leaves step 1's gradient as it was; the weights show it from step 2 (the LR differs)
    assert late["one_step"]["status"] == "reordering_like" and late["status"] == "beyond_reordering"
    assert 2 < late["decided_step"] <= 8
    # the anchors on the same runs: a bug the step-1 loss cannot see (it precedes every update)
    assert bug["rules"]["titan_step1_rtol"] and late["rules"]["titan_step1_rtol"]
    assert result["counts"]["divergence"] == {"misses": 0, "false_alarms": 0, "undecided": 0}
    written = json.loads((tmp_path / "zoo.json").read_text())
    assert [r["case"] for r in written["rows"]] == ["unreduced-param", "scheduler-per-micro-batch", "data-parallel-2"]
    assert "| unreduced-param | bug |" in (tmp_path / "zoo.md").read_text()
    assert json.loads((tmp_path / "unreduced-param" / "pair.json").read_text())["name"] == "unreduced-param"


@pytest.mark.slow
def test_fsdp_and_zero1_on_two_gloo_ranks(tmp_path):
    """FSDP2 vs DDP and ZeRO-1 vs DDP trained as real 2-rank gloo arms, written by rank 0 through ArmWriter,
    read by the same checks: each a reordering of DDP's sums, never a bug."""
    result = bug_zoo.run_zoo(tmp_path, ["fsdp-vs-ddp", "zero-1"], steps=3)
    rows = {r["case"]: r for r in result["rows"]}
    for name, row in rows.items():
        assert row["truth"] == "legitimate" and row["status"] == "reordering_like", name
        assert row["one_step"]["status"] == "reordering_like" and row["trajectory"]["steps"] == 3
        for arm in "ab":
            status = json.loads((tmp_path / name / arm / "status.json").read_text())
            assert (status["state"], status["world_size"], status["last_step"]) == ("finished", 2, 3)
            assert len((tmp_path / name / arm / "losses.jsonl").read_text().splitlines()) == 3
    # arm b of both pairs is the one DDP run, written to both folders
    assert (tmp_path / "zero-1" / "b" / "losses.jsonl").read_text() == (
        tmp_path / "fsdp-vs-ddp" / "b" / "losses.jsonl"
    ).read_text()
    assert all(rows["zero-1"]["rules"].values()) and all(rows["fsdp-vs-ddp"]["rules"].values())
