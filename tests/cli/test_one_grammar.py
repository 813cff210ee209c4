"""One CLI grammar: one flag for "no wandb" with one meaning, renamed flags kept working."""

import argparse
import re

import pytest

from divergence.cli import build_parser, main
from tests.byo.test_watch_result import two_arms


def command_help(command: str) -> str:
    return build_parser()._subparsers._group_actions[0].choices[command].format_help()


@pytest.mark.parametrize("command", ["train", "study", "calibrate", "consequence", "atlas", "report", "watch"])
def test_every_command_that_logs_to_wandb_takes_no_wandb_and_shows_no_other_spelling(command):
    text = command_help(command)
    assert "--no-wandb" in text and "--no-log" not in text


def test_watch_no_wandb_keeps_the_csv_logs_and_no_log_still_writes_the_store_only(tmp_path, capsys):
    for folder, flag in (("w", "--no-wandb"), ("s", "--no-log")):
        two_arms(tmp_path / folder)
        capsys.readouterr()
        args = ["watch", str(tmp_path / folder), flag, flag, "--quiet", "--poll", "0.05", "--timeout", "30"]
        assert main(args) == 0
        err = capsys.readouterr().err
        assert not (tmp_path / folder / "wandb").exists()
        assert (tmp_path / folder / "csv" / "metrics.csv").is_file() == (flag == "--no-wandb")
        # the old name: said once (given twice here), the new name in the line
        assert err.count("--no-log is deprecated; use --no-wandb") == (flag == "--no-log")


@pytest.mark.parametrize("command", ["study", "calibrate", "consequence", "train"])
def test_no_wandb_reaches_the_pair_runs(command, tmp_path, monkeypatch):
    """``--no-wandb`` of a command that trains: log.wandb=false in every run it trains (study: the report too)."""
    seen = {}

    class Planned(Exception):
        pass

    def plan_jobs(study, out, overrides):
        seen["overrides"] = overrides
        raise Planned

    def load_pair_recipe(recipe, overrides):
        seen["overrides"] = overrides
        raise Planned

    monkeypatch.setattr("divergence.study.runner.plan_jobs", plan_jobs)
    monkeypatch.setattr("divergence.variants.pair_recipe.load_pair_recipe", load_pair_recipe)
    extra = ["--recipe", "divergence/recipes/pairs/flash-vs-baseline.yaml"] if command == "train" else []
    with pytest.raises(Planned):
        main([command, "--out", str(tmp_path / "o"), "--no-wandb", *extra])
    assert "log.wandb=false" in seen["overrides"]


def test_watch_without_lightning_no_wandb_is_the_store_alone_and_logging_is_refused(tmp_path, monkeypatch, capsys):
    from divergence.extras import MissingExtra

    def require(extra, *modules):
        raise MissingExtra("lightning is not installed: pip install 'divergence[train]'")

    monkeypatch.setattr("divergence.extras.require", require)
    two_arms(tmp_path / "p")
    assert main(["watch", str(tmp_path / "p"), "--quiet", "--poll", "0.05", "--timeout", "30"]) == 2
    assert "or pass --no-wandb (the store without logs)" in capsys.readouterr().err
    assert main(["watch", str(tmp_path / "p"), "--no-wandb", "--quiet", "--poll", "0.05", "--timeout", "30"]) == 0
    assert "the store only, no CSV logs" in capsys.readouterr().err and not (tmp_path / "p" / "csv").exists()


def _parsers(parser, name="divergence"):
    """Every parser of the command line, with its name: the top, each command, each command's actions."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_no_help_text_prints_rst_double_backticks():
    found = [
        f"{name}: {text[:60]}"
        for name, parser in _parsers(build_parser())
        for text in [parser.description or "", *(a.help or "" for a in parser._actions)]
        if "``" in text
    ]
    assert not found, found


def test_watch_and_track_say_in_their_help_how_they_differ():
    top, watch, track = (
        " ".join(t.split()) for t in (build_parser().format_help(), command_help("watch"), command_help("track"))
    )
    assert "while a pair's two arms train" in watch and "use divergence track" in watch
    assert "after training" in track and "use divergence watch" in track and "no losses" in track
    assert "(live)" in top and "after training:" in top


def test_one_action_groups_are_folded_and_their_old_spelling_still_works(tmp_path, capsys):
    from divergence.pairfolder.pair_json import PairInfo
    from divergence.store import MetricsStore

    listed = [
        line.split()[0]
        for line in build_parser().format_help().splitlines()
        if line.startswith("    ") and line[4] != " "
    ]
    assert "repair" in listed and "pair" in listed and "store" not in listed  # the old group: hidden
    two_arms(tmp_path / "p")
    assert main(["pair", str(tmp_path / "p"), "name=mine"]) == 0
    assert main(["pair", "set", str(tmp_path / "p"), "category=control"]) == 0
    assert (PairInfo.read(tmp_path / "p").name, PairInfo.read(tmp_path / "p").category) == ("mine", "control")
    assert capsys.readouterr().err.count("'divergence pair set DIR' is now 'divergence pair DIR'") == 1
    MetricsStore(tmp_path / "p").path.write_text("[]\n")
    assert main(["repair", str(tmp_path / "p")]) == 0 and "moved 1 lines" in capsys.readouterr().out
    MetricsStore(tmp_path / "p").path.write_text("[]\n")
    assert main(["store", "repair", str(tmp_path / "p")]) == 0
    out, err = capsys.readouterr()
    assert "moved 1 lines" in out and "'divergence store repair DIR' is now 'divergence repair DIR'" in err


def _series(folder, steps=(0, 10)):
    """A checkpoint series of a tiny state dict: step_N.safetensors files."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    for step in steps:
        save_file({"w": torch.full((3,), 1.0 + step)}, str(folder / f"step_{step}.safetensors"))


@pytest.mark.parametrize("command", ["train", "track", "watch", "export", "repair", "pair"])
def test_every_command_of_one_pair_folder_names_it_dir(command):
    usage = " ".join(command_help(command).split("\n\n")[0].split())
    assert re.search(r"[ \[]DIR\b", usage) and "--out" not in usage


def test_track_takes_the_pair_folder_as_dir_and_still_as_out(tmp_path, capsys):
    _series(tmp_path / "a")
    _series(tmp_path / "b")
    assert main(["track", str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "p"), "--quiet"]) == 0
    assert main(["track", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "q"), "--quiet"]) == 0
    assert (tmp_path / "p" / "metrics.jsonl").read_bytes() == (tmp_path / "q" / "metrics.jsonl").read_bytes()
    assert (
        main(["track", str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "r"), "--out", str(tmp_path / "s")])
        == 2
    )
    assert capsys.readouterr().err.strip().startswith("divergence track: error: give the folder once, as DIR")
    assert main(["track", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert "the folder is missing: give it as DIR" in capsys.readouterr().err


def test_train_takes_its_folder_as_dir_before_the_overrides_and_still_as_out(tmp_path, monkeypatch):
    trained = []
    monkeypatch.setattr("divergence.training.single.train_run", lambda recipe, out: trained.append((recipe, out)))
    for args in (
        ["train", str(tmp_path / "r"), "train.max_steps=3"],
        ["train", "train.max_steps=3", "--out", str(tmp_path / "r")],
        ["train", str(tmp_path / "r"), "--checkpoint-every", "5", "train.max_steps=3"],  # KEY=VALUE after an option
        ["train", "train.max_steps=3", str(tmp_path / "r")],
    ):
        assert main(args) == 0
    assert [(recipe.train.max_steps, str(out)) for recipe, out in trained] == [(3, str(tmp_path / "r"))] * 4
    assert main(["train", "train.max_steps=3"]) == 2  # an override is not a folder
    assert main(["train", str(tmp_path / "r"), str(tmp_path / "s")]) == 2  # one folder
    with pytest.raises(SystemExit, match="2"):
        main(["train", str(tmp_path / "r"), "--bogus"])  # an unknown option is still refused


@pytest.mark.parametrize(
    "command",
    [
        ["train", "--max-steps", "3", "train.max_steps=4"],
        ["train", "--checkpoint-every", "2", "train.checkpoint_every=5"],
        ["study", "--max-steps", "3", "train.max_steps=4"],
        ["study", "--replicates", "2", "replicates=3"],
        ["calibrate", "--max-steps", "3", "train.max_steps=4"],
        ["train", "--no-wandb", "log.wandb=true"],
    ],
)
def test_a_flag_and_its_recipe_key_with_two_values_are_refused_in_one_line(command, tmp_path, capsys):
    """``--max-steps N`` is ``train.max_steps=N``: given both with different values, neither silently wins."""
    folder = [str(tmp_path / "out")] if command[0] == "train" else ["--out", str(tmp_path / "out")]  # a study folder
    assert main([command[0], *folder, *command[1:]]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "give the value once" in err and command[1] in err, err
    assert not (tmp_path / "out").exists()


def test_a_flag_and_its_recipe_key_with_one_value_agree():
    from divergence.cli import shorthand

    overrides = ["train.max_steps=6", "train.lr=1e-4"]
    shorthand(overrides, "--max-steps", "train.max_steps", 6)
    assert overrides[-1] == "train.max_steps=6"


@pytest.mark.parametrize("command", ["study", "calibrate", "consequence"])
@pytest.mark.parametrize("flag", ["--max-steps", "--replicates"])
def test_a_count_below_one_is_one_line_before_anything_is_written(command, flag, tmp_path, capsys):
    assert main([command, "--out", str(tmp_path / "o"), flag, "0", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [f"divergence {command}: error: {flag} 0: must be >= 1"], err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["study", "calibrate", "consequence"])
@pytest.mark.parametrize(("code", "status"), [(2, 2), (1, 1), (-9, 1)])
def test_a_failed_pair_run_is_one_line_and_its_exit_status(command, code, status, tmp_path, monkeypatch, capsys):
    """A pair run's bad input (its exit code 2) stays 2; any other failure, a kill too, is 1."""
    from divergence.study import PairFailed

    seen = {}

    def run_jobs(jobs, overrides, parallel, show_progress=True, shared=True):
        seen.update(parallel=parallel, shared=shared, recipes=all(j.recipe_path.is_file() for j in jobs))
        raise PairFailed("seed-vs-seed r0: the pair failed", code)

    monkeypatch.setattr("divergence.study.run_jobs", run_jobs)
    argv = [command, "--out", str(tmp_path / "o"), "--jobs", "1", "--no-shared-arms", "--quiet"]
    assert main(argv) == status
    assert capsys.readouterr().err.strip() == f"divergence {command}: error: seed-vs-seed r0: the pair failed"
    assert seen == {"parallel": 1, "shared": False, "recipes": True}  # recipes written before training
