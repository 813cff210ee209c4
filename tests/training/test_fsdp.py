"""The ``fsdp`` variant (FSDP2 FULL_SHARD / SHARD_GRAD_OP) on 2 gloo CPU ranks, and its pair with DDP.

The 2-rank runs are ``tests.training.fsdp_arms``, in the one spawn of ``tests.gloo_runs``: arms
sharded by hand (what takes effect, the control), and the ``fsdp-full`` pair trained by
``train_arm`` under Lightning (FSDP2 FULL_SHARD vs DDP, 2 ranks of 2), which the comparator
follows here.
"""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from divergence.comparator.follow import Comparator
from divergence.errors import RecipeError
from divergence.pairfolder.arm.status import ArmStatus
from divergence.recipe.run import TrainConfig
from divergence.report.inputs import load_pair
from divergence.training.probe_files import FileProbe
from tests.training.fsdp_arms import CRASH, STEPS

REORDERING = 1e-5  # rel_l2 a reordering of fp32 sums stays under in 2 steps here (measured: 4.5e-8)


@pytest.fixture(scope="module")
def fsdp(gloo_runs):
    return gloo_runs / "fsdp"


def test_the_fsdp_arms_shard_every_trained_weight_and_each_stage_keeps_what_it_says(fsdp):
    """Takes effect: every weight of the UNet and of the trained text encoder is a row shard over the
    2 ranks (``verify`` passed on each rank, or the spawn failed), each block one FSDP unit; between
    forward and backward a FULL_SHARD unit holds its shards only, a SHARD_GRAD_OP unit its gathered
    weights."""
    result = json.loads((fsdp / "result.json").read_text())
    assert result["units"] == [
        *(f"down_blocks.{i}" for i in range(3)),
        *(f"up_blocks.{i}" for i in range(3)),
        "mid_block",
    ]
    assert result["text_encoder_units"] == ["encoder.layers.0", "encoder.layers.1"]
    assert set(result["sharded"].values()) == {result["parameters"]}  # every parameter a DTensor
    assert result["sharded_after_forward"] == {"full": True, "grad-op": False}
    assert result["whole_after_forward"] == {"full": False, "grad-op": True}


def test_fsdp_full_vs_ddp_trains_as_separate_jobs_and_reads_as_a_reordering(fsdp, tmp_path):
    """FSDP2 FULL_SHARD vs DDP, 2 ranks of 2 each: the comparator completes the pair; E > 0 (not
    bitwise DDP: the gradients are reduce-scattered and the clipping norm is summed from shards) yet
    at the size of a reordering of fp32 sums."""
    out = tmp_path / "pair"
    shutil.copytree(fsdp / "pair", out)
    assert Comparator(out, log=False, progress=False, probe=FileProbe).run(poll=0.01, timeout=60) == 0
    statuses = {arm: ArmStatus.read(out / arm) for arm in "ab"}
    assert all(s.finished and s.last_step == STEPS and s.world_size == 2 for s in statuses.values())
    assert statuses["a"].global_batch == statuses["b"].global_batch == 4
    first = [load_file(out / arm / "checkpoints" / "step_000000.safetensors") for arm in "ab"]
    assert first[0].keys() == first[1].keys()  # the full tensors under the 1-rank names
    assert all(torch.equal(first[0][k], first[1][k]) for k in first[0])  # control: one init
    rel = load_pair(out).rel_l2
    assert 0.0 < rel[-1] <= REORDERING, rel


def test_control_and_resume_the_resumed_lightning_arm_is_bitwise_the_arm_stepped_by_hand(fsdp):
    """Arm a crashed after step 1 and resumed from its checkpoint (full weights in, AdamW's full
    moments re-sharded) ends bitwise where the same FSDP arm stepped without Lightning ends."""
    status = ArmStatus.read(fsdp / "pair" / "a")
    assert (status.attempt, status.start_step, status.state) == (2, CRASH, "finished")
    resumed = load_file(fsdp / "pair" / "a" / "checkpoints" / f"step_{STEPS:06d}.safetensors")
    by_hand = load_file(fsdp / "by_hand.safetensors")
    assert resumed.keys() == by_hand.keys() and all(torch.equal(resumed[k], by_hand[k]) for k in resumed)


def test_fsdp_sharding_needs_train_strategy_fsdp():
    with pytest.raises(RecipeError, match="fsdp_sharding: shards with FSDP2 under train.strategy=fsdp"):
        TrainConfig(devices=2, strategy="ddp", fsdp_sharding="FULL_SHARD")
    assert TrainConfig(devices=2, strategy="fsdp", fsdp_sharding="SHARD_GRAD_OP").fsdp_sharding == "SHARD_GRAD_OP"
