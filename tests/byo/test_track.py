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
from divergence.state_dicts import compare_checkpoints
from divergence.store import MetricsStore
from tests.byo.user_module import build, loader


def tiny_unet():
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    return UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(8, 16),
                       norm_num_groups=4, down_block_types=("DownBlock2D", "DownBlock2D"),
                       up_block_types=("UpBlock2D", "UpBlock2D"))


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
    code = main(["track", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out), "--component", "unet",
                 "--quiet"])
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
        fit = pl.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[every])
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
