"""The router panel: an MoE study's report draws the flip fraction beside E(t) and says
it in a sentence; a study without MoE pairs has neither."""

import json

import pytest

from divergence.report import build_report
from tests.analysis.synthetic import write_dose_study

FLIPS = {"optimization": 0.04, "control": 0.0}  # at the last probed step


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """An MoE study of the pair under study, the seed pair (no router record) and the control, two replicates;
    a dense study of one replicate of the pair under study and the control (each pair more is ~1 s of figures)."""
    root = tmp_path_factory.mktemp("router")
    moe = write_dose_study(root / "moe", replicates=2, horizon=40, precision=None, router=FLIPS)
    dense = write_dose_study(root / "dense", replicates=1, horizon=40, seed=False, precision=None)
    return build_report([moe], root / "moe-report", n_boot=50), build_report([dense], root / "dense-report", n_boot=50)


def test_an_moe_study_has_the_panel_and_its_sentence(reports):
    moe, _ = reports
    assert (moe.out / moe.summary["figures"]["router_flip"]).read_bytes()[:4] == b"\x89PNG"
    html, md = (moe.out / "report.html").read_text(), (moe.out / "report.md").read_text()
    assert "<h3>Router</h3>" in html and "### Router" in md and "figures/router_flip.png" in md
    # the optimization pair flipped 4% at its last probed step (step 40), in both replicates
    assert "flash-vs-baseline: 4% of choices flipped (4%, 4%)" in md
    # drops fall in training: each arm's at the first and the last probed step, not a mean over them
    assert (
        "the capacity limit dropped 2% of arm a's choices in the training batch of step 0 and 1% in that of "
        "step 40, arm b's 4% and 2% (medians over replicates)"
    ) in md
    assert "control: 0% of choices flipped" in md and "seed-vs-seed:" not in md  # no record, no line
    pairs = json.loads((moe.out / "summary.json").read_text())["pairs"].values()
    flash = next(p for p in pairs if p["name"] == "flash-vs-baseline")
    assert flash["router"]["step"] == [0, 10, 20, 30, 40]
    assert flash["router"]["flip"] == pytest.approx([0, 0.01, 0.02, 0.03, 0.04])
    assert next(p for p in pairs if p["name"] == "seed-vs-seed")["router"] is None


def test_a_study_without_moe_pairs_has_no_router_panel(reports):
    _, dense = reports
    assert "router_flip" not in dense.summary["figures"] and not (dense.out / "figures" / "router_flip.png").exists()
    html, md = (dense.out / "report.html").read_text(), (dense.out / "report.md").read_text()
    assert "Router" not in html and "Router" not in md
    assert all(p["router"] is None for p in dense.summary["pairs"].values())
