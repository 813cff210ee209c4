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
