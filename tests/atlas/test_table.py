"""The atlas's table logic on synthetic studies: rows from a report's summary and the pair runs'
costs, the seed ceiling, unavailable rows, the files and the figure."""

import json
import math

import pytest

from divergence.analysis import analyze, to_summary
from divergence.atlas.catalog import OPTIMIZATIONS, backbones, select
from divergence.atlas.render import COLUMNS, cells, write_atlas
from divergence.atlas.rows import measured_row, numerics_text, pair_costs, seed_ceiling, unavailable_row
from divergence.errors import UserInputError
from divergence.training.step_costs import append_costs, read_costs
from tests.analysis.synthetic import dose_study

STUDY = "flash-vs-baseline"  # the synthetic study's pair under study


@pytest.fixture(scope="module")
def summary():
    """A bounded synthetic study: the pair's dose 1e-8 against precision's 1e-5 (-3 dex), 3 replicates."""
    return to_summary(analyze(dose_study(study=1e-8, precision=1e-5, replicates=3, horizon=120), n_boot=200))


def _write_costs(folder, a_seconds, b_seconds, a_peak, b_peak, steps=6):
    folder.mkdir(parents=True, exist_ok=True)
    for step in range(1, steps + 1):
        append_costs(
            folder / "costs.jsonl",
            step,
            "rss",
            arms={"a": {"seconds": a_seconds, "peak_bytes": a_peak}, "b": {"seconds": b_seconds, "peak_bytes": b_peak}},
        )


def test_a_row_states_the_dose_its_interval_the_outcome_and_the_costs(summary, tmp_path):
    for p in summary["pairs"].values():  # the pair under study's runs recorded costs: a takes 0.5x the time
        if p["name"] == STUDY:
            p["folder"] = str(tmp_path / f"r{p['replicate']}")
            _write_costs(tmp_path / f"r{p['replicate']}", 0.5, 1.0, 300, 200)
    row = measured_row(OPTIMIZATIONS["flash"], "unet", STUDY, summary, "unet/reports/flash")
    verdict = summary["verdicts"][0]
    assert row["status"] == verdict["status"] == "bounded"
    assert row["dose_ratio"]["log10"] == verdict["dose_ratio"]["log10"] and abs(row["dose_ratio"]["log10"] + 3) < 0.2
    assert row["dose_ratio"]["lo"] < row["dose_ratio"]["log10"] < row["dose_ratio"]["hi"]
    assert row["dose_ratio"]["replicates"] == 3 and row["dose_ratio"]["status"] == "bounded"
    assert row["outcome"]["status"] == verdict["outcome"]["status"]
    assert row["cost"]["time_ratio"] == pytest.approx(0.5) and row["cost"]["memory_ratio"] == pytest.approx(1.5)
    assert row["cost"]["steps"] == 3 * 4  # 6 steps a replicate, the first 2 left out (warm-up)
    text = cells(row)
    assert len(text) == len(COLUMNS) and text[3].startswith("-3.") and "(3)" in text[3]
    assert text[8] == "0.50x" and text[9] == "1.50x" and text[-1] == "bounded"


def test_the_seed_ceiling_is_the_seed_pair_over_the_precision_pair_at_the_last_step(summary):
    pairs = summary["pairs"].values()
    last = {
        c: sorted(p["trajectory"]["rel_l2"][-1] for p in pairs if p["category"] == c) for c in ("seed", "precision")
    }
    expected = math.log10(last["seed"][1] / last["precision"][1])  # medians of 3 replicates
    assert seed_ceiling(summary) == pytest.approx(expected) and expected > 0


def test_costs_skip_warm_up_steps_keep_the_last_line_of_a_step_and_a_torn_line(tmp_path):
    _write_costs(tmp_path, 2.0, 1.0, 100, 100, steps=4)
    append_costs(
        tmp_path / "costs.jsonl",
        4,
        "rss",
        arms={"a": {"seconds": 4.0, "peak_bytes": 100}, "b": {"seconds": 1.0, "peak_bytes": 0}},
    )
    with open(tmp_path / "costs.jsonl", "a") as f:
        f.write('{"step": 5, "memory": "rss", "ar')  # killed mid-write
    assert set(read_costs(tmp_path / "costs.jsonl")) == {1, 2, 3, 4}
    costs = pair_costs([tmp_path])
    assert costs["steps"] == 2 and costs["time_ratio"] == pytest.approx(3.0)  # median of 2.0 (step 3) and 4.0
    assert costs["memory_ratio"] == pytest.approx(1.0)  # step 4's b peak of 0 is no ratio
    assert pair_costs([tmp_path / "none"]) is None


def test_rows_that_cannot_run_here_say_why():
    assert OPTIMIZATIONS["tf32"].unavailable("cpu").startswith("GPU only")
    assert OPTIMIZATIONS["sdpa-efficient"].unavailable("cpu").startswith("GPU only")
    assert OPTIMIZATIONS["cpu-threads"].unavailable("cuda").startswith("CPU only")
    assert OPTIMIZATIONS["tf32"].unavailable("cuda") is None and OPTIMIZATIONS["flash"].unavailable("cpu") is None
    assert OPTIMIZATIONS["fsdp-full"].unavailable("cpu") is None  # FSDP2 on gloo ranks
    assert OPTIMIZATIONS["fsdp"].pair == OPTIMIZATIONS["fsdp-full"].pair  # the earlier name, kept as an alias
    assert OPTIMIZATIONS["data-parallel"].unavailable("cpu") is None  # separate jobs, trained by the atlas
    row = unavailable_row(OPTIMIZATIONS["tf32"], "dit", OPTIMIZATIONS["tf32"].unavailable("cpu"))
    assert row["status"] == "unavailable" and cells(row)[-1].startswith("GPU only")


def test_numerics_say_each_arm_where_they_differ():
    a = {"device": "cpu", "precision": "bf16-mixed", "cpu_autocast": "emulate", "cpu_threads": 1}
    assert numerics_text({"a": a, "b": a}) == "bf16-mixed (cpu, emulated autocast, 1 thread)"
    assert numerics_text({"a": {**a, "cpu_threads": 2}, "b": a}).endswith(
        "2 threads) vs bf16-mixed (cpu, emulated autocast, 1 thread)"
    )


def test_the_atlas_files_and_the_figure(summary, tmp_path):
    rows = [
        measured_row(OPTIMIZATIONS["flash"], "unet", STUDY, summary, "r"),
        unavailable_row(OPTIMIZATIONS["tf32"], "unet", "GPU only: TF32 runs on cuda"),
    ]
    rows[0]["cost"] = {"time_ratio": 0.8, "memory_ratio": 1.0}
    atlas = {
        "schema": 1,
        "device": "cpu",
        "generated": "now",
        "command": "divergence atlas --out A",
        "backbones": {"unet": {"seed_ceiling": seed_ceiling(summary)}},
        "rows": rows,
    }
    files = write_atlas(tmp_path, atlas)
    assert [f.name for f in files] == ["atlas.json", "atlas.md", "atlas.html", "atlas.png"]
    data = json.loads((tmp_path / "atlas.json").read_text())
    assert data["rows"][0]["dose_ratio"]["log10"] == rows[0]["dose_ratio"]["log10"] and data["figure"] == "atlas.png"
    md = (tmp_path / "atlas.md").read_text()
    assert "| flash | unet |" in md and "GPU only: TF32 runs on cuda" in md and "Seed ceiling" in md
    assert (tmp_path / "atlas.png").read_bytes()[:4] == b"\x89PNG"
    assert "data:image/png;base64," in (tmp_path / "atlas.html").read_text()
    rows[0]["cost"] = None  # nothing to place on the speed-up axis: the figure says which rows are not placed
    (tmp_path / "none").mkdir()
    files = write_atlas(tmp_path / "none", {**atlas, "rows": rows})
    assert files[-1].name == "atlas.png" and files[-1].stat().st_size > 0


def test_bad_names_are_one_line():
    with pytest.raises(UserInputError, match="--only nope: unknown optimization; known: fp8-tensorwise"):
        select(["flash", "nope"])
    with pytest.raises(UserInputError, match="--backbone vit: unknown backbone; known: unet, dit"):
        backbones("vit")
    assert [o.name for o in select(["flash", "fp8-tensorwise"])] == ["fp8-tensorwise", "flash"]


def test_names_of_points_that_sit_together_are_moved_apart():
    """Compile, accumulation and fused AdamW sat on one spot in the first atlas's figure."""
    from matplotlib.figure import Figure

    from divergence.atlas.render import _labels

    fig = Figure()
    ax = fig.subplots()
    ax.set_xlim(0.1, 10)
    ax.set_ylim(-5, 5)
    _labels(
        fig,
        ax,
        [("compile", 1.0, -3.3), ("grad-accumulation", 1.01, -3.35), ("fused-adamw", 1.0, -3.4), ("far", 0.2, 4)],
    )
    offsets = {t.get_text(): t.xyann[1] for t in ax.texts}
    assert offsets["compile"] == offsets["far"] == 3  # the top one and one alone stay beside their point
    assert len({offsets[n] for n in ("compile", "grad-accumulation", "fused-adamw")}) == 3


def test_the_reordering_column_states_each_row_against_the_reordering_reference(tmp_path):
    """A study with the reordering reference (R at 1e-11, the pair at 1e-8: +3 dex, beyond) and one
    without it (the column says '-' and the row's key is null)."""
    with_r = to_summary(analyze(dose_study(reordering=1e-11, replicates=3, horizon=120), n_boot=100))
    row = measured_row(OPTIMIZATIONS["compile"], "unet", STUDY, with_r, "r")
    r = row["reordering"]
    assert r["status"] == "beyond_reordering" and r["reference"] == "reordering" and r["replicates"] == 3
    assert r["read_on"] == "window"
    assert abs(r["log10"] - 3) < 0.2 and r["lo"] > 1
    text = cells(row)
    column = COLUMNS.index("vs reordering: log10 [95% CI] (n) status")
    assert (
        len(text) == len(COLUMNS)
        and text[column] == f"{r['log10']:+.2f} [{r['lo']:+.2f}, {r['hi']:+.2f}] (3) beyond_reordering"
    )
    assert text[-1] == row["status"]
    r["status"], r["replicates_needed"] = "inconclusive", 9  # an undecided row says what would decide it
    assert cells(row)[column].endswith("inconclusive, 9 replicates would decide")
    r["read_on"] = "valid_steps"  # no window formed: the cell says where it was read
    assert cells(row)[column].endswith("inconclusive (valid steps), 9 replicates would decide")
    without = measured_row(
        OPTIMIZATIONS["flash"],
        "unet",
        STUDY,
        to_summary(analyze(dose_study(replicates=2, horizon=120), n_boot=100)),
        "r",
    )
    assert without["reordering"] is None and cells(without)[column] == "-"
    assert len(cells(unavailable_row(OPTIMIZATIONS["tf32"], "unet", "GPU only"))) == len(COLUMNS)
    atlas = {"device": "cpu", "generated": "now", "backbones": {}, "rows": [row, without]}
    from divergence.atlas.render import markdown

    assert "against a reordering of fp32 sums (reordering)" in markdown(atlas)


def test_a_separate_pairs_costs_give_each_ranks_step_time_and_peak_memory(tmp_path):
    from divergence.atlas.render import rank_lines
    from divergence.pairfolder.folder import PairFolder
    from divergence.training.step_costs import append_costs, merge_rank_costs

    pair = PairFolder(tmp_path)
    per_rank = {"a": [(0.6, 130), (0.8, 140)], "b": [(1.2, 260)]}  # (seconds, MiB): a is DDP on 2 ranks
    for arm, ranks in per_rank.items():
        pair.arm(arm).path.mkdir(parents=True)
        for rank, (seconds, mib) in enumerate(ranks):
            for step in range(1, 6):
                cost = {"seconds": seconds * (1 + step / 100), "peak_bytes": mib * 2**20}
                append_costs(pair.arm(arm).rank_costs(rank), step, "rss", **cost)
    assert merge_rank_costs(tmp_path) == 5
    costs = pair_costs([tmp_path])
    assert costs["steps"] == 3 and costs["seconds"]["a"] == pytest.approx(0.8 * 1.04)  # the slowest rank's step
    assert [r["seconds"] for r in costs["ranks"]["a"]] == pytest.approx([0.6 * 1.04, 0.8 * 1.04])
    assert [r["peak_bytes"] for r in costs["ranks"]["b"]] == [260 * 2**20]
    row = {"optimization": "data-parallel", "backbone": "unet", "cost": costs}
    (line,) = rank_lines({"rows": [row, {"optimization": "flash", "backbone": "unet", "cost": None}]})[2:]
    assert (
        line
        == "- data-parallel (unet): a 2 ranks: 0.624 s, 0.832 s a step, 130 MiB, 140 MiB peak; b 1 rank: 1.25 s a step, 260 MiB peak"
    )
    _write_costs(tmp_path / "lockstep", 1.0, 1.0, 1, 1)
    assert pair_costs([tmp_path / "lockstep"])["ranks"] is None and rank_lines({"rows": [row | {"cost": None}]}) == []
