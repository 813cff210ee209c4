"""``divergence train`` for a pair recipe: both arms in lockstep in one job, tracked, resumable.

Layout of ``<out>``::

    pair.yaml                              the resolved pair (both arms' recipes)
    pair.json                              what the pair compares (read by the report)
    metrics.jsonl                          the metrics store: per (step, tensor) records
    a/checkpoints/step_NNNNNN.safetensors  arm a's weights-only checkpoints
    b/checkpoints/step_NNNNNN.safetensors  arm b's, at the same steps
    a/samples/, b/samples/                 image grids of each arm
    resume/last.ckpt                       both arms' full training state
    csv/metrics.csv, wandb/, tensorboard/  logs

One process writes the folder at a time (``pairfolder.arm.lock.PairLock``, held on global rank
zero while it trains): a second ``train`` on it, or one started while an arm writer, a
``LockstepPair`` or ``track`` writes it, is refused naming the holder's pid.

Running the same command again resumes from ``resume/last.ckpt``: the store drops the steps
after that checkpoint and the run recomputes them, so the final weights and the metrics
series equal those of an uninterrupted run (bitwise on CPU).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from divergence.recipe.pair import PairRecipe
from divergence.pairfolder.folder import PairFolder
from divergence.pairfolder.folder import as_pair_folder
from divergence.pairfolder.pair_json import finish_pair
from divergence.training.callbacks.step_costs import StepCosts


def train_pair(pair: PairRecipe, out: str | Path, callbacks: list | tuple = (), *, lend_arms: bool = False):
    """Train (or resume) the pair in ``out``; returns the finished ``lightning.Trainer``.

    ``lend_arms``: other pairs of a study read these arms (``divergence.study.shared_arms``), so each
    arm also keeps what a separate arm keeps for its comparator: its weights at every tracked step,
    ``losses.jsonl`` and ``status.json`` (``callbacks.arm_files``)."""
    from divergence.training.host import check_host

    check_host(*pair.arm_recipes.values())
    from divergence.loggers.sinks import global_rank_zero
    from divergence.training.fit import writable_folder
    from divergence.training.folder_check import LOCKSTEP, check_folder, check_numerics
    from divergence.training.pair_setup import pair_config, pair_module, pair_numerics, write_pair_files

    pair_folder = as_pair_folder(out)  # built once here, handed down as the object
    # before the checks read what a live writer writes; a folder no writer ever locked gets its lock file only
    # once checked (a refused command writes nothing)
    lock = pair_lock(pair_folder) if pair_folder.writer_lock.is_file() else None
    try:
        check_folder(pair_folder, LOCKSTEP, pair_config(pair))
        check_no_borrowed_arm(pair_folder)
        check_numerics(pair_folder, pair_numerics(pair))
        module = pair_module(pair)  # builds both arms: bad variants fail before any file is written
        if global_rank_zero():
            writable_folder(pair_folder)
            lock = lock or pair_lock(pair_folder)
            write_pair_files(pair_folder, pair, keep=False)
        return _train(pair, pair_folder, module, callbacks, lend_arms)
    finally:
        if lock is not None:
            lock.release()


def pair_lock(pair_folder: PairFolder):
    """Global rank zero's ``PairLock`` on ``pair_folder`` (one writer of a pair folder: an orphaned ``train`` of a
    killed study, still writing, refuses a second one), None on the other ranks."""
    from divergence.loggers.sinks import global_rank_zero
    from divergence.pairfolder.arm.lock import PairLock

    return PairLock(pair_folder) if global_rank_zero() else None


def check_no_borrowed_arm(pair_folder: PairFolder) -> None:
    """A pair folder whose arm is another pair's (a link a study with shared arms made) trains only its
    own arms, as separate jobs: training both here would write into the other pair's arm."""
    from divergence.errors import UserInputError
    from divergence.training.separate_pair import borrowed_arms

    for arm in borrowed_arms(pair_folder):
        raise UserInputError(
            f"--out {pair_folder.path}: arm {arm} is shared with another pair ({pair_folder.arm(arm).path} is a "
            "link); run the study that made it again (it trains this pair's own arms), or choose a new --out"
        )


def _train(pair: PairRecipe, pair_folder: PairFolder, module, callbacks, lend_arms: bool = False):
    from divergence.training.callbacks.arm_files import arm_callbacks
    from divergence.training.callbacks.attention_outputs import AttentionOutputDeviation
    from divergence.lightning.tracker import DivergenceTracker
    from divergence.tracking.pair_tracker import PairTracker
    from divergence.loggers.sinks import RunIdentity
    from divergence.training.fit import fit
    from divergence.training.pair_setup import pair_config

    coherence = pair_coherence(pair)
    tracker = PairTracker(  # no pair: train_pair has checked the folder, holds its lock and writes pair.json
        pair_folder,
        pair.tracking,
        checkpoint_every=pair.base.train.checkpoint_every,
        probe=pair_probe(pair, module),
        extras=coherence.extras if coherence else None,
    )
    tracker = DivergenceTracker(tracker, losses=lambda m: m.step_losses, weights=arm_weights)
    callbacks = [
        *callbacks,
        StepCosts(pair_folder, costs=lambda m: m.last_costs),
    ]  # costs.jsonl: each arm's step time, memory
    if coherence:
        callbacks.append(coherence)
    recorders = {arm: r for arm, r in module.recorders.items() if r is not None}
    if recorders:
        callbacks = [*callbacks, AttentionOutputDeviation(pair_folder, recorders, pair.tracking.attention_every)]
    # a lent arm keeps what a separate arm keeps for its comparator (``callbacks.arm_files``)
    train = pair.base.train
    lent = arm_callbacks(module, pair_folder, pair.tracking, train.batch_size * train.accumulate) if lend_arms else ()
    trainer = fit(
        module,
        replace(pair.base, name=pair.name),
        pair_folder,
        first_callbacks=[tracker, *lent],
        callbacks=callbacks,
        identity=RunIdentity.for_pair(pair, pair_folder, pair_config(pair)),
    )
    if trainer.is_global_zero:
        finish_pair(pair_folder, trainer.global_step, trainer.global_step >= pair.base.train.max_steps)
    return trainer


def pair_coherence(pair: PairRecipe):
    """The ``UpdateCoherence`` callback of a pair with ``tracking.coherence_every`` (arm a's optimization
    measured on arm b, the reference), or None when it is off."""
    if not pair.tracking.coherence_every:
        return None
    from divergence.training.callbacks.coherence import UpdateCoherence
    from divergence.training.update_error import UpdateError, not_measurable

    reason = not_measurable(pair.arm_recipes["b"], pair.arm_recipes["a"])
    made = {}

    def measure(module, batch):
        if "error" not in made:  # on the first call: the arm is on its device then
            made["error"] = UpdateError(module.arms["b"], pair.arm_recipes["a"])
        return made["error"].measure(module.inputs.prepare_step(batch))

    return UpdateCoherence(pair.tracking.coherence_every, measure, reason)


def pair_probe(pair: PairRecipe, module):
    """The tracker's probe function over the module's arms, or None when the probe is off."""
    if not pair.tracking.probe.enabled:
        return None
    from divergence.training.probe import FunctionProbe

    probe = FunctionProbe(module.inputs, pair.tracking.probe, pair.probe_seed)
    return lambda: probe.record(module.arms["a"], module.arms["b"])


def arm_weights(module) -> tuple[dict, dict] | None:
    """Both arms' weights by checkpoint key on global rank zero (the one that compares), None elsewhere."""
    return (module.arms["a"].weights(), module.arms["b"].weights()) if module.trainer.is_global_zero else None
