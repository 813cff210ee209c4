"""The atlas's files: ``atlas.json`` (every row as data), ``atlas.md`` and ``atlas.html`` (the
table), ``atlas.png`` (deviation against speed-up).

Table columns: optimization, backbone, numerics (arm a's; ``vs`` arm b's where they differ),
log10 dose ratio against the precision reference with its 95% interval and replicates, the dose
status, the equivalent gradient-noise dose, the outcome status, the replicates that would decide
an undecided row, arm a's step time and peak memory over arm b's, log10(E_X / E_R) against the
reordering reference with its interval, replicates and status, the coherence C(T) of the update
error with its interval, replicates, measured steps and reading (docs/method.md, "Coherence"),
and the row's status.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from divergence.analysis.reordering import REORDERING_DEX
from divergence.atlas.rows import numerics_text
from divergence.tables import write_json

SCHEMA = 1
ATLAS_FILE = "atlas.json"
FIGURE = "atlas.png"
COLUMNS = (
    "optimization",
    "backbone",
    "numerics",
    "log10 dose ratio [95% CI] (n)",
    "dose",
    "equivalent noise dose",
    "outcome",
    "replicates to decide",
    "time a/b",
    "memory a/b",
    "vs reordering: log10 [95% CI] (n) status",
    "coherence C(T) [95% CI] (n) reading",
    "status",
)


def write_atlas(out: Path, atlas: dict) -> list[Path]:
    """Write the four files into ``out``; return their paths."""
    figure = draw_figure(atlas, out / FIGURE)
    atlas = {**atlas, "figure": figure.name}
    write_json(out / ATLAS_FILE, atlas)
    (out / "atlas.md").write_text(markdown(atlas), encoding="utf-8")
    (out / "atlas.html").write_text(render_html(atlas, figure), encoding="utf-8")
    return [out / ATLAS_FILE, out / "atlas.md", out / "atlas.html", figure]


def cells(row: dict) -> list[str]:
    """One row of the table as text, in ``COLUMNS`` order."""
    dose, outcome, cost = row.get("dose_ratio") or {}, row.get("outcome") or {}, row.get("cost") or {}
    if row["status"] == "unavailable":
        return [row["optimization"], row["backbone"], *[""] * (len(COLUMNS) - 3), row.get("reason") or ""]
    interval = (
        (
            f"{_num(dose.get('log10'))} [{_num(dose.get('lo'))}, {_num(dose.get('hi'))}] ({dose.get('replicates', '?')})"
            + (" (valid steps: a bound)" if dose.get("read_on") == "valid_steps" else "")
        )
        if dose.get("log10") is not None
        else "-"
    )
    return [
        row["optimization"],
        row["backbone"],
        numerics_text(row.get("numerics") or {}),
        interval,
        str(dose.get("status") or "-"),
        _dose(row.get("equivalent_dose")),
        str(outcome.get("status") or "-"),
        _needed(row),
        _ratio(cost.get("time_ratio")),
        _ratio(cost.get("memory_ratio")),
        _reordering(row.get("reordering")),
        _coherence(row.get("coherence")),
        str(row["status"]),
    ]


def markdown(atlas: dict) -> str:
    lines = [
        f"# Deviation atlas ({atlas.get('device', '?')}, {atlas.get('generated', '')})",
        "",
        f"`{atlas.get('command', 'divergence atlas')}`",
        "",
        _legend(atlas),
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in cells(r)) + " |" for r in atlas["rows"]]
    lines += [
        "",
        "Seed ceiling (log10 E_seed / E_precision at the last step): "
        + ", ".join(f"{b} {_num(v.get('seed_ceiling'))}" for b, v in atlas.get("backbones", {}).items())
        + ".",
    ]
    lines += look_lines(atlas)
    lines += router_lines(atlas)
    lines += rank_lines(atlas)
    notes = [
        f"- {r['optimization']} ({r['backbone']}): {n}"
        for r in atlas["rows"]
        if r["status"] != "unavailable"
        for n in (r.get("reason"), r.get("outside_deployment"))
        if n
    ]
    lines += ["", "Notes:", *notes] if notes else []
    if atlas.get("figure"):
        lines += ["", f"![deviation against speed-up]({atlas['figure']})"]
    return "\n".join(lines) + "\n"


def render_html(atlas: dict, figure: Path) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells(r)) + "</tr>" for r in atlas["rows"])
    data = base64.b64encode(figure.read_bytes()).decode("ascii")
    image = f"<figure><img alt='deviation against speed-up' src='data:image/png;base64,{data}'></figure>"
    text = markdown(atlas).split("\n")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Deviation atlas</title><style>"
        "body{font-family:sans-serif;margin:2em}td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px}"
        "table{border-collapse:collapse}</style></head><body>"
        f"<h1>{html.escape(text[0].lstrip('# '))}</h1><p><code>{html.escape(atlas.get('command', ''))}</code></p>"
        f"<p>{html.escape(text[4])}</p><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        f"<p>{html.escape(next((t for t in text if t.startswith('Seed ceiling')), ''))}</p>"
        + "".join(f"<p>{html.escape(t.lstrip('- '))}</p>" for t in router_lines(atlas) if t)
        + f"{image}</body></html>"
    )


def draw_figure(atlas: dict, path: Path) -> Path:
    """log10 dose ratio (with its interval) against speed-up (arm b's step time over arm a's), one
    point per row that has both, one panel per backbone (shared axes); the precision reference (0)
    and the backbone's seed ceiling marked; labels nudged apart; the rows without a point named
    under the axes."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    placed = [r for r in atlas["rows"] if _placeable(r)]
    backbones = list(dict.fromkeys(r["backbone"] for r in placed)) or ["unet"]
    fig = Figure(figsize=(6 * len(backbones), 5.5))
    axes = fig.subplots(1, len(backbones), sharex=True, sharey=True, squeeze=False)[0]
    for ax, backbone in zip(axes, backbones):
        rows = [r for r in placed if r["backbone"] == backbone]
        for row in rows:
            dose, speedup = row["dose_ratio"], 1.0 / row["cost"]["time_ratio"]
            lo, hi = dose.get("lo"), dose.get("hi")
            yerr = [[dose["log10"] - lo], [hi - dose["log10"]]] if lo is not None and hi is not None else None
            ax.errorbar([speedup], [dose["log10"]], yerr=yerr, fmt="o", capsize=3)
        ax.axhline(0.0, color="k", lw=1, label="precision reference (0 dex)")
        ceiling = atlas.get("backbones", {}).get(backbone, {}).get("seed_ceiling")
        if ceiling is not None:
            ax.axhline(ceiling, ls="--", lw=1, color="tab:red", label="seed ceiling")
        ax.set_xscale("log")
        ax.margins(x=0.3, y=0.15)  # room for the labels at the ends
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("speed-up: step time of arm b / arm a (per step, median)")
        ax.set_title(f"{backbone}: deviation against speed-up")
        ax.legend(fontsize=8, loc="lower left")
        _labels(fig, ax, [(r["optimization"], 1.0 / r["cost"]["time_ratio"], r["dose_ratio"]["log10"]) for r in rows])
    axes[0].set_ylabel("log10 dose ratio vs precision reference")
    left = [f"{r['optimization']} ({r['backbone']}): {r['status']}" for r in atlas["rows"] if not _placeable(r)]
    if left:
        fig.text(0.01, 0.01, "not placed: " + "; ".join(left), fontsize=6, wrap=True)
    fig.tight_layout(rect=(0, 0.06 if left else 0, 1, 1))
    fig.savefig(path, dpi=110)
    return path


def _labels(fig, ax, points: list[tuple[str, float, float]], height: float = 11.0) -> None:
    """Each point's name beside it, moved down in steps of one line until it overlaps no name
    placed before it (greedy, in display pixels, from the top point down)."""
    fig.canvas.draw()  # the axes' limits and transforms as drawn
    taken: list[tuple[float, float, float]] = []  # (x0, x1, y) of the names placed, in pixels
    for name, x, y in sorted(points, key=lambda p: -p[2]):
        px, py = ax.transData.transform((x, y))
        width, shift = 6.0 * len(name), 0.0
        while any(abs(py + shift - ty) < height and px < tx1 and tx0 < px + width for tx0, tx1, ty in taken):
            shift -= height
        taken.append((px, px + width, py + shift))
        ax.annotate(
            name,
            (x, y),
            xytext=(5, 3 + shift),
            textcoords="offset points",
            fontsize=8,
            arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.5"} if shift else None,
        )


def look_lines(atlas: dict) -> list[str]:
    """The replicates of the two looks (``atlas.looks``): the first look's, and the rows this run
    trained further with the readings it did so for; ``[]`` for an atlas without looks."""
    first = (atlas.get("looks") or {}).get("first_replicates")
    rows = [r for r in atlas["rows"] if r.get("looks")]
    if not first or not rows:
        return []
    more = [
        f"{r['optimization']} ({r['backbone']}) to {r['looks']['replicates']} for {', '.join(r['looks']['extended_for'])}"
        for r in rows
        if r["looks"].get("extended_for")
    ]
    said = "; ".join(more) if more else "none"
    return ["", f"Replicates: {first} for every row first (`--first-replicates`); rows trained further: {said}."]


def router_lines(atlas: dict) -> list[str]:
    """The router flip fraction of every MoE row and reference (``[]`` when no row has one): the
    share of the probe's (token, slot) choices whose expert differs between the arms."""
    rows = [r for r in atlas["rows"] if r.get("router_flip")]
    refs = [(b, n, f) for b, v in atlas.get("backbones", {}).items() for n, f in (v.get("router_flip") or {}).items()]
    if not rows and not refs:
        return []
    lines = [
        "",
        "Router flip fraction (MoE rows): the share of the probe's (token, slot) choices that arm a sends to "
        "another expert than arm b at the last probed step, median over replicates (each in brackets):",
    ]
    lines += [f"- {r['optimization']} ({r['backbone']}): {_flip(r['router_flip'])}" for r in rows]
    lines += [f"- reference {n} ({b}): {_flip(f)}" for b, n, f in refs]
    return lines


def rank_lines(atlas: dict) -> list[str]:
    """Each multi-process row's cost per rank (``cost.ranks``; ``[]`` when no row has one): the
    median step seconds and peak step memory of every rank of each arm."""
    rows = [r for r in atlas["rows"] if (r.get("cost") or {}).get("ranks")]
    if not rows:
        return []
    lines = [
        "",
        "Per rank (rows whose arms train as their own jobs, one process or more; median over the steps after the "
        "warm-up, every replicate; the arms ran at different times, so their time ratio is not a speed-up "
        "measured under one load):",
    ]
    for r in rows:
        arms = "; ".join(_arm_ranks(arm, ranks) for arm, ranks in r["cost"]["ranks"].items())
        lines.append(f"- {r['optimization']} ({r['backbone']}): {arms}")
    return lines


def _arm_ranks(arm: str, ranks: list[dict]) -> str:
    seconds = ", ".join("-" if r.get("seconds") is None else f"{r['seconds']:.3g} s" for r in ranks)
    memory = ", ".join("-" if r.get("peak_bytes") is None else f"{r['peak_bytes'] / 2**20:.0f} MiB" for r in ranks)
    return f"{arm} {len(ranks)} rank{'s' if len(ranks) > 1 else ''}: {seconds} a step, {memory} peak"


def _flip(flip: dict) -> str:
    each = ", ".join(f"{100 * x:.3g}%" for x in flip.get("replicates") or [])
    return f"{100 * flip['final']:.3g}% at step {flip.get('step', '?')} ({each})"


def _placeable(row: dict) -> bool:
    return (row.get("dose_ratio") or {}).get("log10") is not None and bool((row.get("cost") or {}).get("time_ratio"))


def _legend(atlas: dict) -> str:
    precision, reordering = _references(atlas, "dose_ratio") or "?", _references(atlas, "reordering")
    return (
        f"log10 dose ratio: log10(E_X / E_P) against the precision reference ({precision}), 0 by "
        "definition; below 0 perturbs less than low precision. time and memory: arm a (the optimization) over "
        "arm b, per step, medians in the same runs. vs reordering: log10(E_X / E_R) against a reordering of fp32 "
        f"sums ({reordering or 'none in this atlas'}): reordering_like when its interval ends at most "
        f"+{REORDERING_DEX:g} dex above it, beyond_reordering when it starts above that; (valid steps): read over "
        "every valid step, as X and R did not grow alike, a status only with every step on its side."
    )


def _reordering(r: dict | None) -> str:
    """``+0.31 [+0.12, +0.50] (6) reordering_like``; ``(valid steps)`` when read there (no window formed);
    the replicates that would decide an inconclusive one."""
    if not r:
        return "-"
    if r.get("log10") is None:
        return str(r.get("status") or "no reading")
    interval = f" [{_num(r.get('lo'))}, {_num(r.get('hi'))}]" if r.get("lo") is not None else ""
    needed = f", {r['replicates_needed']} replicates would decide" if r.get("replicates_needed") else ""
    where = " (valid steps)" if r.get("read_on") == "valid_steps" else ""
    return f"{_num(r['log10'])}{interval} ({r.get('replicates', '?')}) {r.get('status')}{where}{needed}"


def _coherence(c: dict | None) -> str:
    """``1.01 [0.98, 1.04] (6) T=10 wanders``, the reading alone when not measurable, ``-`` when not recorded."""
    if not c:
        return "-"
    if c.get("C") is None:
        return str(c.get("reading") or "-")
    interval = f" [{c['lo']:.2f}, {c['hi']:.2f}]" if c.get("lo") is not None else ""
    return f"{c['C']:.2f}{interval} ({c.get('replicates', '?')}) T={c.get('steps', '?')} {c.get('reading')}"


def _references(atlas: dict, reading: str) -> str:
    """The references the rows' ``reading`` (``dose_ratio``, ``reordering``) is read against."""
    return ", ".join(sorted({(r.get(reading) or {}).get("reference") or "" for r in atlas["rows"]} - {""}))


def _num(x) -> str:
    return "-" if x is None else f"{x:+.2f}"


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _dose(x) -> str:
    if isinstance(x, dict):
        x = x.get("eps", x.get("dose"))
    return "-" if x is None else (f"{x:.1e}" if isinstance(x, (int, float)) else str(x))


def _needed(row: dict) -> str:
    dose, outcome = row.get("dose_ratio") or {}, row.get("outcome") or {}
    if dose.get("windows"):  # under 2 windows: no interval to plan from; what would give the others one
        return dose["windows"]["to_decide"]
    bits = []
    if dose.get("status") == "inconclusive":
        n = (dose.get("replicates_needed") or {}).get("exclude_0")
        bits.append(f"dose {n}" if n else "dose: none within 1000")
    if outcome.get("status") == "undecided":
        n = outcome.get("replicates_needed")
        bits.append(f"outcome {n}" if n else "outcome: none within 1000")
    return ", ".join(bits) or "-"
