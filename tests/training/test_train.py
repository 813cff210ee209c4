"""`divergence train` end to end on the tiny recipe: outputs, bitwise reproducibility, resume."""

import csv
import json

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from PIL import Image
from safetensors.torch import load_file

from divergence.checkpoints import open_checkpoint
from divergence.cli import main
from divergence.pairfolder.arm.weights_file import read_metadata
from divergence.config.schema import to_dict
from divergence.loggers.sinks import wandb_offline
from divergence.training.single import train_run
from tests.training.tiny import FAST, tiny_recipe


class Crash(Callback):
    """Dies after ``step`` optimizer steps, as a killed job would (no end-of-training hooks)."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step:
            raise SystemError("simulated crash")


def _weights(path):
    return load_file(str(path))


def _assert_bitwise_equal(a, b):
    a, b = _weights(a), _weights(b)
    assert a.keys() == b.keys()
    differing = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differing, f"{len(differing)} tensors differ, e.g. {differing[0]}"


def test_outputs_of_a_run(tmp_path):
    recipe = tiny_recipe("train.max_steps=3", "train.checkpoint_every=2")
    train_run(recipe, tmp_path)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_000000.safetensors", "step_000002.safetensors", "step_000003.safetensors"]
    meta = read_metadata(tmp_path / "checkpoints" / "step_000003.safetensors")
    assert meta["step"] == "3" and json.loads(meta["recipe"]) == to_dict(recipe)
    source = open_checkpoint(tmp_path / "checkpoints" / "step_000003.safetensors")  # what compare reads
    last = _weights(tmp_path / "checkpoints" / "step_000003.safetensors")
    assert set(source.names) == set(last)
    assert torch.equal(source.load("unet.conv_in.weight"), last["unet.conv_in.weight"])
    assert (tmp_path / "resume" / "last.ckpt").is_file()
    assert "model:" in (tmp_path / "recipe.yaml").read_text()
    grid = Image.open(tmp_path / "samples" / "step_000003.png")
    assert grid.size == (32 * 1, 32 * 2)  # per_prompt columns, one row per prompt
    rows = list(csv.DictReader(open(tmp_path / "csv" / "metrics.csv")))
    losses = [r["train/loss"] for r in rows if r.get("train/loss")]
    assert len(losses) == 3 and all(float(x) > 0 for x in losses)


def test_two_runs_write_bitwise_identical_checkpoints(tmp_path):
    recipe = tiny_recipe("train.max_steps=2", "sample.enabled=false", "log.csv=false")
    train_run(recipe, tmp_path / "a")
    train_run(recipe, tmp_path / "b")
    for step in (0, 2):
        name = f"step_{step:06d}.safetensors"
        assert (tmp_path / "a/checkpoints" / name).read_bytes() == (tmp_path / "b/checkpoints" / name).read_bytes()


def test_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path):
    overrides = (
        "train.max_steps=5",
        "train.checkpoint_every=2",
        "sample.enabled=false",
        "log.csv=false",
        "train.precision=bf16-mixed",
    )
    recipe = tiny_recipe(*overrides)
    train_run(recipe, tmp_path / "straight")
    with pytest.raises(SystemError, match="simulated crash"):
        train_run(recipe, tmp_path / "resumed", callbacks=[Crash(3)])  # last.ckpt holds step 2
    assert not (tmp_path / "resumed/checkpoints/step_000004.safetensors").exists()
    trainer = train_run(recipe, tmp_path / "resumed")
    assert trainer.global_step == 5
    for step in (4, 5):
        name = f"checkpoints/step_{step:06d}.safetensors"
        _assert_bitwise_equal(tmp_path / "straight" / name, tmp_path / "resumed" / name)


def test_extending_a_finished_run_equals_training_longer_and_continues_its_csv_log(tmp_path):
    base = ("train.checkpoint_every=0", "sample.enabled=false")
    train_run(tiny_recipe("train.max_steps=4", *base), tmp_path / "straight")
    train_run(tiny_recipe("train.max_steps=2", *base), tmp_path / "extended")
    train_run(tiny_recipe("train.max_steps=4", *base), tmp_path / "extended")  # resumed from last.ckpt (step 2)
    name = "checkpoints/step_000004.safetensors"
    _assert_bitwise_equal(tmp_path / "straight" / name, tmp_path / "extended" / name)
    # A resumed ``divergence train`` started ``csv/metrics.csv`` over (Lightning's
    # CSVLogger deletes it), losing the rows of the steps before the resume.
    rows = list(csv.DictReader(open(tmp_path / "extended" / "csv" / "metrics.csv")))
    assert sorted(int(r["step"]) for r in rows if r.get("train/loss")) == [0, 1, 2, 3]
    assert train_run(tiny_recipe("train.max_steps=4", *base), tmp_path / "extended").global_step == 4  # done: no-op


def test_a_different_recipe_will_not_resume(tmp_path, capsys):
    args = ["train", "--out", str(tmp_path), "--max-steps", "1", *FAST, "sample.enabled=false"]
    assert main(args) == 0
    assert main([*args, "train.lr=0.01"]) == 2
    err = capsys.readouterr().err
    assert "train.lr" in err and "new --out" in err


def test_wandb_writes_an_offline_run(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    recipe = tiny_recipe("train.max_steps=1", "log.wandb=true", "sample.per_prompt=1")
    train_run(recipe, tmp_path)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("run-*.wandb"))
    run_id = (tmp_path / "wandb-id").read_text().strip()
    assert runs[0].name.endswith(run_id)


@pytest.mark.parametrize(
    "env, offline", [({}, True), ({"WANDB_MODE": "online"}, False), ({"WANDB_API_KEY": "x" * 40}, False)]
)
def test_wandb_is_online_only_when_the_user_configured_it(env, offline, monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))  # and no `wandb login` credentials
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert wandb_offline() is offline


def test_trains_on_an_image_folder(tmp_path):
    from tests.data.test_folders import _folder

    _folder(tmp_path / "images", n=4)
    recipe = tiny_recipe(
        "train.max_steps=2",
        "data.source=imagefolder",
        f"data.path={tmp_path / 'images'}",
        "sample.enabled=false",
        "log.csv=false",
    )
    assert train_run(recipe, tmp_path / "run").global_step == 2


def test_a_nonfinite_loss_stops_a_run_in_one_line_after_recording_the_step(tmp_path, capsys, monkeypatch):
    from divergence.training import arm as arm_module

    original = arm_module.Arm.training_step

    def poisoned(self, inputs, **kwargs):
        out = original(self, inputs, **kwargs)
        if inputs.step == 1:
            out.loss = torch.tensor(float("inf"))
        return out

    monkeypatch.setattr(arm_module.Arm, "training_step", poisoned)
    args = [
        "train",
        "--out",
        str(tmp_path),
        "--max-steps",
        "4",
        *FAST,
        "sample.enabled=false",
        "train.checkpoint_every=1",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "divergence train: error: run tiny: loss is inf at step 2" in err and "Traceback" not in err
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir())[-1] == "step_000002.safetensors"
