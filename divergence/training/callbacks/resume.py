"""Keep ``<dir>/last.ckpt`` (full training state) current: every N steps and at the end of training.

The folder may also hold Lightning's HPC checkpoint ``hpc_ckpt_N.ckpt``, written when SLURM
sends the requeue signal (``divergence.training.callbacks.requeue``; the Trainer's
``default_root_dir`` is this folder). A run resumes from the newest of the two
(``resume_file``); each is a full training state of several GB, so what a newer one supersedes
is removed (``drop_superseded``): older HPC checkpoints when the run starts, every HPC
checkpoint once a newer ``last.ckpt`` is written.
"""

from __future__ import annotations

import re
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from divergence.pairfolder.layout import RESUME_FILE

HPC_NAME = re.compile(r"^hpc_ckpt_(\d+)\.ckpt$")  # Lightning's CheckpointConnector.hpc_save_path


class ResumeCheckpoint(Callback):
    """``trainer.save_checkpoint`` is collective: every rank calls it, rank zero writes."""

    def __init__(self, directory: str | Path, every_n_steps: int):
        self.path, self.every = Path(directory) / RESUME_FILE, every_n_steps
        self._saved_step = -1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.every and trainer.global_step % self.every == 0:
            self._save(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._saved_step != trainer.global_step:
            self._save(trainer)

    def _save(self, trainer) -> None:
        trainer.save_checkpoint(self.path, weights_only=False)
        self._saved_step = trainer.global_step
        if trainer.is_global_zero:  # written durably (AtomicCheckpointIO): the HPC states are older now
            drop_superseded(self.path.parent, self.path)


def hpc_files(directory: str | Path) -> list[Path]:
    """Lightning's HPC checkpoints in ``directory``, oldest number first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := HPC_NAME.match(p.name)) and p.is_file()]
    return [p for _, p in sorted(found)]


def resume_file(directory: str | Path) -> Path | None:
    """The newest full training state in ``directory``: ``last.ckpt`` or an ``hpc_ckpt_N.ckpt``.

    Newest by modification time (both are written by this run's own ranks, atomically, so the
    later file holds the later step); on a tie the HPC checkpoint with the highest N. None when
    the folder holds neither. The file is not read here: loading goes through
    ``divergence.training.checkpoint_io`` (the weights-only allow-list) like any resume state.
    """
    last = Path(directory) / RESUME_FILE
    candidates = [(last.stat().st_mtime_ns, 0, 0, last)] if last.is_file() else []
    candidates += [(p.stat().st_mtime_ns, 1, i, p) for i, p in enumerate(hpc_files(directory))]
    return max(candidates)[3] if candidates else None


def drop_superseded(directory: str | Path, keep: Path | None) -> list[Path]:
    """Remove every HPC checkpoint in ``directory`` but ``keep``; the removed paths.

    ``last.ckpt`` is never removed here: it is replaced atomically by the next save."""
    removed = []
    for path in hpc_files(directory):
        if keep is None or path.resolve() != Path(keep).resolve():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed
