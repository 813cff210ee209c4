"""Crafted DCP, Megatron ``torch_dist`` and DeepSpeed folders that would hang the reader or take
the machine's memory: each is refused in one line naming the file, within the bounds of
``divergence.checkpoints.bounds``, before the work or the allocation it asks for.

Cases that could hang or eat memory if a fix regressed run under a time limit (``deadline``)
or in a child process with a memory cap (``run_capped``).
"""

import os
import pickle
import warnings
import zipfile

import pytest
import torch

from divergence.checkpoints import bounds, open_checkpoint
from divergence.checkpoints.dcp_chunks import check_tiling as _check_tiling
from divergence.checkpoints.dcp_metadata import Chunk
from divergence.checkpoints.zero_folder import is_zero_folder
from divergence.cli import main
from divergence.errors import CheckpointError

from .capped import deadline, run_capped
from .forge import append_saved, write_dcp_metadata

SHARD = "__0_0.distcp"


def _one_line(argv, capsys, *needles):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, (code, err)
    for needle in needles:
        assert needle in err[0], err[0]
    return err[0]


def _saved_dcp(folder, state=None):
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state or {"model": {"w": torch.arange(12.0).reshape(3, 4)}}, checkpoint_id=folder)
    return folder


# --- DeepSpeed's latest: a FIFO, /dev/zero, a sparse file -------------------------------------


def test_latest_as_a_fifo_is_one_line_not_a_hang(tmp_path, capsys):
    folder = tmp_path / "run"
    (folder / "global_step1").mkdir(parents=True)
    os.mkfifo(folder / "latest")
    with deadline(30):
        assert not is_zero_folder(folder)
        _one_line(["compare", str(folder), str(folder), "--quiet"], capsys, str(folder))
        _one_line(
            ["compare", str(folder), str(folder), "--quiet", "--format", "deepspeed"],
            capsys,
            f"{folder / 'latest'}: is a FIFO",
        )


def test_latest_linked_to_dev_zero_or_a_huge_sparse_file_is_never_read_whole(tmp_path):
    zero, sparse = tmp_path / "zero", tmp_path / "sparse"
    for folder in (zero, sparse):
        (folder / "global_step1").mkdir(parents=True)
    (zero / "latest").symlink_to("/dev/zero")
    with open(sparse / "latest", "wb") as f:
        f.truncate(2**40)  # a terabyte of holes: a read of it whole takes the memory
    results = run_capped(
        [
            ["compare", str(zero), str(zero), "--quiet"],
            ["compare", str(zero), str(zero), "--quiet", "--format", "deepspeed"],
            ["compare", str(sparse), str(sparse), "--quiet"],
            ["compare", str(sparse), str(sparse), "--quiet", "--format", "deepspeed"],
        ]
    )
    for code, err in results:
        assert code == 2 and len(err) == 1, (code, err)
    assert "latest: is a character device" in results[1][1][0]
    assert f"{bounds.MAX_TAG_BYTES:,} of the largest" in results[3][1][0]


def test_compare_a_file_as_deepspeed_is_one_line(tmp_path, capsys):
    file = tmp_path / "w.pt"
    torch.save({"w": torch.ones(2)}, file)
    _one_line(["compare", str(file), str(file), "--format", "deepspeed"], capsys, str(file), "not a folder")


@pytest.mark.parametrize("shape", ["abc", 3.5, [[1]], [2**70], [-1], None])
def test_deepspeed_param_shapes_that_are_not_shapes_are_one_line(tmp_path, capsys, shape):
    from .test_zero_folder import _model, _save_deepspeed

    _save_deepspeed(_model(0), tmp_path / "run", 1)
    states = tmp_path / "run" / "global_step1" / "mp_rank_00_model_states.pt"
    checkpoint = torch.load(states, weights_only=False)  # our own file: trusted here
    checkpoint["param_shapes"] = [{"0.weight": shape}]
    checkpoint["module"]["0.weight"] = torch.empty(0, dtype=torch.bfloat16)  # a placeholder, as ZeRO-3 leaves
    torch.save(checkpoint, states)
    _one_line(
        ["compare", str(tmp_path / "run"), str(tmp_path / "run"), "--quiet"],
        capsys,
        str(states),
        "'0.weight'",
        "param_shapes",
    )


# --- DCP: chunk tiling, shared bytes, compressed chunks ---------------------------------------


def test_tiling_check_is_not_quadratic(tmp_path):
    """A [1, N] tensor in N one-element chunks: pairwise overlap tests took 6 s at N = 2,000."""
    n = 30_000
    chunks = [Chunk((0, i), (1, 1), SHARD, 8 * i, 8) for i in range(n)]
    with deadline(20):
        _check_tiling(tmp_path, "w", (1, n), chunks)
        with pytest.raises(CheckpointError, match="two chunks of tensor 'w' overlap"):
            _check_tiling(tmp_path, "w", (1, n), [*chunks[:-1], Chunk((0, 0), (1, 1), SHARD, 0, 8)])
    n, folder = 10_000, tmp_path / "dcp"  # through the reader: 10,000 chunks took minutes
    folder.mkdir()
    (folder / SHARD).write_bytes(bytes(8 * n))  # chunks are read only when compared
    write_dcp_metadata(
        folder, {"w": ((1, n), torch.float32, [(c.offsets, c.sizes, SHARD, c.offset, 8) for c in chunks[:n]])}
    )
    with deadline(30):
        assert open_checkpoint(folder).info("w").shape == (1, n)


@pytest.mark.parametrize(
    "boxes,ok",
    [
        ([((0, 0), (2, 2)), ((0, 2), (2, 2)), ((2, 0), (2, 4))], True),  # a brick wall: not a grid
        ([((0, 0), (4, 4))], True),
        ([((0, 0), (4, 2)), ((0, 2), (2, 2)), ((1, 2), (2, 2))], False),  # 16 elements: (1, 2) twice, (3, 2) never
        (
            [
                ((0, 0), (2, 2)),
                ((1, 1), (2, 2)),
                ((0, 2), (1, 2)),
                ((2, 0), (2, 1)),
                ((3, 1), (1, 3)),
                ((1, 0), (1, 1)),
            ],
            False,
        ),
    ],
)
def test_tiling_check_on_brick_walls_and_overlaps(tmp_path, boxes, ok):
    chunks = [Chunk(o, s, SHARD, 0, 0) for o, s in boxes]
    if ok:
        _check_tiling(tmp_path, "w", (4, 4), chunks)
    else:
        with pytest.raises(CheckpointError, match="tensor 'w'"):
            _check_tiling(tmp_path, "w", (4, 4), chunks)


def test_chunks_sharing_one_byte_range_are_refused_before_allocating(tmp_path, capsys):
    """100 chunks all pointing at one archive declare a tensor 100 times what the file holds."""
    folder = tmp_path / "dcp"
    folder.mkdir()
    start, length = append_saved(folder / SHARD, torch.zeros(1, 256))
    rows = [((i, 0), (1, 256), SHARD, start, length) for i in range(100)]
    write_dcp_metadata(folder, {"w": ((100, 256), torch.float32, rows)})
    _one_line(["compare", str(folder), str(folder), "--quiet"], capsys, str(folder / ".metadata"), "same bytes")
    other = {"v": ((1, 256), torch.float32, [((0, 0), (1, 256), SHARD, start, length)])}
    write_dcp_metadata(folder, {**other, "w": ((1, 256), torch.float32, [rows[0]])})  # two tensors, one archive
    _one_line(["compare", str(folder), str(folder), "--quiet"], capsys, "same bytes", SHARD)


def _compressed(member: str, compression: int):
    def rewrite(archive: bytes, tmp_path) -> bytes:
        source, target = tmp_path / "plain.zip", tmp_path / "packed.zip"
        source.write_bytes(archive)
        with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as new:
            for info in old.infolist():
                packed = compression if info.filename.endswith(member) else zipfile.ZIP_STORED
                new.writestr(info.filename, old.read(info.filename), compress_type=packed)
        return target.read_bytes()

    return rewrite


@pytest.mark.parametrize(
    "rewrite",
    [_compressed("data.pkl", zipfile.ZIP_BZIP2), _compressed("data.pkl", zipfile.ZIP_DEFLATED)]
    + [_compressed("data/0", zipfile.ZIP_DEFLATED)],
)
def test_compressed_chunk_members_are_refused_uninflated(tmp_path, capsys, rewrite):
    folder = _saved_dcp(tmp_path / "dcp")
    with open(folder / ".metadata", "rb") as f:
        metadata = pickle.load(f)  # our own file, written by torch above: trusted here
    info = next(s for i, s in metadata.storage_data.items() if i.fqn == "model.w")
    shard = folder / info.relative_path
    archive = shard.read_bytes()[info.offset : info.offset + info.length]
    packed = rewrite(archive, tmp_path)
    with open(shard, "ab") as f:
        info.offset, info.length = f.tell(), len(packed)
        f.write(packed)
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    _one_line(["compare", str(folder), str(folder), "--quiet"], capsys, "chunk of 'w'", "compress")


# --- Megatron: metadata.json, stacked layers --------------------------------------------------


def _megatron(folder, tensors, files=()):
    folder.mkdir(parents=True)
    for name, data in files:
        (folder / name).write_bytes(data)
    write_dcp_metadata(folder, tensors)
    (folder / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    return folder


def test_megatron_stack_of_a_hundred_million_empty_layers_is_refused_at_once(tmp_path, capsys):
    folder = _megatron(
        tmp_path / "iter_1",
        {"decoder.layers.w": ((10**8, 0), torch.float32, [((0, 0), (10**8, 0), SHARD, 0, 1)])},
        [(SHARD, b"x")],
    )
    with deadline(20):
        _one_line(["compare", str(folder), str(folder), "--quiet"], capsys, "decoder.layers.w", "100,000,000 layers")


def test_huge_sparse_megatron_metadata_json_is_one_line_unread(tmp_path, capsys):
    folder = _saved_dcp(tmp_path / "iter_1")
    with open(folder / "metadata.json", "wb") as f:
        f.truncate(2**30)
    _one_line(["compare", str(folder), str(folder), "--quiet"], capsys, "metadata.json", "1,073,741,824 bytes")
    (folder / "metadata.json").unlink()
    os.mkfifo(folder / "metadata.json")
    with deadline(30):
        _one_line(["compare", str(folder), str(folder), "--quiet"], capsys, "metadata.json: is a FIFO")


# --- DCP .metadata: bounds, names ---------------------------------------------------------------


def test_metadata_file_larger_than_the_bound_is_refused_unread(tmp_path, capsys, monkeypatch):
    folder = _saved_dcp(tmp_path / "dcp")
    size = (folder / ".metadata").stat().st_size
    monkeypatch.setattr(bounds, "MAX_METADATA_BYTES", size - 1)
    _one_line(["compare", str(folder), str(folder), "--quiet"], capsys, ".metadata", f"{size:,} bytes")
    monkeypatch.undo()
    (folder / ".metadata").unlink()
    os.mkfifo(folder / ".metadata")
    with deadline(30):
        _one_line(["compare", str(folder), str(folder), "--quiet", "--format", "dcp"], capsys, ".metadata: is a FIFO")


def test_chunk_count_past_the_bound_or_the_file_size_is_refused(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "dcp"
    folder.mkdir()
    (folder / SHARD).write_bytes(bytes(64))
    write_dcp_metadata(folder, {"w": ((8,), torch.float32, [((i,), (1,), SHARD, 4 * i, 4) for i in range(8)])})
    monkeypatch.setattr(bounds, "MAX_CHUNKS", 7)
    _one_line(["compare", str(folder), str(folder), "--quiet"], capsys, ".metadata", "lists 8 ", "7 of the largest")
    monkeypatch.setattr(bounds, "MAX_CHUNKS", 2**24)
    monkeypatch.setattr(bounds, "MIN_METADATA_BYTES_PER_CHUNK", 10**6)
    _one_line(["compare", str(folder), str(folder), "--quiet"], capsys, ".metadata", "lists 8 ", "can describe")


def _nested_list_pickle(depth: int) -> bytes:
    """Pickle opcodes of a list nested ``depth`` deep: EMPTY_LIST x depth, APPEND x (depth - 1)."""
    return b"]" * depth + b"a" * (depth - 1)


def test_storage_index_named_by_a_deeply_nested_list_is_one_line(tmp_path, capsys):
    folder = _saved_dcp(tmp_path / "dcp")
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex

    with open(folder / ".metadata", "rb") as f:
        metadata = pickle.load(f)  # trusted: written above
    placeholder = "PLACEHOLDER_NAME_OF_SIXTY_FOUR_CHARACTERS_TO_FIND_IN_THE_PICKLE__"
    metadata.storage_data[MetadataIndex(placeholder, torch.Size([0]))] = _StorageInfo(SHARD, 0, 1)
    data = pickle.dumps(metadata, protocol=2)
    opcode = b"X" + len(placeholder).to_bytes(4, "little") + placeholder.encode()  # BINUNICODE
    assert data.count(opcode) == 1
    (folder / ".metadata").write_bytes(data.replace(opcode, _nested_list_pickle(200_000)))
    _one_line(["compare", str(folder), str(folder), "--quiet"], capsys, ".metadata", "corrupt DCP metadata")


# --- dtypes nobody can compare honestly -----------------------------------------------------------


def test_float4_tensors_are_refused_by_name(tmp_path, capsys):
    packed = torch.zeros(3, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    torch.save({"w": packed}, tmp_path / "w.pt")
    _one_line(["compare", str(tmp_path / "w.pt"), str(tmp_path / "w.pt"), "--quiet"], capsys, "'w'", "float4_e2m1fn_x2")
    folder = tmp_path / "dcp"
    folder.mkdir()
    start, length = append_saved(folder / SHARD, packed)
    write_dcp_metadata(folder, {"w": ((3,), torch.float4_e2m1fn_x2, [((0,), (3,), SHARD, start, length)])})
    _one_line(["compare", str(folder), str(folder), "--quiet"], capsys, "'w'", "float4_e2m1fn_x2")
