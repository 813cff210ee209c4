"""``divergence.watch(DIR)``: the watch command as a function, its result returned, bad input raised."""

import pytest

import divergence
from divergence.cli import main
from divergence.errors import UserInputError
from divergence.store import MetricsStore
from tests.byo.test_watch_result import two_arms


def test_watch_returns_what_it_stored_and_prints_the_command_line(tmp_path, capsys):
    out = tmp_path / "pair"
    two_arms(out)
    capsys.readouterr()
    result = divergence.watch(out, poll=0.05, timeout=30, wandb=False, quiet=True)
    assert result.complete and result.code == 0
    assert (result.steps, result.compared, result.last_step) == (7, 4, 6)
    assert result.seconds > 0
    assert MetricsStore(out).steps() == list(range(7))
    assert (out / "csv" / "metrics.csv").is_file()  # wandb=False keeps the CSV logs
    printed = capsys.readouterr()
    assert printed.err == "" and printed.out.startswith(f"{out}: 7 steps stored (4 compared); step 6:")
    again = divergence.watch(out, poll=0.05, timeout=30, logs=False, quiet=True)  # a complete pair: done at once
    assert (again.code, again.steps) == (0, 7)


def test_watch_of_a_pair_that_never_starts_times_out_with_code_1(tmp_path, capsys):
    result = divergence.watch(tmp_path / "nothing", poll=0.05, timeout=0.2, logs=False)
    assert (result.code, result.complete, result.steps, result.last_step) == (1, False, 0, None)
    assert "holds no started pair after 0.2 s" in capsys.readouterr().err


def test_bad_arguments_raise_one_line_in_python_and_exit_2_on_the_command_line(tmp_path, capsys):
    with pytest.raises(UserInputError, match=r"^watch\(poll=0\): must be > 0 seconds$"):
        divergence.watch(tmp_path, poll=0)
    with pytest.raises(UserInputError, match=r"^watch\(timeout=-1\): must be > 0 seconds$"):
        divergence.watch(tmp_path, timeout=-1)
    assert main(["watch", str(tmp_path), "--poll", "0"]) == 2
    assert capsys.readouterr().err == "divergence watch: error: --poll 0: must be > 0 seconds\n"
