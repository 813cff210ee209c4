"""``divergence check step``: the example's paths through the command line, its exit codes and one-line errors."""

from pathlib import Path

import pytest

from divergence.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "one_step_check.py"


def _step(change, *extra):
    return ["check", "step", f"{EXAMPLE}:{change}", f"{EXAMPLE}:baseline", "--setup", f"{EXAMPLE}:setup", *extra]


def test_reordering_like_exits_0_and_a_bug_exits_1(tmp_path, capsys):
    assert main(_step("two_ranks", "--json", str(tmp_path / "r.json"))) == 0
    assert capsys.readouterr().out.startswith("reordering-like")
    assert '"status": "reordering_like"' in (tmp_path / "r.json").read_text()
    assert main(_step("two_ranks_one_left_out")) == 1
    assert "2.bias" in capsys.readouterr().out  # the tensor furthest above its reordering is named


@pytest.mark.parametrize(
    "argv, message",
    [
        (_step("nope"), "has no function 'nope'"),
        (
            ["check", "step", "missing.py:f", f"{EXAMPLE}:baseline", "--setup", f"{EXAMPLE}:setup"],
            "missing.py: no such",
        ),
        (["check", "step", f"{EXAMPLE}:two_ranks", f"{EXAMPLE}:baseline"], "--setup FILE.py:FUNCTION"),
        (_step("two_ranks", "--update"), "kind='update': give reordered="),
        (
            ["check", "step", f"{EXAMPLE}:setup", f"{EXAMPLE}:baseline", "--setup", f"{EXAMPLE}:setup"],
            "raised TypeError",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_trajectory_of_a_folder_that_is_no_pair_is_one_line(tmp_path, capsys):
    assert main(["check", "trajectory", str(tmp_path), "--reference", str(tmp_path)]) == 2
    assert "not a pair folder (no pair.json)" in capsys.readouterr().err
