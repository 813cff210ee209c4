"""``divergence train`` for one run: folder layout, resume, Trainer, fit.

Layout of ``<out>``::

    recipe.yaml                       the resolved recipe
    checkpoints/step_NNNNNN.safetensors   weights-only checkpoints (divergence compare reads these)
    resume/last.ckpt                  full training state; running the same command again resumes
    resume/hpc_ckpt_N.ckpt            the same, written on SLURM's requeue signal (the newest of the two resumes)
    samples/step_NNNNNN.png           image grids for the recipe's prompts
    csv/metrics.csv, wandb/, tensorboard/   logs

Running again on an existing ``<out>`` resumes from ``resume/last.ckpt`` when the recipe matches
the saved one (``train.max_steps`` and logging/sampling cadence may change: that is how a run is
extended); a different recipe is an error rather than a silently mixed run.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from divergence.atomic import temp_path, write_atomic
from divergence.errors import UserInputError
from divergence.recipe.run import RunRecipe
from divergence.recipe.schema import to_dict
from divergence.recipe.yaml_safe import read_yaml

# Keys that may differ between a run folder's recipe and the command resuming it.
RESUMABLE_CHANGES = ("train.max_steps", "train.checkpoint_every", "train.cpu_threads", "data.workers", "log.",
                     "sample.every", "sample.enabled")


def train_run(recipe: RunRecipe, out: str | Path, callbacks: list | tuple = ()):
    """Train (or resume) the run in ``out``; returns the finished ``lightning.Trainer``.

    ``callbacks`` are added after the run's own (weights, resume, samples).
    """
    from divergence.training.callbacks.attention_outputs import AttentionOutputDeviation
    from divergence.training.module import DiffusionRun
    from divergence.training.pair import shadow_recorder

    out = Path(out)
    check_run_folder(out, recipe)
    recorder = shadow_recorder(recipe)
    module = DiffusionRun(recipe, recorder)  # builds everything: bad paths and variants fail before any file
    if global_rank_zero():
        writable_folder(out)
        write_atomic(out / "recipe.yaml", yaml.safe_dump(to_dict(recipe), sort_keys=False))
    if recorder is not None:  # the shadow variant: log its attention-output deviation
        callbacks = [*callbacks, AttentionOutputDeviation(out, {"run": recorder}, recipe.log.every_n_steps)]
    return fit(module, recipe, out, callbacks=callbacks)


def fit(module, recipe: RunRecipe, out: Path, *, first_callbacks=(), callbacks=(), identity=None):
    """Fit ``module`` (one run or a pair) in the run folder ``out``, resuming from its last .ckpt.

    ``recipe`` gives the hardware, cadence and logging; ``identity`` (a
    ``divergence.training.loggers.RunIdentity``) files the wandb run, by default as a run of its
    own with ``recipe`` as config. Callback order: ``first_callbacks``,
    weights-only checkpoints, the resumable checkpoint, samples, ``callbacks``, progress bar.
    """
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import TQDMProgressBar

    from divergence.training.callbacks.requeue import SlurmRequeue
    from divergence.training.callbacks.resume import ResumeCheckpoint
    from divergence.training.callbacks.samples import SampleGrid
    from divergence.training.callbacks.weights import WeightCheckpoint
    from divergence.training.checkpoint_io import AtomicCheckpointIO
    from divergence.training.determinism import determinism
    from divergence.training.loggers import RunIdentity, build_loggers, finish_wandb

    train, log, every = recipe.train, recipe.log, recipe.train.checkpoint_every
    if global_rank_zero():
        writable_folder(out)  # the loggers write into it first (an arm's folder is new on its first run)
    if train.cpu_threads:
        torch.set_num_threads(train.cpu_threads)
    given = (*first_callbacks, *callbacks)  # a WeightCheckpoint given replaces the default one
    own = [] if any(isinstance(c, WeightCheckpoint) for c in given) else [WeightCheckpoint(out, every)]
    own.append(ResumeCheckpoint(out / "resume", every))
    if recipe.sample.enabled:
        own.append(SampleGrid(out, recipe.sample))
    trainer = L.Trainer(
        max_steps=train.max_steps, max_epochs=-1, precision="32-true",  # arms apply their own precision
        accelerator=train.accelerator, devices=train.devices, strategy=train.strategy, num_nodes=train.num_nodes,
        logger=build_loggers(log, out, recipe.name, identity or RunIdentity.for_run(recipe, out)) or False,
        callbacks=[*first_callbacks, *own, *callbacks, SlurmRequeue(),  # last: after every record of a step
                   *([TQDMProgressBar()] if log.progress_bar else [])],
        enable_checkpointing=False, enable_progress_bar=log.progress_bar, enable_model_summary=log.progress_bar,
        log_every_n_steps=log.every_n_steps, plugins=[AtomicCheckpointIO()],
        default_root_dir=str(out / "resume"),  # where Lightning writes hpc_ckpt_N.ckpt on SLURM's requeue signal
        use_distributed_sampler=False, num_sanity_val_steps=0,
    )
    start = resume_from(out)
    # loaded by AtomicCheckpointIO: weights_only, and only the globals our own resume state holds
    finished = False
    try:
        with determinism(train):  # deterministic kernels and TF32 as the recipe says, restored after
            trainer.fit(module, ckpt_path=str(start) if start else None, weights_only=True)
        finished = True
    finally:  # close the wandb run (Lightning leaves it open); its artifacts only when it finished
        finish_wandb(trainer.loggers, artifacts=finished)
    return trainer


def check_run_folder(out: Path, recipe: RunRecipe) -> None:
    """Refuse to resume a folder trained with a different recipe, naming the first differing key,
    or whose resume state is unusable (``check_resume``)."""
    saved_path = out / "recipe.yaml"
    if out.exists() and not out.is_dir():
        raise UserInputError(f"--out {out}: exists and is not a folder")
    check_resume(out)
    trained = (out / "resume").is_dir() or (out / "checkpoints").is_dir()
    if not saved_path.is_file() or not trained:
        return
    saved, now = flatten_keys(read_yaml(saved_path) or {}), flatten_keys(to_dict(recipe))
    for key in sorted(set(saved) | set(now)):
        if saved.get(key) != now.get(key) and not key.startswith(RESUMABLE_CHANGES):
            raise UserInputError(
                f"--out {out}: holds a run whose recipe has {key} = {saved.get(key)!r}, now "
                f"{now.get(key)!r}; resume with the same recipe or choose a new --out"
            )


def check_resume(out: Path) -> None:
    """The folder's resume state loads without running code, before anything is written or run."""
    from divergence.training.callbacks.resume import RESUME_NAME, resume_file
    from divergence.training.checkpoint_io import check_resume_file

    last = out / "resume" / RESUME_NAME
    for path in {resume_file(out / "resume"), last if last.exists() or last.is_symlink() else None} - {None}:
        check_resume_file(path)


def resume_from(out: Path) -> Path | None:
    """The state ``fit`` resumes from: the newest of ``resume/last.ckpt`` and Lightning's
    ``resume/hpc_ckpt_N.ckpt`` (``resume_file``); rank zero removes the HPC checkpoints it
    supersedes. Checked against the weights-only allow-list before it is returned."""
    from divergence.training.callbacks.resume import drop_superseded, resume_file
    from divergence.training.checkpoint_io import check_resume_file

    start = resume_file(out / "resume")
    if start is not None:
        check_resume_file(start)
        if global_rank_zero():
            drop_superseded(out / "resume", start)
    return start


def global_rank_zero() -> bool:
    """This process is global rank zero (before a Trainer exists: from the launcher's environment,
    as Lightning reads it: ``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID``)."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    return getattr(rank_zero_only, "rank", 0) == 0


def writable_folder(out: Path) -> None:
    """Create ``out`` and prove a file can be written there: a read-only or immutable folder is
    one line now, not a traceback halfway through a run."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = temp_path(out / "write-test")
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise UserInputError(f"--out {out}: cannot write there ({err.strerror or err}); "
                             "choose a folder you can write to") from None


def flatten_keys(data: dict, prefix: str = "") -> dict:
    """``{"train": {"lr": 1}}`` -> ``{"train.lr": 1}`` (attention ``options`` stay one value)."""
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict) and value and key != "options":
            flat.update(flatten_keys(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
