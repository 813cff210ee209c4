"""Packaging: the core install is enough for ``compare``; a command needing an extra names it in one
line (exit 2); the recipes ship inside the wheel, so ``divergence study`` finds its default recipe
outside a checkout."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from divergence.errors import UserInputError
from divergence.extras import MissingExtra, hint, missing_extra, require

ROOT = Path(__file__).resolve().parents[2]
# every optional package, as if only `pip install divergence` had run
OPTIONAL = (
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "diffusers",
    "transformers",
    "PIL",
    "wandb",
    "wandb_workspaces",
    "matplotlib",
    "scipy",
    "pyarrow",
    "tensorboard",
    "accelerate",
    "peft",
)
CORE_ONLY = f"""
import sys
for name in {OPTIONAL!r}:
    sys.modules[name] = None  # import raises ModuleNotFoundError, find_spec says not installed
from divergence.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _cli(*argv, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    return subprocess.run(
        [sys.executable, "-c", CORE_ONLY, *map(str, argv)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_compare_and_the_metrics_need_no_extra(tmp_path):
    torch.manual_seed(0)
    a = {"w": torch.randn(8, 4), "b": torch.zeros(4)}
    save_file(a, tmp_path / "a.safetensors")
    save_file({"w": a["w"] + 0.5, "b": a["b"]}, tmp_path / "b.safetensors")
    done = _cli("compare", tmp_path / "a.safetensors", tmp_path / "b.safetensors", "--json", tmp_path / "out.json")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "out.json").read_text())
    assert summary["summary"]["max_abs_diff"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    "argv, extra",
    [
        (["train", "--max-steps", "1", "--out", "{tmp}/run"], "train"),
        (["report", "{tmp}", "--out", "{tmp}/report"], "report"),
        (["study", "--out", "{tmp}/study"], "train"),
        (["export", "{tmp}", "--parquet", "{tmp}/x.parquet"], "parquet"),
        (["watch", "{tmp}"], "train"),
        (["dashboard", "--entity", "e", "--project", "p", "--dry-run"], "wandb"),
    ],
)
def test_a_command_needing_an_extra_names_it_in_one_line(tmp_path, argv, extra):
    done = _cli(*[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"pip install 'divergence[{extra}]'" in done.stderr, done.stderr


def test_require_and_the_import_error_fallback(monkeypatch):
    require("core", "torch", "numpy")  # installed: nothing happens
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtra, match=r"needs matplotlib \(not installed\), from the 'report' extra"):
        require("report", "matplotlib")
    assert issubclass(MissingExtra, UserInputError)
    try:
        import matplotlib.pyplot  # noqa: F401
    except ImportError as err:
        assert "divergence[report]" in str(missing_extra(err))
    assert missing_extra(ImportError("x", name="not_an_extra_of_ours")) is None
    assert (
        hint("pyarrow") == "needs pyarrow (not installed), from the 'parquet' extra: pip install 'divergence[parquet]'"
    )


@pytest.mark.slow  # builds and installs a wheel (about 15 s)
def test_the_wheel_ships_the_recipes_and_study_finds_its_default_outside_a_checkout(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "divergence", src / "divergence", ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", str(src), "-w", tmp_path / "dist"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheel = next((tmp_path / "dist").glob("divergence-*.whl"))
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--target", tmp_path / "site", wheel],
        check=True,
        capture_output=True,
        timeout=300,
    )
    check = (
        "import divergence, pathlib; from divergence.cli import build_parser; "
        "from divergence.study.config import load_study; p = build_parser().parse_args(['study', '--out', 'x']).recipe; "
        "assert str(p).startswith(sys.argv[1]), p; s = load_study(p); print(len(s.pairs))"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", "import sys; " + check, str(tmp_path / "site")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) >= 2
    help_ = subprocess.run(
        [sys.executable, "-m", "divergence", "study", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert help_.returncode == 0 and "study recipe" in help_.stdout
