"""What the metrics store holds for a pair at one step, built the same way wherever it is built.

The lockstep tracker (``pair_tracker``) and a comparator following two separate
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
from divergence.metrics import METRIC_NAMES, aggregate
from divergence.pairfolder.layout import ARMS
from divergence.tracking.spikes import SpikeDetector

SUMMARY_KEYS = (*METRIC_NAMES, "numel", "tensors_nonfinite", "nonfinite_a", "nonfinite_b")
EMA_KEY = "ema_"  # prefix of the EMA family's summary keys in a step record


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
    from divergence.checkpoints.compare import compare_arms

    return comparison_records(compare_arms(weights_a, weights_b, device))


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
    return {row["group"]: {m: row[m] for m in METRIC_NAMES} for row in aggregate(records, "kind")}
