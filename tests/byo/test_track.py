"""``divergence track A B --out PAIR`` on checkpoint series written by the real libraries.

- diffusers: ``UNet2DModel.save_pretrained`` into accelerate-style ``checkpoint-N/unet``;
- Lightning: ``ModelCheckpoint`` files ``epoch=0-step=N.ckpt`` of two Trainers.

The stored records of a step equal ``compare_checkpoints`` of that step's two checkpoints.
"""

import json

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from divergence.checkpoints.series import find_series
from divergence.cli import main
from divergence.report.inputs import load_pair
from divergence.checkpoints.compare import compare_checkpoints
from divergence.store import MetricsStore
from tests.byo.user_module import build, loader


def tiny_unet():
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    return UNet2DModel(
        sample_size=8,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(8, 16),
        norm_num_groups=4,
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
    )


def test_diffusers_series_with_a_component(tmp_path, capsys):
    for arm, steps, scale in (("a", (0, 10, 20), 1e-3), ("b", (0, 10, 20, 30), 2e-3)):
        unet = tiny_unet()
        g = torch.Generator().manual_seed(5)
        for step in steps:
            with torch.no_grad():
                for p in unet.parameters():
                    p.add_(scale * torch.randn(p.shape, generator=g))
            unet.save_pretrained(tmp_path / arm / f"checkpoint-{step}" / "unet")
            (tmp_path / arm / f"checkpoint-{step}" / "optimizer.bin").write_bytes(b"not weights")
    out = tmp_path / "pair"
    code = main(
        ["track", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out), "--component", "unet", "--quiet"]
    )
    assert code == 0
    err = capsys.readouterr().err
    assert "steps only in b" in err and ": 30" in err
    store = MetricsStore(out)
    assert store.steps() == [0, 10, 20]
    expected = compare_checkpoints(tmp_path / "a" / "checkpoint-20" / "unet", tmp_path / "b" / "checkpoint-20" / "unet")
    stored = {r["tensor"]: r for r in store.tensor_records() if r["step"] == 20}
    assert len(stored) == len(expected.records)
    for record in expected.records:
        assert stored[record["name"]]["wasserstein"] == record["wasserstein"]
    assert store.step_records()[-1]["max_abs_diff"] == expected.summary["max_abs_diff"] > 0
    pair = load_pair(out)  # what report, export and wandb read
    assert pair.steps.tolist() == [0, 10, 20] and pair.name == "pair"
    assert json.loads((out / "pair.json").read_text())["finished"]
    # a second run must not append to (or mix with) the first store
    assert main(["track", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out), "--component", "unet"]) == 2
    assert "already holds a metrics store" in capsys.readouterr().err


def test_lightning_checkpoint_series(tmp_path):
    for arm, approximate in (("a", "none"), ("b", "tanh")):
        pl.seed_everything(0, verbose=False)
        every = ModelCheckpoint(dirpath=tmp_path / arm, every_n_train_steps=2, save_top_k=-1, save_last=True)
        fit = pl.Trainer(
            max_steps=4,
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[every],
        )
        fit.fit(build(0, approximate=approximate), loader())
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "last.ckpt"]
    out = tmp_path / "pair"
    assert main(["track", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out), "--quiet"]) == 0
    store = MetricsStore(out)
    assert store.steps() == [2, 4]
    expected = compare_checkpoints(tmp_path / "a" / "epoch=0-step=4.ckpt", tmp_path / "b" / "epoch=0-step=4.ckpt")
    assert store.step_records()[-1]["wasserstein"] == expected.summary["wasserstein"] > 0
    # an unnumbered .ckpt is numbered by the global_step stored in it (read weights-only)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "weights.ckpt").write_bytes((tmp_path / "a" / "epoch=0-step=2.ckpt").read_bytes())
    assert find_series(tmp_path / "c") == {2: tmp_path / "c" / "weights.ckpt"}


def test_no_series_is_one_line(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "notes.txt").write_text("x")
    assert main(["track", str(tmp_path / "a"), str(tmp_path / "a"), "--out", str(tmp_path / "p")]) == 2
    assert "no step-numbered checkpoints" in capsys.readouterr().err


def _series(root, steps=(0, 5, 10)):
    from safetensors.torch import save_file

    for side, shift in (("A", 0.0), ("B", 0.1)):
        (root / side).mkdir()
        for step in steps:
            save_file({"w": torch.full((4,), step + shift)}, str(root / side / f"step_{step}.safetensors"))
    return str(root / "A"), str(root / "B")


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    return err[0]


def test_out_on_or_under_a_file_is_one_line(tmp_path, capsys):
    a, b = _series(tmp_path)
    (tmp_path / "notes.txt").write_text("x")
    assert main(["track", a, b, "--out", str(tmp_path / "notes.txt"), "--quiet"]) == 2
    assert "notes.txt: exists and is not a folder" in _error(capsys)
    assert main(["track", a, b, "--out", str(tmp_path / "notes.txt" / "pair"), "--quiet"]) == 2
    assert "notes.txt is a file, not a folder" in _error(capsys)
    assert (tmp_path / "notes.txt").read_text() == "x"


def test_a_failure_mid_way_names_the_step_and_file_and_leaves_nothing(tmp_path, capsys):
    """The issue's case: a failed track left a partial store (steps 0 and 5) and named neither the
    step nor the file; a second run then refused the folder as "already holds a metrics store"."""
    a, b = _series(tmp_path)
    bad = tmp_path / "B" / "step_10.safetensors"
    bad.write_bytes(b"not a checkpoint" * 4)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["track", a, b, "--out", str(tmp_path / "pair"), "--quiet"]) == 2
    line = _error(capsys)
    assert line.startswith("divergence track: error: step 10 (") and str(bad) in line
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no pair folder, no staging folder left
    (tmp_path / "existing").mkdir()  # an --out folder that exists: it stays as it was
    assert main(["track", a, b, "--out", str(tmp_path / "existing"), "--quiet"]) == 2
    assert "step 10" in _error(capsys)
    assert [p.name for p in (tmp_path / "existing").iterdir()] == ["writer.lock"]  # the lock's file, no record
    bad.unlink()
    assert main(["track", a, b, "--out", str(tmp_path / "existing"), "--quiet"]) == 0  # then it works
    assert MetricsStore(tmp_path / "existing").steps() == [0, 5]
    assert json.loads((tmp_path / "existing" / "pair.json").read_text())["name"] == "existing"
    assert sorted(p.name for p in (tmp_path / "existing").iterdir()) == ["metrics.jsonl", "pair.json", "writer.lock"]


def test_a_step_past_int64_is_refused_naming_the_file(tmp_path, capsys):
    a, b = _series(tmp_path, steps=(0, 2**63))
    assert main(["track", a, b, "--out", str(tmp_path / "pair"), "--quiet"]) == 2
    assert f"step_{2**63}.safetensors: step {2**63} does not fit in 64 bits" in _error(capsys)
    assert not (tmp_path / "pair").exists()


def test_checkpoint_folders_with_the_model_in_a_subfolder_suggest_the_component(tmp_path, capsys):
    """accelerate's checkpoint-N/ with diffusers' save hook: optimizer.bin at the top, the UNet in unet/."""
    for arm in "ab":
        for step in (0, 10):
            tiny_unet().save_pretrained(tmp_path / arm / f"checkpoint-{step}" / "unet")
            (tmp_path / arm / f"checkpoint-{step}" / "optimizer.bin").write_bytes(b"not weights")
    out = tmp_path / "pair"
    assert main(["track", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "pass --component unet" in err and len(err.splitlines()) == 1
    assert not out.exists()  # nothing left behind: the corrected command is not refused
    assert main(["track", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out), "--component", "unet"]) == 0


def test_lightning_checkpoints_are_numbered_by_the_global_step_they_hold(tmp_path, capsys):
    """The issue's case: ``epoch=0/1/2.ckpt`` holding global_step 2/4/6 were numbered 0/1/2 (the
    last digits of the name), and a ``last-v1.ckpt`` holding step 4 became step 1."""
    import shutil

    pl.seed_everything(0, verbose=False)
    every_epoch = ModelCheckpoint(dirpath=tmp_path / "a", filename="{epoch}", save_top_k=-1, every_n_epochs=1)
    pl.Trainer(
        max_epochs=3,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[every_epoch],
    ).fit(build(0), loader(n=16))  # 2 batches per epoch
    a = tmp_path / "a"
    assert sorted(p.name for p in a.iterdir()) == ["epoch=0.ckpt", "epoch=1.ckpt", "epoch=2.ckpt"]
    shutil.copy(a / "epoch=1.ckpt", a / "last-v1.ckpt")  # repeats step 4: left out
    assert find_series(a) == {2: a / "epoch=0.ckpt", 4: a / "epoch=1.ckpt", 6: a / "epoch=2.ckpt"}
    shutil.copytree(a, tmp_path / "b")
    (tmp_path / "b" / "epoch=1.ckpt").unlink()  # now the last-v1.ckpt's step 4 is b's only one
    b = tmp_path / "b"
    assert find_series(b) == {2: b / "epoch=0.ckpt", 4: b / "last-v1.ckpt", 6: b / "epoch=2.ckpt"}
    out = tmp_path / "pair"
    assert main(["track", str(a), str(b), "--out", str(out), "--quiet"]) == 0
    assert MetricsStore(out).steps() == [2, 4, 6]
    # two files of one step, whatever their names say: one line, exit 2, nothing written
    shutil.copy(a / "epoch=2.ckpt", a / "model-9.ckpt")
    assert main(["track", str(a), str(b), "--out", str(tmp_path / "pair2"), "--quiet"]) == 2
    line = _error(capsys)
    assert "two checkpoints of step 6 (epoch=2.ckpt, model-9.ckpt)" in line and "global_step" in line
    assert not (tmp_path / "pair2").exists()


def test_ckpt_without_a_stored_step_falls_back_to_its_name_and_a_bad_one_is_one_line(tmp_path):
    import pytest

    from divergence.errors import CheckpointError

    state = {"state_dict": {"w": torch.zeros(2)}}
    torch.save(state, tmp_path / "model-500.ckpt")  # no global_step: the name's number
    torch.save(state, tmp_path / "epoch=3.ckpt")  # no global_step, no step= in the name: left out
    torch.save(state, tmp_path / "last.ckpt")
    assert find_series(tmp_path) == {500: tmp_path / "model-500.ckpt"}
    torch.save({**state, "global_step": -3}, tmp_path / "epoch=4-step=7.ckpt")
    with pytest.raises(CheckpointError, match=r"epoch=4-step=7.ckpt: global_step is '-3', not a step number"):
        find_series(tmp_path)


def test_track_over_a_live_arm_writer_is_refused_and_pair_json_is_kept(tmp_path, capsys):
    """``track --out`` over a folder an ``ArmWriter`` still writes rewrote its ``pair.json``."""
    from safetensors.torch import save_file

    from divergence.pairfolder.arm.lock import PairLock
    from divergence.writers import ArmWriter

    for arm in ("a", "b"):
        (tmp_path / arm).mkdir()
        for step in (0, 10):
            save_file({"w": torch.full((2,), float(step))}, str(tmp_path / arm / f"step_{step}.safetensors"))
    out = tmp_path / "pair"
    writer = ArmWriter(out, "a", max_steps=10, every=5, name="live", category="seed", dense=[])
    writer.record(0, {"w": torch.zeros(2)})
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    args = ["track", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out), "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "still writes arm a of this pair folder" in err and str(out) in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # pair.json, no store
    assert not MetricsStore(out).exists() and json.loads((out / "pair.json").read_text())["name"] == "live"
    writer.finish("failed")
    assert main(args) == 0  # once the writer has ended, track may build the folder
    assert not PairLock.is_held(out) and len(MetricsStore(out).step_records()) == 2
