"""The pair folder as one object: every path of the contract by name (``docs/pair-folder.md``).

::

    folder = PairFolder("runs/flash-vs-sdpa")
    folder.pair_json                 runs/flash-vs-sdpa/pair.json
    folder.metrics                   runs/flash-vs-sdpa/metrics.jsonl
    folder.arm("a").losses           runs/flash-vs-sdpa/a/losses.jsonl
    folder.arm("b").weights(120)     runs/flash-vs-sdpa/b/checkpoints/step_000120.safetensors

The names come from ``divergence.pairfolder.layout`` (``PAIR_FILE``, ``METRICS_FILE``, ...), the
one place a name is spelled; this module only joins them to a folder. A writer, callback, tracker
or logger is handed a ``PairFolder`` (or an ``ArmFolder``) and asks it for the path it needs,
instead of joining names to a bare ``out`` of its own.

Both are ``os.PathLike`` (``Path(folder)``, ``open(folder.metrics)``, an f-string print the
folder), and ``PairFolder(folder)`` of a ``PairFolder`` is the same folder, so a function that
takes ``out: str | Path`` takes one as well. A run folder (one arm trained alone, ``divergence
train``), a lockstep pair folder and an arm trained as its own job each hold a run's own
state and logs (``resume/``, ``csv/``, ``wandb-id``, ...): those paths are ``RunFolder``'s, which
``PairFolder`` and ``ArmFolder`` extend.
"""

from __future__ import annotations

import os
from pathlib import Path

from divergence.pairfolder.layout import (
    ARMS,
    ATTENTION_FILE,
    CHECKPOINTS_DIR,
    COSTS_FILE,
    CSV_DIR,
    LOSSES_FILE,
    METRICS_FILE,
    PAIR_FILE,
    PAIR_RECIPE_FILE,
    RESUME_DIR,
    RESUME_FILE,
    RETENTION_FILE,
    rank_costs_name,
    RUN_RECIPE_FILE,
    SAMPLES_DIR,
    STATUS_FILE,
    TENSORBOARD_DIR,
    WANDB_ID_FILE,
    WATCH_STATE_FILE,
    WRITER_LOCK_FILE,
    weights_dcp_name,
    weights_name,
    weights_step,
)


def _child(name: str, doc: str) -> property:
    """The path ``name`` in the folder, as a read-only property documented ``doc``."""
    return property(lambda self: self.path / name, doc=doc)


class RunFolder(os.PathLike):
    """A folder a training run writes its own state and logs in: a run folder, a lockstep pair's
    folder, or the folder of an arm trained as its own job (``resume/``, ``samples/``, ``csv/``,
    ``tensorboard/``, ``wandb-id``, a run's ``recipe.yaml`` and ``checkpoints/``)."""

    __slots__ = ("path",)

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.path == self.path

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.path))

    @classmethod
    def of(cls, out: str | os.PathLike):
        """``out`` as this class (itself when it is one already: a ``PairFolder`` or an ``ArmFolder``
        is a ``RunFolder``)."""
        return out if isinstance(out, cls) else cls(out)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @property
    def name(self) -> str:
        return self.path.name

    checkpoints_dir = _child(CHECKPOINTS_DIR, "``checkpoints/``: the weights files (an arm's, or a run folder's).")

    def weights(self, step: int) -> Path:
        """``checkpoints/step_NNNNNN.safetensors`` of ``step``."""
        return self.checkpoints_dir / weights_name(step)

    def weights_dcp(self, step: int) -> Path:
        """``checkpoints/step_NNNNNN.dcp/``: the weights of ``step`` written as a DCP folder."""
        return self.checkpoints_dir / weights_dcp_name(step)

    def saved_weights(self, step: int) -> Path:
        """The weights of ``step`` as written: its DCP folder when there is one, else its safetensors file.

        A step with both (an arm trained again in the other format by a writer that left the old one)
        is the one written last: the file when its mtime is later than the folder's (a folder's mtime
        moves as its files are written, its ``complete.json`` last); ``ArmWriter`` removes the other
        format's entry of a step before it writes the step, so it leaves no such pair itself.
        """
        folder, file = self.weights_dcp(step), self.weights(step)
        try:
            if not folder.is_dir() or file.stat().st_mtime_ns > folder.stat().st_mtime_ns:
                return file
        except OSError:  # no file (or the folder went meanwhile): the folder, or nothing
            pass
        return folder

    resume_dir = _child(RESUME_DIR, "``resume/``: the resumable training state (``last.ckpt``, ``hpc_ckpt_N.ckpt``).")
    samples_dir = _child(SAMPLES_DIR, "``samples/``: sample grids at checkpoint steps (the built-in trainer).")
    recipe = _child(RUN_RECIPE_FILE, "``recipe.yaml``: a run folder's resolved recipe.")
    wandb_id = _child(WANDB_ID_FILE, "``wandb-id``: the wandb run id a resumed run or watch continues.")
    csv_dir = _child(CSV_DIR, "``csv/``: the CSV logger's ``metrics.csv``.")
    tensorboard_dir = _child(TENSORBOARD_DIR, "``tensorboard/``: the TensorBoard logger's events.")

    @property
    def resume_file(self) -> Path:
        """``resume/last.ckpt``."""
        return self.resume_dir / RESUME_FILE


class ArmFolder(RunFolder):
    """One arm's folder ``<pair>/<arm>/``: ``losses``, ``status``, ``writer_lock``, ``checkpoints_dir``,
    ``weights(step)`` (and, for the built-in trainer's separate arm, a run's ``resume_dir``, ``csv_dir``, ...)."""

    __slots__ = ()

    @property
    def arm(self) -> str:
        """The arm's name: the folder's name (``a`` or ``b``)."""
        return self.path.name

    losses = _child(LOSSES_FILE, "``losses.jsonl``: one loss per optimizer step (``pairfolder.arm.losses``).")
    status = _child(STATUS_FILE, "``status.json``: running / finished / failed (``pairfolder.arm.status``).")
    writer_lock = _child(WRITER_LOCK_FILE, "``writer.lock``: held by the one process writing the arm (``arm.lock``).")

    def rank_costs(self, rank: int) -> Path:
        """``costs.rank<R>.jsonl``: rank ``rank``'s step time and peak memory (``training.step_costs``)."""
        return self.path / rank_costs_name(rank)


class PairFolder(RunFolder):
    """A pair folder (or a run folder): each file of the contract as a property, ``arm(name)`` its arms."""

    __slots__ = ()

    pair_json = _child(PAIR_FILE, "``pair.json``: what the pair is (``divergence.pairfolder.pair_json``).")
    pair_yaml = _child(PAIR_RECIPE_FILE, "``pair.yaml``: the built-in trainer's resolved pair recipe.")
    metrics = _child(METRICS_FILE, "``metrics.jsonl``: the metrics store (``divergence.store.MetricsStore``).")
    attention = _child(ATTENTION_FILE, "``attention.jsonl``: the shadow attention variant's deviations.")
    costs = _child(COSTS_FILE, "``costs.jsonl``: each lockstep arm's step time and peak memory (``step_costs``).")
    watch_state = _child(WATCH_STATE_FILE, "``watch.json``: ``divergence watch``'s own state.")
    retention = _child(RETENTION_FILE, "``retention.json``: the weights files watch is about to delete (``keep``).")
    writer_lock = _child(WRITER_LOCK_FILE, "``writer.lock``: exclusive for a pair writer, shared by arm writers.")

    def arm(self, name: str) -> ArmFolder:
        """The folder of arm ``name`` (``a`` or ``b``)."""
        return ArmFolder(self.path / name)

    @property
    def arms(self) -> dict[str, ArmFolder]:
        """``{arm: ArmFolder}`` of both arms, in ``ARMS`` order."""
        return {name: self.arm(name) for name in ARMS}


as_pair_folder, as_arm_folder, as_run_folder = PairFolder.of, ArmFolder.of, RunFolder.of


def weight_steps(folder: str | os.PathLike) -> list[int]:
    """The steps of a run or arm folder's weights in ``checkpoints/`` (``step_NNNNNN.safetensors`` files
    and ``.dcp`` folders), ascending."""
    found = (weights_step(p.name) for p in as_run_folder(folder).checkpoints_dir.glob("step_*"))
    return sorted(step for step in found if step is not None)
