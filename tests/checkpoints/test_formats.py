"""Each checkpoint format, written by its own library, reads back exactly."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from divergence.checkpoints import open_checkpoint
from divergence.errors import CheckpointError

from .conftest import tiny_clip, tiny_unet


def _as_dict(source):
    return {n: source.load(n) for n in source.names}


def _assert_same(source, state, prefix=""):
    loaded = _as_dict(source)
    assert set(loaded) == {prefix + k for k in state}
    for name, tensor in state.items():
        assert loaded[prefix + name].dtype == tensor.dtype
        assert torch.equal(loaded[prefix + name], tensor), name


def test_safetensors_file_all_dtypes(tmp_path):
    state = {
        "f32": torch.randn(3, 5),
        "f64": torch.randn(4, dtype=torch.float64),
        "bf16": torch.randn(7).bfloat16(),
        "f16": torch.randn(2, 2).half(),
        "i64": torch.arange(5),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
    }
    save_file(state, tmp_path / "w.safetensors", metadata={"recipe": "{}"})
    source = open_checkpoint(tmp_path / "w.safetensors")
    _assert_same(source, state)
    assert source.metadata == {"recipe": "{}"}
    # the reference reader agrees
    assert all(torch.equal(v, source.load(k)) for k, v in load_file(tmp_path / "w.safetensors").items())


def test_diffusers_save_pretrained(tmp_path):
    unet = tiny_unet()
    unet.save_pretrained(tmp_path / "unet")
    _assert_same(open_checkpoint(tmp_path / "unet"), unet.state_dict())


def test_diffusers_sharded_and_bin(tmp_path):
    unet = tiny_unet()
    unet.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert list((tmp_path / "sharded").glob("*.safetensors.index.json"))
    _assert_same(open_checkpoint(tmp_path / "sharded"), unet.state_dict())
    unet.save_pretrained(tmp_path / "bin", safe_serialization=False)
    assert list((tmp_path / "bin").glob("*.bin"))
    _assert_same(open_checkpoint(tmp_path / "bin"), unet.state_dict())


def test_transformers_save_pretrained_and_sharded(tmp_path):
    clip = tiny_clip()
    clip.save_pretrained(tmp_path / "clip")
    state = {k: v for k, v in clip.state_dict().items()}
    source = open_checkpoint(tmp_path / "clip")
    loaded = _as_dict(source)
    for name, tensor in loaded.items():  # transformers may drop tied / non-persistent buffers
        assert torch.equal(tensor, state[name]), name
    clip.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert list((tmp_path / "sharded").glob("*.index.json"))
    assert set(open_checkpoint(tmp_path / "sharded").names) == set(loaded)


def test_diffusers_pipeline_folder(tmp_path):
    unet, clip = tiny_unet(), tiny_clip()
    unet.save_pretrained(tmp_path / "pipe" / "unet")
    clip.save_pretrained(tmp_path / "pipe" / "text_encoder")
    (tmp_path / "pipe" / "tokenizer").mkdir()
    (tmp_path / "pipe" / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    names = open_checkpoint(tmp_path / "pipe").names
    assert "unet.conv_in.weight" in names
    assert any(n.startswith("text_encoder.") and "layers.0" in n for n in names)


def test_torch_state_dict_zip_and_legacy(tmp_path):
    state = tiny_unet().state_dict()
    torch.save(state, tmp_path / "w.pt")
    _assert_same(open_checkpoint(tmp_path / "w.pt"), state)
    torch.save(state, tmp_path / "legacy.bin", _use_new_zipfile_serialization=False)
    _assert_same(open_checkpoint(tmp_path / "legacy.bin"), state)
    torch.save({"model": state, "epoch": 3, "optimizer": {"lr": 0.1}}, tmp_path / "train.pth")
    _assert_same(open_checkpoint(tmp_path / "train.pth"), state)


def test_lightning_trainer_checkpoint(tmp_path):
    import lightning as L

    class Tiny(L.LightningModule):
        def __init__(self, width: int = 4):
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Linear(width, 2)

        def training_step(self, batch, _):
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)
    model = Tiny()
    trainer = L.Trainer(
        max_steps=2,
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(model, data)
    ckpt = next(tmp_path.rglob("*.ckpt"))
    _assert_same(open_checkpoint(ckpt), model.state_dict())


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_code_running_pickle_is_refused_and_nothing_runs(tmp_path):
    marker = str(tmp_path / "pwned")
    torch.save({"w": torch.ones(2), "payload": _RunsCode(marker)}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match=r"refused to unpickle: it references .*mkdir"):
        open_checkpoint(tmp_path / "evil.pt")
    assert not os.path.exists(marker)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda p: p.write_bytes(b"\x00" * 4), "shorter than"),
        (lambda p: p.write_bytes((10**9).to_bytes(8, "little") + b"{}"), "exceeds the format.s limit"),
        (lambda p: p.write_bytes((10**4).to_bytes(8, "little") + b"{}"), "corrupt or truncated"),
        (lambda p: p.write_bytes((4).to_bytes(8, "little") + b"nope"), "not JSON"),
    ],
)
def test_corrupt_safetensors(tmp_path, make, match):
    path = tmp_path / "bad.safetensors"
    make(path)
    with pytest.raises(CheckpointError, match=match):
        open_checkpoint(path)


def test_truncated_safetensors_names_the_tensor(tmp_path):
    save_file({"a": torch.randn(100), "b": torch.randn(100)}, tmp_path / "w.safetensors")
    data = (tmp_path / "w.safetensors").read_bytes()
    (tmp_path / "w.safetensors").write_bytes(data[:-50])
    with pytest.raises(CheckpointError, match="truncated file: tensor"):
        open_checkpoint(tmp_path / "w.safetensors")


def test_folder_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no weights found"):
        open_checkpoint(tmp_path / "empty")
    for name in ("step_1.safetensors", "step_2.safetensors"):
        save_file({"a": torch.zeros(1)}, tmp_path / name)
    with pytest.raises(CheckpointError, match="several weight files"):
        open_checkpoint(tmp_path)
    unet = tiny_unet()
    unet.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    next((tmp_path / "sharded").glob("*-00001-of-*.safetensors")).unlink()
    with pytest.raises(CheckpointError, match="is missing"):
        open_checkpoint(tmp_path / "sharded")


def test_unknown_format_and_missing_path(tmp_path):
    (tmp_path / "w.npz").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="unknown checkpoint format '.npz'"):
        open_checkpoint(tmp_path / "w.npz")
    with pytest.raises(CheckpointError, match="no such file"):
        open_checkpoint(tmp_path / "absent.safetensors")


class _Versioned(torch.nn.Linear):
    """A layer with extra state (as transformer_engine's and torchao's layers have): its state dict
    holds ``<name>._extra_state``, a plain dict, beside its tensors."""

    def get_extra_state(self):
        return {"format": 2}

    def set_extra_state(self, state):
        assert state == {"format": 2}


def test_lightning_checkpoint_with_extra_state_reads_its_tensors_and_names_the_rest(tmp_path, capsys):
    import lightning as L

    from divergence.cli import main

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _Versioned(4, 2)

        def training_step(self, batch, _):
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)
    models = []
    for seed, run in enumerate("ab"):
        torch.manual_seed(seed)
        models.append(Tiny())
        L.Trainer(
            max_steps=2,
            default_root_dir=tmp_path / run,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
        ).fit(models[-1], data)
    ckpt_a, ckpt_b = (next((tmp_path / run).rglob("*.ckpt")) for run in ("a", "b"))
    source = open_checkpoint(ckpt_a)
    tensors = {k: v for k, v in models[0].state_dict().items() if isinstance(v, torch.Tensor)}
    _assert_same(source, tensors)
    assert source.skipped == {"net._extra_state": "dict"}
    out = tmp_path / "c.json"
    assert main(["compare", str(ckpt_a), str(ckpt_b), "--json", str(out)]) == 0
    assert "skipped 2 tensors: net._extra_state (in A: a dict, not a tensor)" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert {r["name"] for r in result["tensors"]} == {"net.weight", "net.bias"}
    assert result["skipped"][1] == {"name": "net._extra_state", "reason": "in B: a dict, not a tensor"}
