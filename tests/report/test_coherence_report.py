"""The report states the studied pair's coherence with its interval, beside the dose ratio, in
report.md, report.html and summary.json, and draws its panel."""

from divergence.report import build_report
from tests.analysis.coherence_records import coherence_extra
from tests.analysis.synthetic import write_dose_study


def test_the_report_states_the_study_pairs_coherence_with_its_interval(tmp_path):
    study = write_dose_study(tmp_path / "study", replicates=3, horizon=60, extra=coherence_extra(0.0))
    report = build_report([study], tmp_path / "out", n_boot=50)
    c = report.summary["verdicts"][0]["coherence"]
    assert c["reading"] == "wanders" and c["replicates"] == 3 and c["steps"] == 9
    assert c["lo"] < c["C"] < c["hi"]
    sentence = f"C(T=9) = {c['C']:.2f} (95% interval {c['lo']:.2f} to {c['hi']:.2f} over 3 replicates"
    md = (tmp_path / "out" / "report.md").read_text()
    dose = md.index("## Dose ratio")
    assert dose < md.index(sentence) < md.index("## Pairs") and "it wanders" in md
    assert sentence in (tmp_path / "out" / "report.html").read_text()
    assert (tmp_path / "out" / report.summary["figures"]["coherence/flash-vs-baseline"]).is_file()
