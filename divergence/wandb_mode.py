"""wandb is offline unless the user configured it: one rule for training and the report.

Online only when the user has said so: ``WANDB_MODE`` set (wandb then follows it) or
``WANDB_API_KEY`` present. Otherwise runs are written offline under the output folder and
``wandb sync`` uploads them later. The mode is passed to ``wandb.init`` explicitly: after a
first run in the process, wandb no longer reads ``WANDB_MODE`` from the environment.
"""

from __future__ import annotations

import os


def wandb_offline() -> bool:
    return "WANDB_MODE" not in os.environ and "WANDB_API_KEY" not in os.environ


def wandb_init_mode() -> str | None:
    """``"offline"`` by default; ``None`` (wandb's own choice) when the user configured wandb."""
    return "offline" if wandb_offline() else None
