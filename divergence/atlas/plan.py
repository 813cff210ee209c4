"""One study per backbone: every optimization's pair under study beside one set of references.

Each optimization is read as ``divergence study`` reads it (``recipes/study.yaml`` with
``base=<backbone's base>`` and ``study=<its pair>``): the same base changes, tracking, references,
replicates and deployment numerics as a study, so a row of the atlas is what that study would say.
The pairs of all the optimizations of a backbone then train as one study in ``DIR/<backbone>/``
(``DIR/<backbone>/<pair>/r<replicate>``): the seed, precision and control references are the same
pairs on the same base for every optimization, so they train once, not once per optimization,
and each optimization's report (``DIR/<backbone>/reports/<optimization>/``) reads its own pair
runs with the shared reference runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from divergence.atlas.catalog import BACKBONE_PAIRS, BACKBONE_STUDY, BACKBONES, Optimization
from divergence.config.schema import apply_overrides
from divergence.errors import UserInputError
from divergence.study.config import STUDY_OVERRIDES, Study, StudyPair, load_study

REFUSED = ("base=", "study=", "study.")  # the atlas sets these per backbone and row


@dataclass(frozen=True)
class BackboneStudy:
    backbone: str
    study: Study  # every optimization's pair under study, then the references (once)
    pairs: dict[str, str]  # optimization name -> its pair's name
    references: tuple[str, ...]  # the reference pairs' names


def split_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """``(study overrides, pair overrides)`` of the command line's KEY=VALUE; the keys the atlas sets
    itself (base, study) are one line."""
    for item in overrides:
        if item.startswith(REFUSED):
            raise UserInputError(
                f"{item}: the atlas sets base and study itself (the backbone's base, each "
                "optimization's pair); choose them with --backbone and --only"
            )
    return (
        [o for o in overrides if o.startswith(STUDY_OVERRIDES)],
        [o for o in overrides if not o.startswith(STUDY_OVERRIDES)],
    )


def backbone_study(
    backbone: str, optimizations: list[Optimization], device: str, study_overrides: list[str]
) -> BackboneStudy:
    """The study of ``backbone`` training every one of ``optimizations`` (those with a pair) beside
    the references, each pair once; the backbone's own study overrides (``BACKBONE_STUDY``) come
    before ``study_overrides``, its pair overrides (``BACKBONE_PAIRS``) are in every pair's recipe
    (the command line's pair overrides come after them)."""
    pairs: dict[str, StudyPair] = {}
    names, last, own = {}, None, BACKBONE_PAIRS.get(backbone, ())
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "study.yaml"
    for opt in optimizations:
        last = load_study(
            recipe,
            [*BACKBONE_STUDY.get(backbone, ()), *study_overrides, f"base={BACKBONES[backbone]}", f"study={opt.pair}"],
            device,
        )
        under_study = next(p for p in last.pairs if p.role == "study")
        names[opt.name] = under_study.name
        for pair in last.pairs:
            pairs.setdefault(pair.name, replace(pair, recipe=apply_overrides(pair.recipe, own)))
    if last is None:
        raise ValueError("backbone_study needs at least one optimization with a pair")
    ordered = [p for p in pairs.values() if p.role == "study"] + [p for p in pairs.values() if p.role != "study"]
    study = Study(f"atlas-{backbone}", tuple(ordered), last.jobs, last.source, last.replicates)
    return BackboneStudy(backbone, study, names, tuple(p.name for p in ordered if p.role != "study"))
