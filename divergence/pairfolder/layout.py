"""Every file name of a run, pair and arm folder: the one place a name is spelled.

::

    PAIR/                      a pair folder (docs/pair-folder.md, contract CONTRACT)
      pair.json                PAIR_FILE          what the pair is (divergence.pairfolder.pair_json)
      metrics.jsonl            METRICS_FILE       the metrics store (divergence.store.MetricsStore)
      attention.jsonl          ATTENTION_FILE     the shadow attention variant's deviations
      costs.jsonl              COSTS_FILE         each lockstep arm's step time and peak memory (training.step_costs)
      writer.lock              WRITER_LOCK_FILE   exclusive for a writer of the whole pair, shared by arm writers
      pair.yaml                PAIR_RECIPE_FILE   the built-in trainer's resolved pair recipe (optional)
      watch.json               WATCH_STATE_FILE   divergence watch's own state
      retention.json           RETENTION_FILE     with tracking.keep: the weights files watch is about to delete
      wandb-id                 WANDB_ID_FILE      the wandb run id a resumed run or watch continues
      csv/                     CSV_DIR            the CSV logger's metrics.csv
      tensorboard/             TENSORBOARD_DIR    the TensorBoard logger's events (log.tensorboard)
      resume/                  RESUME_DIR         the resumable state: last.ckpt (RESUME_FILE), hpc_ckpt_N.ckpt
      samples/                 SAMPLES_DIR        sample grids at checkpoint steps (built-in trainer)
      a/, b/                   ARMS               one folder per arm trained as its own job
        checkpoints/           CHECKPOINTS_DIR    step_NNNNNN.safetensors (weights_name; ArmFolder.weights(step))
                                                  or, written as DCP, step_NNNNNN.dcp/ (weights_dcp_name) with
                                                  its complete.json (DCP_COMPLETE_FILE; pairfolder.weights_dcp)
        losses.jsonl           LOSSES_FILE        one loss per optimizer step (divergence.pairfolder.arm.losses)
        status.json            STATUS_FILE        running / finished / failed (divergence.pairfolder.arm.status)
        writer.lock            WRITER_LOCK_FILE   held by the one process writing the arm (divergence.pairfolder.arm.lock)
        costs.rankR.jsonl      rank_costs_name(R) rank R's step time and peak memory (training.step_costs)

A run folder (one arm trained alone) holds ``recipe.yaml`` (RUN_RECIPE_FILE), ``checkpoints/``,
``resume/``, ``csv/`` and ``wandb-id``.

This module spells the names; ``divergence.pairfolder.folder`` joins them to a folder.
"""

from __future__ import annotations

from divergence.formats import DCP_COMPLETE_FILE  # noqa: F401  re-exported: part of the layout

CONTRACT = 1  # the version of docs/pair-folder.md this package reads and writes
ARMS = ("a", "b")
PAIR_FILE = "pair.json"
PAIR_RECIPE_FILE = "pair.yaml"
RUN_RECIPE_FILE = "recipe.yaml"
METRICS_FILE = "metrics.jsonl"
ATTENTION_FILE = "attention.jsonl"
COSTS_FILE = "costs.jsonl"
WATCH_STATE_FILE = "watch.json"
RETENTION_FILE = "retention.json"
WANDB_ID_FILE = "wandb-id"
CSV_DIR = "csv"
TENSORBOARD_DIR = "tensorboard"
RESUME_DIR = "resume"
RESUME_FILE = "last.ckpt"
SAMPLES_DIR = "samples"
CHECKPOINTS_DIR = "checkpoints"
LOSSES_FILE = "losses.jsonl"
STATUS_FILE = "status.json"
WRITER_LOCK_FILE = "writer.lock"
ARMS_FILE = "arms.json"  # a study folder's: each pair run's shared arms and the arm-steps (study.shared_arms)
DCP_SUFFIX = ".dcp"  # a tracked step's weights as a torch.distributed.checkpoint folder
# DCP_COMPLETE_FILE (divergence.formats): in it, written last, once every rank has saved its shards


def weights_name(step: int) -> str:
    """The weights file of ``step``: ``step_000120.safetensors`` (zero-padded to six digits)."""
    return f"step_{step:06d}.safetensors"


def rank_costs_name(rank: int) -> str:
    """An arm job's rank ``rank`` costs file: ``costs.rank0.jsonl`` (merged into the pair's ``costs.jsonl``)."""
    return f"costs.rank{rank}.jsonl"


def weights_dcp_name(step: int) -> str:
    """The DCP weights folder of ``step``: ``step_000120.dcp`` (``ArmWriter(..., format="dcp")``)."""
    return f"step_{step:06d}{DCP_SUFFIX}"


def weights_step(name: str) -> int | None:
    """The step of a weights file (or DCP folder) name (``step_000120.safetensors``, ``step_000120.dcp``
    -> 120), None for any other name."""
    suffix = DCP_SUFFIX if name.endswith(DCP_SUFFIX) else ".safetensors"
    digits = name.removeprefix("step_").removesuffix(suffix)
    if not name.startswith("step_") or not name.endswith(suffix) or not digits.isascii() or not digits.isdigit():
        return None
    return int(digits)
