"""Hostile and broken checkpoint files: each refused with one error naming the file, as strictly
as the reference readers (safetensors, torch.load weights-only), and never read past its end."""

import json
import os
import time

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from divergence.checkpoints import open_checkpoint
from divergence.errors import CheckpointError

from .forge import evil_pickle, nested_model_pickle, rewrite_torch_zip, write_safetensors

F32_2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


def _refused(path, match):
    with pytest.raises(CheckpointError, match=match) as err:
        open_checkpoint(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def _reference_refuses(path):
    with pytest.raises(Exception):  # noqa: B017 (the reference reader raises its own types; any refusal counts)
        with safe_open(str(path), "pt") as f:
            [f.get_tensor(k) for k in f.keys()]


# --- safetensors: the reference's rules ------------------------------------------------------


@pytest.mark.parametrize(
    "header,data,match",
    [
        ({"a": F32_2, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, 12, "overlaps tensor 'a'"),
        ({"a": F32_2}, 12, "4 bytes after the last tensor"),
        ({"a": F32_2, "b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}}, 16, "leaves a gap"),
        ({"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}, 8, "shape must be a list of integers"),
        ({"a": {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}}, 8, "shape must be a list of integers"),
        ({"a": {"dtype": "F32", "shape": [-1, -8], "data_offsets": [0, 32]}}, 32, "shape must be"),
        ({"a": {"dtype": "F32", "shape": [2**70, 0], "data_offsets": [0, 0]}}, 0, "shape must be"),
        ({"a": {"dtype": "F32", "shape": [2**62, 2**62, 0], "data_offsets": [0, 0]}}, 0, "'a'.* overflows"),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, 8, "begin <= end"),
        ({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, 8, "dtype 'Q4'"),
        ({"a": F32_2, "__metadata__": {"step": 3}}, 8, "__metadata__ must map strings"),
    ],
)
def test_safetensors_refused_where_the_reference_refuses(tmp_path, header, data, match):
    path = write_safetensors(tmp_path / "w.safetensors", header, b"\0" * data)
    _reference_refuses(path)
    _refused(path, match)


def test_duplicate_names_are_refused_not_last_wins(tmp_path):
    raw = (
        b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": '
        b'{"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}'
    )
    _refused(write_safetensors(tmp_path / "w.safetensors", raw, b"\0" * 8), "'a' appears twice")


@pytest.mark.parametrize("raw", [b'{"a":' * 100_000 + b"1" + b"}" * 100_000, b"[" * 100_000 + b"]" * 100_000])
def test_deeply_nested_header_is_one_line(tmp_path, raw):
    _refused(write_safetensors(tmp_path / "w.safetensors", raw), "nested too deeply|not JSON")


def test_header_over_the_limit_is_refused_before_reading_it(tmp_path):
    path = tmp_path / "w.safetensors"
    with open(path, "wb") as f:  # a sparse 100 MB file: the length says 100,000,001
        f.write((100_000_001).to_bytes(8, "little") + b"{")
        f.truncate(100_000_020)
    _reference_refuses(path)
    start = time.perf_counter()
    _refused(path, "exceeds the format's limit of 100,000,000")
    assert time.perf_counter() - start < 1.0


def test_every_reference_dtype_reads_back_exactly(tmp_path):
    state = {
        "u16": torch.tensor([1, 65535], dtype=torch.uint16),
        "u32": torch.tensor([7, 2**32 - 1], dtype=torch.uint32),
        "u64": torch.tensor([3, 2**40], dtype=torch.uint64),
        "c64": torch.tensor([1 + 2j, -3j], dtype=torch.complex64),
        "f8": torch.tensor([0.5, -2.0]).to(torch.float8_e4m3fn),
        "f8b": torch.tensor([4.0]).to(torch.float8_e5m2),
    }
    save_file(state, tmp_path / "w.safetensors")
    source, reference = open_checkpoint(tmp_path / "w.safetensors"), load_file(tmp_path / "w.safetensors")
    for name, tensor in reference.items():
        loaded = source.load(name)
        assert loaded.dtype == tensor.dtype and torch.equal(loaded.view(torch.uint8), tensor.view(torch.uint8)), name


# --- torch pickles -----------------------------------------------------------------------------


def test_storage_shorter_than_declared_is_refused_not_read_past(tmp_path):
    """The archive's data/0 record holds 100 of 4000 declared bytes; a memory map would read zip bytes."""
    torch.save({"w": torch.arange(1000, dtype=torch.float32), "v": torch.ones(3000)}, tmp_path / "ok.pt")
    bad = rewrite_torch_zip(
        tmp_path / "ok.pt",
        tmp_path / "short.pt",
        records={"data/0": torch.arange(25, dtype=torch.float32).numpy().tobytes()},
    )
    _refused(bad, "storage data/0 declares 4000 bytes but the archive holds 100")


def test_stride_zero_view_declaring_a_terabyte_is_refused(tmp_path):
    torch.save({"w": torch.ones(1).expand(10**12)}, tmp_path / "w.pt")
    _refused(tmp_path / "w.pt", r"declares shape \[1000000000000\].*refusing to allocate")


def test_deep_model_nesting_is_one_line(tmp_path):
    torch.save({"w": torch.ones(2)}, tmp_path / "ok.pt")
    deep = rewrite_torch_zip(tmp_path / "ok.pt", tmp_path / "deep.pt", pickle=nested_model_pickle(5000))
    _refused(deep, "no state dict within 8 nested")
    shallow = rewrite_torch_zip(tmp_path / "ok.pt", tmp_path / "shallow.pt", pickle=nested_model_pickle(3))
    assert torch.equal(open_checkpoint(shallow).load("w"), torch.ones(2))


def test_text_file_named_pt(tmp_path):
    (tmp_path / "w.pt").write_text("hello, I am a README\n")
    _refused(tmp_path / "w.pt", "not a torch checkpoint")


def test_float8_state_dict_reads(tmp_path):
    w = torch.tensor([0.5, -2.0, 448.0]).to(torch.float8_e4m3fn)
    torch.save({"w": w}, tmp_path / "w.pt")
    assert open_checkpoint(tmp_path / "w.pt").load("w").view(torch.uint8).tolist() == w.view(torch.uint8).tolist()


@pytest.mark.parametrize("protocol", [2, 4, 5])
@pytest.mark.parametrize("zip_format", [True, False])
def test_code_running_pickles_name_the_global_at_every_protocol(tmp_path, protocol, zip_format):
    marker = tmp_path / "pwned"
    path = evil_pickle(tmp_path / "evil.pt", marker, protocol, zip_format)
    _refused(path, r"refused to unpickle: it references posix\.mkdir")
    assert not marker.exists()


# --- folders and shard indexes -----------------------------------------------------------------


def _index(tmp_path, weight_map_json: str):
    folder = tmp_path / "model"
    folder.mkdir()
    save_file({"w": torch.ones(2)}, folder / "model-1.safetensors")
    (folder / "model.safetensors.index.json").write_text('{"weight_map": ' + weight_map_json + "}")
    return folder


@pytest.mark.parametrize(
    "weight_map,match",
    [
        ('{"w": "/etc/passwd"}', "points at '/etc/passwd', outside the folder"),
        ('{"w": "../model-1.safetensors"}', "outside the folder"),
        ('{"w": 3}', "maps to 3, not a file name"),
        ('["model-1.safetensors"]', "must map tensor names"),
        ("[" * 50_000 + "]" * 50_000, "nested too deeply"),
    ],
)
def test_bad_shard_index(tmp_path, weight_map, match):
    folder = _index(tmp_path, weight_map)
    _refused(folder, match)


def test_pipeline_component_that_is_corrupt_is_an_error_not_skipped(tmp_path):
    pipe = tmp_path / "pipe"
    (pipe / "unet").mkdir(parents=True)
    (pipe / "text_encoder").mkdir()
    save_file({"w": torch.ones(2)}, pipe / "text_encoder" / "model.safetensors")
    (pipe / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(b"\x07" * 3)
    (pipe / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    with pytest.raises(CheckpointError, match="diffusion_pytorch_model.safetensors: not a safetensors file"):
        open_checkpoint(pipe)


# --- what the path itself is -------------------------------------------------------------------


def test_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "w.safetensors")
    _refused(tmp_path / "w.safetensors", "is a FIFO")
    os.mkfifo(tmp_path / "w.pt")
    _refused(tmp_path / "w.pt", "is a FIFO")


def test_symlink_loop_is_named(tmp_path):
    os.symlink(tmp_path / "b.safetensors", tmp_path / "a.safetensors")
    os.symlink(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    _refused(tmp_path / "a.safetensors", "symbolic link loop")


def test_pipeline_component_linking_back_to_the_pipeline_does_not_recurse(tmp_path):
    pipe = tmp_path / "pipe"
    (pipe / "text_encoder").mkdir(parents=True)
    save_file({"w": torch.ones(2)}, pipe / "text_encoder" / "model.safetensors")
    (pipe / "model_index.json").write_text("{}")
    os.symlink(pipe, pipe / "loop")
    assert open_checkpoint(pipe).names == ["text_encoder.w"]
