"""Several ranks: a DDP arm on CPU (gloo), and comparisons divided among ranks equal one rank exactly."""

import json
import os
import pickle
import shutil
import subprocess
import sys

import pytest
import torch.multiprocessing as mp

from divergence.comparator.distributed import assign, compare_files
from divergence.comparator.ranks import Ranks
from divergence.checkpoints.compare import compare_checkpoints
from divergence.pairfolder.arm.status import ArmStatus
from tests.pairs.helpers import PAIR_FAST, PAIRS

from .conftest import STEPS
from .workers import compare_then_watch


def test_assign_balances_sizes_and_gives_every_item_one_rank():
    sizes = [100, 1, 50, 50, 3, 0]
    owner = assign(sizes, 2)
    loads = [sum(s for s, r in zip(sizes, owner) if r == rank) for rank in (0, 1)]
    assert sorted(loads) == [101, 103]  # 100 + 3 and 50 + 50 + 1 (+ 0)
    assert assign(sizes, 1) == [0] * 6
    assert sorted(assign([1, 1, 1], 5)) == [0, 1, 2]  # more ranks than tensors: some hold none


def test_one_rank_equals_compare(trained):
    a, b = (trained / "arms" / arm / "checkpoints/step_000004.safetensors" for arm in "ab")
    ours, reference = compare_files(a, b, Ranks()), compare_checkpoints(a, b)
    assert ours.records == reference.records and ours.summary == reference.summary


def test_two_gloo_ranks_equal_one_rank_and_follow_a_pair(trained, tmp_path):
    a, b = (str(trained / "arms" / arm / "checkpoints/step_000004.safetensors") for arm in "ab")
    pair = tmp_path / "pair"
    shutil.copytree(trained / "arms", pair)
    init = f"file://{tmp_path / 'rendezvous'}"
    result = tmp_path / "result.pkl"
    mp.spawn(compare_then_watch, args=(2, init, a, b, str(pair), str(result)), nprocs=2, join=True)
    records, summary = pickle.loads(result.read_bytes())
    single = compare_files(a, b, Ranks())
    assert records == single.records and summary == single.summary  # exactly, record for record
    assert (pair / "metrics.jsonl").read_bytes() == (trained / "lockstep/metrics.jsonl").read_bytes()


@pytest.mark.slow
def test_a_two_process_ddp_arm_on_cpu_completes_and_checkpoints(tmp_path):
    """torchrun, 2 processes, gloo: about 10 s on 2 cores."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = dict(os.environ, PYTHONPATH=os.getcwd(), OMP_NUM_THREADS="1")
    command = [
        torchrun,
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "divergence",
        "train",
        "--recipe",
        str(PAIRS / "seed-vs-seed.yaml"),
        "--arm",
        "a",
        "--out",
        str(tmp_path),
        *PAIR_FAST,
        *STEPS,
        "train.strategy=ddp",
        "train.devices=2",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    names = sorted(p.name for p in (tmp_path / "a/checkpoints").iterdir())
    assert names == [f"step_{s:06d}.safetensors" for s in (0, 2, 3, 4)]
    status = ArmStatus.read(tmp_path / "a")
    assert status.finished and status.world_size == 2
    losses = [json.loads(line) for line in (tmp_path / "a/losses.jsonl").read_text().splitlines()]
    assert [r["step"] for r in losses] == [1, 2, 3, 4]
    assert (tmp_path / "a/resume/last.ckpt").is_file()
