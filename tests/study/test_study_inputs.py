"""Bad study and calibration input: one line naming the key and the value, nothing written."""

import os
from pathlib import Path

import pytest
import yaml

from divergence.cli import main
from tests.scaleout import launch_stubs
from tests.helpers import assert_one_line

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


@pytest.mark.parametrize("doses", ["[1e300]", "[1.0e+300]", "[1.0e-4, 1.0e+16]"])
def test_a_dose_too_large_to_name_its_pair_names_doses(doses, tmp_path, capsys):
    out = tmp_path / "cal"
    assert main(["calibrate", "--out", str(out), "--quiet", f"doses={doses}"]) == 2
    err = assert_one_line(capsys, "doses[", "< 1e+16")
    assert "pair name" not in err
    assert not out.exists()


def test_an_empty_study_name_is_refused_naming_the_key(tmp_path, capsys):
    """``name=`` read as null used to make a study called "None" (and a folder runs/None)."""
    out = tmp_path / "study"
    assert main(["study", "--out", str(out), "--quiet", "--no-wandb", "name="]) == 2
    assert_one_line(capsys, "study.yaml: name: None is not a usable study name")
    assert main(["launch", "--study", str(RECIPES / "study.yaml"), "--scheduler", "slurm", "--dry-run", "name="]) == 2
    assert_one_line(capsys, "divergence launch: error: ", "name: None")
    assert main(["calibrate", "--out", str(out), "--quiet", "name="]) == 2
    assert_one_line(capsys, "calibration.yaml: name: None")
    assert not out.exists()


def _inline(tmp_path):
    path = tmp_path / "inline.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "s",
                "base": str(RECIPES / "tiny.yaml"),
                "study": {"name": "x", "arms": {"a": ["nosuch"], "b": []}},
                "references": {"control": str(RECIPES / "pairs" / "control.yaml")},
            }
        )
    )
    return path


def test_an_inline_unknown_variant_names_its_key_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    path, out = _inline(tmp_path), tmp_path / "study"
    assert main(["study", "--recipe", str(path), "--out", str(out), "--quiet", "--no-wandb"]) == 2
    assert_one_line(capsys, f"{path}: study.arms.a[0]: unknown variant 'nosuch'")
    monkeypatch.setenv("PATH", launch_stubs.install(tmp_path)["PATH"])
    for dry_run in ([], ["--dry-run"]):
        assert main(["launch", "--study", str(path), "--scheduler", "slurm", "--out", str(out), *dry_run]) == 2
        assert_one_line(capsys, f"{path}: study.arms.a[0]: unknown variant 'nosuch'")
    assert not out.exists()  # no OUT/recipes left behind


def test_a_reference_file_error_names_the_key_and_the_file(tmp_path, capsys):
    bad = tmp_path / "bad-pair.yaml"
    bad.write_text(yaml.safe_dump({"name": "bad", "arms": {"a": [{"tf32": "maybe"}], "b": []}}))
    study = tmp_path / "study.yaml"
    study.write_text(
        yaml.safe_dump(
            {
                "name": "s",
                "base": str(RECIPES / "tiny.yaml"),
                "study": str(RECIPES / "pairs" / "fused-adamw.yaml"),
                "references": {"seed": str(bad)},
            }
        )
    )
    assert main(["study", "--recipe", str(study), "--out", str(tmp_path / "out"), "--quiet", "--no-wandb"]) == 2
    assert_one_line(capsys, f"{study}: references.seed ({bad}): arms.a[0]")
    assert not (tmp_path / "out").exists()


def test_bad_jobs_leaves_nothing(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["study", "--out", str(out), "--quiet", "--no-wandb", "--jobs", "0"]) == 2
    assert_one_line(capsys, "--jobs 0")
    assert not out.exists()


def test_a_study_folder_that_cannot_be_made_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert (
        main(
            [
                "study",
                "--out",
                str(tmp_path / "file" / "study"),
                "--quiet",
                "--no-wandb",
                "--max-steps",
                "1",
                "replicates=1",
            ]
        )
        == 2
    )
    assert_one_line(capsys, str(tmp_path / "file" / "study"))
    assert os.listdir(tmp_path) == ["file"]


def test_a_separate_job_pairs_progress_counts_its_arms_then_its_store(tmp_path):
    """A separate-job pair writes its store only after both arms (arm a, arm b, then the comparator), so its
    bar reads the three in turn: the arms' last loss steps and the store's last step, averaged; a lockstep
    pair's is its store's."""
    from divergence.pairfolder.arm.losses import LossFile
    from divergence.study.runner import PairJob

    job = PairJob(None, tmp_path / "r.yaml", tmp_path / "pair", max_steps=30)
    assert job.done_steps() == 0
    for step in range(1, 31):
        LossFile(job.out / "a").append(step, 1.0)
    assert job.done_steps() == 10  # arm a done: a third of the pair
    for step in range(1, 13):
        LossFile(job.out / "b").append(step, 1.0)
    with open(job.out / "b" / "losses.jsonl", "a") as f:
        f.write('{"step": 13, "lo')  # a line being written is not counted
    assert job.done_steps() == (30 + 12) // 3
