"""The report's files: one figure per pair whatever the names, a read-only
``--out`` in one line."""

import base64
import os
import subprocess

import pytest

from divergence.analysis import analyze
from divergence.cli import main
from divergence.report.dose_figures import dose_figures
from divergence.report.figures import heatmap, losses, shown_runs
from divergence.report.document import render_html, render_markdown
from tests.analysis.synthetic import dose_pair, write_pair

# two pairs under study whose names differ only where a file name cannot hold the character
TWINS = ("flash x", "flash_x")


def test_file_stems_differ_for_names_that_slug_alike():
    from divergence.recipe.names import file_stem

    stems = {file_stem(n) for n in ("flash x", "flash_x", "flash/x", "flash\nx", "flash_x ", "Flash x")}
    assert len(stems) == 6 and all(s.lower().startswith("flash_x") for s in stems)
    assert file_stem("flash x") == file_stem("flash x")  # stable: the same name, the same file


def test_pairs_whose_names_slug_alike_get_their_own_figures(tmp_path):
    pairs = [
        dose_pair(name, "optimization", eps, replicate=r, horizon=120)
        for name, eps in zip(TWINS, (1e-8, 1e-6))
        for r in range(2)
    ]
    pairs += [dose_pair("bf16-vs-fp32", "precision", 1e-5, replicate=r, horizon=120) for r in range(2)]
    analysis = analyze(pairs, n_boot=100)
    assert sorted(v.study for v in analysis.verdicts) == sorted(TWINS)
    out = tmp_path / "figures"
    out.mkdir()
    figures = dose_figures(analysis, out)  # the figures named after a pair (the others: see test_report.py)
    for pair in shown_runs(analysis)[:2]:
        figures |= {f"heatmap/{pair.name}": heatmap(pair, out), f"loss/{pair.name}": losses(pair, out)}
    html = render_html(analysis, figures, "now")
    markdown = render_markdown(analysis, figures, tmp_path, "now")
    drawn = [k for k in ("dose_ratio", "phi", "outcome", "loss", "heatmap") if figures[f"{k}/{TWINS[0]}"]]
    assert {"dose_ratio", "loss", "heatmap"} <= set(drawn), drawn
    for kind in drawn:
        first, second = (figures[f"{kind}/{name}"] for name in TWINS)
        assert first != second, kind  # two files, not one written twice
        assert first.read_bytes() != second.read_bytes(), kind  # each its own pair's picture
        for path in (first, second):
            assert base64.b64encode(path.read_bytes()).decode() in html, (kind, path.name)
            assert path.relative_to(tmp_path).as_posix() in markdown, (kind, path.name)


def _read_only(folder):
    """``folder`` and what is in it unwritable, even to root (who ignores permission bits)."""
    if os.geteuid() != 0:
        for path in (folder / "figures", folder):
            path.chmod(0o555)
        return lambda: [p.chmod(0o755) for p in (folder, folder / "figures")]
    done = subprocess.run(["chattr", "+i", str(folder / "figures"), str(folder)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"root cannot make a folder read-only here (chattr: {done.stderr.decode().strip()})")
    return lambda: subprocess.run(["chattr", "-i", str(folder), str(folder / "figures")], check=True)


def test_a_read_only_out_with_its_figures_folder_is_one_line(tmp_path, capsys):
    run = write_pair(tmp_path / "run", "p", "optimization", 1e-4)
    out = tmp_path / "report"
    (out / "figures").mkdir(parents=True)
    restore = _read_only(out)
    try:
        code = main(["report", str(run), "--out", str(out), "--no-wandb"])
    finally:
        restore()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("divergence report: error: ") and str(out) in err and "cannot write" in err, err
