"""The comparator's logs: exactly what the lockstep tracker sends its loggers, for the same steps.

The loggers are the pair's own (``divergence.training.loggers.build_loggers`` on the pair
folder: wandb offline unless configured, one run id in ``DIR/wandb-id`` so a restarted
comparator continues the same wandb run; CSV under ``DIR/csv``), and the keys and tables are
the ``DivergenceTracker``'s, reused rather than copied so the two modes cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from divergence.recipe.pair import TrackingConfig
from divergence.recipe.run import LogConfig


class StepLogger:
    def __init__(self, out: Path, log: LogConfig, name: str, tracking: TrackingConfig, checkpoint_every: int,
                 max_steps: int, hparams: dict):
        from divergence.training.callbacks.divergence import DivergenceTracker
        from divergence.training.loggers import build_loggers

        self.loggers = build_loggers(log, out, name)
        for logger in self.loggers:
            logger.log_hyperparams(hparams)
        self._tracker = DivergenceTracker(out, tracking, checkpoint_every)
        # what the tracker reads of a Trainer when it logs: the loggers and the run length
        self._trainer = SimpleNamespace(loggers=self.loggers, max_steps=max_steps)

    def log(self, step: int, record: dict, tensors: list[dict]) -> None:
        self._tracker._log(self._trainer, step, record, tensors)

    def close(self) -> None:
        from lightning.pytorch.loggers import WandbLogger

        for logger in self.loggers:
            logger.finalize("success")
            if isinstance(logger, WandbLogger) and logger._experiment is not None:
                logger.experiment.finish()
