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
)


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

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def checkpoints_dir(self) -> Path:
        """``checkpoints/``: the weights files (an arm's, or a run folder's)."""
        return self.path / CHECKPOINTS_DIR

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

    @property
    def resume_dir(self) -> Path:
        """``resume/``: the resumable training state (``last.ckpt``, ``hpc_ckpt_N.ckpt``)."""
        return self.path / RESUME_DIR

    @property
    def resume_file(self) -> Path:
        """``resume/last.ckpt``."""
        return self.resume_dir / RESUME_FILE

    @property
    def samples_dir(self) -> Path:
        """``samples/``: sample grids at checkpoint steps (the built-in trainer)."""
        return self.path / SAMPLES_DIR

    @property
    def recipe(self) -> Path:
        """``recipe.yaml``: a run folder's resolved recipe."""
        return self.path / RUN_RECIPE_FILE

    @property
    def wandb_id(self) -> Path:
        """``wandb-id``: the wandb run id a resumed run or watch continues."""
        return self.path / WANDB_ID_FILE

    @property
    def csv_dir(self) -> Path:
        """``csv/``: the CSV logger's ``metrics.csv``."""
        return self.path / CSV_DIR

    @property
    def tensorboard_dir(self) -> Path:
        """``tensorboard/``: the TensorBoard logger's events."""
        return self.path / TENSORBOARD_DIR


class ArmFolder(RunFolder):
    """One arm's folder ``<pair>/<arm>/``: ``losses``, ``status``, ``writer_lock``, ``checkpoints_dir``,
    ``weights(step)`` (and, for the built-in trainer's separate arm, a run's ``resume_dir``, ``csv_dir``, ...)."""

    __slots__ = ()

    @property
    def arm(self) -> str:
        """The arm's name: the folder's name (``a`` or ``b``)."""
        return self.path.name

    @property
    def losses(self) -> Path:
        """``losses.jsonl``: one loss per optimizer step (``divergence.pairfolder.arm.losses``)."""
        return self.path / LOSSES_FILE

    @property
    def status(self) -> Path:
        """``status.json``: running / finished / failed (``divergence.pairfolder.arm.status``)."""
        return self.path / STATUS_FILE

    @property
    def writer_lock(self) -> Path:
        """``writer.lock``: held by the one process writing the arm (``divergence.pairfolder.arm.lock``)."""
        return self.path / WRITER_LOCK_FILE

    def rank_costs(self, rank: int) -> Path:
        """``costs.rank<R>.jsonl``: rank ``rank``'s step time and peak memory (``training.step_costs``)."""
        return self.path / rank_costs_name(rank)


class PairFolder(RunFolder):
    """A pair folder (or a run folder): each file of the contract as a property, ``arm(name)`` its arms."""

    __slots__ = ()

    @property
    def pair_json(self) -> Path:
        """``pair.json``: what the pair is (``divergence.pairfolder.pair_json``)."""
        return self.path / PAIR_FILE

    @property
    def pair_yaml(self) -> Path:
        """``pair.yaml``: the built-in trainer's resolved pair recipe."""
        return self.path / PAIR_RECIPE_FILE

    @property
    def metrics(self) -> Path:
        """``metrics.jsonl``: the metrics store (``divergence.store.MetricsStore``)."""
        return self.path / METRICS_FILE

    @property
    def attention(self) -> Path:
        """``attention.jsonl``: the shadow attention variant's deviations."""
        return self.path / ATTENTION_FILE

    @property
    def costs(self) -> Path:
        """``costs.jsonl``: each lockstep arm's step time and peak memory (``training.step_costs``)."""
        return self.path / COSTS_FILE

    @property
    def watch_state(self) -> Path:
        """``watch.json``: ``divergence watch``'s own state."""
        return self.path / WATCH_STATE_FILE

    @property
    def retention(self) -> Path:
        """``retention.json``: the weights files watch is about to delete (``tracking.keep``)."""
        return self.path / RETENTION_FILE

    @property
    def writer_lock(self) -> Path:
        """``writer.lock``: exclusive for a writer of the whole pair, shared by arm writers (``pairfolder.arm.lock``)."""
        return self.path / WRITER_LOCK_FILE

    def arm(self, name: str) -> ArmFolder:
        """The folder of arm ``name`` (``a`` or ``b``)."""
        return ArmFolder(self.path / name)

    @property
    def arms(self) -> dict[str, ArmFolder]:
        """``{arm: ArmFolder}`` of both arms, in ``ARMS`` order."""
        return {name: self.arm(name) for name in ARMS}


def as_pair_folder(out: str | os.PathLike) -> PairFolder:
    """``out`` as a ``PairFolder`` (itself when it is one already)."""
    return out if isinstance(out, PairFolder) else PairFolder(out)


def as_arm_folder(folder: str | os.PathLike) -> ArmFolder:
    """``folder`` (an arm's folder) as an ``ArmFolder`` (itself when it is one already)."""
    return folder if isinstance(folder, ArmFolder) else ArmFolder(folder)


def as_run_folder(out: str | os.PathLike) -> RunFolder:
    """``out`` as a ``RunFolder`` (itself when it is one already, a ``PairFolder`` or an ``ArmFolder``)."""
    return out if isinstance(out, RunFolder) else RunFolder(out)
