"""Generated malformed torch.distributed.checkpoint folders: exit 0 or 2 with one line, never a
traceback, and nothing runs.

A valid folder (written by the real ``torch.distributed.checkpoint.save``, single process) is
mutated, seeded so a failure reproduces:

- ``.metadata``: bits flipped, cut short, or spliced with a code-running pickle fragment
  (``posix.mkdir(marker)``) at a random place;
- a ``.distcp`` shard: bits flipped anywhere (headers, ``data.pkl``, tensor bytes), cut short,
  or spliced the same way.

A flip inside tensor bytes is a valid checkpoint with other numbers (exit 0); everything else
must be refused with one line naming the folder or file (exit 2).
"""

import os
import random
import shutil
import warnings

import pytest
import torch

from divergence.cli import main

CASES = 30  # per target; the whole file runs in a few seconds


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    import torch.distributed.checkpoint as dcp

    folder = tmp_path_factory.mktemp("dcp") / "valid"
    torch.manual_seed(0)
    state = {"model": {"w": torch.randn(6, 4), "b": torch.randn(4).to(torch.bfloat16), "n": torch.tensor(3)}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=folder)
    return folder


def _payload(marker) -> bytes:
    """Protocol-0 opcodes that call ``posix.mkdir(marker)`` if unpickled."""
    return b"cposix\nmkdir\n(V" + str(marker).encode() + b"\ntR"


def _mutate(data: bytes, rng: random.Random, marker) -> bytes:
    kind = rng.choice(("flip", "cut", "splice"))
    if kind == "flip":
        out = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        return bytes(out)
    if kind == "cut":
        return data[: rng.randrange(len(data))]
    at = rng.randrange(len(data))
    return data[:at] + _payload(marker) + data[at:]


@pytest.mark.parametrize("target", [".metadata", "__0_0.distcp"])
def test_mutated_dcp_folders_are_one_line_and_run_nothing(valid, tmp_path, capsys, target):
    rng = random.Random(f"dcp-{target}")
    marker = tmp_path / "pwned"
    original = (valid / target).read_bytes()
    refused = 0
    for case in range(CASES):
        folder = tmp_path / f"case{case}"
        shutil.copytree(valid, folder)
        (folder / target).write_bytes(_mutate(original, rng, marker))
        code = main(["compare", str(folder), str(folder), "--quiet"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code in (0, 2), (case, err)
        if code == 2:
            refused += 1
            assert len(err) == 1 and err[0].startswith("divergence compare: error:"), (case, err)
            assert str(folder) in err[0], (case, err)
        assert not marker.exists(), case
        shutil.rmtree(folder)
    assert refused >= CASES // 3  # most mutations break something: the generator does reach the parser


# --- crafted folders, under a memory cap and a time limit -------------------------------------
# Each case is a folder that asks the DCP, torch_dist or DeepSpeed reader for work or memory out
# of proportion to its bytes, or names a FIFO or a device where a file belongs. All are compared
# in one child process (``run_capped``): 256 MiB above its imports, 20 s a case. Every case must
# end in exit 0, or exit 2 with one line naming the folder: no hang, no MemoryError, no traceback.

SHARD = "__0_0.distcp"


def _rows_folder(folder, rng, rows: int, share: str = ""):
    """A [rows, 4] tensor in one chunk per row, each its own archive; ``share``: how chunks lie."""
    import torch

    from ..checkpoints.forge import append_saved, write_dcp_metadata

    folder.mkdir(parents=True)
    placed = [append_saved(folder / SHARD, torch.full((1, 4), float(i))) for i in range(rows)]
    if share == "one":  # every chunk at the first archive's bytes: the tensor is rows times the file
        placed = [placed[0]] * rows
    elif share == "overlap":  # one chunk's range starts inside its neighbour's
        i = rng.randrange(1, rows)
        placed[i] = (placed[i][0] - rng.randint(1, 64), placed[i][1])
    chunks = [((i, 0), (1, 4), SHARD, start, length) for i, (start, length) in enumerate(placed)]
    write_dcp_metadata(folder, {"model.w": ((rows, 4), torch.float32, chunks)}, {"model.w": ("model", "w")})
    return folder


def _memo_chunks(folder, rng):
    """One chunk object listed 200,000 times (2 bytes a time in the pickle's memo)."""
    import pickle

    _rows_folder(folder, rng, 1)
    with open(folder / ".metadata", "rb") as f:
        metadata = pickle.load(f)  # written just above: trusted
    entry = metadata.state_dict_metadata["model.w"]
    entry.chunks = entry.chunks * 200_000
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(metadata, f)


def _bomb_chunk(folder, rng):
    """A chunk whose data.pkl is deflated: 16 MiB of pickle in about 16 kB."""
    import zipfile

    import torch

    from ..checkpoints.forge import write_dcp_metadata

    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / SHARD, "w") as archive:
        archive.writestr("w/data.pkl", b"." + bytes(16 * 2**20), compress_type=zipfile.ZIP_DEFLATED)
    length = (folder / SHARD).stat().st_size
    write_dcp_metadata(folder, {"w": ((1,), torch.float32, [((0,), (1,), SHARD, 0, length)])})


def _special(folder, rng, name: str):
    """The valid folder with ``name`` (a chunk file, .metadata) replaced by a FIFO or a device link."""
    _rows_folder(folder, rng, 2)
    (folder / name).unlink()
    if rng.random() < 0.5:
        os.mkfifo(folder / name)
    else:
        (folder / name).symlink_to(rng.choice(["/dev/zero", "/dev/urandom", "/dev/null"]))


def _megatron(folder, rng):
    import torch

    from ..checkpoints.forge import write_dcp_metadata

    layers = rng.choice([10**8, 2**40, 3 * 10**6])
    folder.mkdir(parents=True)
    (folder / SHARD).write_bytes(b"x")
    write_dcp_metadata(folder, {"decoder.layers.w": ((layers, 0), torch.float32, [((0, 0), (layers, 0), SHARD, 0, 1)])})
    meta = folder / "metadata.json"
    kind = rng.choice(["json", "fifo", "zero", "sparse"])
    if kind == "json":
        meta.write_text('{"sharded_backend": "torch_dist"}')
    elif kind == "fifo":
        os.mkfifo(meta)
    elif kind == "zero":
        meta.symlink_to("/dev/zero")
    else:
        with open(meta, "wb") as f:
            f.truncate(2**40)


def _deepspeed(folder, rng):
    (folder / "global_step1").mkdir(parents=True)
    latest, kind = folder / "latest", rng.choice(["fifo", "zero", "sparse", "text"])
    if kind == "fifo":
        os.mkfifo(latest)
    elif kind == "zero":
        latest.symlink_to("/dev/zero")
    elif kind == "sparse":
        with open(latest, "wb") as f:
            f.truncate(2**40)
    else:
        latest.write_text(rng.choice(["global_step1", "../..", "x" * 5000, "global_step1\n" * 400]))


def _cases(root, rng):
    makers = [
        lambda f: _rows_folder(f, rng, rng.randint(2, 40)),
        lambda f: _rows_folder(f, rng, rng.randint(2, 40), "one"),
        lambda f: _rows_folder(f, rng, rng.randint(2, 40), "overlap"),
        lambda f: _memo_chunks(f, rng),
        lambda f: _bomb_chunk(f, rng),
        lambda f: _special(f, rng, SHARD),
        lambda f: _special(f, rng, ".metadata"),
        lambda f: _megatron(f, rng),
        lambda f: _deepspeed(f, rng),
    ]
    for i in range(len(makers) + 4):  # each maker, and the first four again
        folder = root / f"case{i}"
        makers[i % len(makers)](folder)
        yield i % len(makers), folder


def test_crafted_folders_under_a_memory_cap_and_a_time_limit(tmp_path):
    from ..checkpoints.capped import run_capped

    rng = random.Random("crafted")
    cases = list(_cases(tmp_path, rng))
    commands = [["compare", str(f), str(f), "--quiet"] for _, f in cases]
    commands += [["compare", str(f), str(f), "--quiet", "--format", "deepspeed"] for k, f in cases if k == 8]
    results = run_capped(commands, extra_mb=256, seconds=20)
    expected_ok = {0}  # only the valid row-chunked folders compare
    for argv, (kind, _), (code, err) in zip(commands, cases + [(8, None)] * 10, results):
        assert code in (0, 2), (argv, code, err)
        assert code == 0 or (len(err) == 1 and err[0].startswith("divergence compare: error:")), (argv, err)
        assert code == 2 or kind in expected_ok, (argv, code)
        assert code == 0 or argv[1] in err[0], (argv, err)
