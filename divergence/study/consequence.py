"""A consequence recipe: pair runs trained to convergence, their early dose beside what their finished
models draw.

::

    name: consequence
    base: tiny.yaml
    recipe: {train: {max_steps: 2000}}     # the run to convergence, for every pair
    doses: [1.0e-4, 1.0e-3, 1.0e-2, 1.0e-1, 1.0]
    rows: [pairs/flash-vs-baseline.yaml, pairs/reordering.yaml, pairs/int8-mixed.yaml]
    references: {seed: pairs/seed-vs-seed.yaml, precision: pairs/bf16-vs-fp32.yaml}
    early: [30, 60]
    score: {captions: all, seeds: 4, steps: 25, sampler: ddim, guidance_scale: 3.0}
    replicates: 3
    tracking: {every: 10}
    jobs: auto

The ladder is the calibration's (``divergence.study.calibration``): dose ``eps`` is the pair
``grad-noise-<eps>``, arm a multiplying every gradient by ``1 + eps * xi``. Each row is a pair
recipe (a file or inline ``{name, arms}``) put on the recipe's base as a study's pairs are, in its
deployment numerics as a study's pair under study is (flash and fp8 under bf16 autocast). A row
that is the precision reference's own pair is that reference, trained once. ``early`` is the window
of steps the early dose is read over; ``score`` the sample score's captions (``all``: the checker's
324 evaluation captions; N: N of them, drawn once by a fixed seed), its sampling seeds (N: seeds
0..N-1, or a list), sampler, and the hit the curve reads (``attribute``: ``all``, colour, shape and
position together; ``object``, colour and shape wherever it is; or one attribute; every one is
recorded). Every problem is a RecipeError naming the key.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from divergence.config.schema import to_dict
from divergence.config.yaml_safe import short
from divergence.errors import RecipeError
from divergence.study.calibration import REFERENCE_ROLES, ladder_pair, parse_doses
from divergence.study.config import (
    HEAD_KEYS,
    HEAD_OVERRIDES,
    Study,
    _check_distinct_names,
    _in_deployment,
    _pair,
    read_head,
    reference_pairs,
    replicates_and_jobs,
    study_name,
)

CONSEQUENCE_KEYS = HEAD_KEYS | {"doses", "rows", "early", "score"}
CONSEQUENCE_OVERRIDES = (*HEAD_OVERRIDES, "doses=", "rows=", "early=", "score.", "score=")
ROW_ROLE = "row"
SCORE_KEYS = ("captions", "seeds", "steps", "sampler", "guidance_scale", "batch_size", "attribute")
SCORE_DEFAULTS = {
    "captions": "all",
    "seeds": 4,
    "steps": 25,
    "sampler": "ddim",
    "guidance_scale": 3.0,
    "batch_size": 64,
    "attribute": "all",
}
SCORED = ("all", "object", "colour", "shape", "position")  # divergence.data.shape_check.score's hits
EARLY_DEFAULT = (30, 60)


@dataclass(frozen=True)
class ScoreSettings:
    """What an arm's sample score is read with: the same for every arm, so scores compare image by image."""

    captions: tuple[str, ...]
    seeds: tuple[int, ...]
    steps: int
    sampler: str
    guidance_scale: float
    batch_size: int
    attribute: str = "all"  # the hit the curve reads (shape_check.score's keys); every one is recorded

    def as_dict(self) -> dict:
        """The settings as ``score.json`` records them (all but ``batch_size`` and ``attribute``): a score
        written with others is read again."""
        return {k: v for k, v in to_dict(self).items() if k not in ("batch_size", "attribute")}


@dataclass(frozen=True)
class Consequence:
    study: Study  # the ladder (role "ladder"), the rows ("row") and the references, with replicates and jobs
    doses: tuple[float, ...]
    early: tuple[int, int]
    score: ScoreSettings


def load_consequence(path: str | Path, overrides: list[str] = (), device_type: str = "cpu") -> Consequence:
    """Read a consequence recipe; every problem is a RecipeError naming the key."""
    path = Path(path)
    data, base, shared = read_head(path, overrides, CONSEQUENCE_OVERRIDES, CONSEQUENCE_KEYS, "consequence")
    doses = parse_doses(data.get("doses"), path, example="[1.0e-4, 1.0e-2, 1.0]")
    pairs = [ladder_pair(eps, path, shared) for eps in doses]
    pairs += reference_pairs(data.get("references"), path, shared, device_type, REFERENCE_ROLES, required=True)
    pairs += _rows(data.get("rows", []), path, shared, {p.name for p in pairs if p.role == "precision"})
    _check_distinct_names(pairs, path)
    replicates, jobs = replicates_and_jobs(data, path, 3)
    study = Study(study_name(data, path), tuple(pairs), jobs, path, replicates, None, base)
    return Consequence(study, doses, _early(data.get("early", list(EARLY_DEFAULT)), path), _score(data, path))


def _rows(rows, path: Path, shared: dict, references: set[str]) -> list:
    """Each row on the base, in its deployment numerics; a row that is a reference's pair is left to it."""
    if not isinstance(rows, list):
        raise RecipeError(f"{path}: rows: expected a list of pair recipes (files or {{name, arms}}), got {short(rows)}")
    out = []
    for i, spec in enumerate(rows):
        pair = _pair(ROW_ROLE, spec, path, shared, key=f"rows[{i}]")
        if pair.name not in references:
            out.append(_in_deployment(pair, path))
    return out


def _early(value, path: Path) -> tuple[int, int]:
    ok = (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and 0 <= value[0] < value[1]
    )
    if not ok:
        raise RecipeError(f"{path}: early: expected [first step, last step] of the early window, e.g. [30, 60]")
    return value[0], value[1]


def _score(data: dict, path: Path) -> ScoreSettings:
    from divergence.data.shape_check import evaluation_captions
    from divergence.models.seeded_sampling import SAMPLERS

    given = data.get("score") or {}
    if not isinstance(given, dict) or set(given) - set(SCORE_KEYS):
        raise RecipeError(f"{path}: score: expected a mapping with keys among {', '.join(SCORE_KEYS)}")
    s = {**SCORE_DEFAULTS, **given}
    every = evaluation_captions()
    captions = s["captions"]
    if captions == "all":
        captions = len(every)
    if isinstance(captions, bool) or not isinstance(captions, int) or not 1 <= captions <= len(every):
        raise RecipeError(f"{path}: score.captions: expected all or a count 1..{len(every)}, got {short(captions)}")
    seeds = s["seeds"]
    seeds = list(range(seeds)) if isinstance(seeds, int) and not isinstance(seeds, bool) else seeds
    if not isinstance(seeds, list) or not seeds or not all(_count(x, 0) for x in seeds) or len(set(seeds)) < len(seeds):
        raise RecipeError(f"{path}: score.seeds: expected a count >= 1 or a list of distinct seeds >= 0")
    for key in ("steps", "batch_size"):
        if not _count(s[key], 1):
            raise RecipeError(f"{path}: score.{key}: expected a positive integer, got {short(s[key])}")
    if s["sampler"] not in SAMPLERS:
        raise RecipeError(f"{path}: score.sampler: expected one of {', '.join(SAMPLERS)}, got {short(s['sampler'])}")
    guidance = s["guidance_scale"]
    if isinstance(guidance, bool) or not isinstance(guidance, (int, float)) or not guidance >= 1.0:
        raise RecipeError(f"{path}: score.guidance_scale: expected a number >= 1, got {short(guidance)}")
    attribute = s["attribute"]
    if attribute not in SCORED:
        raise RecipeError(f"{path}: score.attribute: expected one of {', '.join(SCORED)}, got {short(attribute)}")
    chosen = tuple(every[i] for i in sorted(random.Random(0).sample(range(len(every)), captions)))
    return ScoreSettings(chosen, tuple(seeds), s["steps"], s["sampler"], float(guidance), s["batch_size"], attribute)


def _count(value, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least
