"""A pair whose arms cannot share one job: each arm its own local multi-process job, then the comparator.

A lockstep job holds both arms in one set of processes, so both arms have its world size, its
strategy and whatever else is fixed per process. A pair whose arms differ in any of that (1 vs 2
DDP ranks, DDP vs ZeRO-1, FSDP vs DDP) is trained by ``divergence train`` (and so by
``divergence study`` and ``divergence atlas``, which run it) as ``separate_arm`` jobs:

1. arm a, then arm b, each ``divergence train --arm <arm>`` in a child process, which Lightning's
   own launcher turns into ``train.devices`` ranks (gloo on a CPU, NCCL on GPUs);
2. the comparator follows the arms' files into the pair's metrics store (what ``divergence
   watch`` runs, handed in by the command as ``follow``);
3. the ranks' step costs merged into the pair's ``costs.jsonl`` (``step_costs.merge_rank_costs``).

What is fixed per process is decided from the two arms' resolved recipes, never from a list of
pairs: ``LAUNCH_KEYS`` plus every key a registered variant declares ``per_process``
(``Variant.per_process``). Both arms see the same global batch (``separate_arm.check_arm_folder``
refuses two that differ), rank r its slice of it (``divergence.data.batches``), so a correct
parallelization differs from its one-process reference only by the order of fp32 sums.

Running the command again resumes: a finished arm is not trained again, an interrupted one
resumes from its ``resume/last.ckpt``, and the comparator continues after its last stored step.
Stopped (SIGTERM, SIGHUP, Ctrl-C), it stops the arm job it started (Lightning's launcher passes
the signal to its ranks) before it exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

from divergence.config.schema import to_dict
from divergence.errors import UserInputError
from divergence.pairfolder.folder import PairFolder
from divergence.pairfolder.layout import ARMS
from divergence.recipe.pair import PairRecipe
from divergence.pairfolder.arm.status import ArmStatus
from divergence.training import child_start
from divergence.training.stop_signals import signals_raise

# The recipe keys fixed per process by Lightning's Trainer: the world size and the strategy.
LAUNCH_KEYS = ("train.devices", "train.num_nodes", "train.strategy")
# Environment a launcher sets for its ranks: cleared, so an arm's job launches its own ranks.
RANK_VARIABLES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_PORT")
STOP_SECONDS = 20.0  # a stopped arm job's time to end its step before it is killed


def per_process_keys() -> tuple[str, ...]:
    """``LAUNCH_KEYS`` and the keys every registered ``per_process`` variant sets."""
    from divergence.variants import VARIANTS

    keys = dict.fromkeys(LAUNCH_KEYS)
    for variant in VARIANTS.values():
        if variant.per_process:
            keys.update(dict.fromkeys(variant.sets))
    return tuple(keys)


def separate_jobs(pair: PairRecipe) -> str | None:
    """Why the arms of ``pair`` cannot train in one lockstep job (the first per-process key whose
    resolved value differs between them: ``"train.devices: 2 vs 1"``), or None when they can."""
    from divergence.training.pair_setup import dotted

    a, b = (to_dict(pair.arm_recipes[arm]) for arm in ARMS)
    for key in per_process_keys():
        mine, theirs = dotted(a, key), dotted(b, key)
        if mine != theirs:
            return f"{key}: {mine} vs {theirs}"
    return None


def check_ranks(pair: PairRecipe, cpus: int | None = None) -> None:
    """Each arm's CPU job fits this machine: one core per rank (gloo ranks sharing a core wait on
    each other at every all-reduce), and the arms read the same inputs (``pair_setup.check_shared_inputs``:
    the same global batch among them), refused here before an arm job starts."""
    from divergence.training.pair_setup import check_shared_inputs

    cpus = cpus or os.cpu_count() or 1
    for arm in ARMS:
        train = pair.arm_recipes[arm].train
        if on_cpu(train.accelerator) and train.devices > cpus:
            raise UserInputError(
                f"arm {arm}: train.devices={train.devices} CPU ranks, but this machine has {cpus} cores; "
                f"use train.devices <= {cpus} (one core per rank)"
            )
    check_shared_inputs(pair)


def on_cpu(accelerator: str) -> bool:
    if accelerator != "auto":
        return accelerator == "cpu"
    import torch

    return not torch.cuda.is_available()


def train_separate(
    pair: PairRecipe, out: str | Path, train_command: list[str], follow: Callable[[Path], int], borrowed=()
) -> int:
    """Train ``pair``'s arms as separate jobs into ``out`` and follow them; the exit code.

    ``train_command``: ``divergence train`` of this pair without ``--arm`` (``[python, -m,
    divergence, train, --recipe, R, --out, OUT, overrides...]``); ``follow(out)``: the comparator's
    run over ``out`` (0 when the store is complete); ``borrowed``: the arms another pair of a study
    trains (``borrowed_arms``): not trained here, followed as they come."""
    from divergence.training.separate_arm import check_arm_folder
    from divergence.training.step_costs import merge_rank_costs

    check_ranks(pair)
    out = PairFolder(out)
    for arm in ARMS:
        check_arm_folder(out, pair, arm)
    if borrowed:
        from divergence.training.pair_setup import write_pair_files

        write_pair_files(out, pair, keep=True)  # a pair of borrowed arms only: no arm job writes them
    with signals_raise():
        for arm in ARMS:
            if arm in borrowed or arm_finished(out, arm, pair.base.train.max_steps):
                continue
            code = _run(train_command + ["--arm", arm])
            if code:
                return code
        code = follow(out.path)
    merge_rank_costs(out.path)
    return code


def borrowed_arms(out: str | Path) -> tuple[str, ...]:
    """The arms of the pair folder ``out`` that are another pair's: links a study with shared arms made
    (``divergence.study.shared_arms``; docs/pair-folder.md, "Shared arms")."""
    folder = PairFolder(out)
    return tuple(arm for arm in ARMS if folder.arm(arm).path.is_symlink())


def arm_finished(out: PairFolder, arm: str, max_steps: int) -> bool:
    """Whether ``arm`` of ``out`` finished ``max_steps`` (its ``status.json``): not trained again."""
    status = ArmStatus.read(out.arm(arm))
    return status is not None and status.finished and (status.last_step or 0) >= max_steps


def _run(command: list[str]) -> int:
    """One arm job, its output into ours; stopped with us."""
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    process = child_start.start(command, env)  # forked from the imported zygote, or Popen
    try:
        return process.wait()
    except BaseException:
        process.terminate()
        try:
            process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        raise


def arm_command(recipe: str, out: str | Path, overrides: list[str]) -> list[str]:
    """``divergence train`` of a pair recipe in a child process (``train_separate`` adds ``--arm``)."""
    return [sys.executable, "-m", "divergence", "train", "--recipe", str(recipe), "--out", str(out), *overrides]
