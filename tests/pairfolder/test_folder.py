"""The pair folder as one object: each path of the contract by name, spelled by ``layout``."""

from __future__ import annotations

import os
from pathlib import Path

from divergence.pairfolder import ArmFolder, PairFolder, RunFolder
from divergence.store import MetricsStore
from divergence.pairfolder.arm.status import ArmStatus
from divergence.pairfolder.arm.losses import LossFile


def test_every_path_is_the_contracts_name_under_the_folder(tmp_path):
    folder = PairFolder(tmp_path)
    expected = {
        "pair_json": "pair.json",
        "pair_yaml": "pair.yaml",
        "recipe": "recipe.yaml",
        "metrics": "metrics.jsonl",
        "attention": "attention.jsonl",
        "watch_state": "watch.json",
        "retention": "retention.json",
        "wandb_id": "wandb-id",
        "csv_dir": "csv",
        "tensorboard_dir": "tensorboard",
        "resume_dir": "resume",
        "samples_dir": "samples",
        "checkpoints_dir": "checkpoints",
    }
    assert {name: getattr(folder, name) for name in expected} == {k: tmp_path / v for k, v in expected.items()}
    assert folder.resume_file == tmp_path / "resume" / "last.ckpt"
    arm = folder.arm("b")
    assert isinstance(arm, ArmFolder) and arm.arm == "b"
    assert (arm.losses, arm.status, arm.writer_lock) == (
        tmp_path / "b" / "losses.jsonl",
        tmp_path / "b" / "status.json",
        tmp_path / "b" / "writer.lock",
    )
    assert arm.weights(120) == tmp_path / "b" / "checkpoints" / "step_000120.safetensors"
    assert list(folder.arms) == ["a", "b"] and folder.arms["a"] == ArmFolder(tmp_path / "a")


def test_a_folder_is_a_path_where_a_path_is_taken(tmp_path):
    folder = PairFolder(tmp_path / "pair")
    assert os.fspath(folder) == str(tmp_path / "pair") == f"{folder}"
    assert Path(folder) == tmp_path / "pair" and PairFolder(folder) == folder
    assert RunFolder(folder) != folder  # another kind of folder, though the same path
    folder.arm("a").path.mkdir(parents=True)
    LossFile(folder.arm("a")).append(1, 0.5)  # the store's classes take a folder object as a path
    ArmStatus("a").write(folder.arm("a"))
    assert folder.arm("a").losses.read_text().strip() and ArmStatus.read(folder.arm("a")).arm == "a"
    assert not MetricsStore(folder).exists()
