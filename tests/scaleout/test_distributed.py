"""Several ranks: a DDP arm on CPU (gloo), and comparisons divided among ranks equal one rank exactly."""

import json
import pickle

import pytest

from divergence.comparator.distributed import Ranks, assign, compare_files
from divergence.checkpoints.compare import compare_checkpoints
from divergence.pairfolder.arm.status import ArmStatus

from .conftest import rank_results


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


def test_two_gloo_ranks_equal_one_rank_and_follow_a_pair(two_rank_runs, trained):
    """2 gloo ranks (the shared torchrun launch, its ``compare`` job): the comparison divided among
    them, then the comparator following a copy of the separate arms."""
    results = rank_results(two_rank_runs, "compare")
    assert [code for code, _ in results] == [0, 0], results
    a, b = (str(trained / "arms" / arm / "checkpoints/step_000004.safetensors") for arm in "ab")
    records, summary = pickle.loads((two_rank_runs / "compared.pkl").read_bytes())
    single = compare_files(a, b, Ranks())
    assert records == single.records and summary == single.summary  # exactly, record for record
    assert (two_rank_runs / "pair/metrics.jsonl").read_bytes() == (trained / "lockstep/metrics.jsonl").read_bytes()


@pytest.mark.slow
def test_a_two_process_ddp_arm_on_cpu_completes_and_checkpoints(two_rank_runs):
    """``divergence train --arm a`` on 2 gloo ranks under torchrun (the shared launch, its ``arm`` job)."""
    out = two_rank_runs / "arm"
    results = rank_results(two_rank_runs, "arm")
    assert [code for code, _ in results] == [0, 0], [err[-3000:] for _, err in results]
    names = sorted(p.name for p in (out / "a/checkpoints").iterdir())
    assert names == [f"step_{s:06d}.safetensors" for s in (0, 2, 3, 4)]
    status = ArmStatus.read(out / "a")
    assert status.finished and status.world_size == 2
    losses = [json.loads(line) for line in (out / "a/losses.jsonl").read_text().splitlines()]
    assert [r["step"] for r in losses] == [1, 2, 3, 4]
    assert (out / "a/resume/last.ckpt").is_file()
