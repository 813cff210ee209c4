"""Shared arms against the pair-by-pair plan, side by side in one run: arm-steps, wall time, and the
verdicts and stores compared to the last digit.

    nice -n 10 python benchmarks/bench_shared_arms.py --out bench-shared            # the demo study
    nice -n 10 python benchmarks/bench_shared_arms.py --out bench-atlas --atlas flash grad-accumulation -- --replicates 2

Runs ``divergence study --out OUT/shared`` and ``divergence study --out OUT/pair-by-pair
--no-shared-arms`` (or ``divergence atlas --only NAMES`` both ways) one after the other, each in its
own process, with whatever extra arguments follow ``--``. Then prints each plan's arm-steps (from its
``arms.json``) and wall time, their ratios, and whether every pair run's ``metrics.jsonl`` is byte for
byte the same in both and the verdicts (``summary.json``; the atlas's rows) are equal to the last digit.
Writes ``OUT/shared_arms.json`` (after each plan, so a plan that fails keeps the one before). Run it
from a checkout nobody edits while it runs: each pair run imports the package as it starts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def run(command: list[str]) -> float:
    """Wall seconds of ``command`` (its output to ours); exits if it fails."""
    start = time.perf_counter()
    code = subprocess.call(command)
    if code:
        sys.exit(f"{' '.join(command)}: exit {code}")
    return time.perf_counter() - start


def stores(root: Path) -> dict[str, bytes]:
    """Every pair run's store under ``root``, by its path relative to ``root``."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("r*/metrics.jsonl"))}


def arm_steps(root: Path) -> dict:
    """``{"trained", "pair_by_pair"}`` summed over the ``arms.json`` files under ``root``."""
    total = {"trained": 0, "pair_by_pair": 0}
    for path in root.rglob("arms.json"):
        for key, value in json.loads(path.read_text())["arm_steps"].items():
            total[key] += value
    return total


def figures(root: Path, atlas: bool) -> str:
    """What a user reads: the atlas's rows (less their timings), or the study's verdicts."""
    if atlas:
        rows = json.loads((root / "atlas.json").read_text())["rows"]
        for row in rows:
            row.pop("cost", None)  # step times and memory: measured, never the same twice
        return json.dumps(rows, sort_keys=True)
    return json.dumps(json.loads((root / "summary.json").read_text())["verdicts"], sort_keys=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="a new folder: OUT/shared, OUT/pair-by-pair, shared_arms.json")
    parser.add_argument("--atlas", nargs="+", metavar="NAME", help="run `divergence atlas --only NAMES` instead")
    parser.add_argument("extra", nargs="*", help="after --: more arguments for both runs")
    args = parser.parse_args()
    out = Path(args.out)
    base = [sys.executable, "-m", "divergence"]
    base += ["atlas", "--only", *args.atlas] if args.atlas else ["study"]
    plans = {"shared": [], "pair-by-pair": ["--no-shared-arms"]}
    result = {"command": " ".join(["divergence", *base[3:], *args.extra]), "plans": {}}
    for name, flags in plans.items():
        seconds = run([*base, "--out", str(out / name), "--quiet", "--no-wandb", *flags, *args.extra])
        result["plans"][name] = {"wall_seconds": round(seconds, 1), "arm_steps": arm_steps(out / name)}
        (out / "shared_arms.json").write_text(json.dumps(result, indent=1) + "\n")  # kept if the next plan fails
    shared, by_pair = (result["plans"][name] for name in plans)
    result["arm_steps_ratio"] = shared["arm_steps"]["trained"] / by_pair["arm_steps"]["trained"]
    result["wall_ratio"] = shared["wall_seconds"] / by_pair["wall_seconds"]
    same_stores = stores(out / "shared") == stores(out / "pair-by-pair")
    same_figures = figures(out / "shared", bool(args.atlas)) == figures(out / "pair-by-pair", bool(args.atlas))
    result["stores_bitwise_equal"], result["figures_equal"] = same_stores, same_figures
    result["pair_runs"] = len(stores(out / "shared"))
    (out / "shared_arms.json").write_text(json.dumps(result, indent=1) + "\n")
    for name, plan in result["plans"].items():
        steps = plan["arm_steps"]
        print(f"{name:>13}: {steps['trained']} arm-steps trained, {plan['wall_seconds']:.0f} s wall")
    print(
        f"shared / pair-by-pair: arm-steps {result['arm_steps_ratio']:.2f}x, wall {result['wall_ratio']:.2f}x; "
        f"{result['pair_runs']} stores bitwise equal: {same_stores}; verdicts equal: {same_figures}"
    )
    return 0 if same_stores and same_figures else 1


if __name__ == "__main__":
    sys.exit(main())
