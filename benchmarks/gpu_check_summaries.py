"""Read what each part of ``gpu_check.py`` left in its folder, and say it in words and tables.

``summarize(name, folder)`` returns the part's numbers (a JSON-able dict) and raises when the
part left nothing to read; ``headline`` and ``details`` render them for ``report.md``.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

REFERENCE_SEQ = 4096  # the microbenchmark part's reference length (gpu_check.build_parts)


def summarize(name: str, folder: Path) -> dict:
    folder = Path(folder)
    if name == "microbench":
        return _microbench(folder / "run" / "results.csv")
    if name in ("wasserstein", "sd15"):
        return json.loads((folder / "result.json").read_text())
    if name in ("control-deterministic", "control-nondeterministic", "ddp-watch"):
        return store_floor(folder / "pair")
    if name == "study":
        return _study(folder / "study" / "summary.json")
    raise ValueError(f"unknown part {name!r}")


def _microbench(path: Path) -> dict:
    """Max and mean |err| vs fp64 at the reference length, reference inputs, and ratios to baseline."""
    with open(path) as f:
        rows = [
            r
            for r in csv.DictReader(f)
            if r["seq_len"] == str(REFERENCE_SEQ)
            and r.get("input_dist", "normal:1") == "normal:1"
            and r["block_order"] in ("", "default")
        ]
    base = {r["precision"]: r for r in rows if r["impl"] == "baseline"}
    out = []
    for r in rows:
        b = base.get(r["precision"])
        tile = f"{r['block_q']}x{r['block_kv']}" if r["block_q"] else ""
        out.append(
            {
                "precision": r["precision"],
                "impl": r["impl"],
                "accumulate": r["accumulate"],
                "tile": tile,
                "max_abs_err": float(r["max_abs_err"]),
                "mean_abs_err": float(r["mean_abs_err"]),
                "ratio_max": _ratio(r["max_abs_err"], b["max_abs_err"]) if b else math.nan,
                "ratio_mean": _ratio(r["mean_abs_err"], b["mean_abs_err"]) if b else math.nan,
            }
        )
    if not out:
        raise ValueError(f"{path}: no rows at seq {REFERENCE_SEQ}")
    return {"seq_len": REFERENCE_SEQ, "rows": out}


def store_floor(pair: Path) -> dict:
    """Largest whole-model difference over a pair's committed tracked steps (0 means bitwise equal)."""
    from divergence.store import MetricsStore

    stores = sorted(Path(pair).rglob("metrics.jsonl"), key=lambda p: len(p.parts))
    if not stores:
        raise FileNotFoundError(f"no metrics.jsonl under {pair}")
    steps = MetricsStore(stores[0].parent).step_records()
    tracked = [s for s in steps if s.get("tracked")]
    if not tracked:
        raise ValueError(f"{stores[0]}: no tracked step")
    worst = lambda key: max((float(s.get(key) or 0.0) for s in tracked), default=0.0)  # noqa: E731
    out = {
        "steps": len(steps),
        "tracked_steps": len(tracked),
        "last_step": steps[-1]["step"],
        "max_abs_diff": worst("max_abs_diff"),
        "rel_l2": worst("rel_l2"),
        "loss_diff": max((abs(float(s.get("loss_diff") or 0.0)) for s in steps), default=0.0),
    }
    out["exactly_zero"] = out["max_abs_diff"] == 0.0 and out["loss_diff"] == 0.0
    return out


def _study(path: Path) -> dict:
    data = json.loads(path.read_text())
    verdicts = data.get("verdicts") or []
    return {
        "schema": data.get("schema"),
        "verdicts": [{k: v.get(k) for k in ("status", "headline", "dose_ratio") if k in v} for v in verdicts],
        "keys": sorted(data),
    }


def headline(name: str, r: dict) -> str:
    """One short line for the status table."""
    if not r:
        return ""
    if name == "microbench":
        picks = [x for x in r["rows"] if x["precision"] == "bf16" and x["impl"] != "baseline"]
        return "bf16 L=4096, max err / baseline: " + ", ".join(f"{_name(x)} {_x(x['ratio_max'])}" for x in picks[:4])
    if name == "wasserstein":
        return "; ".join(
            f"{_n(g['n'])}: "
            + (
                f"{g['seconds']:.2f} s, {g['peak_gib']:.1f} GiB peak (CPU est. {g['cpu_extrapolated_s']:.0f} s)"
                if "seconds" in g
                else g.get("error", "?")
            )
            for g in r["gpu"]
        )
    if name == "sd15":
        return (
            f"arm {r['one_arm']['step_s']:.2f} s/step ({r['one_arm']['peak_gib']:.0f} GiB); pair "
            f"{r['pair']['step_s']:.2f} s/step ({r['pair']['peak_gib']:.0f} GiB); tracking "
            f"x{r['tracking_overhead_every_10']:.3f} (every 10), x{r['tracking_overhead_every_1']:.2f} (every 1)"
        )
    if name == "study":
        return "; ".join(f"{v.get('status')}: {v.get('headline')}" for v in r["verdicts"]) or "no verdicts"
    return (
        "exactly zero" if r["exactly_zero"] else f"max |a-b| {r['max_abs_diff']:.3g}, rel_l2 {r['rel_l2']:.3g}"
    ) + f" over {r['tracked_steps']} tracked steps"


def details(name: str, r: dict) -> list[str]:
    """Markdown lines: a table where the part has one, else its headline."""
    if not r:
        return []
    if name == "microbench":
        lines = [
            f"Seq {r['seq_len']}, N(0, 1) inputs, errors vs the fp64 golden value; ratio = over baseline "
            "in the same format. Kernels against the re-implementation at their real tiles.",
            "",
            "| format | implementation | max err | mean err | / baseline (max) | / baseline (mean) |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {x['precision']} | {_name(x)} | {x['max_abs_err']:.3g} | {x['mean_abs_err']:.3g} | "
            f"{_x(x['ratio_max'])} | {_x(x['ratio_mean'])} |"
            for x in r["rows"]
        ]
        return lines
    if name == "wasserstein":
        c = r["cpu"]
        lines = [
            f"CPU path measured at {_n(c['n'])} elements: {c['seconds']:.2f} s ({c['threads']} threads); "
            "larger sizes extrapolated linearly per element (a lower bound: the sort is n log n).",
            "",
            "| elements | GPU s | peak GiB | inputs GiB | CPU s (extrapolated) | speed-up |",
            "|---|---|---|---|---|---|",
        ]
        for g in r["gpu"]:
            lines.append(
                f"| {_n(g['n'])} | {g['seconds']:.3f} | {g['peak_gib']:.2f} | {g['inputs_gib']:.2f} | "
                f"{g['cpu_extrapolated_s']:.1f} | {g['speedup_vs_cpu']:.0f}x |"
                if "seconds" in g
                else f"| {_n(g['n'])} | {g.get('error', '?')} | | | {g['cpu_extrapolated_s']:.1f} | |"
            )
        return lines
    if name == "sd15":
        return [
            f"{r['params'] / 1e6:.0f}M trainable parameters, batch {r['batch']}, resolution {r['resolution']}, "
            f"{r['precision']}, {r['steps']} timed steps; random weights, latents encoded once before timing.",
            "",
            "| stage | s/step | peak GiB |",
            "|---|---|---|",
            f"| one arm | {r['one_arm']['step_s']:.3f} | {r['one_arm']['peak_gib']:.1f} |",
            f"| lockstep pair | {r['pair']['step_s']:.3f} | {r['pair']['peak_gib']:.1f} |",
            f"| one whole-model comparison | {r['compare_s']:.3f} | {r['compare_peak_gib']:.1f} |",
            "",
            f"Pair / two arms: {r['pair_over_two_arms']:.3f}. Tracking overhead (1 + compare / (k x pair step)): "
            f"every 10: {r['tracking_overhead_every_10']:.3f}; every 1: {r['tracking_overhead_every_1']:.3f}.",
        ]
    return [headline(name, r)]


def _name(x: dict) -> str:
    if x["impl"] != "flash":
        return x["impl"]
    return f"re-impl {x['tile']} " + ("all-low" if x["accumulate"] == "none" else f"{x['accumulate']}-acc")


def _ratio(a, b) -> float:
    a, b = float(a), float(b)
    return a / b if b else math.nan


def _x(r: float) -> str:
    return "n/a" if math.isnan(r) else f"{r:.2f}x"


def _n(n: float) -> str:
    return f"{n:.0e}".replace("e+0", "e")
