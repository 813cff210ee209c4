"""Nothing a user or a shared recipe gives reaches launch's scripts raw.

A name (pair, study, inline study pair, wandb group) follows one rule where it enters; a value of
an ``#SBATCH`` line may not end the line or hold quotes; every other value is one quoted shell
word. Hostile input is refused in one line (exit 2, nothing written), or gives scripts that parse
and, run with stub ``sbatch``/``srun``/``torchrun``, run nothing they hold.
"""

import shutil
from pathlib import Path

import pytest
import yaml

from divergence.cli import main
from tests.scaleout import launch_stubs
from tests.scaleout.launch_stubs import HOSTILE, MARKER
from tests.helpers import assert_one_line_exit2

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
PAIR = str(RECIPES / "pairs" / "seed-vs-seed.yaml")
STUDY = str(RECIPES / "study.yaml")


def _refused(capsys, tmp_path, args, *named):
    err = assert_one_line_exit2(main(args), capsys)
    assert err.startswith("divergence launch: error: "), err
    assert any(n in err for n in named), (named, err)
    assert not (tmp_path / MARKER).exists()
    assert not (tmp_path / "out").exists()  # nothing written


def _entries(value):
    """(args after ``launch --X FILE``, what the error must name) for every way a value enters."""
    flags = [([f"{flag}={value}"], flag) for flag in ("--partition", "--time", "--account", "--mem", "--group")]
    return [*flags, ([f"--sbatch=constraint={value}"], "--sbatch"), ([f"name={value}"], "name")]


@pytest.mark.parametrize("what", ["--recipe", "--study"])
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "write"])
@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_name_or_sbatch_value_is_refused_in_one_line(what, dry_run, value, tmp_path, monkeypatch, capsys):
    env = launch_stubs.install(tmp_path)
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.chdir(tmp_path)
    recipe = PAIR if what == "--recipe" else STUDY
    for extra, named in _entries(value):
        args = ["launch", what, recipe, "--scheduler", "slurm", "--out", str(tmp_path / "out"), *extra]
        _refused(capsys, tmp_path, args + ["--dry-run"] * dry_run, named)
    assert launch_stubs.calls(tmp_path) == ""  # nothing submitted


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_name_in_a_shared_recipe_is_refused(value, tmp_path, monkeypatch, capsys):
    """A recipe from a colleague: the pair's name, the study's name, the inline study pair's name."""
    monkeypatch.chdir(tmp_path)
    pair = yaml.safe_load(Path(PAIR).read_text()) | {"name": value, "base": str(RECIPES / "tiny.yaml")}
    (tmp_path / "pair.yaml").write_text(yaml.safe_dump(pair))
    study = yaml.safe_load(Path(STUDY).read_text()) | {
        "base": str(RECIPES / "tiny.yaml"),
        "study": str(RECIPES / "pairs/fused-adamw.yaml"),
        "references": {"control": str(RECIPES / "pairs/control.yaml")},
    }
    (tmp_path / "named.yaml").write_text(yaml.safe_dump(study | {"name": value}))
    inline = study | {"study": {"name": value, "arms": {"a": [{"tf32": True}], "b": []}}}
    (tmp_path / "inline.yaml").write_text(yaml.safe_dump(inline))
    for what, recipe in (("--recipe", "pair.yaml"), ("--study", "named.yaml"), ("--study", "inline.yaml")):
        _refused(
            capsys,
            tmp_path,
            [
                "launch",
                what,
                str(tmp_path / recipe),
                "--scheduler",
                "slurm",
                "--out",
                str(tmp_path / "out"),
                "--dry-run",
            ],
            "name",
        )


@pytest.mark.parametrize("value", ["/tmp/x\ny", "/tmp/x\ry", "/tmp/x\x1by"])
def test_an_out_with_a_control_character_is_refused(value, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for scheduler in ("slurm", "torchrun"):
        _refused(
            capsys,
            tmp_path,
            ["launch", "--recipe", PAIR, "--scheduler", scheduler, "--out", value, "--dry-run"],
            "--out",
        )


def test_the_first_shell_breakout_of_the_issue_is_refused(tmp_path, monkeypatch, capsys):
    """``launch --study recipes/study.yaml --scheduler slurm --out D 'name=x$(touch F)'`` created F."""
    env = launch_stubs.install(tmp_path)
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.chdir(tmp_path)
    _refused(
        capsys,
        tmp_path,
        [
            "launch",
            "--study",
            STUDY,
            "--scheduler",
            "slurm",
            "--out",
            str(tmp_path / "out"),
            f"name=x$(touch {MARKER})",
        ],
        "name",
    )


def _hostile_folder(tmp_path, *parts):
    """The shipped recipes copied under a folder whose name holds shell syntax (a legal path)."""
    folder = tmp_path.joinpath(*parts)
    shutil.copytree(RECIPES, folder / "recipes")
    return folder


@pytest.mark.parametrize("scheduler", ["torchrun", "slurm"])
def test_awkward_paths_and_words_are_quoted_and_run_nothing(scheduler, tmp_path, monkeypatch, capfd):
    """Paths, ``--command``, ``--strategy`` and the container image hold shell syntax; the scripts
    quote each: they parse, run with stubs, create no marker, and the stubs get the words intact."""
    env = launch_stubs.install(tmp_path)
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.chdir(tmp_path)
    folder = _hostile_folder(tmp_path, f"r $(touch {MARKER}) `touch {MARKER}`; '\"")
    recipe = folder / "recipes" / "pairs" / "seed-vs-seed.yaml"
    if scheduler == "torchrun":  # its paths may hold anything but control characters
        out = folder / f"out $(touch {MARKER})"
        extra = ["--cpu"]
    else:  # an #SBATCH --output= line holds the pair folder: no spaces or quotes there
        out = tmp_path / "out" / "run&a|b"
        extra = ["--container-image", f"img$(touch {MARKER})", "--sbatch", "constraint=a100&nvlink|h100"]
    args = [
        "launch",
        "--recipe",
        str(recipe),
        "--scheduler",
        scheduler,
        "--out",
        str(out),
        "--strategy",
        f"ddp$(touch {MARKER})",
        "--command",
        f"divergence --x=$(touch {MARKER})",
        *extra,
    ]
    assert main(args) == 0, capfd.readouterr().err
    launch_stubs.check_scripts(out, env, tmp_path)
    assert not list(tmp_path.rglob(MARKER))
    calls = launch_stubs.calls(tmp_path)
    assert f"[--recipe] [{recipe}]" in calls and f"[--out] [{out}]" in calls
    # --command is split into words like a shell would split it, and each word is quoted
    assert f"[--x=$(touch] [{MARKER})]" in calls and f"[train.strategy=ddp$(touch {MARKER})]" in calls
    if scheduler == "slurm":
        arm = (out / "launch" / "arm-a.sbatch").read_text()
        assert "#SBATCH --constraint=a100&nvlink|h100" in arm
        assert f"[--container-image=img$(touch {MARKER})]" in calls


def test_a_study_launch_quotes_and_runs_nothing(tmp_path, monkeypatch, capfd):
    """Every script of a study (pairs, report, submit) with an awkward recipe folder and command."""
    env = launch_stubs.install(tmp_path)
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.chdir(tmp_path)
    folder = _hostile_folder(tmp_path, f"s $(touch {MARKER}); `touch {MARKER}`")
    out = tmp_path / "study"
    assert (
        main(
            [
                "launch",
                "--study",
                str(folder / "recipes" / "study.yaml"),
                "--scheduler",
                "slurm",
                "--out",
                str(out),
                "--command",
                f"divergence $(touch {MARKER})",
                "--container-image",
                f"i`touch {MARKER}`",
                "replicates=1",
            ]
        )
        == 0
    ), capfd.readouterr().err
    launch_stubs.check_scripts(out, env, tmp_path)
    assert not list(tmp_path.rglob(MARKER))
    assert f"[$(touch] [{MARKER})] [report] [{out}]" in launch_stubs.calls(tmp_path)


def test_launch_errors_name_the_command_once(tmp_path, capsys):
    """``launch --command`` used to overwrite the subcommand's name: "divergence divergence: error"."""
    assert main(["launch", "--recipe", PAIR, "--scheduler", "slurm", "--dry-run", "arms.a=[{nosuch: 1}]"]) == 2
    assert capsys.readouterr().err.startswith("divergence launch: error: arms.a[0]: unknown variant")


def test_a_percent_in_the_pair_folder_is_the_folder_logs_go_to(tmp_path, monkeypatch):
    """``run%j`` as the pair folder: ``mkdir -p`` makes ``run%j/logs``; sbatch must write there, not
    into ``run4242/logs`` (a folder nobody made, so SLURM fails the job)."""
    env = launch_stubs.install(tmp_path)
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run%j-100%%x"
    assert main(["launch", "--recipe", PAIR, "--scheduler", "slurm", "--out", str(out)]) == 0
    launch_stubs.check_scripts(out, env, tmp_path)
    for script in ("arm-a.sbatch", "arm-b.sbatch", "watch.sbatch"):
        line = next(x for x in (out / "launch" / script).read_text().splitlines() if x.startswith("#SBATCH --output="))
        written = Path(launch_stubs.sbatch_filename(line.removeprefix("#SBATCH --output=")))
        assert written.parent == out / "logs" and written.parent.is_dir(), line
        assert written.name == f"{script.removesuffix('.sbatch')}-4242.out"


@pytest.mark.parametrize("where", ["--out", "--recipe"])
@pytest.mark.parametrize("character", [",", ":"])
def test_a_comma_or_colon_in_a_mounted_folder_is_refused_with_a_container_image(where, character, tmp_path, capsys):
    """pyxis's ``--container-mounts=SRC:DST,SRC:DST`` splits on both and escapes neither."""
    folder = tmp_path / f"a{character}b"
    recipe = _hostile_folder(folder) / "recipes" / "pairs" / "seed-vs-seed.yaml" if where == "--recipe" else PAIR
    out = folder / "out" if where == "--out" else tmp_path / "out"
    args = ["launch", "--recipe", str(recipe), "--scheduler", "slurm", "--out", str(out), "--dry-run"]
    err = assert_one_line_exit2(
        main([*args, "--container-image", "/img/div.sqsh"]), capsys, where, "--container-mounts"
    )
    assert "',' or ':'" in err and not out.exists()
    assert main(args) == 0  # without a container nothing is mounted: the folder is fine
