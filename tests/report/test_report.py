"""``divergence report``: files written, input discovery, every bad-input path, wandb, the browser."""

import json
import re
from pathlib import Path

import pytest

from divergence.cli import main
from divergence.report import build_report
from divergence.report.wandb_log import flat_summary
from tests.analysis.synthetic import write_pair, write_study
from tests.report.browser import CHROMIUM, Browser

N_FIGURES = 5 + 3 + 4  # 2 trajectories, 2 relative, rates; heatmaps of 3 pairs (the control is all 0); 4 losses


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    return write_study(root, overrides={"flash-vs-baseline": {"spikes": (37, 120)}})


@pytest.fixture(scope="module")
def report(study, tmp_path_factory):
    return build_report([study], tmp_path_factory.mktemp("out"), n_boot=500)


def test_report_files_and_summary(report):
    out = report.out
    for name in ("report.html", "report.md", "summary.json", "trajectories.csv"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdicts"][0]["status"] == "bounded"
    assert set(summary["pairs"]) == {"flash-vs-baseline", "fp16-vs-fp32", "seed-vs-seed", "control"}
    assert summary["pairs"]["flash-vs-baseline"]["spikes"] == {"a": [37, 120], "b": []}
    assert len(summary["figures"]) == N_FIGURES
    for path in summary["figures"].values():
        assert (out / path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "heatmap/control" not in summary["figures"]  # all zero: nothing to colour


def test_markdown_links_every_figure_and_states_the_verdict(report):
    text = (report.out / "report.md").read_text()
    assert report.analysis.verdicts[0].headline in text
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(links) == N_FIGURES and all((report.out / link).is_file() for link in links)


def test_html_is_self_contained(report):
    html = (report.out / "report.html").read_text()
    sources = re.findall(r"src='([^']*)'", html)
    assert len(sources) == N_FIGURES and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "http://" not in html and "https://" not in html and "<script" not in html
    assert report.analysis.verdicts[0].headline.replace("'", "&#x27;") in html


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs headless Chromium at /usr/bin/chromium")
def test_html_opens_in_a_browser_without_errors_and_shows_its_figures(report, tmp_path):
    with Browser() as browser:
        page = browser.open(report.out / "report.html")
        images = page.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
        assert len(images) == N_FIGURES
        assert all(complete and width > 0 and height > 0 for complete, width, height in images), images
        assert page.evaluate("document.querySelector('.verdict .status').textContent") == "bounded"
        assert page.evaluate("document.body.scrollWidth <= window.innerWidth")  # no sideways scrolling
        assert page.errors() == []
        page.screenshot(tmp_path / "report.png")
        assert (tmp_path / "report.png").stat().st_size > 10_000


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs headless Chromium at /usr/bin/chromium")
def test_the_browser_check_catches_broken_pages(tmp_path):
    # the check above must be able to fail: a missing image and a console error are seen
    page_file = tmp_path / "broken.html"
    page_file.write_text("<html><body><img src='missing.png'><script>console.error('boom')</script></body></html>")
    with Browser() as browser:
        page = browser.open(page_file)
        assert page.evaluate("Array.from(document.images).map(i => i.naturalWidth)") == [0]
        assert any(e["method"] == "Runtime.consoleAPICalled" for e in page.errors())


def test_cli_reports_a_study_folder(study, tmp_path, capsys):
    assert main(["report", str(study), "--out", str(tmp_path / "r"), "--no-wandb", "--bootstrap", "200"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Bounded: flash vs baseline drifts") and "report.html" in out
    assert (tmp_path / "r" / "report.html").is_file() and not (tmp_path / "r" / "wandb").exists()


def test_cli_takes_run_folders_copied_from_elsewhere(tmp_path, capsys):
    # separate jobs: each pair run folder given directly, in different places
    write_pair(tmp_path / "job1" / "fb", "flash-vs-baseline", "optimization", 1e-4)
    write_pair(tmp_path / "job2" / "prec", "fp16-vs-fp32", "precision", 4e-4, seed=1)
    args = ["report", str(tmp_path / "job1" / "fb"), str(tmp_path / "job2"), "--out", str(tmp_path / "r"),
            "--no-wandb", "--bootstrap", "200"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("Inconclusive: flash vs baseline drifts") and "no seed pair" in out


def test_cli_logs_to_wandb_offline_by_default(study, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert main(["report", str(study), "--out", str(tmp_path), "--bootstrap", "200"]) == 0
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and f"wandb: {runs[0]}" in capsys.readouterr().out


def test_flat_summary_names_every_ratio(report):
    flat = flat_summary(report.summary)
    assert flat["verdict/flash-vs-baseline/status"] == "bounded"
    assert flat["ratio/flash-vs-baseline/wasserstein/fp16-vs-fp32/ratio"] == pytest.approx(
        report.summary["verdicts"][0]["metrics"]["wasserstein"]["ratios"][0]["ratio"])


def _bad_inputs(tmp_path: Path):
    empty = tmp_path / "empty"
    empty.mkdir()
    no_info = tmp_path / "no-info"
    write_pair(no_info, "p", "optimization", 1e-4)
    (no_info / "pair.json").unlink()
    broken = tmp_path / "broken"
    write_pair(broken, "p", "optimization", 1e-4)
    (broken / "pair.json").write_text("{not json")
    no_store = tmp_path / "no-store"
    write_pair(no_store, "p", "optimization", 1e-4)
    (no_store / "metrics.jsonl").unlink()
    twins = tmp_path / "twins"
    write_pair(twins / "one", "same", "optimization", 1e-4)
    write_pair(twins / "two", "same", "precision", 1e-4)
    return {
        "missing": ([str(tmp_path / "nowhere")], "not a folder"),
        "empty": ([str(empty)], "no pair runs here"),
        "no pair.json": ([str(no_info)], "pair.json: not found"),
        "unreadable pair.json": ([str(broken)], "pair.json: unreadable"),
        "no store": ([str(no_store)], "no metrics store here"),
        "duplicate names": ([str(twins)], "pair name 'same' is also used by"),
        "two dirs, no --out": ([str(no_info), str(broken)], "say where the report goes with --out"),
    }


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    for case, (dirs, message) in _bad_inputs(tmp_path).items():
        assert main(["report", *dirs, "--no-wandb"]) == 2, case
        err = capsys.readouterr().err
        assert err.startswith("divergence report: error: ") and err.count("\n") == 1, (case, err)
        assert message in err, (case, err)
