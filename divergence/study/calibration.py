"""A calibration recipe: a ladder of known doses (``grad-noise`` pairs) beside the seed and precision
references, trained like a study's pairs.

::

    name: calibration
    base: tiny.yaml
    recipe: {train: {max_steps: 300}}
    doses: [1.0e-7, 1.0e-6, 1.0e-5, 1.0e-4, 1.0e-3, 1.0e-2, 1.0e-1]
    references: {seed: pairs/seed-vs-seed.yaml, precision: auto}
    horizons: [100, 300]
    replicates: 3
    tracking: {every: 10}
    jobs: auto

Dose ``eps`` is the pair ``grad-noise-<eps>`` with arms ``{"a": ["grad-noise=<eps>"], "b": []}``
(category ``optimization``): arm a multiplies every gradient elementwise by ``1 + eps * xi``
(``divergence.training.arm.multiply_grad_noise``). Every pair is put on the recipe's base like a
study's pairs (``divergence.study.config``), and replicate r of every pair shares its initial
weights and batches. Doses written ``1e-7`` (YAML 1.1 reads that as a string) are accepted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from divergence.config.yaml_safe import short
from divergence.errors import RecipeError
from divergence.study.config import (
    HEAD_KEYS,
    HEAD_OVERRIDES,
    Study,
    StudyPair,
    _pair,
    read_head,
    reference_pairs,
    replicates_and_jobs,
    study_name,
)

CALIBRATION_KEYS = HEAD_KEYS | {"doses", "horizons"}
CALIBRATION_OVERRIDES = (*HEAD_OVERRIDES, "doses=", "horizons=")
LADDER_ROLE = "ladder"
# Doses stay below 1e16: from there Python writes 1e+16, and a '+' may not be in the pair's name
# (grad-noise-<eps>); a relative noise far above 1 drowns the gradient anyway.
MAX_DOSE = 1e16
REFERENCE_ROLES = ("seed", "precision")


@dataclass(frozen=True)
class Calibration:
    study: Study  # the ladder pairs (role "ladder") and the references, with replicates and jobs
    doses: tuple[float, ...]
    horizons: tuple[int, ...]


def ladder_name(eps: float) -> str:
    """``grad-noise-1e-07``: the pair name of dose ``eps`` (its arm a's label is ``grad-noise=1e-07``)."""
    return f"grad-noise-{float(eps)}"


def load_calibration(path: str | Path, overrides: list[str] = (), device_type: str = "cpu") -> Calibration:
    """Read a calibration recipe; every problem is a RecipeError naming the key."""
    path = Path(path)
    data, _, shared = read_head(path, overrides, CALIBRATION_OVERRIDES, CALIBRATION_KEYS, "calibration")
    doses = parse_doses(data.get("doses"), path)
    from divergence.analysis.calibration import MIN_DOSES  # the statistic's rule, checked before anything trains

    if len(doses) < MIN_DOSES:
        raise RecipeError(
            f"{path}: doses: {len(doses)} given ({', '.join(f'{d:g}' for d in doses)}); the calibration needs at "
            f"least {MIN_DOSES} (a slope and a monotone order), e.g. doses=[1.0e-6,1.0e-4,1.0e-2]"
        )
    pairs = [ladder_pair(eps, path, shared) for eps in doses]
    pairs += reference_pairs(data.get("references") or {}, path, shared, device_type, REFERENCE_ROLES)
    horizons = data.get("horizons", [100, 300])
    if (
        not isinstance(horizons, list)
        or not horizons
        or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in horizons)
    ):
        raise RecipeError(f"{path}: horizons: expected a list of positive step counts, got {short(horizons)}")
    replicates, jobs = replicates_and_jobs(data, path, 3)
    study = Study(study_name(data, path), tuple(pairs), jobs, path, replicates)
    return Calibration(study, doses, tuple(sorted(set(horizons))))


def ladder_pair(eps: float, path: Path, shared: dict) -> StudyPair:
    """Dose ``eps``'s pair on the recipe's base: arm a with ``grad-noise=<eps>``, arm b as the base."""
    spec = {
        "name": ladder_name(eps),
        "arms": {"a": [{"grad-noise": eps}], "b": []},
        "description": f"relative gradient noise {eps:g} vs none",
    }
    return _pair(LADDER_ROLE, spec, path, shared, key=f"doses ({eps:g})")


def parse_doses(value, path: Path, example: str = "[1.0e-6, 1.0e-4, 1.0e-2]") -> tuple[float, ...]:
    """A recipe's ``doses``: distinct finite relative doses ``0 < eps < MAX_DOSE``, sorted; anything else
    is a RecipeError naming the entry (``example`` shows a good list)."""
    if not isinstance(value, list) or not value:
        raise RecipeError(f"{path}: doses: expected a list of relative doses eps > 0, e.g. {example}")
    doses = []
    for i, item in enumerate(value):
        try:
            eps = float(item) if not isinstance(item, bool) else math.nan
        except (TypeError, ValueError):
            eps = math.nan
        if not (math.isfinite(eps) and 0 < eps < MAX_DOSE):
            raise RecipeError(f"{path}: doses[{i}]: expected a finite dose 0 < eps < {MAX_DOSE:g}, got {short(item)}")
        doses.append(eps)
    if len(set(doses)) != len(doses):
        raise RecipeError(f"{path}: doses: {doses} repeats a dose")
    return tuple(sorted(doses))
