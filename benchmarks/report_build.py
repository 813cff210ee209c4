"""What building reports costs, the old way and the new, side by side on one synthetic study.

    python benchmarks/report_build.py [--replicates 6] [--horizon 200] [--rows 4] [--workers 2] [--study DIR]

Writes a study's pair runs (tests/analysis/synthetic.py ``write_dose_study``: the pair under study,
the precision, seed, control and reordering references, ``--replicates`` each; at 6, 25 runs, about
the 19-31 of an atlas backbone), or reads ``--study DIR`` (a study folder such as an atlas's
``OUT/<backbone>``, read only), then:

1. Figures: analyses it once and draws every report figure (``all_figures``) the old way
   (``Figure.tight_layout`` then ``savefig`` on a figure without a canvas: the placeholder layout
   engine ``tight_layout`` leaves makes ``savefig`` draw the figure twice, and the canvas switch
   prints a third time to get a renderer) and the new way (``divergence.report.canvas.save``: the
   tight layout engine run directly, one draw), checks the PNGs are pixel-identical and prints the
   CPU seconds (``time.process_time``) of each and their ratio.
2. The atlas's report phase: ``--rows`` reports over the whole study (an atlas row's report reads
   its pair and all the backbone's references), built as before (one at a time, every run read
   and every figure drawn the old way), one at a time now (``build_reports``: runs read once,
   figures drawn once) and ``--workers`` at a time (worker processes), with the wall seconds and
   the CPU seconds of this process and its workers, and whether every way wrote the same
   summaries. The wall ratio is what the atlas gains; on a machine busy with other work it is
   noisy (two workers on two busy cores gain nothing), the CPU seconds less so.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from divergence.analysis import analyze  # noqa: E402
from divergence.atlas.runner import build_reports  # noqa: E402
from divergence.report import canvas, dose_figures, figures, router_panel  # noqa: E402
from divergence.report.inputs import load_pairs  # noqa: E402

MODULES = (canvas, figures, dose_figures, router_panel)  # canvas: its finish saves


def old_subplots(*grid, figsize, **kwargs):
    """The figure as it was made: no canvas of its own (``FigureCanvasBase``)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(*grid, **kwargs)


def old_save(fig, path: Path, dpi: int, rect=(0, 0, 1, 1)) -> Path:
    """The figure as it was written: ``tight_layout`` then ``savefig``."""
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=dpi)
    return path


@contextmanager
def old_way():
    """Every report figure module drawing with the old ``subplots`` and ``save``."""
    saved = [(m, m.subplots, m.save) for m in MODULES]
    for m in MODULES:
        m.subplots, m.save = old_subplots, old_save
    try:
        yield
    finally:
        for m, subplots, save in saved:
            m.subplots, m.save = subplots, save


def cpu() -> float:
    """CPU seconds of this process and its finished children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def pixels(folder: Path) -> dict[str, np.ndarray]:
    from PIL import Image

    return {p.name: np.asarray(Image.open(p)) for p in sorted(folder.glob("*.png"))}


def bench_figures(study: Path, work: Path) -> None:
    pairs = load_pairs([study])
    analysis = analyze(pairs, n_boot=200, seed=0)
    times = {}
    for way in ("old", "new", "old again", "new again"):  # twice each: the first draw warms caches
        out = work / "figures" / way.split()[0]
        start = time.process_time()
        if way.startswith("old"):
            with old_way():
                drawn = figures.all_figures(analysis, out)
        else:
            drawn = figures.all_figures(analysis, out)
        times[way] = time.process_time() - start
    old, new = pixels(work / "figures" / "old"), pixels(work / "figures" / "new")
    same = old.keys() == new.keys() and all(np.array_equal(old[k], new[k]) for k in old)
    old_s, new_s = min(times["old"], times["old again"]), min(times["new"], times["new again"])
    print(f"figures: {len(pairs)} pair runs, {len(drawn)} PNGs, pixel-identical old/new: {same}")
    print(f"  old (tight_layout + savefig): {old_s:6.2f} s CPU")
    print(f"  new (canvas.save, one draw):  {new_s:6.2f} s CPU   old/new = {old_s / new_s:.2f}x")
    if not same:
        raise SystemExit("the new figures differ from the old: not a like-for-like benchmark")


def bench_atlas(study: Path, work: Path, rows: int, workers: int) -> None:
    from divergence.report import build_report

    def before(builds):  # the old report phase: one at a time, every run read and drawn anew
        with old_way():
            return [build_report(inputs, folder).summary for inputs, folder in builds]

    ways = {
        "before (one at a time, old figures)": before,
        "one at a time, runs read once": lambda builds: build_reports(builds, None, workers=1),
        f"{workers} worker processes": lambda builds: build_reports(builds, None, workers=workers),
    }
    results = {}
    for i, (way, build) in enumerate(ways.items()):
        builds = [([study], work / f"atlas-{i}" / f"row{r}") for r in range(rows)]
        wall, used = time.perf_counter(), cpu()
        summaries = build(builds)
        strip = [json.dumps({k: v for k, v in s.items() if k != "generated"}) for s in summaries]
        results[way] = (time.perf_counter() - wall, cpu() - used, strip)
    first = next(iter(results.values()))
    same = all(r[2] == first[2] for r in results.values())
    print(f"atlas report phase: {rows} reports over the whole study, same summaries every way: {same}")
    for way, (wall, used, _) in results.items():
        print(f"  {way:38s} {wall:6.1f} s wall, {used:6.1f} s CPU   wall ratio = {first[0] / wall:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicates", type=int, default=6)
    p.add_argument("--horizon", type=int, default=200)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--study", type=Path, help="a study folder to read instead of a synthetic one (read only)")
    p.add_argument("--skip-atlas", action="store_true", help="only the figures")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        study = args.study
        if study is None:
            from tests.analysis.synthetic import write_dose_study

            study = write_dose_study(
                work / "study", replicates=args.replicates, horizon=args.horizon, reordering=1e-7, router=None
            )
        bench_figures(study, work)
        if not args.skip_atlas:
            bench_atlas(study, work, args.rows, args.workers)


if __name__ == "__main__":
    main()
