"""Expert parallelism (``train.expert_parallel``, the ``expert-parallel`` variant): an MoE layer's
experts over 2 gloo ranks with all-to-all dispatch against all experts on one process.

The layer alone (the shared 2-rank spawn, ``tests.models.expert_parallel_runs``): each rank holds 2
of the 4 experts, sends kept choices to the other rank, and computes the one-process layer's rows,
routing and drops (capacity from the global token count), balance loss and averaged gradients up
to fp32 reordering; a second expert-parallel copy is bitwise the first (the control). The pair (one
``divergence train`` of ``recipes/pairs/expert-parallel.yaml``: arm a a Lightning-launched 2-rank
job, killed after its first resumable checkpoint and resumed, arm b one process, then the
comparator): 3 steps, a global batch of 4, E(t) at the level of a reordering, the router's flip fraction stored,
each arm's capacity drops stored from its own training steps, step-0 weights equal (the full experts
gathered under the 1-rank names).
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from divergence.errors import RecipeError
from divergence.training import child_start
from divergence.training.separate_pair import RANK_VARIABLES
from divergence.pairfolder.arm.losses import LossFile
from divergence.pairfolder.arm.status import ArmStatus
from divergence.variants import VARIANTS, as_base
from tests.procs import children, parent
from tests.pairs.helpers import PAIR_FAST, PAIRS, pair_recipe, store_lines
from tests.training.tiny import tiny_recipe

REORDERING = 1e-5  # relative: what fp32 reordering leaves of one forward and backward of the layer
PAIR_REORDERING = 1e-4  # relative E(t) after 3 steps of a pair whose arms only reorder fp32 sums
TIMEOUT = 600
SHORT = ("train.max_steps=3", "train.checkpoint_every=1", "tracking.every=1", "tracking.probe.every=1")
ARMS = ("arms.a=[{expert-parallel: 2x2}]", "arms.b=[{expert-parallel: 1x4}]")


def test_experts_over_two_ranks_compute_the_one_process_layer(gloo_runs):
    ranks = json.loads((gloo_runs / "experts" / "result.json").read_text())
    assert len(ranks) == 2
    for r in ranks:
        assert r["sharded"] == {"ff": 2} and r["local_experts"] == 2  # takes effect: half the experts each
        assert r["sent_away"] > 0  # kept choices whose expert is on the other rank
        assert r["start_equal"]  # the gathered experts are the 1-rank weights, under the 1-rank names
        assert r["same_choices"] and r["same_drops"] and r["dropped"] > 0  # one process's queue and capacity
        assert r["output"] <= REORDERING and r["aux"] <= REORDERING and r["grads"] <= REORDERING, r
        assert r["control_output"] == 0.0 and r["control_grads"] == 0.0, r  # the same sums in the same order


def test_the_expert_parallel_pair_trains_as_separate_jobs_resumes_and_differs_by_a_reordering(tmp_path):
    """Arm a's 2-rank job is killed (SIGKILL, both ranks) after its first resumable checkpoint; the
    pair's command then resumes it from the full tensors of ``resume/last.ckpt``, trains arm b and
    runs the comparator. Both commands and their arm jobs are forked from one zygote
    (``training.child_start``, as a study starts its pairs); arm a's rank 1 is Lightning's, started by
    rank 0."""
    out = tmp_path / "pair"
    recipe = str(PAIRS / "expert-parallel.yaml")
    command = [sys.executable, "-m", "divergence", "train", "--recipe", recipe, "--out", str(out)]
    command += [*PAIR_FAST, *SHORT, *ARMS]
    # without the rank variables an in-process launch may have left in this worker (a stale MASTER_PORT)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", *RANK_VARIABLES)}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    zygote = None
    try:
        with open(tmp_path / "killed.log", "w") as log:
            first = child_start.start([*command, "--arm", "a"], env, stdout=log, stderr=subprocess.STDOUT)
        zygote = _zygote_of(first)
        deadline = time.time() + TIMEOUT
        while time.time() < deadline and first.poll() is None and not (out / "a" / "resume" / "last.ckpt").exists():
            time.sleep(0.02)
        rank0 = children(zygote.pid)
        for pid in [*rank0, *(p for r in rank0 for p in children(r))]:  # as a scheduler kills a job: every rank
            os.kill(pid, signal.SIGKILL)
        assert first.wait(timeout=60) == -signal.SIGKILL, "arm a finished before it could be killed"
        with open(tmp_path / "resumed.log", "w") as log:
            run = child_start.start(command, env, stdout=log, stderr=subprocess.STDOUT)
        assert run.wait(timeout=TIMEOUT) == 0, (tmp_path / "resumed.log").read_text()[-3000:]
    finally:
        child_start.close_all()  # the zygote exits once its children have; waited for, so its CPU is ours
        if zygote is not None:
            zygote.wait(timeout=60)
    assert json.loads((out / "pair.json").read_text())["last_step"] == 3
    a, b = (ArmStatus.read(out / arm) for arm in "ab")
    assert a.attempt == 2 and a.start_step >= 1  # resumed, not started again
    assert (a.world_size, b.world_size) == (2, 1) and a.global_batch == b.global_batch == 4
    first = [load_file(out / arm / "checkpoints" / "step_000000.safetensors") for arm in "ab"]
    assert first[0].keys() == first[1].keys() and all(torch.equal(first[0][k], first[1][k]) for k in first[0])
    last = store_lines(out)[-1]
    assert last["step"] == 3 and 0.0 < last["rel_l2"] < PAIR_REORDERING, last["rel_l2"]
    assert 0.0 <= last["router_flip"] < 0.05, last["router_flip"]  # recorded; a reordering flips few choices
    # each arm's capacity drops from its own training steps (losses.jsonl, over both of arm a's ranks;
    # arm a's resumed attempt wrote its lines again), stored by the comparator at the probed steps
    trained = {arm: LossFile(out / arm) for arm in "ab"}
    assert all(sorted(f.read_new()) == [1, 2, 3] and sorted(f.router_drops) == [1, 2, 3] for f in trained.values())
    stored = {r["step"]: r for r in store_lines(out) if r["type"] == "step" and r["step"] > 0}
    for step, record in stored.items():
        assert [record[f"router_drop_{arm}"] for arm in "ab"] == [trained[arm].router_drops[step] for arm in "ab"]
    first_a, first_b = trained["a"].router_drops[1], trained["b"].router_drops[1]
    assert 0.0 < first_b < 1.0 and abs(first_a - first_b) < 0.01  # step 1 from equal weights: one queue, one capacity
    costs = [json.loads(line) for line in (out / "costs.jsonl").read_text().splitlines()]
    # every merged step holds both of arm a's ranks; the step the kill interrupted may be missing (a rank
    # can die between the resumable checkpoint and its costs line, and the resumed attempt does not redo it)
    assert len(costs) >= 2 and all(len(c["arms"]["a"]["ranks"]) == 2 for c in costs)


def _zygote_of(child) -> subprocess.Popen:
    """The zygote process that forked ``child`` (a Popen'd child, were the fork server refused, fails here)."""
    assert type(child) is child_start.ForkedChild, type(child)
    (zygote,) = (z.process for z in child_start._zygotes.values() if z.process.pid == parent(child.pid))
    return zygote


def test_expert_parallel_is_fp32_equivalent_reads_as_one_process_and_bad_values_are_one_line():
    variant = VARIANTS["expert-parallel"]
    assert variant.fp32_equivalent and variant.per_process
    pair = pair_recipe("expert-parallel")
    a, b = (pair.arm_recipes[arm].train for arm in "ab")
    assert (a.devices, a.batch_size, a.expert_parallel, a.strategy) == (2, 8, 2, "auto")
    assert (b.devices, b.batch_size, b.expert_parallel) == (1, 16, 1)
    from divergence.config.schema import to_dict

    assert as_base(to_dict(pair.arm_recipes["a"]))["train"] == as_base(to_dict(pair.arm_recipes["b"]))["train"]
    with pytest.raises(RecipeError, match="train.expert_parallel: spreads .* 3 experts do not split evenly"):
        pair_recipe("expert-parallel", "model.moe.experts=3", "model.moe.top_k=1")
    with pytest.raises(RecipeError, match="train.expert_parallel: .*the model has no experts"):
        pair_recipe("expert-parallel", "model.moe=null")
    moe = ("model.denoiser=transformer", "model.moe={}", "train.devices=2", "train.expert_parallel=2")
    with pytest.raises(RecipeError, match="sample.enabled: .*add sample.enabled=false"):
        tiny_recipe(*moe, "sample.enabled=true")
    with pytest.raises(RecipeError, match="expert_parallel: .*ModelParallelStrategy.*set train.strategy=auto"):
        tiny_recipe(*moe, "sample.enabled=false", "train.strategy=ddp")
    with pytest.raises(RecipeError, match="expert_parallel: must be 1 or devices x num_nodes"):
        tiny_recipe(*moe, "sample.enabled=false", "train.devices=1")
