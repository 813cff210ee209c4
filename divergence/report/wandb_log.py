"""Send the report to wandb: verdict numbers as run summary, figures, the HTML, the files.

Offline unless the user configured wandb: with ``WANDB_MODE`` set wandb follows it, with
``WANDB_API_KEY`` present it goes online; otherwise an offline run is written under
``<out>/wandb`` for ``wandb sync`` (the same rule as the training loggers).
"""

from __future__ import annotations

import os
from pathlib import Path

from divergence.report.figures import file_stem
from divergence.wandb_mode import wandb_init_mode

DEFAULT_PROJECT = "divergence"


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
    for study, ratios in summary.get("legacy_slope_ratio", {}).get("ratios", {}).items():
        for r in ratios:
            for key in ("ratio", "lo", "hi"):
                flat[f"legacy_ratio/{study}/{r['metric']}/{r['reference']}/{key}"] = r[key]
    for name, pair in summary["pairs"].items():
        for metric, g in pair["growth_rate"].items():
            for key in ("value", "lo", "hi"):
                flat[f"growth/{name}/{metric}/{key}"] = g[key]
    return {k: v for k, v in flat.items() if v is not None}


def log_report(summary: dict, figures: dict[str, Path], files: list[Path], out_dir: Path, project: str | None) -> str:
    """Log everything to one wandb run; return where it went (a local folder or a URL)."""
    import wandb

    run = wandb.init(
        project=project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT, dir=str(out_dir), job_type="report",
        name=f"report-{file_stem(out_dir.name)}", config=summary["settings"],
        mode=wandb_init_mode(), settings=wandb.Settings(silent=True),
    )
    try:
        run.summary.update(flat_summary(summary))
        payload = {f"report/{key}": wandb.Image(str(path)) for key, path in figures.items()}
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
