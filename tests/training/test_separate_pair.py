"""Pairs whose arms differ in how they are launched: decided from the arms' recipes, refused in one line.

The 2-process runs themselves (the rows' takes-effect checks, the injected bugs against the
reordering yardstick) are in ``tests/scaleout/test_parallel_rows.py``.
"""

import pytest
import torch

from divergence.analysis.calibration import recipe_identity
from divergence.cli import main
from divergence.config.schema import to_dict
from divergence.data import build_dataset
from divergence.data.batches import StepBatches
from divergence.errors import RecipeError
from divergence.training.fit import strategy_for
from divergence.training.tensor_parallel import model_parallel, model_parallel_strategy
from divergence.training.separate_pair import check_ranks, per_process_keys, separate_jobs
from tests.pairs.helpers import PAIRS, PAIR_FAST, pair_recipe
from tests.training.tiny import tiny_recipe


def test_the_ranks_slices_of_a_global_batch_are_the_one_rank_batch():
    """Rank r of N takes examples [r n, (r + 1) n) of the step's global batch, with every draw."""
    recipe = tiny_recipe()
    dataset = build_dataset(recipe.data)

    def batches(per_rank):
        return StepBatches(
            dataset,
            lambda captions: torch.tensor([len(c) for c in captions]),
            recipe.data,
            per_rank,
            (3, 32, 32),
            1000,
            False,
        )

    for step in (0, 7):
        whole = batches(4).batch(step)
        parts = [batches(2).batch(step, rank, 2) for rank in range(2)]
        for field in ("pixels", "input_ids", "noise", "timesteps"):
            joined = torch.cat([getattr(p, field) for p in parts])
            assert torch.equal(joined, getattr(whole, field)), field  # bitwise: the same examples in the same order


def test_the_launch_is_decided_from_the_arms_resolved_recipes():
    assert separate_jobs(pair_recipe("data-parallel")) == "train.devices: 2 vs 1"
    assert separate_jobs(pair_recipe("zero-1")) == "train.shard_optimizer: True vs None"
    assert separate_jobs(pair_recipe("seed-vs-seed")) is None  # lockstep
    assert separate_jobs(pair_recipe("seed-vs-seed", "train.devices=2", "train.strategy=ddp")) is None  # lockstep DDP
    assert separate_jobs(pair_recipe("seed-vs-seed", "arms.a=[{injected-bug: rank-scale}]", "train.strategy=ddp"))
    assert {"train.devices", "train.strategy", "train.shard_optimizer", "train.fsdp_sharding"} <= set(
        per_process_keys()
    )


def test_each_row_sets_what_it_says_and_reads_as_its_reference():
    dp = pair_recipe("data-parallel").arm_recipes
    assert (dp["a"].train.devices, dp["a"].train.batch_size, dp["a"].train.strategy) == (2, 8, "ddp")
    assert (dp["b"].train.devices, dp["b"].train.batch_size, dp["b"].train.strategy) == (1, 16, "auto")
    assert (dp["a"].train.devices * dp["a"].train.batch_size) == (dp["b"].train.devices * dp["b"].train.batch_size)
    zero = pair_recipe("zero-1").arm_recipes
    assert zero["a"].train.shard_optimizer and not zero["b"].train.shard_optimizer
    for name, sharding in (("fsdp-full", "FULL_SHARD"), ("fsdp-grad-op", "SHARD_GRAD_OP")):
        arms = pair_recipe(name, "train.batch_size=8").arm_recipes  # its base: 2 ranks of 8 (PAIR_FAST: 2)
        assert (arms["a"].train.strategy, arms["a"].train.fsdp_sharding) == ("fsdp", sharding)
        built = model_parallel_strategy(arms["a"].train)  # FSDP2 over one data-parallel group of 2 ranks
        assert (built._data_parallel_size, built._tensor_parallel_size) == (2, 1)
        assert model_parallel(arms["a"].train) and not model_parallel(arms["b"].train)
        assert arms["b"].train.strategy == "ddp"
    for name in ("data-parallel", "zero-1", "fsdp-full"):  # a calibration reads each arm as the base recipe
        arms = pair_recipe(name, "train.batch_size=8").arm_recipes
        assert recipe_identity(to_dict(arms["a"])) == recipe_identity(to_dict(arms["b"]))


def test_control_a_lockstep_pair_keeps_the_default_optimizer_and_strategy():
    arms = pair_recipe("seed-vs-seed").arm_recipes
    assert {arms[a].train.shard_optimizer for a in "ab"} == {None}
    assert strategy_for(None, "auto") == "auto" and strategy_for(None, "fsdp") == "fsdp"  # fsdp: Lightning's FSDP1


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["arms.a=[{data-parallel: 64x1}]", "arms.b=[{data-parallel: 1x64}]"], "train.devices=64 CPU ranks"),
        (["arms.a=[{data-parallel: 2x8}]", "arms.b=[{data-parallel: 1x8}]"], "global batch"),
        (["arms.a=[{data-parallel: 2x8}, {zero-1: true}]", "arms.b=[{data-parallel: 1x16}, {zero-1: true}]"], "ddp"),
        (["arms.a=[{fsdp: half}]"], "full, grad-op"),
        (["train.fsdp_sharding=FULL_SHARD"], "shards with FSDP2 under train.strategy=fsdp"),
    ],
)
def test_a_bad_value_is_one_line_and_exit_2(overrides, says, tmp_path, capsys):
    code = main(
        ["train", "--recipe", str(PAIRS / "data-parallel.yaml"), "--out", str(tmp_path / "p"), *PAIR_FAST, *overrides]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and says in err[0], err
    assert not (tmp_path / "p").exists()  # refused before anything is written


def test_check_ranks_counts_this_machines_cores():
    pair = pair_recipe("data-parallel")
    check_ranks(pair, cpus=2)
    with pytest.raises(Exception, match="this machine has 1 cores"):
        check_ranks(pair, cpus=1)
    with pytest.raises(RecipeError, match="shard_optimizer"):
        pair_recipe("seed-vs-seed", "arms.a=[zero-1]")


@pytest.fixture
def one_rank_group(tmp_path):
    """A gloo process group of one rank (what ZeroRedundancyOptimizer shards over), torn down after."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_zero_1_takes_effect_and_steps_exactly_as_adamw(one_rank_group):
    """Takes effect: the arm's optimizer is a ZeroRedundancyOptimizer (the variant's verify); control: on
    one rank it owns every weight, so its step is AdamW's, bitwise, and its state resumes."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from divergence.variants.parallel import Zero1
    from tests.training.tiny import ready_arm

    sharded, inputs = ready_arm("train.strategy=ddp", "train.shard_optimizer=true")
    plain, _ = ready_arm()
    assert isinstance(sharded.optimizer, ZeroRedundancyOptimizer)
    Zero1(True).verify(sharded)
    with pytest.raises(RuntimeError, match="zero-1"):
        Zero1(True).verify(plain)
    batch = inputs.prepare(inputs.batches.batch(0).to("cpu"))
    for arm in (sharded, plain):
        arm.training_step(batch)
    assert all(torch.equal(a, b) for a, b in zip(sharded.weights().values(), plain.weights().values()))
    resumed, _ = ready_arm("train.strategy=ddp", "train.shard_optimizer=true")
    saved = sharded.train_state_dict()["optimizer"]  # consolidated on rank 0
    assert len(saved["state"]) == len(sharded.trainable_parameters())  # AdamW's moments of every weight
    resumed.load_train_state_dict(sharded.train_state_dict())
    assert all(
        torch.equal(resumed.train_state_dict()["optimizer"]["state"][i]["exp_avg"], saved["state"][i]["exp_avg"])
        for i in saved["state"]
    )
