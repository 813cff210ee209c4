"""The run's Lightning loggers: wandb (offline unless the user configured it), CSV, TensorBoard.

wandb goes online only when the user has said so: ``WANDB_MODE`` set (wandb then follows it) or
``WANDB_API_KEY`` present. Otherwise it writes an offline run under ``<out>/wandb`` that
``wandb sync`` can upload later. The run id is kept in ``<out>/wandb-id`` so a resumed run
continues the same wandb run.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from divergence.recipe.run import LogConfig
from divergence.wandb_mode import wandb_init_mode, wandb_offline


def build_loggers(config: LogConfig, out: Path, run_name: str) -> list:
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger

    loggers = []
    if config.wandb:
        loggers.append(WandbLogger(
            name=run_name, project=config.project, save_dir=str(out), id=_wandb_id(out),
            offline=wandb_offline(), resume="allow", mode=wandb_init_mode(),
        ))
    if config.csv:
        loggers.append(CSVLogger(save_dir=str(out), name="csv", version=""))
    if config.tensorboard:
        loggers.append(TensorBoardLogger(save_dir=str(out), name="tensorboard", version=""))
    return loggers


def _wandb_id(out: Path) -> str:
    """The run's wandb id, made and kept by global rank zero (the only rank that logs to wandb)."""
    from divergence.atomic import write_atomic
    from divergence.training.run import global_rank_zero

    path = out / "wandb-id"
    if path.is_file():
        return path.read_text().strip()
    run_id = secrets.token_hex(4)  # wandb ids: 8 lowercase alphanumerics
    if global_rank_zero():
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(path, run_id + "\n")
    return run_id
