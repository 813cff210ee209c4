"""Run the atlas: plan every backbone's study, train what is not finished, report each
optimization, write the atlas's files. Resumable as a study is: finished pair runs are skipped,
an interrupted one resumes from its last checkpoint, ``--replicates N`` trains only the new ones.
"""

from __future__ import annotations

import datetime
import os
from contextlib import contextmanager
from pathlib import Path

from divergence.atlas.catalog import Optimization
from divergence.atlas.plan import BackboneStudy, backbone_study, split_overrides
from divergence.atlas.catalog import BACKBONES, OPTIMIZATIONS
from divergence.atlas.render import ATLAS_FILE, SCHEMA, write_atlas
from divergence.atlas.rows import measured_row, reference_flips, seed_ceiling, unavailable_row

CALIBRATION_FILE = "calibration.json"
CACHE_DIR = "inductor-cache"  # torch.compile's artifacts, shared by every compile arm and replicate


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
) -> dict:
    """Train and report; return the atlas (what ``atlas.json`` holds)."""
    from divergence.study.runner import device_type, parallel_jobs
    from divergence.study.lock import study_lock
    from divergence.study.runner import plan_jobs, run_jobs, write_recipes

    device = device_type()
    study_overrides, pair_overrides = split_overrides(overrides)
    plans: dict[str, tuple[BackboneStudy, list]] = {}
    for backbone in backbones:  # every recipe checked before anything is written
        measured = [o for o in optimizations if o.applies(backbone) and o.unavailable(device, backbone) is None]
        if measured:
            plan = backbone_study(backbone, measured, device, study_overrides)
            plans[backbone] = (plan, plan_jobs(plan.study, out / backbone, pair_overrides))
    if calibration is None and (out / CALIBRATION_FILE).is_file():
        calibration = out / CALIBRATION_FILE
    with study_lock(out), inductor_cache(out / CACHE_DIR):
        write_recipes([job for _, planned in plans.values() for job in planned])  # every reused run checked first
        workers = 1  # the reports are built as many at a time as the pair runs were trained
        for backbone, (plan, planned) in plans.items():
            parallel = parallel_jobs(jobs, plan.study.jobs, device, len(planned))
            workers = max(workers, parallel)
            if not quiet:
                print(
                    f"atlas {backbone}: {len(planned)} pair runs ({', '.join(dict.fromkeys(j.label for j in planned))}),"
                    f" {parallel} at a time, into {out / backbone}"
                )
            run_jobs(planned, pair_overrides, parallel, show_progress=not quiet)
        atlas = keep_earlier_rows(out, _assemble(out, optimizations, backbones, plans, device, calibration, workers))
        atlas["command"] = command
        write_atlas(out, atlas)
    return atlas


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
    kept = [r for r in rows if _known(r) and (r["optimization"], r["backbone"]) not in made]
    order = {(o, b): (list(BACKBONES).index(b), i) for i, o in enumerate(OPTIMIZATIONS) for b in BACKBONES}
    rows = sorted([*atlas["rows"], *kept], key=lambda r: order[(r["optimization"], r["backbone"])])
    backbones = {
        **(earlier.get("backbones") if isinstance(earlier.get("backbones"), dict) else {}),
        **atlas["backbones"],
    }
    return {**atlas, "rows": rows, "backbones": {b: backbones[b] for b in BACKBONES if b in backbones}}


def _known(row) -> bool:
    return isinstance(row, dict) and row.get("optimization") in OPTIMIZATIONS and row.get("backbone") in BACKBONES


def _assemble(
    out: Path, optimizations, backbones, plans, device: str, calibration: Path | None, workers: int = 1
) -> dict:
    """Each optimization's report (``OUT/<backbone>/reports/<name>``) and row, in catalog order; the
    reports built ``workers`` at a time (:func:`build_reports`)."""
    builds = []  # (backbone, optimization, the report's inputs, its folder), in row order
    for backbone in backbones:
        for opt in (o for o in optimizations if o.applies(backbone) and o.unavailable(device, backbone) is None):
            plan, planned = plans[backbone]
            names = (plan.pairs[opt.name], *plan.references)
            inputs = [j.out for j in planned if j.pair.name in names]
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
    ``UserInputError``), the reports not yet started cancelled."""
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


def _report_summary(inputs: list[Path], folder: Path, calibration: Path | None, options: dict) -> dict:
    from divergence.report import build_report

    return build_report(inputs, folder, calibration=calibration, **options).summary
