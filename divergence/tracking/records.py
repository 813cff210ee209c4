"""What the metrics store holds for a pair at one step, built the same way wherever it is built.

The lockstep callback (``callbacks/divergence.py``) and a comparator following two separate
arm jobs both use these functions, so their stores are identical record for record.

Step convention: step ``N`` is the state after ``N`` optimizer steps (step 0: the initial
weights); ``loss_a``/``loss_b`` at step ``N`` are the losses of the N-th step (NaN at 0).

Families: every compared tensor has a record, EMA tensors (``ema.unet.<name>``, with
``train.ema``) included. The step's whole-model summary (``SUMMARY_KEYS`` and ``kinds``) covers
the raw weights only, exactly as without EMA; the EMA family has its own beside it, the same
keys prefixed ``ema_`` (``ema_wasserstein`` ... ``ema_cosine``, ``ema_numel``,
``ema_tensors_nonfinite``, ``ema_nonfinite_a``, ``ema_nonfinite_b``, ``ema_kinds``), present only
when the weights hold an EMA.
"""

from __future__ import annotations

import math

from divergence.checkpoints.families import by_family
from divergence.metrics import METRICS, aggregate
from divergence.pairfolder.layout import ARMS
from divergence.tracking.spikes import SpikeDetector

SUMMARY_KEYS = (*METRICS, "numel", "tensors_nonfinite", "nonfinite_a", "nonfinite_b")
EMA_KEY = "ema_"  # prefix of the EMA family's summary keys in a step record


def is_tracked(step: int, max_steps: int, tracking, checkpoint_every: int) -> bool:
    """Whether the arms are compared at ``step``: the one rule of the lockstep tracker, the
    separate arm's tracked weights and the comparator that follows separate arms.

    Tracked: step 0, every ``tracking.every`` steps, the dense early schedule on top
    (``tracking.dense``: ``[[20, 1], [100, 5]]`` by default: every step up to 20, every 5th up
    to 100; it adds steps, never removes one), every checkpoint step and the last step.

    >>> from divergence.recipe.pair import TrackingConfig
    >>> [s for s in range(131) if is_tracked(s, 130, TrackingConfig(every=10), 0)][18:]
    [18, 19, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 75, 80, 85, 90, 95, 100, 110, 120, 130]
    """
    at_checkpoint = bool(checkpoint_every) and step % checkpoint_every == 0
    if step == 0 or at_checkpoint or step == max_steps or step % tracking.every == 0:
        return True
    for until, every in tracking.dense:
        if step <= until:
            return step % every == 0
    return False


def probe_due(step: int, max_steps: int, config) -> bool:
    """Whether a tracked ``step`` gets the function-space probe (``config``: the recipe's
    ``tracking.probe``): multiples of ``config.every`` and the last step.

    >>> from divergence.recipe.pair import ProbeConfig
    >>> [s for s in range(0, 51, 5) if probe_due(s, 50, ProbeConfig(every=20))]
    [0, 20, 40, 50]
    """
    return config.enabled and (step % config.every == 0 or step == max_steps)


def loss_record(losses: dict[str, float] | None, detectors: dict[str, SpikeDetector]) -> dict:
    """``loss_a, loss_b, loss_diff, spike_a, spike_b`` (NaN losses and no spikes at step 0)."""
    if losses is None:
        return {"loss_a": math.nan, "loss_b": math.nan, "loss_diff": math.nan, "spike_a": False, "spike_b": False}
    record = {f"loss_{arm}": float(losses[arm]) for arm in ARMS}
    record["loss_diff"] = record["loss_a"] - record["loss_b"]
    record.update({f"spike_{arm}": detectors[arm].update(record[f"loss_{arm}"]) for arm in ARMS})
    return record


def divergence_records(weights_a: dict, weights_b: dict, device=None) -> tuple[list[dict], dict]:
    """Per-tensor store records and the step's whole-model summary (with ``kinds``)."""
    from divergence.checkpoints.compare import compare_state_dicts

    return comparison_records(compare_state_dicts(weights_a, weights_b, device))


def comparison_records(result) -> tuple[list[dict], dict]:
    """``divergence_records`` of a finished ``Comparison`` (e.g. of two checkpoint files)."""
    tensors = [{"tensor": r["name"], **{k: v for k, v in r.items() if k != "name"}} for r in result.records]
    families = by_family(result.records)
    summary = {k: result.summary[k] for k in SUMMARY_KEYS}
    summary["kinds"] = _kinds(families.get("weights", []))
    if "ema" in families:
        summary.update({EMA_KEY + k: result.summary["ema"][k] for k in SUMMARY_KEYS})
        summary[EMA_KEY + "kinds"] = _kinds(families["ema"])
    return tensors, summary


def _kinds(records: list[dict]) -> dict:
    """``{kind: {metric: value}}`` of one family's records."""
    return {row["group"]: {m: row[m] for m in METRICS} for row in aggregate(records, "kind")}
