"""The tensor-parallel arm on the 2 gloo ranks of the shared spawn (``tests.gloo_runs``); read by
``tests/training/test_tensor_parallel.py``.

- ``root/result.json`` (rank 0), from ``check_on_rank`` in the spawn's process group: arms ``a`` and
  ``a2`` (its control, built alike) with the DiT's attention and MLP linears sharded over the 2 ranks,
  and ``b`` on one process, 2 steps of ``Arm.training_step`` on the same batches; their full weights
  (gathered from the shards) compared, and AdamW's moments through the resumable checkpoint's gather
  and re-shard;
- ``root/pair/a``, from ``train_on_rank`` once the spawn's process group has ended: the command a
  user runs, ``divergence train --recipe tensor-parallel.yaml --arm a``, on the same 2 processes as
  ranks started outside Lightning (``LOCAL_RANK`` set, as torchrun does), on a port of its own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

SMALL = ("train.batch_size=4", "tracking.probe.enabled=false")
RECIPE = "recipes/pairs/tensor-parallel.yaml"
COMMAND = ["train.max_steps=2", *SMALL, "log.wandb=false", "log.csv=false", "log.progress_bar=false"]


def check_on_rank(root: Path, rank: int) -> None:
    """This rank's part of ``result.json``, in a process group already initialised."""
    with torch.random.fork_rng(devices=[]):  # the spawn's other runs see the RNG as they found it
        _check(root, rank)


def train_on_rank(root: Path, rank: int, port: int) -> None:
    """``divergence train --arm a`` into ``root/pair``: rank ``rank`` of 2 on ``port``."""
    from divergence.cli import main

    os.environ.update(MASTER_PORT=str(port), LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE="2", NODE_RANK="0")
    assert main(["train", "--recipe", RECIPE, "--arm", "a", "--out", str(root / "pair"), *COMMAND]) == 0


def _check(root: Path, rank: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from divergence.models.tensor_parallel import parallelize
    from divergence.training import tensor_parallel as tp
    from divergence.training.arm import Arm
    from divergence.training.inputs import Inputs
    from tests.pairs.helpers import pair_recipe

    root.mkdir(parents=True, exist_ok=True)
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
        (root / "result.json").write_text(json.dumps(result))
