"""SLURM's requeue signal handled at a step boundary, by every rank at the same step.

Lightning's SLURM plugin (``SLURMEnvironment`` with ``auto_requeue``) answers the requeue signal
(``#SBATCH --signal=SIGUSR1@120``) by writing ``hpc_ckpt_N.ckpt`` into the Trainer's
``default_root_dir`` and running ``scontrol requeue``, inside the signal handler, wherever the
training step happens to be: after the optimizer step but before the step's loss line and tracked
weights are written, the checkpoint would resume after a step whose records do not exist, and
ranks that got the signal at different points would call the collective save at different steps.

This callback does the same with Lightning's public API, but at a step boundary: the signal only
sets a flag; after each step (after the step's records, losses and ``last.ckpt``: place it last)
the ranks reduce the flag (any rank signalled) and, all at the same step, close the loggers, save
``hpc_ckpt_N.ckpt`` (``Trainer.save_checkpoint``, collective; N one above the folder's highest, as
Lightning numbers them), and rank zero runs ``scontrol requeue JOB``. The requeued job resumes from
that checkpoint (``divergence.training.callbacks.resume``).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from divergence.training.callbacks.resume import HPC_NAME


class SlurmRequeue(Callback):
    def __init__(self):
        self._signalled = False
        self._signum = None  # the requeue signal, once this is a SLURM job that Lightning would requeue

    def on_train_start(self, trainer, pl_module) -> None:
        env = requeue_environment(trainer)
        if env is None:
            return  # not a SLURM job Lightning requeues: nothing to defer
        self._signum = env.requeue_signal
        signal.signal(self._signum, self._note)  # Lightning restores its own handlers at teardown

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._signum is None:
            return
        if trainer.strategy.reduce_boolean_decision(self._signalled, all=False):  # any rank: every rank
            self._signalled = False
            requeue(trainer)

    def _note(self, signum, frame) -> None:
        self._signalled = True


def requeue_environment(trainer):
    """The SLURM environment Lightning requeues on its signal, or None: the strategy's cluster
    environment (multi-process strategies), else a detected SLURM job's default one (auto-requeue on
    SIGUSR1, as Lightning's Trainer builds it)."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    env = getattr(trainer.strategy, "cluster_environment", None)
    if env is None and SLURMEnvironment.detect():
        env = SLURMEnvironment()
    if isinstance(env, SLURMEnvironment) and env.auto_requeue and env.requeue_signal is not None:
        return env
    return None


def requeue(trainer) -> None:
    """Close the loggers, save ``hpc_ckpt_N.ckpt`` (every rank), then ``scontrol requeue`` (rank zero)."""
    for logger in trainer.loggers:
        logger.finalize("finished")
    folder = Path(trainer.default_root_dir)  # hpc_ckpt_N.ckpt, N one above the highest there (1 in a folder without)
    numbers = [int(m.group(1)) for p in folder.glob("hpc_ckpt_*.ckpt") if (m := HPC_NAME.match(p.name))]
    trainer.save_checkpoint(folder / f"hpc_ckpt_{max(numbers, default=0) + 1}.ckpt")
    if trainer.is_global_zero:  # an array task as ARRAYJOB_TASK, else SLURM_JOB_ID
        array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
        job = f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.environ["SLURM_JOB_ID"]
        subprocess.call(["scontrol", "requeue", job])
