"""A study recipe: the pair under study and the reference pairs that bound it, on one base recipe.

::

    name: flash-attention
    base: tiny.yaml                        # the run recipe every pair trains (relative to this file)
    recipe: {train: {max_steps: 200}}      # changes to the base, for every pair
    study: pairs/flash-vs-baseline.yaml    # a pair file, or inline: {name: ..., arms: {a: [...], b: [...]}}
    references:
      seed: pairs/seed-vs-seed.yaml        # the paper's reference bound
      precision: auto                      # the upper bound; auto: fp16-vs-fp32 on a GPU, bf16 on a CPU
      control: pairs/control.yaml          # the harness's zero check
      reordering: pairs/reordering.yaml    # the second yardstick: a reordering of fp32 sums
    tracking: {every: 10}
    replicates: 3                          # replicates of every pair but the control (one suffices)
    numerics: deployment                   # the pair under study in its deployment numerics (or: base)
    jobs: auto
    pretrain: {steps: 300}                 # optional: every pair fine-tunes from the base pretrained N
                                           # steps (trained on first use into OUT/pretrained, study.pretrain)

Every pair is rewritten onto the study's base (its own ``base`` and ``recipe`` are replaced,
its arms and name kept), so the pairs differ only in their arms. ``precision: auto`` picks
fp16-vs-fp32, the paper's pair, where fp16 is fast (a CUDA GPU); on a CPU, whose fp16 autocast
runs 10-20x slower than fp32 here, it picks bf16-vs-fp32, and the report says so.

Deployment numerics (``numerics: deployment``, the default): the pair under study trains in the
numerics its variants are used in (``divergence.variants.deployment``): flash-vs-baseline with
both arms under bf16 autocast (its base's precision when that is already fp16/bf16, as on a GPU
recipe), while the precision reference compares bf16 with fp32 on the same base and the seed
pair and the control train on the base as it is. ``numerics: base`` trains every pair on the
base as it is (a flash pair then in fp32: outside its deployment, which ``pair.json`` and the
report say in one line); so does a ``train.precision=...`` override on the command line.

``references.reordering`` names a pair whose arms only reorder fp32 sums (the shipped
``pairs/reordering.yaml``: 4x4 gradient accumulation vs one batch of 16): it trains as
``reordering: true`` (category ``reordering``; every variant of its arms must declare
``fp32_equivalent``, else one line naming the key), in the base numerics, with replicates, and
each verdict states the pair under study against it beside the dose ratio
(``divergence.analysis.reordering``).

Replicate r of every pair trains with the pair recipe's ``replicate: r`` (see
``divergence.recipe.pair.replicate_seed``): the pairs of one replicate start from the same
weights and see the same batches and probe set, so they are common random numbers, and the
replicates give the run-to-run uncertainty. The control is trained once (replicate 0): it must
be exactly zero, which one run shows.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, replace
from pathlib import Path

from divergence.errors import RecipeError
from divergence.recipe.names import check_name
from divergence.recipe.pair import PAIR_KEYS, existing_file, pair_name
from divergence.config.schema import apply_overrides, load_yaml
from divergence.config.yaml_safe import short
from divergence.study.pretrain import check_pretrain, with_start

# The keys every study, calibration and consequence recipe has (``read_head``), and the command-line
# KEY=VALUE overrides of them; every other override goes to each pair.
HEAD_KEYS = {"name", "description", "base", "recipe", "references", "tracking", "replicates", "jobs"}
HEAD_OVERRIDES = ("base=", "references.", "replicates=", "jobs=", "name=")
STUDY_KEYS = HEAD_KEYS | {"study", "numerics", "pretrain"}
STUDY_OVERRIDES = (*HEAD_OVERRIDES, "study=", "study.", "numerics=", "pretrain.", "pretrain=")
REFERENCE_ROLES = ("seed", "precision", "control", "reordering")
NUMERICS = ("deployment", "base")
PRECISION_AUTO = {"cuda": "pairs/fp16-vs-fp32.yaml", "cpu": "pairs/bf16-vs-fp32.yaml"}
SHIPPED_RECIPES = Path(__file__).resolve().parents[1] / "recipes"  # auto's pairs, beside a recipe or shipped


@dataclass(frozen=True)
class StudyPair:
    """One pair of the study: its role, its name and the pair-recipe mapping to train."""

    role: str  # "study" or a reference role
    name: str
    recipe: dict  # a pair recipe as plain data, ``base`` an absolute path
    note: str = ""
    key: str = ""  # where the study recipe gives it: ``study``, ``references.seed``, ``doses (1e-05)``
    file: str = ""  # the pair file it names there, if any

    @property
    def single(self) -> bool:
        """Trained once whatever the study's replicates (the control: exactly zero is one run's fact)."""
        return self.role == "control"


@dataclass(frozen=True)
class Study:
    name: str
    pairs: tuple[StudyPair, ...]
    jobs: int | str
    source: Path
    replicates: int = 1
    pretrain: dict | None = None  # {steps, recipe}: every pair fine-tunes from the base pretrained (study.pretrain)
    base: Path | None = None  # the run recipe every pair trains


def read_head(path: Path, overrides: list[str], prefixes: tuple[str, ...], keys: set[str], kind: str):
    """``(data, base, shared)`` of a study, calibration or consequence recipe: the file with its own
    overrides (those starting with ``prefixes``) applied, its keys among ``keys``, its ``base`` found,
    and what every pair shares (base, recipe changes, tracking)."""
    data = apply_overrides(load_yaml(path), [o for o in overrides if o.startswith(prefixes)])
    unknown = sorted(map(str, set(data) - keys))
    if unknown:
        raise RecipeError(f"{path}: unknown key {short(unknown[0])}; a {kind} recipe has {', '.join(sorted(keys))}")
    if "base" not in data:
        raise RecipeError(f"{path}: missing key 'base' (the run recipe every pair trains, e.g. base: tiny.yaml)")
    base = _existing(path.parent / str(data["base"]), "base", path)
    return data, base, {"base": str(base), "recipe": data.get("recipe") or {}, "tracking": data.get("tracking") or {}}


def replicates_and_jobs(data: dict, path: Path, replicates: int) -> tuple[int, int | str]:
    """The recipe's ``replicates`` (default ``replicates``) and ``jobs`` (``auto`` or a count), checked."""
    count, jobs = data.get("replicates", replicates), data.get("jobs", "auto")
    if jobs != "auto" and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise RecipeError(f"{path}: jobs: expected auto or a positive integer, got {short(jobs)}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise RecipeError(f"{path}: replicates: expected a positive integer, got {short(count)}")
    return count, jobs


def load_study(path: str | Path, overrides: list[str] = (), device_type: str = "cpu") -> Study:
    """Read a study recipe and resolve every pair onto its base; errors name the key."""
    path = Path(path)
    data, base, shared = read_head(path, overrides, STUDY_OVERRIDES, STUDY_KEYS, "study")
    numerics = data.get("numerics", "deployment")
    if numerics not in NUMERICS:
        raise RecipeError(f"{path}: numerics: expected one of {', '.join(NUMERICS)}, got {short(numerics)}")
    study = _pair("study", data.get("study"), path, shared)
    pairs = [_in_deployment(study, path) if numerics == "deployment" else study]
    pairs += reference_pairs(data.get("references") or {}, path, shared, device_type, REFERENCE_ROLES, stand_in=True)
    _check_distinct_names(pairs, path)
    replicates, jobs = replicates_and_jobs(data, path, 1)
    pretrain = check_pretrain(data.get("pretrain"), str(path))
    return Study(study_name(data, path), tuple(pairs), jobs, path, replicates, pretrain, base)


def reference_pairs(
    references, path: Path, shared: dict, device_type: str, roles, required: bool = False, stand_in: bool = False
) -> list[StudyPair]:
    """The reference pairs ``references`` gives, among ``roles`` and in their order. ``precision: auto``
    is ``precision_auto``'s pair (``stand_in``: noted where bf16 stands in for fp16, on a CPU);
    ``required``: every role, else one line naming the missing one (what the consequence needs)."""
    if not isinstance(references, dict) or set(references) - set(roles):
        raise RecipeError(f"{path}: references: expected a mapping with keys among {', '.join(roles)}")
    pairs = []
    for role in roles:
        spec, note = references.get(role), ""
        if not spec and required:
            raise RecipeError(
                f"{path}: references.{role}: missing; the early dose needs the precision pair (e.g. "
                "pairs/bf16-vs-fp32.yaml) and the seed margin the seed pair (pairs/seed-vs-seed.yaml)"
            )
        if spec == "auto" and role == "precision":
            spec = precision_auto(path, device_type)
            if stand_in and device_type != "cuda":
                note = (
                    "bf16-vs-fp32 stands in for fp16-vs-fp32: fp16 autocast on a CPU runs 10-20x slower than "
                    "fp32; set references.precision to pairs/fp16-vs-fp32.yaml to insist"
                )
        if spec:
            pairs.append(_pair(role, spec, path, shared, note))
    return pairs


def fine_tuned(study: Study, out: Path) -> Study:
    """``study`` with every pair loading the study's pretrained parts from ``out`` (``study.pretrain``);
    unchanged without ``pretrain``."""
    if study.pretrain is None:
        return study
    pairs = tuple(
        replace(p, recipe={**p.recipe, "recipe": with_start(p.recipe.get("recipe") or {}, out)}) for p in study.pairs
    )
    return replace(study, pairs=pairs)


def study_name(data: dict, path: Path) -> str:
    """The recipe's ``name`` (default: the file's stem), held to the one name rule: it names the
    study's folder (``runs/<name>``) and, through ``launch --study``, every SLURM job."""
    return check_name(data.get("name", path.stem), f"{path}: name", "study name", "the study's folder and its jobs")


def precision_auto(recipe_path: Path, device_type: str) -> str:
    """``references.precision: auto``: fp16-vs-fp32 on a GPU, bf16-vs-fp32 on a CPU, the pair file
    beside the recipe (``recipes/pairs/``), else the shipped one (a recipe in a folder of one's own)."""
    spec = PRECISION_AUTO["cuda" if device_type == "cuda" else "cpu"]
    return spec if existing_file(recipe_path.parent / spec) is not None else str(SHIPPED_RECIPES / spec)


def _pair(role: str, spec, study_path: Path, shared: dict, note: str = "", key: str | None = None) -> StudyPair:
    key = key or ("study" if role == "study" else f"references.{role}")
    if isinstance(spec, str):
        pair_path = _existing(study_path.parent / spec, key, study_path)
        data = load_yaml(pair_path)
    elif isinstance(spec, dict) and "arms" in spec:
        data = copy.deepcopy(spec)
    else:
        raise RecipeError(
            f"{study_path}: {key}: expected a pair recipe file or {{name: ..., arms: {{a: [...], b: [...]}}}}"
        )
    if "name" not in data:
        raise RecipeError(f"{study_path}: {key}: the pair needs a name")
    recipe = {k: v for k, v in data.items() if k not in ("base", "recipe", "tracking")}
    recipe.update(
        base=shared["base"],
        recipe=copy.deepcopy(shared["recipe"]),
        tracking={**(data.get("tracking") or {}), **shared["tracking"]},
    )
    if note:
        recipe["description"] = f"{data.get('description', data['name'])} (stand-in for fp16 vs fp32 on a CPU)"
    file = spec if isinstance(spec, str) else ""
    if role == "reordering":
        if data.get("control") is True:
            raise RecipeError(
                f"{study_path}: {key}{f' ({file})' if file else ''}: a control pair (identical arms, control: "
                "true) is no reordering yardstick; name a pair whose arms only reorder fp32 sums, e.g. "
                "pairs/reordering.yaml"
            )
        recipe["reordering"] = True  # its category, whatever the file says; its arms are checked when read
    return StudyPair(role, pair_name(data["name"], f"{study_path}: {key}: name"), recipe, note, key, file)


def _check_distinct_names(pairs: list[StudyPair], path: Path) -> None:
    """Each pair of a study trains into ``OUT/<name>``: two pairs of one name are one line naming both keys."""
    seen = {}
    for pair in pairs:
        where = f"{pair.key} ({pair.file})" if pair.file else pair.key
        if pair.name in seen:
            raise RecipeError(
                f"{path}: two pairs share a name ({pair.name}: {seen[pair.name]} and {where}); each pair of a "
                "study needs its own name (its folder): give one of them another pair, or name the inline one "
                "differently"
            )
        seen[pair.name] = where


def in_study(message: str, pair: StudyPair, study: Study) -> str:
    """A pair recipe's error said where the study recipe gives the pair: ``arms.a[0]: ...`` of the
    inline study pair is ``study.yaml: study.arms.a[0]: ...``; of a pair file,
    ``study.yaml: references.seed (pairs/seed-vs-seed.yaml): arms.a[0]: ...``."""
    root = re.split(r"[.\[:]", message, maxsplit=1)[0]
    if pair.file:
        return f"{study.source}: {pair.key} ({pair.file}): {message}"
    return f"{study.source}: {pair.key}{'.' if root in PAIR_KEYS else ': '}{message}"


def _in_deployment(pair: StudyPair, study_path: Path) -> StudyPair:
    """The pair under study in its variants' deployment numerics: the precision set for both arms
    (arms whose own variants set one keep theirs), with a note; unchanged when the base serves."""
    from divergence.recipe.run import RunRecipe
    from divergence.variants import parse_variant
    from divergence.variants.deployment import deployment_precision

    arms = pair.recipe.get("arms") if isinstance(pair.recipe.get("arms"), dict) else {}
    where = f"{study_path}: {pair.key} ({pair.file}): " if pair.file else f"{study_path}: {pair.key}."
    variants = [
        parse_variant(spec, f"{where}arms.{arm}[{i}]")
        for arm, specs in arms.items()
        for i, spec in enumerate(specs or [])
    ]
    recipe = pair.recipe["recipe"]
    base_precision = (
        ((recipe.get("train") or {}).get("precision"))
        or ((load_yaml(Path(pair.recipe["base"])).get("train") or {}).get("precision"))
        or RunRecipe().train.precision
    )
    precision = deployment_precision(variants, base_precision)
    if precision is None:
        return pair
    train = {**(recipe.get("train") or {}), "precision": precision}
    used = ", ".join(dict.fromkeys(d.what for d in (v.deployment() for v in variants) if d and d.precisions))
    note = (
        f"both arms train in {precision}, where {used} is used (its deployment numerics; the base trains in "
        f"{base_precision}); numerics=base studies it in the base's"
    )
    return replace(  # its key and file kept: its errors still say where the study recipe gives it
        pair,
        recipe={**pair.recipe, "recipe": {**recipe, "train": train}},
        note="; ".join(n for n in (pair.note, note) if n),
    )


def _existing(path: Path, key: str, study_path: Path) -> Path:
    found = existing_file(path)
    if found is None:
        raise RecipeError(f"{study_path}: {key}: {short(str(path), text=True)} not found")
    return found
