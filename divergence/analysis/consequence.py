"""What one pair run of a consequence curve says: its early dose, and at its last step its score and
probe-loss shifts (``docs/method.md``, "What a dose predicts").

- **Early dose** (dex vs the precision pair P, bf16-vs-fp32): the study's own dose statistic
  (``dose.estimate_replicates``) on the steps of the ``early`` window [t1, t2]: each pair run and
  its replicate of P and of the seed pair cut at t2 (``calibration.truncate``), the window read
  from t1 (``start``). Per replicate lr_r = median over U_r of log10(E_X / E_P); where a replicate
  forms no window, the median of log10(E_X / E_P) over its valid steps in [t1, t2]
  (``every_step.on_valid_steps``: both E > 0, before either pair saturates against the seed
  pair), as the reordering reading does; ``read_on`` says which. P itself is at 0 dex by definition.
- **Score shift**: the hit rate (of the recipe's ``score.attribute``) of arm a minus arm b, both
  sampled from the same noises (``training.sample_score``), with the paired percentile bootstrap over sampling seeds
  (``metrics.score_intervals.paired_seed_bootstrap``).
- **Probe-loss shift**: the package's outcome Delta (``outcome.delta``): the mean over the last
  ``LAST_FRACTION`` of the tracked steps of (l_a - l_b) / l_b on the probe (training losses where
  a run did not record the probe; the same source for every run, ``outcome.source``).
"""

from __future__ import annotations

import math

from divergence.analysis import every_step
from divergence.analysis.calibration import truncate
from divergence.analysis.dose import estimate_replicates
from divergence.analysis.replicates import replicate_of
from divergence.analysis.trajectories import PairData


def early_doses(
    runs: list[PairData], references: list[PairData], seeds: list[PairData], early: tuple[int, int]
) -> dict[int, dict]:
    """``{replicate: {"dex", "read_on", "window"}}`` of one pair's runs against P over ``early``;
    ``dex`` NaN where neither a window nor ``MIN_WINDOW`` valid steps formed (e.g. saturated before t1)."""
    first, last = early
    triples = []
    for x in runs:
        p, s = replicate_of(references, x.replicate), replicate_of(seeds, x.replicate)
        if p is not None:
            triples.append((truncate(x, last), truncate(p, last), truncate(s, last) if s is not None else None))
    out = {}
    for e in estimate_replicates(triples, start=first) if triples else []:
        read = e if e.usable else every_step.on_valid_steps(e)
        out[e.replicate] = {
            "dex": read.log10 if read.usable else math.nan,
            "read_on": ("window" if e.usable else "valid_steps") if read.usable else None,
            "window": list(read.window) if read.usable and read.window else None,
        }
    return out
