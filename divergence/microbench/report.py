"""Write the microbenchmark's reports: summary.md and index.html (its CSV files: ``tables.write_csv``).

``summary.md`` and ``index.html`` carry the same content: the setup, the headline findings, the
findings tables, the agreement with the real CPU flash kernel and the figures. The HTML page is
self-contained (figures embedded as base64 PNG), so it can be mailed or archived alone.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path

from divergence.microbench import bias, findings, scale_findings
from divergence.microbench.select import reference_rows
from divergence.microbench.validation import COLUMNS as VALIDATION_COLUMNS


def write_reports(
    out_dir: Path, rows, checks, recipe, figures: list[Path], notes: list[str], seconds: float
) -> tuple[Path, Path]:
    """``summary.md`` and ``index.html`` in ``out_dir``."""
    sections = _sections(rows, checks, recipe, notes, seconds)
    md = out_dir / "summary.md"
    md.write_text(_markdown(sections, figures))
    page = out_dir / "index.html"
    page.write_text(_html(sections, figures))
    return md, page


def _sections(all_rows, checks, recipe, notes, seconds) -> list[tuple[str, list]]:
    i, s = recipe.inputs, recipe.sweep
    rows = reference_rows(all_rows, recipe)  # the length and tile studies
    br, bc = recipe.tiles.reference_tile(i.head_dim)
    tile_from = (
        f"given as {recipe.tiles.block_sizes[0]}"
        if recipe.tiles.block_sizes
        else f"Bc = ceil(M/4d), Br = min(Bc, d) with M = {recipe.tiles.memory}, d = {i.head_dim}"
    )
    setup = [
        f"Inputs: B={i.batch}, H={i.heads}, D={i.head_dim}, reference {i.reference_dist().label}, seed {i.seed}, "
        f"{'causal' if i.causal else 'not causal'}; Q, K, V exact in every format (rounded to bf16 once).",
        f"Device {s.device}; formats {', '.join(s.precisions)}; sequence lengths {', '.join(map(str, s.seq_lens))}; "
        f"reference length {s.reference_seq_len}; reference tile {br}x{bc} ({tile_from}).",
        "Errors are against the fp64 golden value (baseline attention in fp64); "
        "'vs baseline' is against baseline attention in the same format.",
        f"{len(all_rows)} runs in {seconds:.0f} s.",
    ] + notes
    out = [
        ("Setup", setup),
        (
            "Findings",
            findings.headlines(rows, recipe)
            + scale_findings.scale_lines(all_rows, recipe)
            + bias.bias_lines(all_rows, recipe),
        ),
    ]
    out.append((f"By number format (seq {s.reference_seq_len})", [findings.format_table(rows, recipe)]))
    out.append(("By sequence length", [findings.length_table(rows, recipe)]))
    head, body = scale_findings.scale_table(all_rows, recipe)
    if body:
        out.append(("By input scale", _scale_text(recipe) + [(head, body)]))
    head, body = bias.bias_table(all_rows, recipe)
    if body:
        out.append(("Bias of the error (forward and backward)", [bias.TABLE_TEXT, (head, body)]))
    if checks:
        out.append(("Re-implementation vs PyTorch's CPU flash kernel", _validation_text(checks)))
    return out


def _scale_text(recipe) -> list[str]:
    dists = ", ".join(d.label for d in scale_findings.scale_dists(recipe))
    return [
        f"Flash (reference tile) error over baseline error, both against the fp64 golden value on the same "
        f"inputs: ×max = max |err| ratio, ×mean = mean |err| ratio. Inputs {dists}; Q, K, V share one draw per "
        f"length (normal inputs are scaled copies). all-low: every operation stored in the format (the "
        f"paper's); fp32-acc: kernel-faithful, fp32 S, m, l, O (FlashAttention-2). The baseline stores every "
        f"operation in the format, so these ratios belong to (input scale, length, this baseline)."
    ]


def _validation_text(checks) -> list:
    worst = max(
        (c for c in checks if not math.isnan(c["diff_over_baseline_err"])),
        key=lambda c: c["diff_over_baseline_err"],
        default=None,
    )
    text = [
        "Kernel-faithful mode (fp32 accumulators; fp64 at fp64) on the kernel's own tiles, same inputs. "
        "Differences come from summation order inside the matrix products and the kernel's vectorized exp."
    ]
    if worst:
        text.append(
            f"Largest max |re-implementation − sdpa-flash| relative to the baseline's own max error: "
            f"{worst['diff_over_baseline_err']:.2f} ({worst['precision']}, seq {worst['seq_len']})."
        )
    head = list(VALIDATION_COLUMNS)
    text.append((head, [[c[k] for k in head] for c in checks]))
    return text


def _cell(value) -> str:
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:.3g}"
    return str(value)


def _markdown(sections, figures) -> str:
    lines = ["# Attention numerics microbenchmark", ""]
    for title, items in sections:
        lines += [f"## {title}", ""]
        for item in items:
            if isinstance(item, tuple):
                head, body = item
                lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in body]
            elif title == "Findings":
                lines.append(f"- {item}")
                continue  # a tight list
            else:
                lines.append(item)
            lines.append("")
        if title == "Findings":
            lines.append("")
    lines += ["## Figures", ""] + [f"![{p.stem}]({p.name})\n" for p in figures]
    lines += ["Data: `results.csv` (one row per run), `validation.csv`, resolved recipe `recipe.yaml`.", ""]
    return "\n".join(lines)


def _html(sections, figures) -> str:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Attention numerics microbenchmark</title>",
        "<style>body{font-family:sans-serif;max-width:1250px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:right;font-size:13px}th{background:#f3f3f3}img{max-width:100%}</style></head><body>",
        "<h1>Attention numerics microbenchmark</h1>",
    ]
    for title, items in sections:
        parts.append(f"<h2>{html.escape(title)}</h2>")
        bullets = [i for i in items if not isinstance(i, tuple)]
        if title == "Findings":
            parts.append("<ul>" + "".join(f"<li>{html.escape(b)}</li>" for b in bullets) + "</ul>")
        for item in items:
            if isinstance(item, tuple):
                head, body = item
                parts.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>")
                parts += ["<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>" for row in body]
                parts.append("</table>")
            elif title != "Findings":
                parts.append(f"<p>{html.escape(item)}</p>")
    parts.append("<h2>Figures</h2>")
    for p in figures:
        data = base64.b64encode(Path(p).read_bytes()).decode()
        parts.append(f"<p><img alt='{p.stem}' src='data:image/png;base64,{data}'></p>")
    parts.append("</body></html>")
    return "\n".join(parts)
