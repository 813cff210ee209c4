"""Every file name of a run, pair and arm folder: the one place a name is spelled.

::

    PAIR/                      a pair folder (docs/pair-folder.md, contract CONTRACT)
      pair.json                PAIR_JSON      what the pair is (divergence.pairfolder.pair_json)
      metrics.jsonl            METRICS        the metrics store (divergence.store.MetricsStore)
      attention.jsonl          ATTENTION      the shadow attention variant's deviations
      pair.yaml                PAIR_RECIPE    the built-in trainer's resolved pair recipe (optional)
      watch.json               WATCH_STATE    divergence watch's own state
      a/, b/                   ARMS           one folder per arm trained as its own job
        checkpoints/           CHECKPOINTS    step_NNNNNN.safetensors (weights_name)
        losses.jsonl           LOSSES         one loss per optimizer step (divergence.store.losses)
        status.json            STATUS         running / finished / failed (divergence.store.arm_status)
        writer.lock            WRITER_LOCK    held by the one process writing the arm (divergence.pairfolder.arm_lock)

A run folder (one arm trained alone) holds ``recipe.yaml`` (RUN_RECIPE) and ``checkpoints/``.
"""

from __future__ import annotations

from pathlib import Path

CONTRACT = 1  # the version of docs/pair-folder.md this package reads and writes
ARMS = ("a", "b")
PAIR_JSON = "pair.json"
PAIR_RECIPE = "pair.yaml"
RUN_RECIPE = "recipe.yaml"
METRICS = "metrics.jsonl"
ATTENTION = "attention.jsonl"
WATCH_STATE = "watch.json"
CHECKPOINTS = "checkpoints"
LOSSES = "losses.jsonl"
STATUS = "status.json"
WRITER_LOCK = "writer.lock"


def weights_name(step: int) -> str:
    """The weights file of ``step``: ``step_000120.safetensors`` (zero-padded to six digits)."""
    return f"step_{step:06d}.safetensors"


def weights_path(directory: str | Path, step: int) -> Path:
    """``directory/step_NNNNNN.safetensors`` (``directory``: an arm's or run's ``checkpoints/``)."""
    return Path(directory) / weights_name(step)


def weights_step(name: str) -> int | None:
    """The step of a weights file name (``step_000120.safetensors`` -> 120), None for any other name."""
    digits = name.removeprefix("step_").removesuffix(".safetensors")
    if not name.startswith("step_") or not name.endswith(".safetensors") or not digits.isascii() or not digits.isdigit():
        return None
    return int(digits)
