"""What a pair's loggers receive at a step: the same keys from lockstep training and the comparator.

    divergence/model/<metric>             whole-model summary, each of the six metrics
    divergence/ema/<metric>               the EMA weights' summary (``ema_<metric>``), with train.ema
    divergence/kind/<kind>/<metric>       per kind of layer (attn_q, conv, norm, ...), wasserstein
                                          and max_abs_diff
    divergence/probe/<key>                the function-space probe, when the step record has it
                                          (probe_rel_diff, probe_loss_a, probe_loss_b)
    divergence/router/<key>               a mixture of experts' router record, when the step record
                                          has it (flip, drop_a, drop_b; flip/<layer> per MoE layer)
    divergence/coherence/<key>            the update error's coherence, at the steps it is measured
                                          (tracking.coherence_every): model (C(T)), cos, mean_cos,
                                          rel_err (||e_t|| / ||g_t||); layer/<layer> per layer
    train/loss_a, train/loss_b, train/loss_diff, train/spike_a, train/spike_b
    trainer/global_step                   the step axis of every key above

At the table steps (checkpoint steps and the last step), to wandb only:

    divergence/layers                     a Table of every module's values at this step
    divergence/top_layers                 a Table of the TOP_K modules of largest wasserstein
    divergence/heatmap                    an image, layers x tracked steps so far, a panel for
                                          wasserstein and one for max_abs_diff
                                          (divergence.loggers.layer_heatmap)

With ``log.per_layer_scalars`` (off by default: a thousand panels for an SD-1.5-sized model),
also one scalar per module: ``divergence/wasserstein/<module>`` and
``divergence/max_abs_diff/<module>``, the module path made key-safe (``down_blocks.0.attn1`` ->
``down_blocks_0_attn1``; see ``divergence.loggers.wandb_mode.key_part``).

wandb summaries (``define_keys``): ``max`` for spikes and every ``max_abs_diff`` key, ``last``
for the rest; every key on the step axis ``trainer/global_step``.

``StepLogger`` feeds a pair's loggers step by step from outside a Trainer: what ``divergence watch``
logs. The loggers are the pair's own (``divergence.loggers.sinks.build_loggers`` on the pair folder:
one run id in ``DIR/wandb-id`` so a restarted comparator continues the same wandb run; CSV under
``DIR/csv``), filed as ``job_type`` ``comparator`` in the pair's group with the pair's tags, so the
comparator's logs are exactly what the lockstep tracker sends its loggers, for the same steps. When
the pair is complete, the store goes to wandb as an artifact.
"""

from __future__ import annotations

import math
from pathlib import Path

from divergence.metrics import METRIC_NAMES, TRAJECTORY_METRICS, aggregate
from divergence.loggers.wandb_mode import STEP_KEY, key_part
from divergence.pairfolder.folder import RunFolder
from divergence.pairfolder.settings import LogConfig

TABLE_COLUMNS = ["module", "kind", "tensors", "numel", *METRIC_NAMES]
LOSS_KEYS = ("loss_a", "loss_b", "loss_diff", "spike_a", "spike_b")
PROBE_KEYS = ("probe_rel_diff", "probe_loss_a", "probe_loss_b")
TOP_K = 20


def is_table_step(step: int, max_steps: int, checkpoint_every: int) -> bool:
    """The per-module tables go out at checkpoint steps and the last step (tables are heavy)."""
    return step == max_steps or bool(checkpoint_every and step % checkpoint_every == 0)


def summary_of(key: str) -> str:
    """``max`` for a spike flag or a max difference (the worst is what matters), else ``last``."""
    return (
        "max" if key.startswith("train/spike_") or key.endswith("max_abs_diff") or "/max_abs_diff/" in key else "last"
    )


def step_metrics(record: dict) -> dict[str, float]:
    """The scalar keys of one step record (losses always; divergence keys at tracked steps)."""
    metrics = {
        f"train/{k}": float(record[k])
        for k in LOSS_KEYS
        if not (isinstance(record[k], float) and math.isnan(record[k]))
    }
    if record.get("tracked"):
        metrics.update({f"divergence/model/{m}": record[m] for m in METRIC_NAMES})
        metrics.update({f"divergence/ema/{m}": record[f"ema_{m}"] for m in METRIC_NAMES if f"ema_{m}" in record})
        for kind, values in record["kinds"].items():
            metrics.update({f"divergence/kind/{key_part(kind)}/{m}": values[m] for m in TRAJECTORY_METRICS})
        metrics.update(
            {
                f"divergence/probe/{k}": float(record[k])
                for k in PROBE_KEYS
                if isinstance(record.get(k), (int, float)) and math.isfinite(record[k])
            }
        )
        metrics.update(router_metrics(record))
    metrics.update(coherence_metrics(record))
    return metrics


def coherence_metrics(record: dict) -> dict[str, float]:
    """``divergence/coherence/{model,cos,mean_cos,rel_err}`` and ``.../layer/<layer>`` of a step
    record holding the update error's coherence (``divergence.training.callbacks.coherence``)."""
    if not isinstance(record.get("coherence"), (int, float)):
        return {}
    out = {f"divergence/coherence/{k}": float(record[f"coherence_{k}"]) for k in ("cos", "mean_cos")}
    out["divergence/coherence/model"] = float(record["coherence"])
    grad = record.get("coherence_grad") or 0.0
    out["divergence/coherence/rel_err"] = float(record["coherence_err"]) / grad if grad > 0 else math.nan
    for layer, value in (record.get("coherence_layers") or {}).items():
        out[f"divergence/coherence/layer/{key_part(layer)}"] = float(value)
    return {k: v for k, v in out.items() if math.isfinite(v)}


def router_metrics(record: dict) -> dict[str, float]:
    """``divergence/router/flip``, ``.../flip/<layer>``, ``.../drop_a``, ``.../drop_b`` of a step
    record holding the router's record (``divergence.training.probe.ROUTER_KEYS``)."""
    out = {
        f"divergence/router/{key.removeprefix('router_')}": float(record[key])
        for key in ("router_flip", "router_drop_a", "router_drop_b")
        if isinstance(record.get(key), (int, float))
    }
    for layer, value in (record.get("router_flip_layers") or {}).items():
        out[f"divergence/router/flip/{key_part(layer)}"] = float(value)
    return out


def log_step(loggers, step: int, record: dict, tensors: list[dict], table: bool = False) -> None:
    """Send one step's store records (``record`` and its ``tensors``) to every logger."""
    if not loggers:
        return
    metrics = step_metrics(record)
    modules = module_rows(tensors) if record.get("tracked") else []
    per_layer = {}
    for row in modules:
        name = key_part(row["group"])
        per_layer[f"divergence/wasserstein/{name}"] = row["wasserstein"]
        per_layer[f"divergence/max_abs_diff/{name}"] = row["max_abs_diff"]
    for logger in loggers:
        log_config = getattr(logger, "log_config", None)
        extra = per_layer if getattr(log_config, "per_layer_scalars", False) else {}
        log_at_step(logger, {**metrics, **extra}, step)
        if modules:
            _log_layers(logger, step, modules, table)


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
        run = logger.experiment
        define_keys(logger, run, metrics)
        run.log({**metrics, STEP_KEY: step}, step=step)
    else:
        logger.log_metrics(metrics, step=step)


def define_keys(logger, run, metrics: dict) -> None:
    """``define_metric`` each key not yet defined for this run: the step axis and its summary."""
    defined = logger.__dict__.setdefault("defined_keys", set())
    if not hasattr(run, "define_metric"):
        return
    if STEP_KEY not in defined:
        run.define_metric(STEP_KEY)
        defined.add(STEP_KEY)
    for key in metrics.keys() - defined:
        run.define_metric(key, step_metric=STEP_KEY, summary=summary_of(key))
        defined.add(key)


def _log_layers(logger, step: int, modules: list[dict], table: bool) -> None:
    """wandb only: feed the heatmap history; at table steps, the tables and the heatmaps."""
    from lightning.pytorch.loggers import WandbLogger

    if not isinstance(logger, WandbLogger):
        return
    from divergence.loggers.layer_heatmap import LayerHistory, heatmap_image

    history = logger.__dict__.get("layer_history")
    if history is None:  # the first time: seeded from the store (a resumed run)
        history = logger.__dict__["layer_history"] = LayerHistory()
        if getattr(logger, "store_dir", None) is not None:
            history.seed(logger.store_dir, before=step)
    history.add(step, modules)
    if not table:
        return
    import wandb

    rows = [[r["group"], r.get("kind", ""), r["tensors"], r["numel"], *[r[m] for m in METRIC_NAMES]] for r in modules]
    w = TABLE_COLUMNS.index("wasserstein")
    top = sorted(rows, key=lambda row: -row[w] if math.isfinite(row[w]) else math.inf)[:TOP_K]
    payload = {
        "divergence/layers": wandb.Table(columns=TABLE_COLUMNS, data=rows),
        "divergence/top_layers": wandb.Table(columns=TABLE_COLUMNS, data=top),
    }
    modules_n, steps_n = len(history.matrix("wasserstein")[0]), len(history.steps)
    payload["divergence/heatmap"] = wandb.Image(
        heatmap_image(history), caption=f"{modules_n} modules x {steps_n} tracked steps"
    )
    logger.experiment.log({**payload, STEP_KEY: step}, step=step)


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
        log_step(self.loggers, step, record, tensors, table=is_table_step(step, self.max_steps, self.checkpoint_every))
        self.complete = self.complete or (self.max_steps is not None and step >= self.max_steps)

    def close(self) -> None:
        from divergence.loggers.sinks import finish_wandb

        for logger in self.loggers:
            logger.finalize("success")
        finish_wandb(self.loggers, artifacts=self.complete)
