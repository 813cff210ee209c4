"""A lockstep pair under DDP: 2 gloo processes on CPU, against the 1-process pair.

What can equal the 1-process pair, and what cannot: a step's global batch is
``batch_size x world_size x accumulate`` examples drawn from (data seed, step) alone, rank r
taking its slice, so with 2 ranks each step trains on twice the 1-process batch: from step 1 on
the weights differ from that pair's by construction, not by float rounding. What must equal:
the initial weights (step 0) exactly, the store's layout (steps, tracked steps, tensors), and
the 1-process pair accumulating 2 micro-batches (the same examples and draws), up to summation
order (DDP sums the ranks' averaged gradients; accumulation the micro-batches' in one process).
What DDP itself must keep: a control pair's two arms stay exactly equal at every step (both
arms' gradients averaged over the ranks alike, both fed the same global loss), and a NaN on one
rank stops both ranks with one line, no hang.
"""

import json

import pytest
from safetensors.torch import load_file as _load

from divergence.training.separate_arm import train_arm
from tests.pairs.helpers import pair_recipe, store_lines

from .conftest import STEPS, rank_results


def load_file(path) -> dict:
    """Tensors as nested lists: comparable with ``==``."""
    return {key: value.tolist() for key, value in _load(path).items()}


@pytest.mark.slow
def test_a_ddp_control_pair_stays_exactly_zero_and_starts_where_one_process_starts(two_rank_runs, trained, tmp_path):
    out = two_rank_runs / "control"  # 2 ranks of `divergence train` (train.strategy=ddp, train.devices=2)
    (rc0, err0), (rc1, err1) = rank_results(two_rank_runs, "control")
    assert rc0 == 0 and rc1 == 0, (err0[-3000:], err1[-3000:])
    ddp, single = (store_lines(path) for path in (out, trained / "lockstep"))  # single: seed-vs-seed, 1 process
    ddp_steps, single_steps = ({r["step"]: r for r in lines if r["type"] == "step"} for lines in (ddp, single))
    assert list(ddp_steps) == list(single_steps) == [0, 1, 2, 3, 4]
    assert [r["tracked"] for r in ddp_steps.values()] == [r["tracked"] for r in single_steps.values()]
    tensors = [[(r["step"], r["tensor"]) for r in lines if r["type"] == "tensor"] for lines in (ddp, single)]
    assert tensors[0] == tensors[1]
    for step, record in ddp_steps.items():
        assert step == 0 or (record["loss_a"] == record["loss_b"] and record["loss_a"] > 0)
        assert not record["tracked"] or (record["max_abs_diff"] == 0.0 and record["rel_l2"] == 0.0)
    first, last = (f"step_{s:06d}.safetensors" for s in (0, 4))
    ddp_a, single_a = (path / "a/checkpoints" for path in (out, trained / "lockstep"))
    assert load_file(ddp_a / first) == load_file(single_a / first)  # arm a: model seed 0 in both recipes
    assert load_file(ddp_a / last) != load_file(single_a / last)  # a global batch of 2 x batch_size
    assert json.loads((out / "pair.json").read_text())["finished"] is True
    accumulated = tmp_path / "accumulated"  # 1 process, 2 micro-batches: the global batch of 2 ranks
    train_arm(pair_recipe("control", *STEPS, "train.accumulate=2"), "a", accumulated)  # arm a's weights alone
    start, ddp_w, acc_w = (_load(path) for path in (ddp_a / first, ddp_a / last, accumulated / "a/checkpoints" / last))
    diff = sum(float(((ddp_w[k] - acc_w[k]).double() ** 2).sum()) for k in start)
    moved = sum(float(((ddp_w[k] - start[k]).double() ** 2).sum()) for k in start)
    assert (diff / moved) ** 0.5 < 1e-4  # fp32 summation order only (tests/training/test_accumulate.py)


@pytest.mark.slow
def test_a_nan_on_one_rank_stops_both_ranks_with_one_line(two_rank_runs):
    out = two_rank_runs / "nan"  # seed-vs-seed; rank 1's loss of arm a NaN at step 1, rank 0's finite
    results = rank_results(two_rank_runs, "nan")
    for rank, (code, err) in enumerate(results):
        assert code == 2, (rank, err[-3000:])
        lines = [line for line in err.splitlines() if "divergence train: error:" in line]
        assert len(lines) == 1 and "arm a: loss is nan at step 2" in lines[0], (rank, err[-3000:])
        assert "Traceback" not in err, (rank, err[-3000:])
    steps = [r for r in store_lines(out) if r["type"] == "step"]
    assert [r["step"] for r in steps] == [0, 1, 2]  # the NaN step is recorded, then both ranks stop
    assert steps[-1]["spike_a"] and not steps[-1]["spike_b"]
