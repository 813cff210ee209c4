"""A pair's loggers fed step by step from outside a Trainer: what ``divergence watch`` logs.

The loggers are the pair's own (``divergence.loggers.sinks.build_loggers`` on the pair folder:
the user's wandb settings first, one run id in ``DIR/wandb-id`` so a restarted comparator
continues the same wandb run; CSV under ``DIR/csv``), filed as ``job_type`` ``comparator`` in the
pair's group with the pair's tags; the keys and tables are ``divergence.loggers.step_logging``'s,
shared with the lockstep tracker, so the comparator's logs are exactly what the lockstep tracker
sends its loggers, for the same steps. When the pair is complete, the store goes to wandb as an
artifact.
"""

from __future__ import annotations

from pathlib import Path

from divergence.pairfolder.folder import RunFolder
from divergence.pairfolder.settings import LogConfig


class StepLogger:
    def __init__(
        self,
        out: RunFolder | Path,
        log: LogConfig,
        name: str,
        checkpoint_every: int,
        max_steps: int | None,
        hparams: dict,
    ):
        from divergence.loggers.sinks import RunIdentity, build_loggers

        self.loggers = build_loggers(log, out, name, RunIdentity.for_comparator(out, hparams))
        for logger in self.loggers:
            logger.log_hyperparams(hparams)
        self.checkpoint_every, self.max_steps = checkpoint_every, max_steps  # None until an open pair ends
        self.complete = False

    def end_at(self, max_steps: int | None) -> None:
        """The pair's length, once an open pair's arms have ended (None: open again)."""
        self.max_steps = max_steps

    def log(self, step: int, record: dict, tensors: list[dict]) -> None:
        from divergence.loggers.step_logging import is_table_step, log_step

        log_step(self.loggers, step, record, tensors, table=is_table_step(step, self.max_steps, self.checkpoint_every))
        self.complete = self.complete or (self.max_steps is not None and step >= self.max_steps)

    def close(self) -> None:
        from divergence.loggers.sinks import finish_wandb

        for logger in self.loggers:
            logger.finalize("success")
        finish_wandb(self.loggers, artifacts=self.complete)
