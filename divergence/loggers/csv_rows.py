"""``csv/metrics.csv`` continued, never started over: the CSV logger of a run or watch that resumes.

Lightning's ``CSVLogger`` deletes ``metrics.csv`` when it starts in a folder that holds one, so a
restarted ``divergence watch`` or a resumed ``divergence train`` lost the rows of every step before
the restart. ``ContinuedCSVLogger`` keeps them: at its first save its writer reads the file's
columns and rows, drops only the rows of the steps it logs again (a run resumed from step G logs
the steps after G anew, so rows of those steps left by the run before are replaced, as the
store's steps are: ``MetricsStore.truncate_after``), and appends from there.
"""

from __future__ import annotations

import csv
import os

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter


class ContinuedWriter(ExperimentWriter):
    """Lightning's CSV experiment writer that continues an existing ``metrics.csv``."""

    def __init__(self, log_dir: str) -> None:
        self._continued = False
        super().__init__(log_dir=log_dir)

    def _check_log_dir_exists(self) -> None:
        """Lightning's deletes ``metrics.csv`` here; it is continued at the first save instead."""

    def save(self) -> None:
        if self.metrics and not self._continued:
            self._continue(min(_step(m.get("step")) for m in self.metrics))
        super().save()

    def _continue(self, first: int) -> None:
        """Keep the file's rows of the steps before ``first`` (the first step logged now) and its columns."""
        self._continued = True
        path = self.metrics_file_path
        if not self._fs.isfile(path):
            return
        with self._fs.open(path, "r", newline="") as file:
            reader = csv.DictReader(file)
            columns, rows = list(reader.fieldnames or []), list(reader)
        if not columns:
            self._fs.rm_file(path)  # an empty file: written afresh with its header
            return
        kept = [row for row in rows if _step(row.get("step")) < first]
        self.metrics_keys = sorted(set(columns))
        temporary = f"{path}.tmp"
        with self._fs.open(temporary, "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=self.metrics_keys)
            writer.writeheader()
            writer.writerows(kept)
        os.replace(temporary, path)


class ContinuedCSVLogger(CSVLogger):
    """``CSVLogger`` whose ``metrics.csv`` a restarted or resumed run continues (``ContinuedWriter``)."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ContinuedWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = ContinuedWriter(log_dir=self.log_dir)
        return self._experiment


def _step(value) -> float:
    """A row's step as a number (a row without one sorts first: it is kept)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("-inf")
