"""``watch`` timing out tells how to start the missing arm the way this pair's arms are started."""

import json

import torch

from divergence.cli import main
from divergence.pairfolder.schedule import how_to_start
from divergence.writers import ArmWriter


def watch(out, capsys) -> tuple[int, str]:
    code = main(["watch", str(out), "--no-wandb", "--quiet", "--poll", "0.02", "--timeout", "0.3"])
    return code, capsys.readouterr().err.strip().splitlines()[-1]


def start_arm_a(out):
    writer = ArmWriter(out, "a", max_steps=2, name="flash-vs-baseline")
    writer.record(0, torch.nn.Linear(2, 2))
    return writer


def test_armwriter_arms_are_told_to_run_their_script_not_the_builtin_trainer(tmp_path, capsys):
    writer = start_arm_a(tmp_path)
    code, line = watch(tmp_path, capsys)
    writer.finish("failed")
    assert code == 1 and "timed out: no progress" in line, line
    assert "b: not started" in line and "start arm b: run arm b's training script" in line
    assert "ArmWriter" in line and "divergence train" not in line


def test_a_builtin_pair_is_told_the_builtin_command(tmp_path, capsys):
    writer = start_arm_a(tmp_path)
    info = json.loads((tmp_path / "pair.json").read_text())
    (tmp_path / "pair.json").write_text(json.dumps(info | {"recipe": {"model": {"name": "tiny"}}}))
    code, line = watch(tmp_path, capsys)
    writer.finish("failed")
    assert code == 1 and f"start arm b: divergence train --recipe PAIR --arm b --out {tmp_path}" in line, line
    assert "training script" not in line


def test_nothing_started_names_both_ways(tmp_path, capsys):
    code, line = watch(tmp_path / "pair", capsys)
    assert code == 1 and "holds no started pair" in line
    assert "ArmWriter" in line and "divergence train --recipe PAIR --arm a" in line
    assert how_to_start(tmp_path / "pair", "a") in line
