"""Fuzzed names and values through every command that writes a script (``launch --recipe`` for
SLURM and torchrun, ``launch --study``), printed (``--dry-run``) and written and run.

Each case puts a random string of shell and ``#SBATCH`` syntax (command substitution, quotes,
separators, newlines, ``--`` prefixes, redirections) in one place a user or a shared recipe can:
the pair's or study's name (in the recipe or as ``name=``), the inline study pair's name, a SLURM
option, an extra ``#SBATCH`` line, the wandb group, the pair folder, ``--command``, ``--strategy``,
the container image. The command must either refuse it (exit 2, one line, nothing written) or
write scripts that parse (``bash -n``) and, run with stub ``sbatch``/``srun``/``torchrun``, run
nothing they hold: no marker file appears.
"""

import random
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from divergence.cli import main
from tests.scaleout import launch_stubs
from tests.scaleout.launch_stubs import MARKER

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
PAIR = RECIPES / "pairs" / "seed-vs-seed.yaml"
STUDY = RECIPES / "study.yaml"
FRAGMENTS = (
    f"$(touch {MARKER})",
    f"`touch {MARKER}`",
    f";touch {MARKER};",
    f"\ntouch {MARKER}\n",
    "'",
    '"',
    "--",
    "-",
    " ",
    "#",
    "\\",
    f"&&touch {MARKER}",
    f"|touch {MARKER}",
    f">{MARKER}",
    "\r",
    "\t",
    "é",
    "${IFS}",
    "%",
    "*",
    "..",
    "x",
    "a100",
    "{a,b}",
    "~",
    "!",
    "$HOME",
    "\n#SBATCH --wrap=touch " + MARKER,
    "=",
    ":",
    ",",
    "[",
    "]",
)
# where a value enters: (command, scheduler, how the value is put in)
ENTRIES = [
    (what, scheduler, place)
    for what, scheduler in (("recipe", "slurm"), ("recipe", "torchrun"), ("study", "slurm"))
    for place in (
        "name=",
        "recipe-name",
        "--group",
        "--partition",
        "--time",
        "--account",
        "--mem",
        "--sbatch",
        "--out",
        "--command",
        "--strategy",
        "--container-image",
    )
    if not (place == "--container-image" and scheduler == "torchrun")
]
ENTRIES += [("study", "slurm", "inline-name")]
CASES = 72
SEED = 24


def hostile(rng: random.Random) -> str:
    return "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 4)))


def _args(tmp_path: Path, what: str, scheduler: str, place: str, value: str) -> tuple[list[str], Path]:
    """The command line of one case and the folder it writes into."""
    out, recipe, extra = tmp_path / "out", PAIR if what == "recipe" else STUDY, []
    if place == "name=":
        extra = [f"name={value}"]
    elif place in ("recipe-name", "inline-name"):
        data = yaml.safe_load(recipe.read_text()) | {"base": str(RECIPES / "tiny.yaml")}
        if what == "study":
            data["study"] = str(RECIPES / "pairs" / "fused-adamw.yaml")
            data["references"] = {"control": str(RECIPES / "pairs" / "control.yaml")}
        if place == "inline-name":
            data["study"] = {"name": value, "arms": {"a": [{"tf32": True}], "b": []}}
        else:
            data["name"] = value
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(yaml.safe_dump(data))
    elif place == "--sbatch":
        extra = [f"--sbatch=constraint={value}"]
    elif place == "--out":
        out = tmp_path / "o" / value.replace("/", "_")
    elif place == "--command":
        extra = [f"--command=divergence {value}"]
    else:
        extra = [f"{place}={value}"]
    args = ["launch", f"--{what}", str(recipe), "--scheduler", scheduler, "--out", str(out), *extra]
    return args + (["--cpu"] if scheduler == "torchrun" else []) + (["replicates=1"] if what == "study" else []), out


def _rendered_scripts(printed: str) -> list[str]:
    """The scripts ``--dry-run`` prints, each under a ``# ==> PATH <==`` line."""
    return [part for part in re.split(r"^# ==> .* <==$", printed, flags=re.MULTILINE)[1:]]


def _check(tmp_path, capfd, args, out, dry_run, env):
    code = main(args + ["--dry-run"] * dry_run)
    printed, err = capfd.readouterr()
    assert not list(tmp_path.rglob(MARKER)), (args, err)
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("divergence launch: error: "), (args, err)
        assert not out.exists()  # refused before anything was written
        return "refused"
    assert code == 0, (args, err)
    if dry_run:
        assert not out.exists()
        for text in _rendered_scripts(printed):
            parsed = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
            assert parsed.returncode == 0, (args, parsed.stderr)
    else:
        launch_stubs.check_scripts(out, env, tmp_path)
        assert not list(tmp_path.rglob(MARKER)), args
    return "accepted"


def test_hostile_values_through_every_script_writer_are_refused_or_harmless(tmp_path_factory, monkeypatch, capfd):
    rng = random.Random(SEED)
    seen = {"refused": 0, "accepted": 0}
    for i in range(CASES):
        tmp_path = tmp_path_factory.mktemp(f"case{i}")
        env = launch_stubs.install(tmp_path)
        monkeypatch.setenv("PATH", env["PATH"])
        monkeypatch.chdir(tmp_path)
        what, scheduler, place = ENTRIES[i % len(ENTRIES)]
        value = hostile(rng)
        args, out = _args(tmp_path, what, scheduler, place, value)
        seen[_check(tmp_path, capfd, args, out, bool(i // len(ENTRIES) % 2), env)] += 1
    assert seen["refused"] > CASES // 3 and seen["accepted"] > 5, seen  # both outcomes were exercised


@pytest.mark.parametrize("fragment", FRAGMENTS, ids=range(len(FRAGMENTS)))
def test_every_fragment_as_a_study_name_is_refused_or_harmless(fragment, tmp_path, monkeypatch, capfd):
    """The finding itself: a study's name reaches every job name, comment and echo of a study launch."""
    env = launch_stubs.install(tmp_path)
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.chdir(tmp_path)
    args, out = _args(tmp_path, "study", "slurm", "name=", f"s{fragment}")
    _check(tmp_path, capfd, args, out, False, env)
