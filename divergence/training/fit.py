"""One fit for every kind of run: the Trainer, its loggers and callbacks, resume, determinism.

``fit`` trains an ``ArmsModule`` (a single run, a lockstep pair or one separate arm) in a run
folder, resuming from ``<out>/resume/last.ckpt`` (or SLURM's newer ``hpc_ckpt_N.ckpt``) when it exists; ``train_run``, ``train_pair``
and ``train_arm`` (``training.single``, ``training.lockstep``, ``training.separate_arm``) check
the folder, build the module and the callbacks of their kind, and call it.
"""

from __future__ import annotations

from pathlib import Path

from divergence.atomic import temp_path
from divergence.errors import UserInputError
from divergence.pairfolder.folder import RunFolder, as_run_folder
from divergence.recipe.run import RunRecipe


def fit(module, recipe: RunRecipe, out: RunFolder | Path, *, first_callbacks=(), callbacks=(), identity=None):
    """Fit ``module`` (one run or a pair) in the run folder ``out`` (a ``RunFolder``: a run's, a
    lockstep pair's or a separate arm's), resuming from its last .ckpt.

    ``recipe`` gives the hardware, cadence and logging; ``identity`` (a
    ``divergence.loggers.sinks.RunIdentity``) files the wandb run, by default as a run of its
    own with ``recipe`` as config. Callback order: ``first_callbacks``,
    the arms' weights files (``callbacks.arm_files``), the resumable checkpoint, samples, ``callbacks``, progress bar.
    """
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import TQDMProgressBar

    from divergence.training.callbacks.requeue import SlurmRequeue
    from divergence.training.callbacks.resume import ResumeCheckpoint, drop_superseded, resume_file
    from divergence.training.callbacks.samples import SampleGrid
    from divergence.lightning.arm_checkpoints import ArmCheckpoints
    from divergence.training.callbacks.arm_files import arm_callbacks
    from divergence.training.checkpoint_io import AtomicCheckpointIO, check_resume_file
    from divergence.training.tensor_parallel import model_parallel, model_parallel_strategy
    from divergence.models.determinism import determinism
    from divergence.loggers.sinks import RunIdentity, build_loggers, finish_wandb, global_rank_zero

    out = as_run_folder(out)
    train, log, every = recipe.train, recipe.log, recipe.train.checkpoint_every
    if global_rank_zero():
        writable_folder(out)  # the loggers write into it first (an arm's folder is new on its first run)
    if train.cpu_threads:
        torch.set_num_threads(train.cpu_threads)
    given = (*first_callbacks, *callbacks)  # arm writers given replace the default ones (the weights files alone)
    own = [] if any(isinstance(c, ArmCheckpoints) for c in given) else arm_callbacks(module, out)
    own.append(ResumeCheckpoint(out.resume_dir, every))
    if recipe.sample.enabled:
        own.append(SampleGrid(out, recipe.sample, arms=lambda m: m.checkpoint_arms(), inputs=lambda m: m.inputs))
    trainer = L.Trainer(
        max_steps=train.max_steps,
        max_epochs=-1,
        precision="32-true",  # arms apply their own precision
        accelerator=train.accelerator,
        devices=train.devices,
        strategy=model_parallel_strategy(train) if model_parallel(train) else strategy_for(module, train.strategy),
        num_nodes=train.num_nodes,
        logger=build_loggers(log, out, recipe.name, identity or RunIdentity.for_run(recipe, out)) or False,
        callbacks=[
            *first_callbacks,
            *own,
            *callbacks,
            SlurmRequeue(),  # last: after every record of a step
            *([TQDMProgressBar()] if log.progress_bar else []),
        ],
        enable_checkpointing=False,
        enable_progress_bar=log.progress_bar,
        enable_model_summary=log.progress_bar,
        log_every_n_steps=log.every_n_steps,
        plugins=[AtomicCheckpointIO()],
        default_root_dir=str(out.resume_dir),  # where Lightning writes hpc_ckpt_N.ckpt on SLURM's requeue signal
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
    )
    # the newest of resume/last.ckpt and Lightning's resume/hpc_ckpt_N.ckpt, checked against the weights-only
    # allow-list (AtomicCheckpointIO loads it so); rank zero removes the HPC checkpoints it supersedes
    start = resume_file(out.resume_dir)
    if start is not None:
        check_resume_file(start)
        if global_rank_zero():
            drop_superseded(out.resume_dir, start)
    finished = False
    try:
        with determinism(train):  # deterministic kernels and TF32 as the recipe says, restored after
            trainer.fit(module, ckpt_path=str(start) if start else None, weights_only=True)
        finished = True
    finally:  # close the wandb run (Lightning leaves it open); its artifacts only when it finished
        finish_wandb(trainer.loggers, artifacts=finished)
    return trainer


def strategy_for(module, strategy: str):
    """Lightning's strategy for ``module`` (an arm with DTensor weights, tensor parallel or FSDP2, trains
    under ``tensor_parallel.model_parallel_strategy`` instead): several arms under DDP step with one
    backward each, and each backward leaves the other arms' weights unused, so DDP must look for
    unused parameters (Lightning's manual optimization then marks them at every ``manual_backward``)."""
    if strategy == "ddp" and len(getattr(module, "arms", ())) > 1:
        return "ddp_find_unused_parameters_true"
    return strategy


def writable_folder(out: RunFolder | Path) -> None:
    """Create ``out`` and prove a file can be written there: a read-only or immutable folder is
    one line now, not a traceback halfway through a run."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = temp_path(out / "write-test")
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise UserInputError(
            f"--out {out}: cannot write there ({err.strerror or err}); choose a folder you can write to"
        ) from None
