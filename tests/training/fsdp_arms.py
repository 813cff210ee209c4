"""The FSDP2 arms (the ``fsdp`` variant) on 2 gloo CPU ranks, run by ``tests.gloo_runs``'s one spawn.

- ``root/result.json`` and ``root/by_hand.safetensors`` (rank zero): arms ``full`` and ``grad-op``
  sharded by hand on the spawn's process group, the ``fsdp`` variant's ``verify`` run on each, what
  a unit of each holds between forward and backward, and ``full``'s weights after ``STEPS`` steps
  of ``Arm.training_step`` without Lightning (rank r its slice of each step's global batch);
- ``root/pair/``: the ``fsdp-full`` pair (FSDP2 FULL_SHARD vs DDP, 2 ranks of 2) trained by
  ``train_arm`` under Lightning, arm a crashing after step 2 and resumed from its checkpoint, then
  arm b, for the comparator to follow in ``tests/training/test_fsdp.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

STEPS = 2
CRASH = 1  # arm a's first attempt stops after this step (its resumable checkpoint holds it)
OVERRIDES = (
    "data.resolution=16",  # the UNet's blocks at 16, 8 and 4 pixels: its units and sharding the same
    "train.batch_size=2",
    f"train.max_steps={STEPS}",
    "train.checkpoint_every=1",
    "tracking.every=1",
    "tracking.dense=[]",
    "tracking.probe.enabled=false",
    "log.wandb=false",
    "log.csv=false",
    "log.progress_bar=false",
    "arms.b=[{data-parallel: 2x2}]",
)


def pair(name: str = "fsdp-full", *overrides: str):
    from tests.pairs.helpers import pair_recipe

    sharding = name.removeprefix("fsdp-")  # the pair file's 2 ranks of 8 as 2 ranks of 2
    return pair_recipe(name, *OVERRIDES, f"arms.a=[{{data-parallel: 2x2}}, {{fsdp: {sharding}}}]", *overrides)


def crash():
    """A callback stopping the fit with SystemError after step ``CRASH`` (Lightning imported here, after
    the spawn set the ranks' environment: its rank-zero flag is read at import)."""
    from lightning.pytorch.callbacks import Callback

    class Crash(Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == CRASH:
                raise SystemError("simulated crash")

    return Crash()


def write_on_rank(root: Path, rank: int, world: int) -> None:
    from safetensors.torch import save_file

    from divergence.training.separate_arm import train_arm

    root.mkdir(parents=True, exist_ok=True)
    result, weights = _by_hand(rank, world)
    if rank == 0:
        (root / "result.json").write_text(json.dumps(result))
        save_file(weights, root / "by_hand.safetensors")
    try:
        train_arm(pair(), "a", root / "pair", callbacks=[crash()])
    except SystemError:
        pass
    train_arm(pair(), "a", root / "pair")  # resumed from step CRASH
    train_arm(pair(), "b", root / "pair")


def _by_hand(rank: int, world: int) -> tuple[dict, dict]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from divergence.models.fully_sharded import shard, units
    from divergence.training import tensor_parallel as tp
    from divergence.training.arm import Arm
    from divergence.training.inputs import Inputs

    recipes = {"full": pair("fsdp-full"), "grad-op": pair("fsdp-grad-op")}
    inputs = Inputs(recipes["full"].arm_recipes["a"])
    # Lightning's ModelParallelStrategy mesh: its data-parallel dimension is the same mesh (by value), so
    # the DTensor sharding rules computed here are cached for the Lightning arm's steps too
    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))["data_parallel"]
    arms, kept = {}, {}
    for name, p in recipes.items():
        arm = arms[name] = Arm(p.arm_recipes["a"], inputs.tokenizer)
        for network in arm.trained_networks():
            shard(network, mesh, p.arm_recipes["a"].train.fsdp_sharding)
        arm.setup(torch.device("cpu"))
        arm.configure_optimizers()
        for variant in p.arms["a"]:
            variant.verify(arm)  # raises unless every trained weight is sharded as the stage says
    sharded = {name: sum(isinstance(p, DTensor) for p in arm.parameters()) for name, arm in arms.items()}
    hooks = [arm.unet.register_forward_hook(_keep(kept, name, arm.unet)) for name, arm in arms.items()]
    arms["grad-op"].predict(inputs.prepare_step(inputs.batches.batch(0, rank, world))[0])  # its forward only
    for step in range(STEPS):  # arm full's training, the uninterrupted reference of the resumed arm a
        arms["full"].training_step(inputs.prepare_step(inputs.batches.batch(step, rank, world)))
    for hook in hooks:
        hook.remove()
    full = tp.full_tensors(arms["full"].weights())
    result = {
        "units": units(arms["full"].unet),
        "text_encoder_units": units(arms["full"].text_encoder),
        "sharded": sharded,
        "parameters": sum(1 for _ in arms["full"].parameters()),
        "sharded_after_forward": {name: all(v) for name, v in kept.items()},
        "whole_after_forward": {name: not any(v) for name, v in kept.items()},
    }
    return result, {k: v.contiguous() for k, v in full.items()}


def _keep(kept: dict, name: str, unet):
    """A forward hook on ``unet`` noting, after its first forward (before the backward), whether each
    weight of its first FSDP unit is a DTensor (that unit holds its shards) or a plain tensor (gathered)."""
    from torch.distributed.tensor import DTensor

    from divergence.models.fully_sharded import units

    unit = unet.get_submodule(units(unet)[0])

    def hook(*_):
        kept.setdefault(name, [isinstance(p, DTensor) for p in unit.parameters()])

    return hook
