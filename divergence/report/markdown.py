"""``report.md``: the same content as the HTML, figures linked from ``figures/``."""

from __future__ import annotations

from pathlib import Path

from divergence.analysis import METRIC_LABELS, TRAJECTORY_METRICS, Analysis
from divergence.report import content
from divergence.report.content import Table
from divergence.report.figures import shown_runs
from divergence.report.router_panel import FIGURE as ROUTER_FIGURE, router_text


def render_markdown(
    analysis: Analysis, figures: dict[str, Path], out_dir: Path, generated: str, cost: str | None = None
) -> str:
    """The whole report as Markdown; ``cost``: the study's arm-steps line (``content.cost_text``)."""
    lines = ["# Divergence report", "", f"_{generated} · {len(analysis.pairs)} pair runs_", ""]
    if not analysis.verdicts:
        lines += ["**No verdict**: no pair under study (category optimization) among the inputs.", ""]
    for v in analysis.verdicts:
        lines += [f"**{v.headline}**", ""]
        lines += [f"- {note}" for note in content.notes(v)] + [""]
    lines += [f"> Warning: {w}" for w in analysis.warnings] + ([""] if analysis.warnings else [])
    lines += ["## Dose ratio", "", _image(figures.get("log_e"), out_dir, "log E(t)"), ""]
    for v in analysis.verdicts:
        lines += [
            _image(figures.get(f"{kind}/{v.study}"), out_dir, f"{kind} {v.study}") for kind, _ in content.DOSE_CAPTIONS
        ] + [""]
    for v in analysis.verdicts:
        text = content.coherence_text(v)
        if text:
            lines += [text, "", _image(figures.get(f"coherence/{v.study}"), out_dir, f"coherence {v.study}"), ""]
    if analysis.verdicts:
        lines += ["### Every estimate", "", _table(content.estimates_table(analysis)), ""]
    lines += [*content.calibration_text(analysis), ""]
    if analysis.consequence is not None:
        lines += ["### What a dose predicts", "", *content.consequence_text(analysis), ""]
        lines += [_image(figures.get(k), out_dir, k) for k in content.CONSEQUENCE_CAPTIONS if k in figures] + [""]
    if router_text(analysis):  # MoE pairs: flip fraction beside E(t)
        lines += ["### Router", "", _image(figures.get(ROUTER_FIGURE), out_dir, "router flip fraction"), ""]
        lines += [*router_text(analysis), ""]
    lines += ["## Pairs", "", _table(content.pairs_table(analysis)), ""] + ([cost, ""] if cost else [])
    lines += ["### Noise floor", ""]
    lines += [*content.noise_floor_text(analysis), "", "## Weight difference over training", ""]
    lines += [
        _image(figures.get(f"trajectory_{m}"), out_dir, f"whole-model {METRIC_LABELS[m]}") for m in TRAJECTORY_METRICS
    ]
    lines.append("")
    for pair in shown_runs(analysis):
        lines += [
            f"## Pair {pair.name} ({content.ROLES.get(pair.category, pair.category)}: {pair.description or pair.name})",
            "",
            _image(figures.get(f"loss/{pair.name}"), out_dir, "loss"),
            "",
            content.spikes_text(pair),
            "",
        ]
        if content.all_zero(pair):
            lines += ["Every layer is exactly equal in both arms at every tracked step.", ""]
            continue
        lines += [
            _image(figures.get(f"heatmap/{pair.name}"), out_dir, "per-layer heatmap"),
            "",
            "### Most divergent layers",
            "",
            _table(content.top_layers_table(pair)),
            "",
            "### By kind of layer",
            "",
            _table(content.kinds_table(pair)),
            "",
        ]
    lines += ["## Growth since the first tracked step", ""]
    lines += [_image(figures.get(f"relative_{m}"), out_dir, f"relative {METRIC_LABELS[m]}") for m in TRAJECTORY_METRICS]
    lines += [""]
    lines += ["## Method", ""] + [p + "\n" for p in content.method()]
    lines.append("Every number above is in `summary.json` beside this file.")
    return "\n".join(line for line in lines if line is not None) + "\n"


def _table(table: Table) -> str:
    if not table.rows:
        return "_(no data)_"
    aligns = ["---" if i < table.align_left else "---:" for i in range(len(table.columns))]
    rows = [table.columns, aligns, *table.rows]
    return "\n".join("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows)


def _image(path: Path | None, out_dir: Path, alt: str) -> str:
    if path is None:
        return f"_({alt}: no data to draw)_"
    return f"![{alt}]({Path(path).relative_to(out_dir).as_posix()})"
