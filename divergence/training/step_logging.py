"""What a pair's loggers receive at a step: the same keys from lockstep training and the comparator.

    divergence/model/<metric>             whole-model summary, each of the six metrics
    divergence/wasserstein/<module>       per module (parent path of the tensors)
    divergence/max_abs_diff/<module>
    divergence/kind/<kind>/<metric>       per kind of layer (attn_q, conv, norm, ...)
    train/loss_a, train/loss_b, train/loss_diff, train/spike_a, train/spike_b
    divergence/layers                     a wandb Table of the per-module values
                                          (at checkpoint steps and the last step)
"""

from __future__ import annotations

import math

from divergence.metrics import METRICS, aggregate

TABLE_COLUMNS = ["module", "kind", "tensors", "numel", *METRICS]
LOSS_KEYS = ("loss_a", "loss_b", "loss_diff", "spike_a", "spike_b")


def is_table_step(step: int, max_steps: int, checkpoint_every: int) -> bool:
    """The per-module table goes out at checkpoint steps and the last step (tables are heavy)."""
    return step == max_steps or bool(checkpoint_every and step % checkpoint_every == 0)


def log_step(loggers, step: int, record: dict, tensors: list[dict], table: bool = False) -> None:
    """Send one step's store records (``record`` and its ``tensors``) to every logger."""
    if not loggers:
        return
    metrics = {f"train/{k}": float(record[k]) for k in LOSS_KEYS
               if not (isinstance(record[k], float) and math.isnan(record[k]))}
    modules = []
    if record.get("tracked"):
        metrics.update({f"divergence/model/{m}": record[m] for m in METRICS})
        for kind, values in record["kinds"].items():
            metrics.update({f"divergence/kind/{kind}/{m}": values[m] for m in ("wasserstein", "max_abs_diff")})
        modules = module_rows(tensors)
        for row in modules:
            metrics[f"divergence/wasserstein/{row['group']}"] = row["wasserstein"]
            metrics[f"divergence/max_abs_diff/{row['group']}"] = row["max_abs_diff"]
    for logger in loggers:
        log_at_step(logger, metrics, step)
    if modules and table:
        _log_table(loggers, step, modules)


def module_rows(tensors: list[dict]) -> list[dict]:
    """Per-module aggregates of a step's tensor records, each with its weight's ``kind``."""
    modules = aggregate([dict(r, name=r["tensor"]) for r in tensors], "module")
    kind_of = {r["module"] or "(root)": r["kind"] for r in tensors if r["tensor"].endswith("weight")}
    for row in modules:
        row["kind"] = kind_of.get(row["group"], "")
    return modules


def log_at_step(logger, metrics: dict, step: int) -> None:
    """Log ``metrics`` at training step ``step``; to wandb with its own step set to ``step``.

    wandb keeps a run's steps strictly increasing and ignores a step at or below the last
    one it has: when a killed run resumes from an earlier checkpoint and logs the steps after
    it again, the ones wandb already holds are dropped and the ones lost with the crash are
    filled in, so each step is in wandb exactly once. (Lightning's WandbLogger logs without
    a wandb step, which would append the re-logged steps as duplicates.)
    """
    from lightning.pytorch.loggers import WandbLogger

    if isinstance(logger, WandbLogger):
        logger.experiment.log({**metrics, "trainer/global_step": step}, step=step)
    else:
        logger.log_metrics(metrics, step=step)


def _log_table(loggers, step: int, modules: list[dict]) -> None:
    from lightning.pytorch.loggers import WandbLogger

    rows = [[r["group"], r.get("kind", ""), r["tensors"], r["numel"], *[r[m] for m in METRICS]] for r in modules]
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            import wandb

            table = wandb.Table(columns=TABLE_COLUMNS, data=rows)
            logger.experiment.log({"divergence/layers": table, "trainer/global_step": step}, step=step)
