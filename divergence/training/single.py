"""``divergence train`` for one run: one arm, its folder, resume.

Layout of ``<out>``::

    recipe.yaml                       the resolved recipe
    checkpoints/step_NNNNNN.safetensors   weights-only checkpoints (divergence compare reads these)
    resume/last.ckpt                  full training state; running the same command again resumes
    resume/hpc_ckpt_N.ckpt            the same, written on SLURM's requeue signal (the newest of the two resumes)
    samples/step_NNNNNN.png           image grids for the recipe's prompts
    csv/metrics.csv, wandb/, tensorboard/   logs

Running again on an existing ``<out>`` resumes from ``resume/last.ckpt`` when the recipe matches
the saved one (``train.max_steps`` and logging/sampling cadence may change: that is how a run is
extended); a different recipe is an error rather than a silently mixed run
(``training.folder_check``).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from divergence.atomic import write_atomic
from divergence.pairfolder.folder import as_run_folder
from divergence.recipe.run import RunRecipe
from divergence.config.schema import to_dict

RUN_ARM = "run"  # the name of a single run's one arm in the ArmsModule


def train_run(recipe: RunRecipe, out: str | Path, callbacks: list | tuple = ()):
    """Train (or resume) the run in ``out``; returns the finished ``lightning.Trainer``.

    ``callbacks`` are added after the run's own (weights, resume, samples).
    """
    from divergence.training.host import check_host

    check_host(recipe)
    from divergence.training.arms_module import ArmsModule
    from divergence.training.callbacks.attention_outputs import AttentionOutputDeviation
    from divergence.loggers.sinks import global_rank_zero
    from divergence.training.fit import fit, writable_folder
    from divergence.training.folder_check import RUN, check_folder
    from divergence.training.pair_setup import shadow_recorder

    out = as_run_folder(out)
    check_folder(out, RUN, to_dict(recipe))
    recorder = shadow_recorder(recipe)
    # builds everything: bad paths and variants fail before any file
    module = ArmsModule(
        {RUN_ARM: recipe},
        folders={RUN_ARM: ""},
        labels={RUN_ARM: recipe.name},
        config=to_dict(recipe),
        recorders={RUN_ARM: recorder},
    )
    if global_rank_zero():
        writable_folder(out)
        write_atomic(out.recipe, yaml.safe_dump(to_dict(recipe), sort_keys=False))
    if recorder is not None:  # the shadow variant: log its attention-output deviation
        callbacks = [*callbacks, AttentionOutputDeviation(out, {"run": recorder}, recipe.log.every_n_steps)]
    return fit(module, recipe, out, callbacks=callbacks)
