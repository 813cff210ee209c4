"""``report.html``: one self-contained file (inline CSS, figures as base64 PNG, no scripts)."""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path

from divergence import __version__
from divergence.analysis import METRIC_LABELS, TRAJECTORY_METRICS, Analysis
from divergence.report import content
from divergence.report.content import Table
from divergence.report.figures import shown_runs
from divergence.report.router_panel import CAPTION, FIGURE as ROUTER_FIGURE, router_text

STATUS_COLORS = {
    "bounded": "#1a7f37",
    "not_bounded": "#cf222e",
    "inconclusive": "#9a6700",
    "no_verdict": "#57606a",
    "preliminary": "#0969da",
}

CSS = """
body { font: 15px/1.5 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #1f2328; margin: 0;
       background: #f6f8fa; }
main { max-width: 1100px; margin: 0 auto; padding: 24px 32px 64px; background: #fff; }
h1 { font-size: 26px; margin: 0 0 4px; } h2 { font-size: 20px; margin-top: 36px; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 16px; margin-top: 24px; }
.meta { color: #57606a; font-size: 13px; }
.verdict { border-left: 6px solid; padding: 10px 16px; margin: 16px 0; background: #f6f8fa; border-radius: 4px; }
.verdict .status { font-weight: 700; text-transform: uppercase; letter-spacing: .04em; font-size: 13px; }
.verdict .headline { font-size: 18px; margin: 4px 0; }
.verdict ul { margin: 6px 0; }
.warn { background: #fff8c5; border: 1px solid #d4a72c; padding: 8px 12px; border-radius: 4px; margin: 8px 0; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; display: block; overflow-x: auto; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; } th { background: #f6f8fa; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
figure { margin: 12px 0 24px; } figure img { max-width: 100%; height: auto; border: 1px solid #eaeef2; }
figcaption { color: #57606a; font-size: 13px; }
code { background: #eff1f3; padding: 1px 4px; border-radius: 3px; font-size: 13px; }
"""


def render_html(analysis: Analysis, figures: dict[str, Path], generated: str, cost: str | None = None) -> str:
    """The whole report as one HTML string; ``cost``: the study's arm-steps line (``content.cost_text``)."""
    body = [
        f"<h1>Divergence report</h1><p class='meta'>divergence {escape(__version__)} · {escape(generated)} · "
        f"{len(analysis.pairs)} pair runs</p>"
    ]
    body += _verdicts(analysis)
    body += [f"<div class='warn'>{escape(w)}</div>" for w in analysis.warnings]
    body += ["<h2>Dose ratio</h2>", _figure(figures.get("log_e"), content.log_e_caption())]
    for v in analysis.verdicts:
        body += [_figure(figures.get(f"{kind}/{v.study}"), caption) for kind, caption in content.DOSE_CAPTIONS]
        text = content.coherence_text(v)
        if text:
            body += [f"<p>{escape(text)}</p>", _figure(figures.get(f"coherence/{v.study}"), content.COHERENCE_CAPTION)]
    if analysis.verdicts:
        body += ["<h3>Every estimate</h3>", _table(content.estimates_table(analysis))]
    body += [f"<p>{escape(t)}</p>" for t in content.calibration_text(analysis)]
    if analysis.consequence is not None:
        body += ["<h3>What a dose predicts</h3>"] + [f"<p>{escape(t)}</p>" for t in content.consequence_text(analysis)]
        body += [_figure(figures[k], caption) for k, caption in content.CONSEQUENCE_CAPTIONS.items() if k in figures]
    if router_text(analysis):  # MoE pairs: flip fraction beside E(t)
        body += ["<h3>Router</h3>", _figure(figures.get(ROUTER_FIGURE), CAPTION)]
        body += [f"<p>{escape(t)}</p>" for t in router_text(analysis)]
    body += ["<h2>Pairs</h2>", _table(content.pairs_table(analysis))]
    body += ([f"<p>{escape(cost)}</p>"] if cost else []) + ["<h3>Noise floor</h3>"]
    body += [f"<p>{escape(t)}</p>" for t in content.noise_floor_text(analysis)]
    body += ["<h2>Weight difference over training</h2>"]
    for metric in TRAJECTORY_METRICS:
        body.append(
            _figure(
                figures.get(f"trajectory_{metric}"),
                f"Whole-model {METRIC_LABELS[metric]} per pair (log scale; values of exactly 0 cannot be drawn on it).",
            )
        )
    for pair in shown_runs(analysis):
        body += _pair_section(pair, figures)
    body += ["<h2>Growth since the first tracked step</h2>"]
    for metric in TRAJECTORY_METRICS:
        body.append(
            _figure(
                figures.get(f"relative_{metric}"),
                f"Increase of the layer-mean {METRIC_LABELS[metric]} "
                "since the first tracked step; dashed: the least-squares fit whose slope is g.",
            )
        )
    body += ["<h2>Method</h2>"] + [f"<p>{escape(t)}</p>" for t in content.method()]
    body.append("<p class='meta'>Every number above is in <code>summary.json</code> beside this file.</p>")
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>Divergence report</title><style>{CSS}</style></head>"
        f"<body><main>{''.join(body)}</main></body></html>\n"
    )


def _verdicts(analysis: Analysis) -> list[str]:
    if not analysis.verdicts:
        return [
            "<div class='verdict' style='border-color:#57606a'><div class='status'>No verdict</div>"
            "<div class='headline'>No pair under study (category optimization) among the inputs.</div></div>"
        ]
    out = []
    for v in analysis.verdicts:
        color = STATUS_COLORS[v.status]
        parts = [
            f"<div class='verdict' style='border-color:{color}'>",
            f"<div class='status' style='color:{color}'>{escape(v.status.replace('_', ' '))}</div>",
            f"<div class='headline'>{escape(v.headline)}</div>",
        ]
        notes = content.notes(v)
        if notes:
            parts.append("<ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>")
        out.append("".join(parts) + "</div>")
    return out


def _pair_section(pair, figures: dict[str, Path]) -> list[str]:
    out = [
        f"<h2>Pair {escape(pair.name)} <span class='meta'>({escape(content.ROLES.get(pair.category, ''))}: "
        f"{escape(pair.description or pair.name)})</span></h2>"
    ]
    out.append(_figure(figures.get(f"loss/{pair.name}"), content.spikes_text(pair)))
    if content.all_zero(pair):
        return out + ["<p>Every layer is exactly equal in both arms at every tracked step.</p>"]
    out.append(
        _figure(
            figures.get(f"heatmap/{pair.name}"),
            "Per-layer Wasserstein distance over training, largest final value on top.",
        )
    )
    out += [
        "<h3>Most divergent layers</h3>",
        _table(content.top_layers_table(pair)),
        "<h3>By kind of layer</h3>",
        _table(content.kinds_table(pair)),
    ]
    return out


def _table(table: Table) -> str:
    if not table.rows:
        return "<p class='meta'>(no data)</p>"
    head = "".join(f"<th>{escape(c)}</th>" for c in table.columns)
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{escape(cell)}</td>" if i < table.align_left else f"<td class='num'>{escape(cell)}</td>"
            for i, cell in enumerate(row)
        )
        + "</tr>"
        for row in table.rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _figure(path: Path | None, caption: str) -> str:
    if path is None:
        return f"<p class='meta'>{escape(caption)} (no data to draw)</p>"
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return (
        f"<figure><img alt='{escape(Path(path).stem)}' src='data:image/png;base64,{data}'>"
        f"<figcaption>{escape(caption)}</figcaption></figure>"
    )
