"""Launcher scripts are well-formed bash with Lightning's SLURM flags; submission chains the jobs."""

import os
import subprocess

import pytest

from divergence.cli import main
from tests.pairs.helpers import PAIRS

RECIPE = str(PAIRS / "seed-vs-seed.yaml")


def _launch(tmp_path, *args):
    return main(["launch", "--recipe", RECIPE, "--out", str(tmp_path / "run"), *args])


def _bash_n(path):
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, f"{path.name}: {done.stderr}"


def _fake(bin_dir, name, body):
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


def test_slurm_dry_run_prints_all_scripts_and_writes_nothing(tmp_path, capsys):
    assert (
        _launch(
            tmp_path,
            "--scheduler",
            "slurm",
            "--nodes",
            "2",
            "--gpus-per-node",
            "8",
            "--dry-run",
            "train.max_steps=1000",
        )
        == 0
    )
    out = capsys.readouterr().out
    for name in ("arm-a.sbatch", "arm-b.sbatch", "watch.sbatch", "submit.sh"):
        assert f"/run/launch/{name} <==" in out
    for flag in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gres=gpu:8",
        "--arm a",
        "--arm b",
        "train.devices=8",
        "train.num_nodes=2",
        "train.strategy=ddp",
        "train.max_steps=1000",
        "--dependency=after:",
        f"divergence watch {tmp_path / 'run'}",
    ):
        assert flag in out, flag
    assert not (tmp_path / "run").exists()


def test_slurm_scripts_parse_and_submit_chains_the_comparator_after_both_arms(tmp_path, monkeypatch, capfd):
    calls = tmp_path / "sbatch-calls"
    _fake(tmp_path / "bin", "sbatch", f'echo "$@" >> {calls}\necho "$((100 + $(wc -l < {calls})));cluster"\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert (
        _launch(tmp_path, "--scheduler", "slurm", "--gpus-per-node", "4", "--partition", "gpu", "--time", "1:00:00")
        == 0
    )
    launch_dir = tmp_path / "run/launch"
    for path in launch_dir.iterdir():
        _bash_n(path)
    arm = (launch_dir / "arm-a.sbatch").read_text()
    assert arm.startswith("#!/bin/bash\n#SBATCH") and "#SBATCH --partition=gpu" in arm
    assert "srun divergence train" in arm
    lines = calls.read_text().splitlines()
    assert lines[0].endswith("arm-a.sbatch") and lines[1].endswith("arm-b.sbatch")
    assert "--dependency=after:101:102" in lines[2] and lines[2].endswith("watch.sbatch")
    assert "comparator: job 103" in capfd.readouterr().out
    assert (tmp_path / "run/logs").is_dir()  # SLURM does not create --output folders


def test_torchrun_scripts_give_each_arm_its_gpus_and_port(tmp_path, capsys):
    assert (
        _launch(tmp_path, "--scheduler", "torchrun", "--gpus-per-node", "2", "--comparator-gpus", "2", "--dry-run") == 0
    )
    out = capsys.readouterr().out
    assert "CUDA_VISIBLE_DEVICES_A:-0,1" in out and "CUDA_VISIBLE_DEVICES_B:-2,3" in out
    assert "--nnodes=1 --nproc-per-node=2" in out and "MASTER_PORT_A:-29500" in out and "MASTER_PORT_B:-29501" in out
    assert "torchrun --standalone --nproc-per-node=2 -m divergence watch" in out


def test_torchrun_start_runs_both_arms_and_the_comparator(tmp_path, monkeypatch):
    log = tmp_path / "torchrun-calls"
    _fake(tmp_path / "bin", "torchrun", f'echo "torchrun $@" >> {log}\n')
    _fake(tmp_path / "bin", "divergence", f'echo "divergence $@" >> {log}\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert _launch(tmp_path, "--scheduler", "torchrun", "--cpu", "--gpus-per-node", "2") == 0
    for path in (tmp_path / "run/launch").iterdir():
        _bash_n(path)
    calls = log.read_text()
    assert "--arm a" in calls and "--arm b" in calls and "train.accelerator=cpu" in calls
    assert f"divergence watch {tmp_path / 'run'} --poll 30 --device cpu" in calls


@pytest.mark.parametrize(
    "args,message",
    [
        (["--scheduler", "slurm"], "'sbatch' is not on PATH"),
        (["--scheduler", "torchrun"], "'torchrun' is not on PATH"),
        (["--scheduler", "slurm", "--nodes", "0", "--dry-run"], "--nodes 0: must be >= 1"),
    ],
)
def test_bad_launch_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.setenv("PATH", str(tmp_path))  # neither sbatch nor torchrun
    assert _launch(tmp_path, *args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_launch_needs_a_pair_recipe(tmp_path, capsys):
    assert main(["launch", "--recipe", str(PAIRS.parent / "tiny.yaml"), "--scheduler", "slurm", "--dry-run"]) == 2
    assert "not a pair recipe" in capsys.readouterr().err
