"""Run the atlas: plan every backbone's study, train what is not finished, report each
optimization, write the atlas's files. Resumable as a study is: finished pair runs are skipped,
an interrupted one resumes from its last checkpoint, ``--replicates N`` trains only the new ones.

Replicates come in two looks (``atlas.looks``): every pair trains the first ``first_replicates``;
a row they leave undecided, where the study's ``replicates`` would decide it, then trains those
with the references. Each row's report reads the replicates from 0 on that its pair and every
reference finished (``Look``).
"""

from __future__ import annotations

import datetime
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from divergence.atlas.catalog import Optimization
from divergence.atlas.plan import BackboneStudy, backbone_study, split_overrides
from divergence.atlas.catalog import BACKBONES, OPTIMIZATIONS
from divergence.atlas.looks import FIRST_REPLICATES, to_decide, trained_prefix
from divergence.atlas.render import ATLAS_FILE, SCHEMA, write_atlas
from divergence.atlas.rows import measured_row, reference_flips, seed_ceiling, unavailable_row, verdict_of

CALIBRATION_FILE = "calibration.json"
CACHE_DIR = "inductor-cache"  # torch.compile's artifacts, shared by every compile arm and replicate


@dataclass(frozen=True)
class Look:
    """A row after the first look: the replicates its report reads, and the readings this run
    trained the study's replicates for (``atlas.looks.to_decide``; empty: decided, out of reach, or
    trained to the study's replicates before)."""

    replicates: int
    extended_for: tuple[str, ...] = ()


def run_atlas(
    out: Path,
    optimizations: list[Optimization],
    backbones: list[str],
    overrides: list[str],
    *,
    jobs: int | None = None,
    calibration: Path | None = None,
    quiet: bool = False,
    command: str = "divergence atlas",
    first_replicates: int = FIRST_REPLICATES,
    shared: bool = True,
) -> dict:
    """Train and report; return the atlas (what ``atlas.json`` holds). ``first_replicates``: the
    first look's replicates (``atlas.looks``); the study's replicates or more: a single look;
    ``shared``: every arm of a replicate trained once (``study.shared_arms``), else pair by pair."""
    from divergence.study.runner import device_type, parallel_jobs
    from divergence.study.lock import study_lock
    from divergence.study.runner import plan_jobs, run_jobs, write_recipes

    device = device_type()
    study_overrides, pair_overrides = split_overrides(overrides)
    plans: dict[str, tuple[BackboneStudy, list]] = {}
    for backbone in backbones:  # every recipe checked before anything is written
        if measured := _measured(optimizations, backbone, device):
            plan = backbone_study(backbone, measured, device, study_overrides)
            plans[backbone] = (plan, plan_jobs(plan.study, out / backbone, pair_overrides))
    if calibration is None and (out / CALIBRATION_FILE).is_file():
        calibration = out / CALIBRATION_FILE
    with study_lock(out), inductor_cache(out / CACHE_DIR):
        write_recipes([job for _, planned in plans.values() for job in planned])  # every reused run checked first
        workers = 1  # the reports are built as many at a time as the pair runs were trained
        arm_steps = {}  # backbone -> {trained, pair_by_pair} (its arms.json)
        for backbone, (plan, planned) in plans.items():  # the first look's replicates
            first = [j for j in planned if j.replicate < first_replicates]
            parallel = parallel_jobs(jobs, plan.study.jobs, device, len(first))
            workers = max(workers, parallel)
            if not quiet:
                print(
                    f"atlas {backbone}: {len(first)} pair runs ({', '.join(dict.fromkeys(j.label for j in first))}),"
                    f" {parallel} at a time, into {out / backbone}"
                )
            arm_steps[backbone] = run_jobs(first, pair_overrides, parallel, not quiet, shared)["arm_steps"]
        looks = {}
        for backbone, (plan, planned) in plans.items():  # the first look: its undecided rows train more
            looks[backbone] = first_look(
                plan, planned, _measured(optimizations, backbone, device), calibration, workers
            )
            extended = {name: look for name, look in looks[backbone].items() if look.extended_for}
            if extended:
                names = {plan.pairs[name] for name in extended} | set(plan.references)
                more = [j for j in planned if j.pair.name in names]
                if not quiet:
                    print(
                        f"atlas {backbone}: {plan.study.replicates} replicates for "
                        + "; ".join(f"{name} ({', '.join(look.extended_for)})" for name, look in extended.items())
                        + ", and the references"
                    )
                parallel = parallel_jobs(jobs, plan.study.jobs, device, len(more))
                arm_steps[backbone] = run_jobs(more, pair_overrides, parallel, not quiet, shared)["arm_steps"]
        atlas = keep_earlier_rows(
            out, _assemble(out, optimizations, backbones, plans, device, calibration, workers, looks)
        )
        atlas["command"] = command
        atlas["arm_steps"] = arm_steps
        atlas["looks"] = {"first_replicates": first_replicates}
        write_atlas(out, atlas)
    return atlas


def first_look(plan: BackboneStudy, planned: list, optimizations, calibration: Path | None, workers: int) -> dict:
    """``{optimization: Look}`` of the rows of ``plan`` once its first look trained: each row's
    verdict over the replicates its pair and the references finished (``looks.trained_prefix``),
    read without figures, and the readings of it that the study's replicates would decide
    (``looks.to_decide``). A row that has the study's replicates already is not read here."""
    most = plan.study.replicates
    done = {(j.pair.name, j.replicate) for j in planned if j.finished()}
    once = {j.pair.name for j in planned if j.pair.single}
    have = {o.name: trained_prefix(done, once, [plan.pairs[o.name], *plan.references], most) for o in optimizations}
    short = [o for o in optimizations if 2 <= have[o.name] < most]  # under 2: no interval to plan from
    builds = [(row_inputs(plan, planned, o.name, have[o.name]), None) for o in short]
    verdicts = {
        o.name: verdict_of(summary, plan.pairs[o.name])
        for o, summary in zip(short, build_reports(builds, calibration, workers, figures=False))
    }
    looks = {}
    for o in optimizations:
        need = tuple(to_decide(verdicts.get(o.name), most))
        looks[o.name] = Look(most, need) if need else Look(have[o.name])
    return looks


def row_inputs(plan: BackboneStudy, planned: list, optimization: str, replicates: int) -> list[Path]:
    """The pair runs the report of ``optimization``'s row reads: its pair's and the references'
    first ``replicates`` (the control's one)."""
    names = (plan.pairs[optimization], *plan.references)
    return [j.out for j in planned if j.pair.name in names and j.replicate < replicates]


def _measured(optimizations, backbone: str, device: str) -> list[Optimization]:
    return [o for o in optimizations if o.applies(backbone) and o.unavailable(device, backbone) is None]


@contextmanager
def inductor_cache(folder: Path):
    """``TORCHINDUCTOR_CACHE_DIR`` is ``folder`` while the atlas trains, so that every compile arm and
    replicate its children run reuses one cache; unless the caller set one, which stays. Afterwards the
    environment is as it was: before, the variable stayed in the calling process, and a library user's
    later studies ran their children with the first atlas's cache folder."""
    name = "TORCHINDUCTOR_CACHE_DIR"
    if name in os.environ:
        yield
        return
    os.environ[name] = str(folder.resolve())
    try:
        yield
    finally:
        os.environ.pop(name, None)


def keep_earlier_rows(out: Path, atlas: dict) -> dict:
    """``atlas`` with the rows of ``out``'s earlier ``atlas.json`` that it does not make again (an
    ``--only B`` run after ``--only A`` holds both rows, in catalog order); an earlier atlas of another
    schema or device, or one that does not read, adds nothing."""
    import json

    try:
        earlier = json.loads((out / ATLAS_FILE).read_text())
    except (OSError, ValueError):
        return atlas
    if not isinstance(earlier, dict) or earlier.get("schema") != SCHEMA or earlier.get("device") != atlas["device"]:
        return atlas
    made = {(r["optimization"], r["backbone"]) for r in atlas["rows"]}
    rows = earlier.get("rows") if isinstance(earlier.get("rows"), list) else []
    known = [r for r in rows if isinstance(r, dict) and r.get("optimization") in OPTIMIZATIONS]
    kept = [r for r in known if r.get("backbone") in BACKBONES and (r["optimization"], r["backbone"]) not in made]
    order = {(o, b): (list(BACKBONES).index(b), i) for i, o in enumerate(OPTIMIZATIONS) for b in BACKBONES}
    rows = sorted([*atlas["rows"], *kept], key=lambda r: order[(r["optimization"], r["backbone"])])
    backbones = {
        **(earlier.get("backbones") if isinstance(earlier.get("backbones"), dict) else {}),
        **atlas["backbones"],
    }
    return {**atlas, "rows": rows, "backbones": {b: backbones[b] for b in BACKBONES if b in backbones}}


def _assemble(
    out: Path, optimizations, backbones, plans, device: str, calibration: Path | None, workers: int, looks: dict
) -> dict:
    """Each optimization's report (``OUT/<backbone>/reports/<name>``) and row, in catalog order; the
    reports built ``workers`` at a time (:func:`build_reports`), each over its ``looks`` replicates."""
    builds = []  # (backbone, optimization, the report's inputs, its folder), in row order
    for backbone in backbones:
        for opt in _measured(optimizations, backbone, device):
            plan, planned = plans[backbone]
            inputs = row_inputs(plan, planned, opt.name, looks[backbone][opt.name].replicates)
            builds.append((backbone, opt, inputs, out / backbone / "reports" / opt.name))
    summaries = iter(build_reports([(inputs, folder) for _, _, inputs, folder in builds], calibration, workers))
    rows, info = [], {}
    for backbone in backbones:
        info[backbone] = {"seed_ceiling": None, "references": []}
        for opt in (o for o in optimizations if o.applies(backbone)):
            reason = opt.unavailable(device, backbone)
            if reason is not None:
                rows.append(unavailable_row(opt, backbone, reason))
                continue
            plan, _ = plans[backbone]
            summary = next(summaries)
            folder = out / backbone / "reports" / opt.name
            rows.append(measured_row(opt, backbone, plan.pairs[opt.name], summary, folder.relative_to(out).as_posix()))
            rows[-1]["looks"] = {
                "replicates": looks[backbone][opt.name].replicates,
                "extended_for": list(looks[backbone][opt.name].extended_for),
            }
            info[backbone] = {"seed_ceiling": seed_ceiling(summary), "references": list(plan.references)}
            if flips := reference_flips(summary, plan.references):  # MoE: the references' router flips
                info[backbone]["router_flip"] = flips
    return {
        "schema": SCHEMA,
        "generated": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "device": device,
        "calibration": str(calibration) if calibration else None,
        "backbones": info,
        "rows": rows,
    }


def build_reports(
    builds: list[tuple[list[Path], Path]], calibration: Path | None, workers: int = 1, **options
) -> list[dict]:
    """``build_report(inputs, folder, calibration=calibration, **options)`` of every ``(inputs, folder)``;
    their summaries, in order.

    ``workers`` > 1 builds them in that many processes (the analysis and matplotlib are CPU-bound
    Python: threads would take turns). Each process reads a pair run once and reuses it in its
    later reports (``reuse_loaded_pairs``: every row's report reads all the backbone's reference
    runs). Each report is written by one process into its own folder,
    so the files are those a sequential build writes. An error is raised as the sequential build
    raises it: the first failing report in ``builds`` order, its own exception (one line for a
    ``UserInputError``), the reports not yet started cancelled.

    ``figures=False``: the summaries only (the analysis, no figure and no file; each folder may
    be None), as the atlas's first look reads them."""
    from divergence.report.inputs import keep_loaded_pairs, reuse_loaded_pairs

    workers = max(1, min(workers, len(builds)))
    if workers == 1:
        with reuse_loaded_pairs():
            return [_report_summary(inputs, folder, calibration, options) for inputs, folder in builds]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"  # fork: no re-import
    context = multiprocessing.get_context(method)
    with ProcessPoolExecutor(workers, mp_context=context, initializer=keep_loaded_pairs) as pool:
        futures = [pool.submit(_report_summary, inputs, folder, calibration, options) for inputs, folder in builds]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def _report_summary(inputs: list[Path], folder: Path | None, calibration: Path | None, options: dict) -> dict:
    from divergence.report import build_report

    options = dict(options)
    if options.pop("figures", True):
        return build_report(inputs, folder, calibration=calibration, **options).summary
    from divergence.analysis import analyze, to_summary
    from divergence.report.build import load_calibration
    from divergence.report.inputs import load_pairs

    return to_summary(analyze(load_pairs(inputs), calibration=load_calibration(calibration, inputs), **options))
