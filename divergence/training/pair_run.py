"""``divergence train`` for a pair recipe: both arms in lockstep, tracked, resumable.

Layout of ``<out>``::

    pair.yaml                              the resolved pair (both arms' recipes)
    pair.json                              what the pair compares (read by the report)
    metrics.jsonl                          the metrics store: per (step, tensor) records
    a/checkpoints/step_NNNNNN.safetensors  arm a's weights-only checkpoints
    b/checkpoints/step_NNNNNN.safetensors  arm b's, at the same steps
    a/samples/, b/samples/                 image grids of each arm
    resume/last.ckpt                       both arms' full training state
    csv/metrics.csv, wandb/, tensorboard/  logs

Running the same command again resumes from ``resume/last.ckpt``: the store drops the steps
after that checkpoint and the run recomputes them, so the final weights and the metrics
series equal those of an uninterrupted run (bitwise on CPU).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml

from divergence.atomic import write_atomic
from divergence.errors import UserInputError
from divergence.pairfolder.layout import PAIR_RECIPE as PAIR_FILE
from divergence.recipe.pair import PairRecipe
from divergence.recipe.yaml_safe import read_yaml
from divergence.store import MetricsStore
from divergence.pairfolder.pair_json import PairInfo
from divergence.training.run import (RESUMABLE_CHANGES, check_resume, flatten_keys, global_rank_zero,
                                     writable_folder)


def train_pair(pair: PairRecipe, out: str | Path, callbacks: list | tuple = ()):
    """Train (or resume) the pair in ``out``; returns the finished ``lightning.Trainer``."""
    from divergence.training.callbacks.attention_outputs import AttentionOutputDeviation
    from divergence.training.callbacks.divergence import DivergenceTracker
    from divergence.training.pair import PairRun, pair_config
    from divergence.training.run import fit

    out = Path(out)
    check_pair_folder(out, pair)
    module = PairRun(pair)  # builds both arms: bad variants fail before any file is written
    info = pair_info(pair)
    if global_rank_zero():
        writable_folder(out)
        write_atomic(out / PAIR_FILE, yaml.safe_dump(pair_config(pair), sort_keys=False))
        info.write(out)
    tracker = DivergenceTracker(out, pair.tracking, pair.base.train.checkpoint_every, probe=pair_probe(pair, module))
    recorders = {arm: r for arm, r in module.recorders.items() if r is not None}
    if recorders:
        callbacks = [*callbacks, AttentionOutputDeviation(out, recorders, pair.tracking.attention_every)]
    from divergence.training.loggers import RunIdentity

    trainer = fit(module, replace(pair.base, name=pair.name), out, first_callbacks=[tracker], callbacks=callbacks,
                  identity=RunIdentity.for_pair(pair, out))
    info.finished, info.last_step = trainer.global_step >= pair.base.train.max_steps, trainer.global_step
    if trainer.is_global_zero:
        info.write(out)
    return trainer


def pair_info(pair: PairRecipe) -> PairInfo:
    """The ``pair.json`` of a pair that starts training (``finished`` false)."""
    from divergence.recipe.schema import to_dict
    from divergence.training.pair import pair_config

    return PairInfo(name=pair.name, category=pair.category, arms=pair.labels(), description=pair.summary_line(),
                    max_steps=pair.base.train.max_steps, recipe=pair_config(pair)["recipes"]["a"],
                    replicate=pair.replicate, tracking=to_dict(pair.tracking))


def pair_probe(pair: PairRecipe, module):
    """The tracker's probe function over a ``PairRun``'s arms, or None when the probe is off."""
    if not pair.tracking.probe.enabled:
        return None
    from divergence.training.probe import FunctionProbe

    probe = FunctionProbe(module.inputs, pair.tracking.probe, pair.probe_seed)
    return lambda pl_module: probe.record(pl_module.arms["a"], pl_module.arms["b"])


def added_later(saved: dict, key: str) -> bool:
    """A key that pair files written before replicates and the probe lack (read as its default)."""
    return key not in saved and (key == "replicate" or key.startswith(("tracking.dense", "tracking.probe")))


def check_pair_folder(out: Path, pair: PairRecipe) -> None:
    """Refuse to resume a folder trained with a different pair (naming the first differing key), or
    whose resume state or metrics store is unusable (naming the file, and the line)."""
    from divergence.training.pair import pair_config

    if out.exists() and not out.is_dir():
        raise UserInputError(f"--out {out}: exists and is not a folder")
    check_resume(out)
    if MetricsStore(out).exists():
        MetricsStore(out).check()  # resuming cuts the store: every line of it must read first
    saved_path = out / PAIR_FILE
    if not saved_path.is_file() or not (out / "resume").is_dir():
        if (out / "recipe.yaml").is_file():
            raise UserInputError(f"--out {out}: holds a single run, not a pair; choose a new --out")
        return
    saved, now = flatten_keys(read_yaml(saved_path) or {}), flatten_keys(pair_config(pair))
    for key in sorted(set(saved) | set(now)):
        resumable = key.split(".", 2)[-1].startswith(RESUMABLE_CHANGES) or key.startswith("tracking.")
        if saved.get(key) != now.get(key) and not resumable and not added_later(saved, key):
            raise UserInputError(f"--out {out}: holds a pair whose {key} = {saved.get(key)!r}, now {now.get(key)!r}; "
                                 "resume with the same recipe or choose a new --out")
