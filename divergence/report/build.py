"""Build the report of a set of pair runs: figures, ``report.html``, ``report.md``, ``summary.json``."""

from __future__ import annotations

import datetime
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from divergence.analysis import MIN_WINDOW, TRAJECTORY_METRICS, Analysis, analyze, to_summary
from divergence.analysis.calibration_file import check_calibration
from divergence.analysis.consequence_file import CONSEQUENCE_FILE, check_consequence
from divergence.analysis.dose import probe_values
from divergence.analysis.growth import N_BOOT
from divergence.atomic import write_atomic
from divergence.errors import UserInputError
from divergence.report.figures import all_figures
from divergence.report.document import render_html, render_markdown
from divergence.report import content
from divergence.report.inputs import load_pairs, study_arm_steps
from divergence.tables import write_csv, write_json

FIGURES_DIR = "figures"
CALIBRATION_FILE = "calibration.json"


@dataclass
class Report:
    analysis: Analysis
    summary: dict
    out: Path
    files: list[Path]  # report.html, report.md, summary.json, trajectories.csv
    figures: dict[str, Path] = field(default_factory=dict)
    wandb: str | None = None  # where the wandb run went, when logged


def build_report(
    inputs: list[str | Path],
    out: str | Path,
    n_boot: int = N_BOOT,
    seed: int = 0,
    min_steps: int = MIN_WINDOW,
    calibration: str | Path | None = None,
    consequence: str | Path | None = None,
) -> Report:
    """Read the pair runs under ``inputs``, analyse them and write the report into ``out``.

    ``calibration``: a ``calibration.json`` (``divergence calibrate``); when None, one lying next to
    the inputs (in an input folder or its parent) is used. ``consequence``: a ``consequence.json``
    (``divergence consequence``), found the same way: each verdict then says what its dose predicts
    for the finished model on that recipe."""
    pairs = load_pairs(inputs)  # first: bad input must not leave an empty report folder behind
    calibration_data = load_calibration(calibration, inputs)
    consequence_data = load_consequence_result(consequence, inputs)
    out = Path(out).resolve()
    try:
        (out / FIGURES_DIR).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserInputError(f"{out}: cannot create the report folder: {err.strerror or err}") from None
    for folder in (out, out / FIGURES_DIR):  # now, not after the analysis
        _check_writable(folder)
    analysis = analyze(
        pairs, n_boot=n_boot, seed=seed, min_steps=min_steps, calibration=calibration_data, consequence=consequence_data
    )
    summary = to_summary(analysis)
    generated = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    summary["generated"] = generated
    arm_steps = study_arm_steps(inputs)
    if arm_steps is not None:
        summary["arm_steps"] = arm_steps  # the studies' arms.json: trained, and pair by pair
    try:
        figures = all_figures(analysis, out / FIGURES_DIR)
    except OSError as err:  # a figure file that cannot be replaced, a full disk
        raise UserInputError(f"{err.filename or out / FIGURES_DIR}: cannot write: {err.strerror or err}") from None
    summary["figures"] = {k: p.relative_to(out).as_posix() for k, p in figures.items()}
    files = [out / "summary.json", out / "trajectories.csv", out / "report.md", out / "report.html"]
    write_json(files[0], summary)
    write_csv(
        files[1],
        _trajectory_rows(analysis),
        ("pair", "category", "step", *TRAJECTORY_METRICS, *(f"relative_{m}" for m in TRAJECTORY_METRICS))
        + ("replicate", "rel_l2", "probe_rel_diff"),
    )
    cost = content.cost_text(arm_steps)
    _write_text(files[2], render_markdown(analysis, figures, out, generated, cost))
    _write_text(files[3], render_html(analysis, figures, generated, cost))
    return Report(analysis, summary, out, files, figures)


def _trajectory_rows(analysis: Analysis):
    for p in analysis.pairs:
        rel = {m: p.relative(m) for m in p.model}
        for i, step in enumerate(p.steps.tolist()):
            yield {
                "pair": p.name,
                "category": p.category,
                "step": step,
                "replicate": p.replicate,
                "rel_l2": float(p.rel_l2[i]),
                "probe_rel_diff": float(probe_values(p)[i]),
                **{m: float(p.model[m][i]) for m in p.model},
                **{f"relative_{m}": float(rel[m][i]) for m in rel},
            }


def load_calibration(path: str | Path | None, inputs: list[str | Path]) -> dict | None:
    """The calibration to state equivalent doses with: ``path``, or ``calibration.json`` next to the inputs."""
    found = _given_or_beside(path, inputs, CALIBRATION_FILE)
    if found is None:
        return None
    return check_calibration(_read_json(found, "calibration", "divergence calibrate"), found)


def load_consequence_result(path: str | Path | None, inputs: list[str | Path]) -> dict | None:
    """The consequence curve to state predictions with: ``path``, or ``consequence.json`` next to the inputs."""
    found = _given_or_beside(path, inputs, CONSEQUENCE_FILE)
    if found is None:
        return None
    data = check_consequence(_read_json(found, "consequence curve", "divergence consequence"), found)
    return {**data, "source_file": str(found)}


def _given_or_beside(path: str | Path | None, inputs: list[str | Path], name: str) -> Path | None:
    """``path``, or the first ``name`` in an input folder or its parent; None when there is none."""
    if path is not None:
        return Path(path)
    found = [c for d in map(Path, inputs) for c in (d / name, d.parent / name) if c.is_file()]
    return found[0] if found else None


def _read_json(path: Path, what: str, writer: str):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UserInputError(f"{path}: no such {what} file; write one with {writer}") from None
    except (OSError, ValueError) as err:
        raise UserInputError(f"{path}: unreadable {what} ({err})") from None
    except RecursionError:
        raise UserInputError(f"{path}: unreadable {what} (JSON nested too deeply)") from None


def _check_writable(folder: Path) -> None:
    """One line if ``folder`` takes no new file (read-only, immutable, full), before any work."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise UserInputError(f"{folder}: cannot write the report there: {err.strerror or err}") from None


def _write_text(path: Path, text: str) -> None:
    """Write atomically: a browser or wandb never reads half a report."""
    try:
        write_atomic(path, text)
    except OSError as err:
        raise UserInputError(f"{path}: cannot write: {err.strerror or err}") from None
