"""``divergence pair OUT KEY=VALUE ...``: a pair folder named after the fact, as the verdict then reads it."""

import json

import pytest

from divergence.cli import main
from divergence.pairfolder.arm.lock import ArmLock
from tests.analysis.synthetic import write_dose_study


def summary(*roots):
    """``divergence report``'s summary.json of ``roots`` without its figures (not read here): the folders read
    as the report reads them (``load_pairs``), analysed as it analyses them."""
    from divergence.analysis import analyze, to_summary
    from divergence.report.inputs import load_pairs

    return json.loads(json.dumps(to_summary(analyze(load_pairs(list(roots))))))


def verdicts(root, tmp_path):
    return summary(root)["verdicts"]


def test_the_verdict_names_the_pair_by_the_name_set(tmp_path, capsys):
    root = write_dose_study(tmp_path / "study", replicates=2)
    for folder in root.glob("flash-vs-baseline-r*"):
        assert main(["pair", str(folder), "name=my-kernel", "description=my kernel vs theirs"]) == 0
    assert "name=my-kernel" in capsys.readouterr().out
    (verdict,) = verdicts(root, tmp_path)
    assert verdict["study"] == "my-kernel"
    assert "my kernel vs theirs perturbs training" in verdict["headline"]


def test_a_category_set_to_control_takes_the_pair_out_of_the_study(tmp_path):
    root = write_dose_study(tmp_path / "study", replicates=2, control=None)
    for folder in root.glob("flash-vs-baseline-r*"):
        assert main(["pair", str(folder), "category=control"]) == 0
    assert verdicts(root, tmp_path) == []  # an identical-arms run is a control, not a pair under study


def test_a_users_own_pair_set_to_reordering_is_the_reordering_reference_of_the_verdict(tmp_path):
    root = write_dose_study(tmp_path / "study", replicates=2)  # flash at 1e-8 against bf16 at 1e-5
    mine = write_dose_study(tmp_path / "mine", study=1e-11, precision=None, seed=False, control=None, replicates=2)
    for folder in mine.glob("flash-vs-baseline-r*"):  # the user's own reordering, trained anywhere
        assert main(["pair", str(folder), "name=my-reordering", "category=reordering"]) == 0
    read = summary(root, mine)
    (verdict,) = read["verdicts"]
    assert {p["category"] for p in read["pairs"].values() if p["name"] == "my-reordering"} == {"reordering"}
    assert verdict["reordering"]["reference"] == "my-reordering" and verdict["reordering"]["replicates"] == 2
    assert verdict["reordering"]["status"] == "beyond_reordering" and abs(verdict["reordering"]["log10"] - 3) < 0.05
    assert read["settings"]["reordering_reference"] == "my-reordering"


def test_arm_labels_and_the_rest_of_pair_json_kept(tmp_path):
    root = write_dose_study(tmp_path / "study", replicates=1)
    folder = next(root.glob("flash-vs-baseline-r*"))
    before = json.loads((folder / "pair.json").read_text())
    assert main(["pair", str(folder), "arms.a=attention=flash,precision=bf16", "arms.b=attention=sdpa"]) == 0
    after = json.loads((folder / "pair.json").read_text())
    assert after["arms"] == {"a": ["attention=flash", "precision=bf16"], "b": ["attention=sdpa"]}
    assert {k: v for k, v in after.items() if k != "arms"} == {k: v for k, v in before.items() if k != "arms"}


@pytest.mark.parametrize(
    "word, says",
    [
        ("name=has space", "name: "),
        ("category=fast", "category='fast': must be one of optimization, seed, precision, control, reordering"),
        ("colour=red", "'colour=red': give KEY=VALUE with KEY one of name, category"),
        ("name", "'name': give KEY=VALUE"),
        ("arms.a=,", "arms.a=',': give the arm's labels"),
    ],
)
def test_bad_values_are_one_line_and_exit_2(tmp_path, capsys, word, says):
    root = write_dose_study(tmp_path / "study", replicates=1)
    folder = next(root.glob("flash-vs-baseline-r*"))
    before = (folder / "pair.json").read_bytes()
    assert main(["pair", str(folder), word]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1
    assert (folder / "pair.json").read_bytes() == before


def test_refused_while_a_writer_holds_an_arm_and_without_pair_json(tmp_path, capsys):
    root = write_dose_study(tmp_path / "study", replicates=1)
    folder = next(root.glob("flash-vs-baseline-r*"))
    lock = ArmLock(folder / "b")
    try:
        assert main(["pair", str(folder), "name=other"]) == 2
        assert "still writes arm b of this pair folder" in capsys.readouterr().err
    finally:
        lock.release()
    assert json.loads((folder / "pair.json").read_text())["name"] == "flash-vs-baseline"
    assert main(["pair", str(tmp_path / "nowhere"), "name=x"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
