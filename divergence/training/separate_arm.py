"""``divergence train --arm a|b``: one arm of a pair trained as its own (multi-GPU) job.

Real studies outgrow one process: each arm alone may need several GPUs or nodes, and the two
arms run as separate jobs (any Lightning strategy: DDP, FSDP, several nodes, SLURM). Inputs
are a pure function of (data seed, global step) and each rank takes its slice of the global batch,
so two separate arms (on any world sizes with the same global batch) see what a
lockstep pair sees; a comparator (``divergence watch DIR``) follows both and writes the same
metrics store the lockstep tracker writes. Layout of ``DIR`` (the lockstep layout, with each
arm's own training state under its folder)::

    pair.yaml, pair.json                     written by the first arm to start
    metrics.jsonl, wandb/, csv/            the comparator's (the lockstep tracker's in lockstep mode)
    <arm>/checkpoints/step_NNNNNN.safetensors   at every step the tracker compares
    <arm>/losses.jsonl                       the loss of every step (divergence.pairfolder.arm.losses)
    <arm>/status.json                        running / finished / failed (divergence.pairfolder.arm.status)
    <arm>/resume/last.ckpt                   the arm's full training state; the same command resumes
    <arm>/samples/, <arm>/csv/, <arm>/wandb/ the arm's samples and logs

On one CPU process, an arm here computes bitwise what it computes in lockstep: same weights
files byte for byte, same losses, hence the same store.
"""

from __future__ import annotations

from pathlib import Path

from divergence.errors import UserInputError
from divergence.recipe.pair import ARMS, PairRecipe
from divergence.pairfolder.folder import PairFolder
from divergence.pairfolder.folder import as_pair_folder
from divergence.pairfolder.arm.status import ArmStatus


def train_arm(pair: PairRecipe, arm: str, out: str | Path, callbacks: list | tuple = ()):
    """Train (or resume) arm ``arm`` of ``pair`` in ``out/<arm>``; returns the finished Trainer."""
    from divergence.training.host import check_host

    if arm in pair.arm_recipes:
        check_host(pair.arm_recipes[arm])
    from divergence.pairfolder.arm.lock import ArmLock
    from divergence.training.callbacks.arm_files import arm_callbacks
    from divergence.training.callbacks.injected_bug import InjectedBug
    from divergence.training.callbacks.step_costs import RankCosts
    from divergence.loggers.sinks import RunIdentity, global_rank_zero
    from divergence.training.fit import fit, writable_folder
    from divergence.training.pair_setup import pair_config, pair_module, write_pair_files

    pair_folder = as_pair_folder(out)  # built once here, handed down as the object
    recipe = pair.arm_recipes[arm]
    check_arm_folder(pair_folder, pair, arm)
    module = pair_module(pair, (arm,))  # builds the arm: bad variants fail before any file is written
    arm_folder, lock = pair_folder.arm(arm), None
    if global_rank_zero():  # whichever arm starts first writes the pair's files
        writable_folder(pair_folder)
        lock = ArmLock(arm_folder)  # one writer per arm (divergence.pairfolder.arm.lock), held while it trains
    try:
        if lock is not None:
            write_pair_files(pair_folder, pair, keep=True)
        per_rank = recipe.train.batch_size * recipe.train.accumulate
        first = arm_callbacks(module, pair_folder, pair.tracking, per_rank)  # weights, losses, status
        identity = RunIdentity.for_pair(pair, pair_folder, pair_config(pair), job_type="arm", arm=arm)
        # every rank's step costs (``<arm>/costs.rank<R>.jsonl``), and the injected bug when the recipe asks
        callbacks = [*callbacks, RankCosts(arm_folder.rank_costs, costs=lambda m: m.last_costs)]
        if recipe.train.inject_bug is not None:
            callbacks.append(InjectedBug(recipe.train.inject_bug))
        return fit(module, recipe, arm_folder, first_callbacks=first, callbacks=callbacks, identity=identity)
    finally:
        if lock is not None:
            lock.release()


def check_arm_folder(out: PairFolder | Path, pair: PairRecipe, arm: str) -> None:
    """The folder holds nothing, or this pair's separate-job run; the other arm trains alike."""
    from divergence.training.folder_check import SEPARATE, check_folder
    from divergence.training.pair_setup import pair_config

    check_folder(out, SEPARATE, pair_config(pair), arm=arm)
    train = pair.arm_recipes[arm].train
    if train.strategy.startswith("fsdp"):
        _check_fsdp(pair.arm_recipes[arm])
    other = ArmStatus.read(as_pair_folder(out).arm(ARMS[1 - ARMS.index(arm)]))
    world_size = train.devices * train.num_nodes
    mine = global_batch(train, world_size)
    if other is not None and other.global_batch != mine:
        raise UserInputError(
            f"arm {arm}: global batch {mine} (train.batch_size {train.batch_size} x {world_size} ranks x "
            f"train.accumulate {train.accumulate}), but the other arm's is {other.global_batch} (its status.json); both "
            "arms need the same global batch, or they train on different examples (train that arm again to match)"
        )


def global_batch(train, world_size: int) -> int:
    """Examples per optimizer step: ``batch_size x replicas x accumulate``, the data-parallel replicas
    ``world_size / train.tensor_parallel`` (the ranks of a tensor-parallel group share their batch)."""
    return train.batch_size * (world_size // train.tensor_parallel) * train.accumulate


def _check_fsdp(recipe) -> None:
    """What the arm cannot do on sharded weights yet: fail now, with the fix, not after hours. FSDP2
    (``train.fsdp_sharding``) runs on CPUs and clips by the global norm; Lightning's FSDPStrategy
    (``train.strategy=fsdp`` alone, or ``fsdp_cpu_offload``) needs GPUs and would clip by a shard's."""
    from divergence.training.tensor_parallel import model_parallel

    fsdp2 = model_parallel(recipe.train)
    if recipe.train.accelerator == "cpu" and not fsdp2:
        raise UserInputError(
            f"train.strategy={recipe.train.strategy} needs GPUs (Lightning's FSDPStrategy); on CPUs use "
            "train.fsdp_sharding=FULL_SHARD or SHARD_GRAD_OP (FSDP2, the fsdp variant) or train.strategy=ddp"
        )
    if recipe.sample.enabled:
        raise UserInputError(
            f"train.strategy={recipe.train.strategy}: sampling does not run on sharded weights; add sample.enabled=false"
        )
    if recipe.train.grad_clip is not None and not fsdp2:
        raise UserInputError(
            f"train.strategy={recipe.train.strategy}: the arm would clip by the norm of its own shard, not the global "
            "norm; add train.grad_clip=null (or shard with FSDP2: train.fsdp_sharding=FULL_SHARD)"
        )
