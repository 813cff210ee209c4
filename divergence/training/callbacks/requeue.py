"""SLURM's requeue signal handled at a step boundary, by every rank at the same step.

Lightning's SLURM plugin (``SLURMEnvironment`` with ``auto_requeue``) answers the requeue signal
(``#SBATCH --signal=SIGUSR1@120``) by writing ``hpc_ckpt_N.ckpt`` into the Trainer's
``default_root_dir`` and running ``scontrol requeue`` (``_SignalConnector._slurm_sigusr_handler_fn``).
It does so inside the signal handler, wherever the training step happens to be: after the
optimizer step but before the step's loss line and tracked weights are written, the checkpoint
would resume after a step whose records do not exist, and ranks that got the signal at
different points would call the collective save at different steps.

This callback keeps Lightning's handler and its file, but defers them: the signal only sets a
flag; after each step (after the step's records, losses and ``last.ckpt``: place it last) the
ranks reduce the flag (any rank signalled) and, all at the same step, call Lightning's handler.
The requeued job resumes from that checkpoint (``divergence.training.callbacks.resume``).
"""

from __future__ import annotations

import signal

from lightning.pytorch.callbacks import Callback


class SlurmRequeue(Callback):
    def __init__(self):
        self._signalled = False
        self._signum = None
        self._handler = None  # Lightning's requeue handler, called at the step boundary

    def on_train_start(self, trainer, pl_module) -> None:
        from lightning.fabric.plugins.environments import SLURMEnvironment

        env = trainer._accelerator_connector.cluster_environment
        if not (isinstance(env, SLURMEnvironment) and env.auto_requeue and env.requeue_signal is not None):
            return  # not a SLURM job Lightning requeues: nothing to defer
        self._signum, self._handler = env.requeue_signal, trainer._signal_connector._slurm_sigusr_handler_fn
        signal.signal(self._signum, self._note)  # Lightning restores its own handlers at teardown

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._handler is None:
            return
        if trainer.strategy.reduce_boolean_decision(self._signalled, all=False):  # any rank: every rank
            self._signalled = False
            self._handler(self._signum, None)  # hpc_ckpt_N.ckpt (collective), then scontrol requeue

    def _note(self, signum, frame) -> None:
        self._signalled = True
