"""The tensor-parallel arm: the DiT's attention and MLP linears sharded over 2 gloo CPU ranks.

One spawn of two processes holds every assertion about the arm itself: after 2 steps on the
same batches its full weights (gathered from the shards) carry the 1-rank arm's names and differ
from them by fp32 reordering only (nonzero, at most 1e-5: measured 4e-7), a second tensor-parallel
arm from the same seed is bitwise the first (the control: the same sums in the same order), and
AdamW's moments survive the resumable checkpoint's gather and re-shard. The same two processes
then run the command a user runs, ``divergence train --recipe tensor-parallel.yaml --arm a``, as
ranks started outside Lightning (as torchrun starts them; Lightning's own launcher of a 2-rank
``--arm a`` job: tests/scaleout/test_parallel_rows.py), and its written weights match arm b's
1-rank files (``--arm b``, in this process) the same way: one spawn, not two (a second one, and
arm b's own process, cost about 30 s of CPU in interpreter start-up).
"""

import json
import os
import socket

import pytest
import torch
from safetensors.torch import load_file

from divergence.cli import main
from divergence.errors import RecipeError
from divergence.recipe.run import TrainConfig
from divergence.variants import VARIANTS
from tests.pairs.helpers import pair_recipe

SMALL = ("train.batch_size=4", "tracking.probe.enabled=false")
REORDERING = 1e-5  # the largest weight difference a reordering of fp32 sums makes in 2 steps here
RECIPE = "recipes/pairs/tensor-parallel.yaml"
COMMAND = ["train.max_steps=2", *SMALL, "log.wandb=false", "log.csv=false", "log.progress_bar=false"]


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (all bound at once, so none is handed out twice)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _worker(rank: int, port: int, out: str, train_port: int, pair: str) -> None:
    _check_the_arm(rank, port, out)
    # the command, on the same 2 processes: ranks started outside Lightning (LOCAL_RANK set, as torchrun does)
    os.environ.update(MASTER_PORT=str(train_port), LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE="2", NODE_RANK="0")
    assert main(["train", "--recipe", RECIPE, "--arm", "a", "--out", pair, *COMMAND]) == 0


def _check_the_arm(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from divergence.training.arm import Arm
    from divergence.training.inputs import Inputs
    from divergence.models.tensor_parallel import parallelize
    from divergence.training import tensor_parallel as tp

    dist.init_process_group("gloo", rank=rank, world_size=2)
    pair = pair_recipe("tensor-parallel", *SMALL)
    inputs = Inputs(pair.arm_recipes["a"])
    mesh = init_device_mesh("cpu", (2,))
    arms = {name: Arm(pair.arm_recipes[name[0]], inputs.tokenizer) for name in ("a", "a2", "b")}
    sharded = {name: parallelize(arms[name].unet, mesh) for name in ("a", "a2")}
    for name, arm in arms.items():
        arm.setup(torch.device("cpu"))
        arm.configure_optimizers()
        for variant in pair.arms[name[0]]:
            variant.verify(arm)
    for step in range(2):
        micro = inputs.prepare_step(inputs.batches.batch(step))
        losses = {name: float(arm.training_step(micro).loss) for name, arm in arms.items()}
    weights = {name: tp.full_tensors(arm.weights()) for name, arm in arms.items()}
    moments = tp.full_optimizer_state(arms["a"].optimizer.state_dict())
    arms["a2"].optimizer.load_state_dict(moments)  # the resume: full moments in, re-sharded
    tp.shard_optimizer_state(arms["a2"].optimizer)
    kept = all(
        torch.equal(s["exp_avg"].to_local(), arms["a"].optimizer.state[p]["exp_avg"].to_local())
        for p, s in zip(arms["a"].optimizer.state, arms["a2"].optimizer.state.values())
        if hasattr(s["exp_avg"], "to_local")
    )
    if rank == 0:
        a, a2, b = weights["a"], weights["a2"], weights["b"]
        result = {
            "names": list(a) == list(b),
            "sharded": len(sharded["a"]),
            "vs_one_rank": max(float((a[k] - b[k]).abs().max()) for k in a),
            "control": max(float((a[k] - a2[k]).abs().max()) for k in a),
            "losses": losses,
            "plain_moments": all(type(v) is torch.Tensor for s in moments["state"].values() for v in s.values()),
            "moments_kept": kept,
        }
        with open(out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    """One spawn of 2 gloo processes: the arm's checks (``result.json``), then ``divergence train --arm a``
    on them; then ``--arm b`` (1 rank) here, into the same pair folder ``pair``."""
    root = tmp_path_factory.mktemp("tensor-parallel")
    port, train_port = _free_ports(2)
    torch.multiprocessing.spawn(
        _worker, args=(port, str(root / "result.json"), train_port, str(root / "pair")), nprocs=2
    )
    assert main(["train", "--recipe", RECIPE, "--arm", "b", "--out", str(root / "pair"), *COMMAND]) == 0
    return root


def test_the_tensor_parallel_arm_is_the_one_rank_arm_up_to_fp32_reordering_and_exact_against_itself(spawned):
    result = json.loads((spawned / "result.json").read_text())
    assert result["names"]  # the comparator matches every tensor by name
    assert result["sharded"] == 2 * 10  # 2 blocks x (q, k, v, out of 2 attentions + 2 MLP linears)
    assert 0.0 < result["vs_one_rank"] <= REORDERING, result
    assert result["control"] == 0.0, result
    assert result["plain_moments"] and result["moments_kept"]


def test_divergence_train_runs_the_tensor_parallel_arm_on_two_processes(spawned):
    """The separate-job command: arm a on 2 ranks (gloo), arm b on 1."""
    out = spawned / "pair"
    a, b = (load_file(out / arm / "checkpoints" / "step_000002.safetensors") for arm in ("a", "b"))
    assert list(a) == list(b)
    assert 0.0 < max(float((a[k] - b[k]).abs().max()) for k in a) <= REORDERING
    status = {arm: json.loads((out / arm / "status.json").read_text()) for arm in ("a", "b")}
    assert (status["a"]["world_size"], status["b"]["world_size"]) == (2, 1)
    assert status["a"]["global_batch"] == status["b"]["global_batch"] == 4  # one batch for both ranks


def test_tensor_parallel_is_fp32_equivalent_and_bad_values_are_one_line():
    assert VARIANTS["tensor-parallel"].fp32_equivalent is True
    pair = pair_recipe("tensor-parallel")
    train = pair.arm_recipes["a"].train
    assert (train.devices, train.tensor_parallel, train.strategy) == (2, 2, "auto")
    assert pair.arm_recipes["b"].train.devices == 1
    with pytest.raises(RecipeError, match="tensor_parallel: must be 1 or devices x num_nodes"):
        TrainConfig(devices=4, tensor_parallel=2)
    with pytest.raises(RecipeError, match="tensor_parallel: .*ModelParallelStrategy.*train.strategy=auto"):
        TrainConfig(devices=2, tensor_parallel=2, strategy="ddp")


def test_a_tensor_parallel_arm_reads_one_replica_of_the_global_batch():
    from divergence.training.separate_arm import global_batch

    pair = pair_recipe("tensor-parallel", *SMALL)
    a, b = (pair.arm_recipes[arm].train for arm in ("a", "b"))
    assert global_batch(a, 2) == global_batch(b, 1) == 4


def test_tensor_parallel_on_the_unet_is_a_recipe_error_naming_the_backbone():
    with pytest.raises(RecipeError, match="train.tensor_parallel: shards the PixArt DiT.*model.denoiser=transformer"):
        pair_recipe("tensor-parallel", "model.denoiser=unet")
