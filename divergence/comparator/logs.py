"""The comparator's logs: exactly what the lockstep tracker sends its loggers, for the same steps.

The loggers are the pair's own (``divergence.training.loggers.build_loggers`` on the pair
folder: wandb offline unless configured, one run id in ``DIR/wandb-id`` so a restarted
comparator continues the same wandb run; CSV under ``DIR/csv``), and the keys and tables are
``divergence.training.step_logging``'s, shared with the lockstep tracker so the two modes
cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path

from divergence.recipe.run import LogConfig


class StepLogger:
    def __init__(self, out: Path, log: LogConfig, name: str, checkpoint_every: int, max_steps: int, hparams: dict):
        from divergence.training.loggers import build_loggers

        self.loggers = build_loggers(log, out, name)
        for logger in self.loggers:
            logger.log_hyperparams(hparams)
        self.checkpoint_every, self.max_steps = checkpoint_every, max_steps

    def log(self, step: int, record: dict, tensors: list[dict]) -> None:
        from divergence.training.step_logging import is_table_step, log_step

        log_step(self.loggers, step, record, tensors, table=is_table_step(step, self.max_steps, self.checkpoint_every))

    def close(self) -> None:
        from lightning.pytorch.loggers import WandbLogger

        for logger in self.loggers:
            logger.finalize("success")
            if isinstance(logger, WandbLogger) and logger._experiment is not None:
                logger.experiment.finish()
