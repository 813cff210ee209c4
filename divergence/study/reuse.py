"""May a study reuse the pair runs already in its folder? The same recipe, and no live writer.

A study, calibration or atlas re-run skips its finished pair runs and resumes the interrupted
ones (``runner.run_jobs``). Both are right only for runs of the recipe the command asks for: a
re-run with ``train.lr=0.5`` over runs trained with ``train.lr=0.001`` would report the old runs
as the new study, and an interrupted study re-run with an edited recipe would mix the two.
So before anything is written, every run folder holding a ``pair.yaml`` is compared with the
recipe its job would train (``check_reusable``), key by key with the rule a resumed
``divergence train`` follows (``training.folder_check.first_change``: ``train.max_steps``
extends a run; checkpoint, sample and log cadences and data workers may differ) and, since
the report reads every run of a study as one, ``tracking`` too. The first differing key is
refused in one line naming the run folder and both values: give a new ``--out``, or delete
the folder to train that run again.

A run folder written by a live process (``PairLock.is_held``), such as
the ``divergence train`` child of a study killed with ``kill -9``, which keeps training, is
refused too, naming that process, rather than starting a second ``train`` there.
"""

from __future__ import annotations

from divergence.errors import UserInputError
from divergence.pairfolder.layout import PAIR_RECIPE_FILE
from divergence.training.folder_check import RESUMABLE_CHANGES, FolderKind, first_change

REUSED = FolderKind(
    PAIR_RECIPE_FILE,
    RESUMABLE_CHANGES,
    "a pair run of this folder",
    tracking_changes=False,
    fix="a re-run reuses a pair run only with its recipe: give a new --out, or delete that folder to train it again",
)


def check_reusable(jobs) -> None:
    """Refuse the first job whose folder a live process writes (a ``train`` left by a killed study),
    then the first whose folder's ``pair.yaml`` differs from ``job.config`` (see the module docstring)."""
    from divergence.config.yaml_safe import read_yaml, short
    from divergence.pairfolder.arm.lock import PairLock

    for job in jobs:
        who = PairLock.writer(job.out)
        if who is not None:
            raise UserInputError(
                f"{job.out}: {who} is still writing this pair run (pair {job.pair.name}, replicate "
                f"{job.replicate}), e.g. a divergence train left running by a study that was killed; wait for it "
                "to end or stop it, then run this command again"
            )
    for job in jobs:
        saved = job.out / PAIR_RECIPE_FILE
        if job.config is None or not saved.is_file():
            continue
        key, old, new = first_change(read_yaml(saved) or {}, job.config, REUSED)
        if key is not None:
            raise UserInputError(
                f"{job.out}: its {PAIR_RECIPE_FILE} (pair {job.pair.name}, replicate {job.replicate}) has "
                f"{key} = {short(old)}, this command {short(new)}; {REUSED.fix}"
            )
