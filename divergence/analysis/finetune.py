"""Fine-tuning: pairs whose arms all start from the same pretrained weights (``docs/method.md``,
"Fine-tuning").

Training from scratch, the seed pair's arms start from different initial weights and its
difference E_S is the level every small change approaches: a pair has left the shared regime
once E >= ``SATURATED_E`` x E_S (0.1). In a fine-tune every arm starts from the same weights, the
seed pair included (a data-order / noise seed: E_S(0) = 0), so E_S grows from zero like the other
pairs' and sits only ~7-10x above the precision pair's from the first step: the 0.1 rule fires at
once and no tracking gives a window. What a fine-tune can reach is how far its arms move from the
start; the data-order pair's own level measures it (its E_S is 0.85-0.96 of one arm's displacement
||theta_t - theta_0|| / ||theta_0|| on the tiny model, docs/method.md), so in a fine-tune a pair
has reached the ceiling once

    E >= SATURATED_FINETUNE x E_S        (E_S: the data-order seed pair, at the same step)

A study is recognized as a fine-tune (``recognize``) from ``pair.json``'s ``start`` (the built-in
trainer writes it when the denoiser loads pretrained weights; ``ArmWriter(start=...)`` and the
callbacks take it), else from the weights: every pair run, the seed pair included, tracked step 0
with E(0) = 0 (its arms started equal, which a seed pair's arms from scratch never do).

>>> recognize([])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from divergence.analysis.dose import SATURATED_E
from divergence.analysis.trajectories import PairData

SATURATED_FINETUNE = 0.5  # E / E_S at which a fine-tune's pair has reached the ceiling (E_S: data-order pair)
FROM_START = "pair.json's start"  # how a fine-tune was recognized: every pair records its starting weights
FROM_WEIGHTS = "equal step-0 weights"  # or every pair's arms, the seed pair's too, start equal (E(0) = 0)


@dataclass(frozen=True)
class FineTune:
    """A study recognized as a fine-tune: how, and from which starting weights (``start``, if recorded)."""

    how: str  # FROM_START or FROM_WEIGHTS
    start: str | None = None


def recognize(pairs: list[PairData]) -> FineTune | None:
    """The pairs' ``FineTune``, or None when they train from scratch (or nothing says otherwise)."""
    if not pairs:
        return None
    starts = {p.start for p in pairs}
    if None not in starts:
        return FineTune(FROM_START, starts.pop() if len(starts) == 1 else None)
    if any(p.category == "seed" for p in pairs) and all(_equal_at_start(p) for p in pairs):
        return FineTune(FROM_WEIGHTS)
    return None


def saturation_level(fine_tune: FineTune | None) -> float:
    """E / E_S that ends a pair's window: ``SATURATED_E`` from scratch, ``SATURATED_FINETUNE`` in a fine-tune."""
    return SATURATED_FINETUNE if fine_tune is not None else SATURATED_E


def ceiling_text(fine_tune: FineTune, seeds: list[PairData]) -> str:
    """The sentence a fine-tune's verdict carries: what it was recognized from, its seed reference and
    the ceiling that reference measured (its E at its first and last tracked steps after step 0)."""
    start = f" ({fine_tune.start})" if fine_tune.start else ""
    text = f"a fine-tune (recognized from {fine_tune.how}{start}): "
    if not seeds:
        return text + "no seed pair, so no ceiling: the window ends only where the pairs stop growing alike"
    seed = seeds[0]
    after = [(int(t), float(e)) for t, e in zip(seed.steps, seed.rel_l2) if t > 0 and np.isfinite(e)]
    level = f"{SATURATED_FINETUNE:g} E_S, E_S the difference of the data-order seed pair ({seed.label})"
    if not after:
        return text + f"a pair's window ends where its difference reaches {level} (not tracked)"
    (t0, e0), (t1, e1) = after[0], after[-1]
    return (
        text + f"the ceiling is what fine-tuning reaches, {level} (E_S = {e0:.2g} at step {t0}, "
        f"{e1:.2g} at step {t1}, replicate {seed.replicate}); a pair's window ends there"
    )


def _equal_at_start(pair: PairData) -> bool:
    """The pair tracked step 0 and its arms were equal there (E(0) = 0)."""
    return bool(len(pair.steps) and pair.steps[0] == 0 and pair.rel_l2[0] == 0)
