"""``report.md`` and ``report.html``, rendered from one list of blocks so the two never disagree.

``report.html`` is one self-contained file (inline CSS, figures as base64 PNG, no scripts);
``report.md`` links its figures from ``figures/``. A block is ``("h", level, text)``, ``("p", texts)``,
``("figures", [(key, alt, caption)])`` (Markdown shows the alt text, HTML the caption), ``("table",
Table)``, or ``("raw", markdown lines, html parts)`` where the two say it differently.
"""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path

from divergence import __version__
from divergence.analysis import METRIC_LABELS, TRAJECTORY_METRICS, Analysis
from divergence.analysis.coherence import sentence
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


WHOLE_MODEL = "Whole-model {} per pair (log scale; values of exactly 0 cannot be drawn on it)."
GROWTH = "Increase of the layer-mean {} since the first tracked step; dashed: the least-squares fit whose slope is g."


def blocks(analysis: Analysis, figures: dict[str, Path], generated: str, cost: str | None, fmt: str) -> list[tuple]:
    """The whole report in ``fmt`` (``md``, ``html``), top to bottom; ``cost``: the study's arm-steps
    line (``content.cost_text``)."""
    n, warnings = len(analysis.pairs), analysis.warnings
    title = (
        f"<h1>Divergence report</h1><p class='meta'>divergence {escape(__version__)} · {escape(generated)} · "
        f"{n} pair runs</p>"
    )
    out = [("raw", ["# Divergence report", "", f"_{generated} · {n} pair runs_", ""], [title]), *_verdicts(analysis)]
    out.append(
        (
            "raw",
            [f"> Warning: {w}" for w in warnings] + ([""] if warnings else []),
            [f"<div class='warn'>{escape(w)}</div>" for w in warnings],
        )
    )
    out += [("h", 2, "Dose ratio"), ("figures", [("log_e", "log E(t)", content.log_e_caption())])]
    for v in analysis.verdicts:  # HTML: each verdict's coherence after its dose figures; Markdown: after all
        out.append(
            ("figures", [(f"{kind}/{v.study}", f"{kind} {v.study}", text) for kind, text in content.DOSE_CAPTIONS])
        )
        out += _coherence(v) if fmt == "html" else []
    out += [block for v in analysis.verdicts for block in _coherence(v)] if fmt == "md" else []
    if analysis.verdicts:
        out += [("h", 3, "Every estimate"), ("table", content.estimates_table(analysis))]
    out.append(("p", content.calibration_text(analysis)))
    if analysis.consequence is not None:
        out += [("h", 3, "What a dose predicts"), ("p", content.consequence_text(analysis))]
        out.append(("figures", [(k, k, text) for k, text in content.CONSEQUENCE_CAPTIONS.items() if k in figures]))
    if router_text(analysis):  # MoE pairs: flip fraction beside E(t)
        out += [("h", 3, "Router"), ("figures", [(ROUTER_FIGURE, "router flip fraction", CAPTION)])]
        out.append(("p", router_text(analysis)))
    out += [("h", 2, "Pairs"), ("table", content.pairs_table(analysis))] + ([("p", [cost])] if cost else [])
    out += [("h", 3, "Noise floor"), ("p", content.noise_floor_text(analysis))]
    labels = [(m, METRIC_LABELS[m]) for m in TRAJECTORY_METRICS]
    out.append(("h", 2, "Weight difference over training"))
    out.append(("figures", [(f"trajectory_{m}", f"whole-model {x}", WHOLE_MODEL.format(x)) for m, x in labels]))
    for pair in shown_runs(analysis):
        out += _pair_section(pair, fmt)
    out.append(("h", 2, "Growth since the first tracked step"))
    out.append(("figures", [(f"relative_{m}", f"relative {x}", GROWTH.format(x)) for m, x in labels]))
    out += [("h", 2, "Method"), *(("p", [t]) for t in content.method())]
    return out + [
        (
            "raw",
            ["Every number above is in `summary.json` beside this file."],
            ["<p class='meta'>Every number above is in <code>summary.json</code> beside this file.</p>"],
        )
    ]


def _verdicts(analysis: Analysis) -> list[tuple]:
    if not analysis.verdicts:
        return [
            (
                "raw",
                ["**No verdict**: no pair under study (category optimization) among the inputs.", ""],
                [
                    "<div class='verdict' style='border-color:#57606a'><div class='status'>No verdict</div>"
                    "<div class='headline'>No pair under study (category optimization) among the inputs.</div></div>"
                ],
            )
        ]
    out = []
    for v in analysis.verdicts:
        color, notes = STATUS_COLORS[v.status], content.notes(v)
        items = ("<ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>") if notes else ""
        html = (
            f"<div class='verdict' style='border-color:{color}'><div class='status' style='color:{color}'>"
            f"{escape(v.status.replace('_', ' '))}</div><div class='headline'>{escape(v.headline)}</div>{items}</div>"
        )
        out.append(("raw", [f"**{v.headline}**", "", *(f"- {n}" for n in notes), ""], [html]))
    return out


def _coherence(v) -> list[tuple]:
    text = sentence(v.coherence, v.study)
    if not text:
        return []
    return [("p", [text]), ("figures", [(f"coherence/{v.study}", f"coherence {v.study}", content.COHERENCE_CAPTION)])]


def _pair_section(pair, fmt: str) -> list[tuple]:
    role, description = content.ROLES.get(pair.category, pair.category), pair.description or pair.name
    heading = (
        "raw",
        [f"## Pair {pair.name} ({role}: {description})", ""],
        [f"<h2>Pair {escape(pair.name)} <span class='meta'>({escape(role)}: {escape(description)})</span></h2>"],
    )
    spikes = content.spikes_text(pair)
    out = [heading, ("figures", [(f"loss/{pair.name}", "loss", spikes)])] + ([("p", [spikes])] if fmt == "md" else [])
    if pair.layers and all((pair.layer_values[m] == 0).all() for m in TRAJECTORY_METRICS):  # a deterministic control
        return out + [("p", ["Every layer is exactly equal in both arms at every tracked step."])]
    heatmap = "Per-layer Wasserstein distance over training, largest final value on top."
    return out + [
        ("figures", [(f"heatmap/{pair.name}", "per-layer heatmap", heatmap)]),
        ("h", 3, "Most divergent layers"),
        ("table", content.top_layers_table(pair)),
        ("h", 3, "By kind of layer"),
        ("table", content.kinds_table(pair)),
    ]


def render_markdown(
    analysis: Analysis, figures: dict[str, Path], out_dir: Path, generated: str, cost: str | None = None
) -> str:
    """The whole report as Markdown, figures linked relative to ``out_dir``."""
    lines = []
    for kind, *args in blocks(analysis, figures, generated, cost, "md"):
        if kind == "h":
            lines += ["#" * args[0] + " " + args[1], ""]
        elif kind == "p":
            lines += [*args[0], ""]
        elif kind == "figures":
            lines += [_image(figures.get(key), out_dir, alt) for key, alt, _ in args[0]] + [""]
        elif kind == "table":
            lines += [_markdown_table(args[0]), ""]
        else:
            lines += args[0]
    return "\n".join(lines) + "\n"


def render_html(analysis: Analysis, figures: dict[str, Path], generated: str, cost: str | None = None) -> str:
    """The whole report as one HTML string."""
    body = []
    for kind, *args in blocks(analysis, figures, generated, cost, "html"):
        if kind == "h":
            body.append(f"<h{args[0]}>{escape(args[1])}</h{args[0]}>")
        elif kind == "p":
            body += [f"<p>{escape(t)}</p>" for t in args[0]]
        elif kind == "figures":
            body += [_figure(figures.get(key), caption) for key, _, caption in args[0]]
        elif kind == "table":
            body.append(_html_table(args[0]))
        else:
            body += args[1]
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>Divergence report</title><style>{CSS}</style></head>"
        f"<body><main>{''.join(body)}</main></body></html>\n"
    )


def _markdown_table(table: Table) -> str:
    if not table.rows:
        return "_(no data)_"
    aligns = ["---" if i < table.align_left else "---:" for i in range(len(table.columns))]
    rows = [table.columns, aligns, *table.rows]
    return "\n".join("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows)


def _html_table(table: Table) -> str:
    if not table.rows:
        return "<p class='meta'>(no data)</p>"
    head = "".join(f"<th>{escape(c)}</th>" for c in table.columns)
    tags = ["<td>" if i < table.align_left else "<td class='num'>" for i in range(len(table.columns))]
    rows = "".join("<tr>" + "".join(f"{t}{escape(c)}</td>" for t, c in zip(tags, row)) + "</tr>" for row in table.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _image(path: Path | None, out_dir: Path, alt: str) -> str:
    if path is None:
        return f"_({alt}: no data to draw)_"
    return f"![{alt}]({Path(path).relative_to(out_dir).as_posix()})"


def _figure(path: Path | None, caption: str) -> str:
    if path is None:
        return f"<p class='meta'>{escape(caption)} (no data to draw)</p>"
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return (
        f"<figure><img alt='{escape(Path(path).stem)}' src='data:image/png;base64,{data}'>"
        f"<figcaption>{escape(caption)}</figcaption></figure>"
    )
