"""``divergence atlas``: the plan (one study per backbone, references once), a tiny atlas end to end,
its resume, and bad input as one line."""

import json
import os
from pathlib import Path

import pytest

from divergence.atlas.catalog import OPTIMIZATIONS
from divergence.atlas.plan import backbone_study
from divergence.cli import main
from divergence.training import child_start

QUICK = [
    "--no-wandb",
    "--quiet",
    "--backbone",
    "dit",  # the atlas's mechanics, not a backbone's: the DiT trains ~3x faster than the UNet
    "train.max_steps=5",
    "train.checkpoint_every=5",
    "train.batch_size=2",
    "tracking.every=1",
    "tracking.probe.size=4",
    "references.control=null",
    "references.seed=null",
    "references.reordering=null",
    "log.wandb=false",  # each arm's offline wandb run (~2.4 s of CPU a child): tests/loggers
    "data.resolution=16",  # 8x8 patches, not 16x16: a pair step ~2x cheaper, the atlas's mechanics the same
]


def test_one_study_per_backbone_trains_the_references_once_and_each_pair_in_its_numerics():
    plan = backbone_study("dit", [OPTIMIZATIONS["fp8-tensorwise"], OPTIMIZATIONS["flash"]], "cpu", [])
    names = [p.name for p in plan.study.pairs]
    assert names == ["fp8-tensorwise", "flash-vs-baseline", "seed-vs-seed", "bf16-vs-fp32", "control", "reordering"]
    assert plan.pairs == {"fp8-tensorwise": "fp8-tensorwise", "flash": "flash-vs-baseline"}
    assert plan.references == ("seed-vs-seed", "bf16-vs-fp32", "control", "reordering")
    by_name = {p.name: p for p in plan.study.pairs}
    assert all(Path(p.recipe["base"]).name == "tiny-dit.yaml" for p in plan.study.pairs)
    for name in ("fp8-tensorwise", "flash-vs-baseline"):  # deployment numerics: bf16 autocast for both arms
        assert by_name[name].recipe["recipe"]["train"]["precision"] == "bf16-mixed"
    assert "precision" not in by_name["seed-vs-seed"].recipe["recipe"]["train"]
    # the reordering reference once per backbone, in the base's fp32, declared a reordering
    assert (
        "precision" not in by_name["reordering"].recipe["recipe"]["train"]
        and by_name["reordering"].recipe["reordering"]
    )


def test_the_flash_unbiased_row_trains_its_pair_against_baseline_under_bf16_autocast():
    plan = backbone_study("unet", [OPTIMIZATIONS["flash-unbiased"]], "cpu", [])
    (pair,) = [p for p in plan.study.pairs if p.role == "study"]
    assert plan.pairs == {"flash-unbiased": "flash-unbiased"}
    assert pair.recipe["recipe"]["train"]["precision"] == "bf16-mixed"
    assert pair.recipe["arms"] == {"a": [{"attention": "flash-unbiased"}], "b": [{"attention": "baseline"}]}


def test_a_tiny_atlas_end_to_end_then_a_second_run_trains_nothing(tmp_path, capsys):
    out = tmp_path / "A"
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    assert main(["atlas", "--out", str(out), "--only", "fused-adamw", "tf32", "--replicates", "1", *QUICK]) == 0
    printed = capsys.readouterr().out
    # the pair runs' children shared the atlas's compile cache; this process's environment is as it was
    children = [dict(key[2]).get("TORCHINDUCTOR_CACHE_DIR") for key in child_start._zygotes]
    assert (cache or str((out / "inductor-cache").resolve())) in children
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == cache
    assert "fused-adamw" in printed and "tf32" in printed and "GPU only" in printed
    atlas = json.loads((out / "atlas.json").read_text())
    assert [(r["optimization"], r["backbone"]) for r in atlas["rows"]] == [("fused-adamw", "dit"), ("tf32", "dit")]
    fused, tf32 = atlas["rows"]
    assert tf32["status"] == "unavailable" and tf32["reason"].startswith("GPU only")
    assert fused["numerics"]["a"]["precision"] == "32-true" and fused["dose_ratio"]["reference"] == "bf16-vs-fp32"
    assert fused["status"] and fused["report"] == "dit/reports/fused-adamw"
    assert fused["cost"]["steps"] == 3 and fused["cost"]["time_ratio"] > 0  # 5 steps, 2 of warm-up, 1 replicate
    assert fused["cost"]["memory"] == "rss" and fused["cost"]["peak_bytes"]["a"] > 0
    for name in ("atlas.md", "atlas.html", "atlas.png", "dit/reports/fused-adamw/summary.json"):
        assert (out / name).is_file(), name
    runs = sorted(p.parent.relative_to(out).as_posix() for p in out.glob("dit/*/r*/pair.json"))
    assert runs == [f"dit/{n}/r{r}" for n in ("bf16-vs-fp32", "fused-adamw") for r in (0,)]
    for run in runs:  # every pair run recorded each arm's step time at every step, its peak memory at step 3
        lines = [json.loads(x) for x in (out / run / "costs.jsonl").read_text().splitlines()]
        assert [x["step"] for x in lines] == [1, 2, 3, 4, 5] and all(set(x["arms"]) == {"a", "b"} for x in lines)
        assert all(x["arms"][arm]["seconds"] > 0 for x in lines for arm in "ab")
        assert [x["arms"]["a"]["peak_bytes"] is not None for x in lines] == [False, False, True, False, False]
    # one replicate: a single look
    assert atlas["looks"] == {"first_replicates": 3} and fused["looks"] == {"replicates": 1, "extended_for": []}
    logs = {p.name: p.stat().st_size for p in (out / "dit" / "logs").iterdir()}
    assert main(["atlas", "--out", str(out), "--only", "fused-adamw", "tf32", "--replicates", "1", *QUICK]) == 0
    assert logs == {p.name: p.stat().st_size for p in (out / "dit" / "logs").iterdir()}  # no pair run started
    assert json.loads((out / "atlas.json").read_text())["rows"][0]["cost"] == fused["cost"]
    # `--only tf32` (nothing to train on a CPU) rewrote atlas.json with tf32's row alone
    assert main(["atlas", "--out", str(out), "--only", "tf32", "--replicates", "1", *QUICK]) == 0
    rows = json.loads((out / "atlas.json").read_text())["rows"]
    assert [(r["optimization"], r["status"] == "unavailable") for r in rows] == [("fused-adamw", False), ("tf32", True)]
    assert rows[0] == json.loads(json.dumps(fused))  # the earlier measured row, kept as it was


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--only", "flash", "nope"], "--only nope: unknown optimization; known: fp8-tensorwise, fp8-rowwise"),
        (["--backbone", "vit"], "--backbone vit: unknown backbone; known: unet, dit, moe, all"),
        (
            ["--first-replicates", "1"],
            "--first-replicates 1: must be >= 2 (one replicate has no interval to decide on)",
        ),
        (["--only", "expert-grouped"], "--only expert-grouped: a row of moe only, not of --backbone unet, dit"),
        (["--replicates", "0"], "--replicates 0: must be >= 1"),
        (["--calibration", "missing.json"], "--calibration missing.json: no such file"),
        (["--calibration", "."], "--calibration .: a folder; expected the calibration.json that divergence calibrate"),
        (
            ["--only", "train.max_steps=2"],  # an override alone would have started every row
            "--only train.max_steps=2: names no optimization; name the rows, then the overrides "
            "(--only flash train.max_steps=2), or leave --only out for every row",
        ),
        (["base=tiny.yaml"], "base=tiny.yaml: the atlas sets base and study itself"),
        (["--only", "flash", "train.lr=-1"], "lr: must be in (0, 1]"),  # KEY=VALUE after --only: an override
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    out = tmp_path / "A"
    assert main(["atlas", "--out", str(out), "--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("divergence atlas: error: ") and message in err and "\n" not in err
    assert not (out / "atlas.json").exists()
