"""``divergence report``: files written, input discovery, every bad-input path, wandb, the browser."""

import json
import math
import re
from pathlib import Path

import pytest

from divergence.cli import main
from divergence.report import build_report
from divergence.report.wandb_log import flat_summary
from tests.analysis.synthetic import write_dose_study, write_pair
from tests.report.browser import CHROMIUM, Browser

# log E, dose ratio, phi, outcome; 2 trajectories, 2 relative; heatmaps and losses of 4 pairs
N_FIGURES = 4 + 4 + 4 + 4


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    # 3 replicates; a control that is not exactly zero, 100x below the pair under study
    return write_dose_study(tmp_path_factory.mktemp("study"), replicates=3, horizon=120, control=1e-10)


@pytest.fixture(scope="module")
def report(study, tmp_path_factory):
    return build_report([study], tmp_path_factory.mktemp("out"), n_boot=200)


def test_report_files_and_summary(report):
    out = report.out
    for name in ("report.html", "report.md", "summary.json", "trajectories.csv"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schema"] == 2
    v = summary["verdicts"][0]
    assert v["status"] == "bounded" and v["dose_ratio"]["replicates"] == 3
    assert abs(v["dose_ratio"]["log10"] + 3) < 0.2 and v["dose_ratio"]["lo"] < -3 < v["dose_ratio"]["hi"]
    assert "times the run-to-run floor of this hardware" in v["headline"]
    assert {"flash-vs-baseline", "flash-vs-baseline#2", "bf16-vs-fp32#1", "control"} <= set(summary["pairs"])
    assert len(summary["figures"]) == N_FIGURES
    for path in summary["figures"].values():
        assert (out / path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = (out / "trajectories.csv").read_text().splitlines()
    assert rows[0].endswith(",replicate,rel_l2,probe_rel_diff") and len(rows) > 10 * 13


def test_markdown_links_every_figure_and_states_the_verdict(report):
    text = (report.out / "report.md").read_text()
    assert report.analysis.verdicts[0].headline in text
    assert "### Every estimate" in text and "pooled (3)" in text
    assert text.index("## Dose ratio") < text.index("## Growth since the first tracked step")
    assert "legacy" not in text.lower() and "growth_rates" not in text  # the slope ratio and its figure are gone
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
    assert main(["report", str(study), "--out", str(tmp_path / "r"), "--no-wandb"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Bounded: flash vs baseline perturbs training") and "report.html" in out
    assert (tmp_path / "r" / "report.html").is_file() and not (tmp_path / "r" / "wandb").exists()


def test_cli_takes_run_folders_copied_from_elsewhere(study, tmp_path, capsys):
    # separate jobs: each pair run folder given directly; replicates of one pair grouped by name
    runs = [study / f"{name}-r{r}" for name in ("flash-vs-baseline", "bf16-vs-fp32") for r in range(2)]
    args = ["report", *map(str, runs), "--out", str(tmp_path / "r"), "--no-wandb"]
    assert main(args) == 0
    out = capsys.readouterr().out
    # no seed pair: the outcome has no margin and is undecided; the status is the dose's alone
    assert out.startswith("Bounded: flash vs baseline perturbs training") and "no seed pair" in out
    assert "outcome undecided" in out and "no seed margin" in out
    assert "2 replicates" in out


def test_cli_logs_to_wandb_offline_by_default(study, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    runs = [str(study / "flash-vs-baseline-r0"), str(study / "bf16-vs-fp32-r0")]  # two runs: few figures, fast
    assert main(["report", *runs, "--out", str(tmp_path)]) == 0
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and f"wandb: {runs[0]}" in capsys.readouterr().out


def test_flat_summary_names_every_ratio(report):
    flat = flat_summary(report.summary)
    assert flat["verdict/flash-vs-baseline/status"] == "bounded"
    assert flat["dose_ratio/flash-vs-baseline/log10"] == report.summary["verdicts"][0]["dose_ratio"]["log10"]
    assert "legacy_slope_ratio" not in report.summary and not any(k.startswith("legacy_ratio/") for k in flat)


def test_the_legacy_bootstrap_flags_are_accepted_said_gone_and_ignored(study, tmp_path, capsys):
    # --bootstrap and --seed drew the legacy slope ratio's interval: a script that passes them still runs
    runs = [str(study / "flash-vs-baseline-r0"), str(study / "bf16-vs-fp32-r0")]
    assert main(["report", *runs, "--out", str(tmp_path), "--no-wandb", "--bootstrap", "50", "--seed", "3"]) == 0
    err = capsys.readouterr().err
    assert "--bootstrap is gone" in err and "--seed is gone" in err
    assert "bootstrap" not in main_help("report")


def main_help(command: str) -> str:
    from divergence.cli import build_parser

    return build_parser()._subparsers._group_actions[0].choices[command].format_help()


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
    bad_replicate = tmp_path / "bad-replicate"
    write_pair(bad_replicate, "p", "optimization", 1e-4)
    (bad_replicate / "pair.json").write_text(
        json.dumps(json.loads((bad_replicate / "pair.json").read_text()) | {"replicate": -1})
    )
    return {
        "missing": ([str(tmp_path / "nowhere")], "not a folder"),
        "empty": ([str(empty)], "no pair runs here"),
        "no pair.json": ([str(no_info)], "pair.json: not found"),
        "unreadable pair.json": ([str(broken)], "pair.json: unreadable"),
        "no store": ([str(no_store)], "no metrics store here"),
        "duplicate names": ([str(twins)], "pair name 'same' replicate 0 is also used by"),
        "bad replicate": ([str(bad_replicate)], "'replicate' is -1; it must be an integer >= 0"),
        "bad calibration": (
            [str(no_info.parent / "twins" / "one"), "--calibration", str(broken / "pair.json")],
            "unreadable calibration",
        ),
        "two dirs, no --out": ([str(no_info), str(broken)], "say where the report goes with --out"),
    }


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    for case, (dirs, message) in _bad_inputs(tmp_path).items():
        assert main(["report", *dirs, "--no-wandb"]) == 2, case
        err = capsys.readouterr().err
        assert err.startswith("divergence report: error: ") and err.count("\n") == 1, (case, err)
        assert message in err, (case, err)


def test_degenerate_stores_give_a_report_not_a_traceback(tmp_path):
    # a constant pair under study, a reference that is exactly zero, NaN layers, one replicate
    study = write_pair(tmp_path / "s" / "flat", "flat", "optimization", 0.0, offset=0.3, nan_layer=2)
    write_pair(tmp_path / "s" / "zero", "zero-ref", "precision", 0.0, noise=0.0)
    write_pair(tmp_path / "s" / "seed", "seed", "seed", 1e-4, offset=0.01, nan_layer=0)
    report = build_report([tmp_path / "s"], tmp_path / "out", n_boot=100)
    v = report.summary["verdicts"][0]
    assert v["status"] == "no_verdict" and "cannot serve as the yardstick" in v["headline"] and study.is_dir()
    assert v["dose_ratio"]["log10"] is None and (report.out / "report.html").is_file()
    assert any("layers hold NaN/inf" in w for w in report.summary["warnings"])


def test_a_calibration_next_to_the_inputs_is_found_and_stated(study, tmp_path):
    from divergence.analysis import analyze
    from divergence.analysis.calibration import evaluate
    from divergence.report.build import load_calibration
    from divergence.report.inputs import load_pairs
    from tests.analysis.synthetic import dose_pair

    ladder = {
        eps: [dose_pair(f"grad-noise-{eps:g}", "optimization", eps, replicate=r, horizon=120) for r in range(3)]
        for eps in (1e-9, 1e-8, 1e-7, 1e-6, 1e-5)
    }
    seeds = [dose_pair("seed-vs-seed", "seed", 0.0, replicate=r, horizon=120) for r in range(3)]
    (tmp_path / "calibration.json").write_text(json.dumps(evaluate(ladder, seeds, horizons=(60, 120))))
    runs = tmp_path / "runs"
    runs.symlink_to(study)
    calibration = load_calibration(None, [runs])  # beside the study folder
    assert calibration is not None and calibration == load_calibration(tmp_path / "calibration.json", [])
    v = analyze(load_pairs([runs]), n_boot=100, calibration=calibration).verdicts[0]
    assert v.dose.equivalent is not None and abs(math.log10(v.dose.equivalent) + 8) < 0.3
    assert "It perturbs training like a relative gradient noise of" in v.headline


def test_a_study_laid_out_as_pair_and_replicate_folders_is_found(study, tmp_path):
    # divergence study writes OUT/<pair>/r<k>/ when it trains replicates: two levels down. The report reads
    # its runs with load_pairs (build_report's first step; the report of this study: the fixture above)
    import shutil

    from divergence.report.inputs import load_pairs

    nested = tmp_path / "study"
    for run in sorted(p for p in study.iterdir() if p.is_dir()):
        name, _, replicate = run.name.rpartition("-r")
        shutil.copytree(run, nested / name / f"r{replicate}")

    def found(root):
        return sorted((p.name, p.replicate, p.category, p.steps.tolist(), p.layers) for p in load_pairs([root]))

    assert found(nested) == found(study)
    assert [(name, r) for name, r, *_ in found(nested) if name == "flash-vs-baseline"] == [
        ("flash-vs-baseline", r) for r in range(3)
    ]
