"""``divergence calibrate``: the grad-noise ladder trained with replicates and handed to the analysis."""

import json
import sys
import types
from pathlib import Path

import pytest

from divergence.cli import main
from divergence.errors import RecipeError
from divergence.study.calibration import ladder_name, load_calibration

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_shipped_ladder_spans_the_references_doses():
    calibration = load_calibration(RECIPES / "calibration.yaml")
    doses = calibration.doses
    assert len(doses) >= 5 and doses[0] <= 1e-6 and doses[-1] >= 1.0
    pairs = calibration.study.pairs
    ladder = [p for p in pairs if p.role == "ladder"]
    assert [p.name for p in ladder] == [ladder_name(eps) for eps in doses] and ladder[0].name == "grad-noise-1e-06"
    assert ladder[0].recipe["arms"] == {"a": [{"grad-noise": 1e-6}], "b": []}
    assert {p.role for p in pairs} == {"ladder", "seed", "precision"} and calibration.horizons == (100, 300)


@pytest.mark.parametrize(
    "text,message",
    [
        ("doses: [0.1, -1]", "doses[1]"),
        ("doses: []", "doses:"),
        ("doses: [1e-3, 1e-2, 1e-1]\nhorizons: [0]", "horizons"),
        ("flavour: 1", "unknown key"),
    ],
)
def test_bad_calibration_recipes(tmp_path, text, message):
    path = tmp_path / "calibration.yaml"
    path.write_text(f"base: {RECIPES}/tiny.yaml\n{text}\n")
    with pytest.raises(RecipeError, match=None) as err:
        load_calibration(path)
    assert message in str(err.value)


def test_calibrate_trains_the_ladder_and_calls_evaluate(tmp_path, monkeypatch, capsys):
    calls = []

    def evaluate(ladder, seed_pairs, horizons=(100, 300), references=None):  # a stand-in recording its inputs
        calls.append((ladder, seed_pairs, horizons, references))
        return {"doses": sorted(ladder), "replicates": [len(v) for _, v in sorted(ladder.items())]}

    # the stand-in takes 2 doses (the statistic's 3: the next test), each dose 2 pair runs (its replicates)
    monkeypatch.setitem(
        sys.modules, "divergence.analysis.calibration", types.SimpleNamespace(evaluate=evaluate, MIN_DOSES=2)
    )
    out = tmp_path / "cal"
    args = [
        "calibrate",
        "--out",
        str(out),
        "--max-steps",
        "2",
        "--replicates",
        "2",
        "--jobs",
        "2",
        "--quiet",
        "doses=[1.0e-4,1.0e-2]",
        "base=tiny-dit.yaml",  # the ladder's mechanics, not a backbone's: the DiT trains ~3x faster than the UNet
        "references.precision=null",
        "horizons=[1,2]",
        "train.batch_size=2",
        "tracking.probe.size=2",
        "sample.enabled=false",
        "log.wandb=false",
        "log.csv=false",
        "tracking.dense=[]",
        "data.resolution=16",  # 8x8 patches, not 16x16: a pair step ~2x cheaper, the ladder's mechanics the same
    ]
    assert main(args) == 0
    ((ladder, seed_pairs, horizons, references),) = calls
    assert sorted(ladder) == [1e-4, 1e-2] and horizons == (1, 2) and references == {}  # precision=null
    assert all(len(runs) == 2 for runs in ladder.values()) and len(seed_pairs) == 2
    run = ladder[1e-2][1]
    assert run.name == "grad-noise-0.01" and Path(run.folder) == (out / "grad-noise-0.01" / "r1").resolve()
    assert json.loads((out / "grad-noise-0.01" / "r1" / "pair.json").read_text())["arms"] == {
        "a": ["grad-noise=0.01"],
        "b": [],
    }
    assert json.loads((out / "calibration.json").read_text()) == {"doses": [1e-4, 1e-2], "replicates": [2, 2]}


def test_fewer_than_three_doses_are_refused_before_anything_trains(tmp_path, capsys):
    """``calibrate`` with two doses trained every pair run, then refused."""
    out = tmp_path / "cal"
    assert main(["calibrate", "--out", str(out), "--quiet", "--max-steps", "2", "doses=[1.0e-4,1.0e-2]"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "doses: 2 given (0.0001, 0.01)" in err and "at least 3" in err
    assert not out.exists()  # nothing trained, nothing written
