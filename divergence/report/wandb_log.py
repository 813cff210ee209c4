"""Send the report to wandb: verdict numbers as run summary, figures, the HTML, the files.

Where it goes follows the user's wandb settings, the same rule as training's
(``divergence.loggers.wandb_mode``). The run is ``job_type`` ``report`` in the study's group
(``WANDB_RUN_GROUP``, else the study folder's name: the common parent of the pair folders, or the
one pair folder's name).

Summary keys (``flat_summary``), each path segment key-safe (``flash-vs-baseline`` ->
``flash_vs_baseline``, see ``divergence.loggers.wandb_mode.key_part``) where marked <safe>:

    report/status/<safe study>                       the verdict's status
    report/dose_ratio/<safe study>/log10, lo, hi     the dose ratio (summary.json schema 2), and
    report/dose_ratio/<safe study>/replicates        its window as window_start, window_end
    report/outcome/<safe study>/mean, lo, hi, margin
    report/dose_ratio/<safe study>/status            bounded / not_bounded / inconclusive (the dose alone)
    report/outcome/<safe study>/status               within / shifted / undecided (the outcome alone)
    report/reordering/<safe study>/log10, lo, hi, replicates, status
                                                     against the reordering reference (when the study has one)
    verdict/<study>/status, verdict/<study>/headline, dose_ratio/<study>/<key>, outcome/<study>/<key>,
    growth/<pair>/<metric>/<key>                     the earlier keys, unchanged

and the table ``report/dose_ratios`` (one row per verdict: study, reference, metric, log10, lo,
hi, replicates, window_start, window_end) that the dashboard's dose-ratio panel shows.

Lineage: the report ``use``s each pair folder's store artifact (``store-<pair>``, see
``divergence.loggers.wandb_artifacts``), so wandb links the report to the runs it was computed from.
wandb refuses ``use_artifact`` in an offline run; there the artifacts' names and digests go into
the run's config under ``inputs`` instead.

``log_consequence`` sends ``divergence consequence``'s result the same way, to a run of
``job_type`` ``consequence`` (``consequence_summary``'s keys, the table ``consequence/runs``, the
curve and the sample grids).
"""

from __future__ import annotations

import os
from pathlib import Path

from divergence.report.figures import file_stem
from divergence.loggers.wandb_mode import key_part, wandb_target

DOSE_COLUMNS = ["study", "reference", "metric", "log10", "lo", "hi", "replicates", "window_start", "window_end"]


def flat_summary(summary: dict) -> dict[str, float | str]:
    """The verdict's numbers as flat ``section/key`` entries (wandb panels group by the prefix)."""
    flat: dict[str, float | str] = {}
    for v in summary["verdicts"]:
        flat[f"verdict/{v['study']}/status"] = v["status"]
        flat[f"verdict/{v['study']}/headline"] = v["headline"]
        for key in ("log10", "lo", "hi"):
            flat[f"dose_ratio/{v['study']}/{key}"] = v["dose_ratio"][key]
        for key in ("mean", "lo", "hi", "margin"):
            flat[f"outcome/{v['study']}/{key}"] = v["outcome"][key]
        flat.update(_report_keys(v))
    for name, pair in summary["pairs"].items():
        for metric, g in pair.get("growth_rate", {}).items():
            for key in ("value", "lo", "hi"):
                flat[f"growth/{name}/{metric}/{key}"] = g[key]
    return {k: v for k, v in flat.items() if v is not None}


def _report_keys(verdict: dict) -> dict:
    study = key_part(verdict["study"])
    flat = {f"report/status/{study}": verdict["status"]}
    dose = verdict.get("dose_ratio") or {}
    for key in ("log10", "lo", "hi", "replicates"):
        flat[f"report/dose_ratio/{study}/{key}"] = dose.get(key)
    window = dose.get("window") or (None, None)
    flat[f"report/dose_ratio/{study}/window_start"], flat[f"report/dose_ratio/{study}/window_end"] = window
    for key in ("mean", "lo", "hi", "margin", "status"):
        flat[f"report/outcome/{study}/{key}"] = (verdict.get("outcome") or {}).get(key)
    flat[f"report/dose_ratio/{study}/status"] = dose.get("status")
    for key in ("log10", "lo", "hi", "replicates", "status"):
        flat[f"report/reordering/{study}/{key}"] = (verdict.get("reordering") or {}).get(key)
    return flat


def dose_rows(summary: dict) -> list[list]:
    """One row of ``DOSE_COLUMNS`` per verdict that has a dose ratio."""
    rows = []
    for v in summary["verdicts"]:
        dose = v.get("dose_ratio")
        if dose:
            window = dose.get("window") or (None, None)
            rows.append([v["study"], *(dose.get(k) for k in DOSE_COLUMNS[1:-2]), window[0], window[1]])
    return rows


def report_group(folders: list[str | Path], out_dir: Path) -> str:
    """The study folder's name: the pair folders' common parent, or the one pair folder."""
    paths = [Path(f).resolve() for f in folders]
    if len(paths) == 1:
        return paths[0].name
    if paths:
        return Path(os.path.commonpath(paths)).name or out_dir.name
    return Path(out_dir).resolve().name


def log_report(
    summary: dict,
    figures: dict[str, Path],
    files: list[Path],
    out_dir: Path,
    project: str | None,
    folders: list[str | Path] = (),
) -> str:
    """Log everything to one wandb run; return where it went (a local folder or a URL)."""
    import wandb

    from divergence.loggers.wandb_artifacts import store_artifact

    target = wandb_target(None, report_group(folders, out_dir), ("report",), out_dir)
    offline = target.mode in ("offline", "dryrun")
    inputs = [a for a in map(store_artifact, folders) if a is not None]
    config = dict(summary["settings"])
    if offline:
        config["inputs"] = {a.name: a.digest for a in inputs}
    run = _init(target, project, "report", f"report-{file_stem(out_dir.name)}", config)
    try:
        if not offline:
            for artifact in inputs:
                run.use_artifact(artifact)  # same digest: the version the pair run logged
        run.summary.update(flat_summary(summary))
        payload = {f"report/{key}": wandb.Image(str(path)) for key, path in figures.items()}
        payload["report/dose_ratios"] = wandb.Table(columns=DOSE_COLUMNS, data=dose_rows(summary))
        html = next((p for p in files if p.suffix == ".html"), None)
        if html is not None:
            payload["report/html"] = wandb.Html(html.read_text())
        run.log(payload)
        artifact = wandb.Artifact(f"report-{run.id}", type="report")
        for path in files:
            artifact.add_file(str(path))
        run.log_artifact(artifact)
        where = run.url or str(Path(run.dir).parent)  # offline: the run folder `wandb sync` takes
    finally:
        run.finish()
    return str(where)


CONSEQUENCE_COLUMNS = [
    "pair",
    "role",
    "replicate",
    "eps",
    "early_dex",
    "score_a",
    "score_b",
    "score_shift",
    "shift_lo",
    "shift_hi",
    "probe_shift",
    "sample_distance",
]


def consequence_summary(result: dict) -> dict[str, float | str]:
    """``consequence.json``'s statement as flat keys: ``consequence/threshold/below_dex``,
    ``above_dex``; ``consequence/seed_margin/score``, ``probe``; ``consequence/spearman/<score|probe|distance>/rho,
    lo, hi``; ``consequence/seed_distance``; ``consequence/sentence``."""
    flat = {f"consequence/threshold/{k}": result["threshold"].get(k) for k in ("below_dex", "above_dex")}
    for what in ("score", "probe"):
        flat[f"consequence/seed_margin/{what}"] = result["seed_margin"][what]["value"]
    for what, correlation in result["spearman"].items():
        for key in ("rho", "lo", "hi"):
            flat[f"consequence/spearman/{what}/{key}"] = correlation.get(key)
    flat["consequence/seed_distance"] = (result.get("sample_distance") or {}).get("seed")
    flat["consequence/sentence"] = result["sentence"]
    return {k: v for k, v in flat.items() if v is not None and v == v}  # NaN is no value to log


def log_consequence(result: dict, figures: dict[str, Path], out_dir: Path, project: str | None) -> str:
    """Log ``divergence consequence``'s result to one wandb run (``job_type`` consequence, grouped by
    the folder's name): the statement as summary keys, every pair run as the table
    ``consequence/runs``, the figures; return where it went."""
    import wandb

    target = wandb_target(None, Path(out_dir).resolve().name, ("consequence",), out_dir)
    config = {k: result[k] for k in ("recipe", "steps", "early", "doses", "replicates", "score")}
    run = _init(target, project, "consequence", f"consequence-{file_stem(Path(out_dir).name)}", config)
    try:
        run.summary.update(consequence_summary(result))
        rows = [
            [r["pair"], r["reference"] or r["role"], *(r[k] for k in CONSEQUENCE_COLUMNS[2:7])]
            + [*(r["score_shift"][k] for k in ("value", "lo", "hi")), r["probe_shift"]]
            + [(r.get("sample_distance") or {}).get("value")]
            for r in result["runs"]
        ]
        payload = {"consequence/runs": wandb.Table(columns=CONSEQUENCE_COLUMNS, data=rows)}
        payload.update({f"consequence/{k}": wandb.Image(str(p)) for k, p in figures.items() if p is not None})
        run.log(payload)
        where = run.url or str(Path(run.dir).parent)
    finally:
        run.finish()
    return str(where)


def _init(target, project: str | None, job_type: str, name: str, config: dict):
    """``wandb.init`` where ``target`` (``wandb_target``) says, silent."""
    import wandb

    return wandb.init(
        project=project or target.project,
        entity=target.entity,
        dir=target.dir,
        job_type=job_type,
        group=target.group,
        tags=list(target.tags),
        name=name,
        config=config,
        mode=target.mode,
        settings=wandb.Settings(silent=True),
    )
