"""The atlas's two looks (``divergence.atlas.looks``): after its first replicates a row trains the
study's replicates only where they would decide a reading its first look left open.

Synthetic stores of known doses: the study's pair against bf16's 1e-5 per step, 6 replicates
written, the last 3 unfinished (the first look trained 3)."""

import json

import pytest

from divergence.atlas.looks import to_decide, trained_prefix
from divergence.atlas.plan import BackboneStudy
from divergence.atlas.render import look_lines
from divergence.atlas.runner import Look, first_look, row_inputs
from divergence.study.config import Study, StudyPair
from divergence.study.runner import PairJob
from tests.analysis.synthetic import DOSE_STUDY, write_dose_study

HORIZON = 120
ROLES = {"optimization": "study", "precision": "precision", "seed": "seed", "control": "control"}


def _plan(root, dose: float, first: int = 3, most: int = 6):
    """The backbone study of one row (``flash``) over ``root``'s synthetic runs, its jobs, the
    replicates from ``first`` on unfinished."""
    write_dose_study(root, study=dose, precision=1e-5, reordering=1e-8, replicates=most, horizon=HORIZON)
    pairs = [StudyPair(ROLES.get(category, category), name, {}) for name, category, _ in DOSE_STUDY]
    plan = BackboneStudy(
        "unet",
        Study("atlas-unet", tuple(pairs), 2, None, most),
        {"flash": "flash-vs-baseline"},
        tuple(p.name for p in pairs[1:]),
    )
    planned = [
        PairJob(p, None, root / f"{p.name}-r{r}", HORIZON, replicate=r)
        for r in range(most)
        for p in pairs
        if not (r and p.single)
    ]
    for job in planned:
        if job.replicate >= first:
            info = json.loads((job.out / "pair.json").read_text())
            (job.out / "pair.json").write_text(json.dumps(info | {"finished": False}))
    return plan, planned


class Row:
    name = "flash"


@pytest.mark.parametrize(
    "dose, look",
    [
        (1e-8, Look(3)),  # -3 dex: decided at 3
        (6e-6, Look(6, ("dose 4",))),  # -0.25 [-0.50, +0.01]: 4 replicates would exclude 0
        (1e-5, Look(3)),  # -0.03 [-0.28, +0.23]: 60 would, more than the study's 6
    ],
)
def test_a_row_trains_the_studys_replicates_only_where_they_would_decide_it(tmp_path, dose, look):
    plan, planned = _plan(tmp_path, dose)
    assert first_look(plan, planned, [Row()], None, workers=1) == {"flash": look}
    inputs = row_inputs(plan, planned, "flash", look.replicates)
    assert sorted(p.name for p in inputs if p.name.startswith("flash")) == [
        f"flash-vs-baseline-r{r}" for r in range(look.replicates)
    ]
    assert [p.name for p in inputs if p.name.startswith("control")] == ["control-r0"]  # trained once


def test_a_row_already_trained_to_the_studys_replicates_is_not_read_again(tmp_path, monkeypatch):
    from divergence.atlas import runner

    plan, planned = _plan(tmp_path, 6e-6, first=6)
    monkeypatch.setattr(runner, "build_reports", lambda builds, *a, **k: [] if not builds else pytest.fail("read"))
    assert first_look(plan, planned, [Row()], None, workers=1) == {"flash": Look(6)}


def test_a_row_reads_the_replicates_its_pair_and_every_reference_finished(tmp_path, monkeypatch):
    from divergence.atlas import runner

    plan, planned = _plan(tmp_path, 1e-8, first=6)
    precision = tmp_path / "bf16-vs-fp32-r2" / "pair.json"  # one reference's replicate 2 killed
    precision.write_text(json.dumps(json.loads(precision.read_text()) | {"finished": False}))
    read, build = [], runner.build_reports
    monkeypatch.setattr(runner, "build_reports", lambda builds, *a, **k: read.extend(builds) or build(builds, *a, **k))
    # at 2 replicates the dose is decided (-3 dex), the ratio to the reordering reference is not: 3 would
    assert first_look(plan, planned, [Row()], None, workers=1) == {"flash": Look(6, ("reordering 3",))}
    ((inputs, _),) = read
    assert sorted(p.name for p in inputs if p.name.startswith(("flash", "bf16"))) == [
        "bf16-vs-fp32-r0",
        "bf16-vs-fp32-r1",
        "flash-vs-baseline-r0",
        "flash-vs-baseline-r1",
    ]


def test_each_open_reading_within_reach_is_named():
    dose = {"status": "inconclusive", "replicates_needed": {"exclude_0": 5}}
    verdict = {
        "dose_ratio": dose,
        "reordering": {"status": "inconclusive", "replicates_needed": 4},
        "outcome": {"status": "undecided", "replicates_needed": 6},
    }
    assert to_decide(verdict, 6) == ["dose 5", "reordering 4", "outcome 6"]
    assert to_decide(verdict, 5) == ["dose 5", "reordering 4"]
    assert (
        to_decide({**verdict, "dose_ratio": {**dose, "replicates_needed": {"exclude_0": None}}}, 6)[0] == "reordering 4"
    )
    decided = {"dose_ratio": {"status": "bounded"}, "reordering": {"status": "reordering_like"}, "outcome": {}}
    assert to_decide(decided, 6) == [] and to_decide(None, 6) == []


def test_a_row_without_an_interval_for_want_of_windows_trains_until_two_would_form():
    """The DiT's data-parallel row in the CPU atlas: 1 of 3 replicates formed a window of 5 tracked steps,
    so the dose ratio had a point and no interval (``preliminary``); at that rate 6 replicates form 2."""
    window = {"window": [10, 30], "steps_in_window": 19}
    verdict = {
        "status": "preliminary",
        "dose_ratio": {"status": "bounded", "log10": -3.45, "lo": None, "hi": None, "replicates": 1},
        "reordering": {"status": "reordering_like"},
        "outcome": {"status": "undecided", "replicates_needed": None},
        "per_replicate": [
            {"window": [11, 11], "steps_in_window": 1},
            window,
            {"window": [13, 14], "steps_in_window": 2},
        ],
    }
    assert to_decide(verdict, 6) == ["windows 6"]
    assert to_decide(verdict, 5) == []  # 2 windows not expected within 5
    none_formed = {**verdict, "dose_ratio": {**verdict["dose_ratio"], "log10": None, "replicates": 0}}
    assert to_decide(none_formed, 6) == []  # no rate to go by
    pooled = {**verdict, "dose_ratio": {**verdict["dose_ratio"], "lo": -3.9, "hi": -3.0, "replicates": 2}}
    assert to_decide(pooled, 6) == []


def test_the_finished_replicates_are_counted_from_0_and_the_control_once():
    done = {("x", 0), ("x", 1), ("x", 3), ("ref", 0), ("ref", 1), ("ref", 2), ("ctl", 0)}
    assert trained_prefix(done, {"ctl"}, ["x", "ref", "ctl"], 6) == 2
    assert trained_prefix(done, {"ctl"}, ["ref", "ctl"], 6) == 3 and trained_prefix(done, {"ctl"}, ["ref"], 2) == 2
    assert trained_prefix(done, set(), ["ctl"], 6) == 1 and trained_prefix(set(), set(), ["x"], 6) == 0


def test_the_table_says_which_rows_trained_past_the_first_look():
    rows = [
        {"optimization": "flash", "backbone": "unet", "looks": {"replicates": 6, "extended_for": ["dose 4"]}},
        {"optimization": "compile", "backbone": "dit", "looks": {"replicates": 3, "extended_for": []}},
    ]
    (line,) = look_lines({"looks": {"first_replicates": 3}, "rows": rows})[1:]
    assert (
        line
        == "Replicates: 3 for every row first (`--first-replicates`); rows trained further: flash (unet) to 6 for dose 4."
    )
    assert look_lines({"looks": {"first_replicates": 3}, "rows": rows[1:]})[1].endswith("rows trained further: none.")
    assert look_lines({"rows": rows}) == []  # an atlas of before the looks
