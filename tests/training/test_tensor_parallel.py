"""The tensor-parallel arm: the DiT's attention and MLP linears sharded over 2 gloo CPU ranks.

The 2-rank runs are ``tests.training.tensor_parallel_runs``, in the session's one spawn of
``tests.gloo_runs``: after 2 steps on the same batches the arm's full weights (gathered from the
shards) carry the 1-rank arm's names and differ from them by fp32 reordering only (nonzero, at
most 1e-5: measured 4e-7), a second tensor-parallel arm from the same seed is bitwise the first
(the control: the same sums in the same order), and AdamW's moments survive the resumable
checkpoint's gather and re-shard. The same two processes then run the command a user runs,
``divergence train --recipe tensor-parallel.yaml --arm a``, as ranks started outside Lightning (as
torchrun starts them; Lightning's own launcher of a 2-rank ``--arm a`` job:
tests/scaleout/test_parallel_rows.py), and its written weights match arm b's 1-rank files (``--arm
b``, in this process) the same way. No spawn of its own: two more processes, and arm b's own
process, cost about 30 s of CPU in interpreter start-up.
"""

import json
import shutil

import pytest
from safetensors.torch import load_file

from divergence.cli import main
from divergence.errors import RecipeError
from divergence.recipe.run import TrainConfig
from divergence.variants import VARIANTS
from tests.pairs.helpers import pair_recipe
from tests.training.tensor_parallel_runs import COMMAND, RECIPE, SMALL

REORDERING = 1e-5  # the largest weight difference a reordering of fp32 sums makes in 2 steps here


@pytest.fixture(scope="module")
def spawned(gloo_runs, tmp_path_factory):
    """The spawn's ``result.json`` and its ``--arm a`` pair folder (copied), then ``--arm b`` (1 rank)
    here, into that pair folder ``pair``."""
    root = tmp_path_factory.mktemp("tensor-parallel")
    shutil.copy(gloo_runs / "tensor" / "result.json", root / "result.json")
    shutil.copytree(gloo_runs / "tensor" / "pair", root / "pair")
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
