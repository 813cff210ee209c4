"""torch.distributed.checkpoint folders written by a real 2-rank FSDP2 run (``dcp_runs``).

The oracle is the same weights saved as safetensors: every metric of every tensor, and the
store ``divergence track`` builds, must be equal. Hostile folders (a ``.metadata`` or a chunk
whose unpickling would run code, chunks pointing outside the folder, overlapping or
truncated) are one line naming the file, and nothing runs.
"""

import math
import pickle
import shutil

import pytest
import torch

from divergence.checkpoints import open_checkpoint
from divergence.checkpoints.compare import compare_checkpoints
from divergence.cli import main
from divergence.errors import CheckpointError
from divergence.store import MetricsStore

from .dcp_runs import STEPS
from .forge import RunsCode


@pytest.fixture
def runs(gloo_runs):
    """``dcp_runs``' folder, written by the session's one gloo spawn (``tests.gloo_runs``)."""
    return gloo_runs / "runs"


def _by_name(records):
    return {r["name"]: r for r in records}


def _same(x, y) -> bool:
    return x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))


def test_fsdp2_dcp_compares_exactly_as_the_same_weights_in_safetensors(runs):
    for step in STEPS:
        dcp = compare_checkpoints(runs / "a" / f"step-{step}", runs / "b" / f"checkpoint-{step}")
        oracle = compare_checkpoints(
            runs / "a_st" / f"step_{step}.safetensors", runs / "b_st" / f"step_{step}.safetensors"
        )
        got, want = _by_name(dcp.records), _by_name(oracle.records)
        assert set(got) == set(want) and len(got) == 10  # optimizer state left out, _orig_mod. dropped
        for name, record in want.items():
            assert record.keys() == got[name].keys()
            assert all(_same(got[name][k], v) for k, v in record.items()), name
    assert want["1.weight"]["max_abs_diff"] > 0  # the two arms did diverge


def test_dcp_tensors_equal_torch_dcp_load(runs):
    """Each tensor assembled from its chunks is the tensor DCP's own loader gives (single process)."""
    import torch.distributed.checkpoint as dcp

    source = open_checkpoint(runs / "a" / "step-4")
    assert len(source._stored["1.weight"].chunks) == 2  # 5 rows over 2 ranks: 3 + 2
    state = {"model": {n: torch.empty(source.info(n).shape, dtype=source.info(n).torch_dtype) for n in source.names}}
    with pytest.warns(UserWarning, match="single process"):
        dcp.load(state, checkpoint_id=runs / "a" / "step-4")
    for name in source.names:
        assert torch.equal(source.load(name), state["model"][name]), name


def test_column_shards_are_copied_into_place(runs):
    source = open_checkpoint(runs / "columns")
    assert [c.sizes for c in source._stored["w"].chunks] == [(4, 4), (4, 3)]
    assert torch.equal(source.load("w"), open_checkpoint(runs / "columns.safetensors").load("w"))
    assert source.load("w").dtype == torch.bfloat16


def test_dcp_saved_as_safetensors_shards(tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import FileSystemWriter, SerializationFormat

    state = {"w": torch.arange(6.0).reshape(2, 3), "n": torch.tensor(3), "h": torch.ones(4, dtype=torch.float16)}
    writer = FileSystemWriter(tmp_path / "st", serialization_format=SerializationFormat.SAFETENSORS)
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"model": dict(state)}, storage_writer=writer)
    source = open_checkpoint(tmp_path / "st")
    assert sorted(source.names) == sorted(state)
    for name, tensor in state.items():
        assert torch.equal(source.load(name), tensor) and source.load(name).dtype == tensor.dtype


def test_megatron_stacked_layers_are_split_per_layer(runs):
    folder = runs / "megatron" / "iter_0000004"
    source, oracle = open_checkpoint(folder), open_checkpoint(runs / "megatron.safetensors")
    assert sorted(source.names) == sorted(oracle.names)  # optimizer state left out, layers named
    assert "decoder.layers.2.mlp.linear_fc1.weight" in source.names
    for name in oracle.names:
        assert torch.equal(source.load(name), oracle.load(name)), name
    assert not (runs / "pwned").exists()  # common.pt never opened
    assert main(["compare", str(folder), str(runs / "megatron.safetensors"), "--quiet"]) == 0
    assert "decoder.layers.self_attention.linear_proj.weight" in open_checkpoint(folder, "dcp").names


def test_track_over_dcp_folders_equals_track_over_safetensors(runs, tmp_path):
    assert main(["track", str(runs / "a"), str(runs / "b"), "--out", str(tmp_path / "dcp"), "--quiet"]) == 0
    assert main(["track", str(runs / "a_st"), str(runs / "b_st"), "--out", str(tmp_path / "st"), "--quiet"]) == 0
    dcp, oracle = MetricsStore(tmp_path / "dcp"), MetricsStore(tmp_path / "st")
    assert dcp.steps() == list(STEPS)
    assert dcp.step_records() == oracle.step_records()

    def rows(store):  # each file lists its tensors in its own order
        return sorted(store.tensor_records(), key=lambda r: (r["step"], r["tensor"]))

    assert rows(dcp) == rows(oracle) and len(rows(dcp)) == 10 * len(STEPS)


def test_format_flag_forces_a_reader(runs, tmp_path, capsys):
    a, b = str(runs / "a" / "step-2"), str(runs / "b" / "checkpoint-2")
    assert main(["compare", a, b, "--quiet", "--format", "dcp", "--json", str(tmp_path / "d.json")]) == 0
    capsys.readouterr()
    assert main(["compare", a, b, "--quiet", "--format", "pretrained"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no weights found" in err[0]
    st = str(runs / "a_st" / "step_2.safetensors")
    assert main(["compare", st, st, "--quiet", "--format", "dcp"]) == 2
    assert "is a folder" not in (err := capsys.readouterr().err) and ".metadata" in err


# --- hostile folders --------------------------------------------------------------------------


def _copy(runs, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(runs / "a" / "step-2", folder)
    return folder


def _metadata(folder):
    with open(folder / ".metadata", "rb") as f:
        return pickle.load(f)  # our own file, written by torch above: trusted here


def _write_metadata(folder, metadata):
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(metadata, f)


def _refused(folder, capsys, *needles):
    code = main(["compare", str(folder), str(folder), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    for needle in needles:
        assert needle in err[0], err[0]


def test_metadata_whose_unpickling_runs_code_is_refused_naming_the_global(runs, tmp_path, capsys):
    folder, marker = _copy(runs, tmp_path), tmp_path / "pwned"
    metadata = _metadata(folder)
    metadata.planner_data["payload"] = RunsCode(marker)
    _write_metadata(folder, metadata)
    _refused(folder, capsys, ".metadata: refused to unpickle: it references posix.mkdir")
    assert not marker.exists()
    with pytest.raises(CheckpointError, match="posix.mkdir"):
        open_checkpoint(folder)
    assert not marker.exists()


def test_chunk_whose_unpickling_runs_code_is_refused_naming_the_global(runs, tmp_path, capsys):
    folder, marker = _copy(runs, tmp_path), tmp_path / "pwned"
    metadata = _metadata(folder)
    index, info = next((i, s) for i, s in metadata.storage_data.items() if i.fqn == "model.1.weight")
    with open(folder / info.relative_path, "ab") as f:  # an evil archive appended to the shard
        start = f.tell()
        torch.save(RunsCode(marker), f)
        info.offset, info.length = start, f.tell() - start
    _write_metadata(folder, metadata)
    source = open_checkpoint(folder)  # the metadata is fine; the chunk is read when compared
    with pytest.raises(CheckpointError, match=r"refused to unpickle: it references posix\.mkdir"):
        source.load("1.weight")
    _refused(folder, capsys, "__", ".distcp: chunk of '1.weight'", "posix.mkdir")
    assert not marker.exists()


def _point(field, value):
    def change(metadata):
        info = next(s for i, s in metadata.storage_data.items() if i.fqn == "model.1.weight")
        setattr(info, field, value)

    return change


def _outside(metadata):
    chunks = metadata.state_dict_metadata["model.1.weight"].chunks  # rows 0-2 and 3-4 of 5
    chunks[1].sizes = torch.Size([3, 8])


def _grow(metadata):
    metadata.state_dict_metadata["model.1.weight"].size = torch.Size([10**6, 8])


@pytest.mark.parametrize(
    "change,needle",
    [
        (_point("relative_path", "../../etc/passwd"), "outside the folder"),
        (_point("relative_path", "/etc/passwd"), "outside the folder"),
        (_point("relative_path", "__9_0.distcp"), "which is missing"),
        (_point("offset", 10**9), "truncated checkpoint"),
        (_point("length", 7), "corrupt torch.save archive"),
        (_point("transform_descriptors", ["zstd"]), "transforms"),
        (_outside, "lies outside its shape [5, 8]"),
        (_grow, "chunks holding"),
    ],
)
def test_corrupt_metadata_is_one_line(runs, tmp_path, capsys, change, needle):
    folder = _copy(runs, tmp_path)
    metadata = _metadata(folder)
    change(metadata)
    _write_metadata(folder, metadata)
    _refused(folder, capsys, str(folder), needle)


def test_overlapping_chunks_are_refused(tmp_path):
    from divergence.checkpoints.dcp_chunks import check_tiling as _check_tiling
    from divergence.checkpoints.dcp_metadata import Chunk

    top, middle, bottom = (Chunk((row, 0), (2, 4), "f", 0, 1) for row in (0, 1, 2))
    with pytest.raises(CheckpointError, match="two chunks of tensor 'w' overlap"):
        _check_tiling(tmp_path, "w", (4, 4), [top, middle])  # 16 elements, but row 1 twice, row 3 never
    _check_tiling(tmp_path, "w", (4, 4), [top, bottom])


def test_track_over_accelerate_fsdp_checkpoints_names_the_model_folder(tmp_path, capsys):
    """accelerate's FSDP ``save_state`` with a sharded state dict: ``checkpoint-N/pytorch_model_fsdp_0/``
    (DCP of ``{"model": ...}``) beside ``optimizer_0/`` (DCP) and ``random_states_0.pkl``."""
    import torch.distributed.checkpoint as dcp

    for arm, scale in (("a", 1.0), ("b", 1.5)):
        for step in (1, 2):
            folder = tmp_path / arm / f"checkpoint-{step}"
            w = torch.arange(6.0).reshape(2, 3) * scale * step
            with pytest.warns(UserWarning, match="single process"):
                dcp.save({"model": {"w": w}}, checkpoint_id=folder / "pytorch_model_fsdp_0")
            with pytest.warns(UserWarning, match="single process"):
                dcp.save({"optimizer": {"state": {"w": {"exp_avg": w}}}}, checkpoint_id=folder / "optimizer_0")
            (folder / "random_states_0.pkl").write_bytes(b"never read")
    a, b, out = str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "pair")
    assert main(["track", a, b, "--out", out, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--component pytorch_model_fsdp_0" in err[0] and "checkpoint-1" in err[0], err
    assert main(["track", a, b, "--out", out, "--quiet", "--component", "pytorch_model_fsdp_0"]) == 0
    assert MetricsStore(out).steps() == [1, 2]
