"""The report's wandb run: filed with the study's runs, its summary under report/, its inputs named."""

from divergence.report.wandb_log import report_group
from divergence.loggers.wandb_artifacts import store_artifact

from .runfile import history_keys, logged_artifacts, run_files, run_info, summary_values


def test_the_report_run_is_in_the_pairs_group_with_its_summary_under_report(report_run, shadow_pair):
    out, where = report_run
    [path] = run_files(out)
    assert where == str(path.parent)
    info = run_info(path)
    assert info["job_type"] == "report" and info["group"] == shadow_pair[0].name and "report" in info["tags"]
    summary = summary_values(path)
    assert summary["report/dose_ratio/flash_vs_baseline/log10"] == -3.9
    assert (summary["report/dose_ratio/flash_vs_baseline/lo"], summary["report/dose_ratio/flash_vs_baseline/hi"]) == (
        -4.2,
        -3.6,
    )
    assert summary["report/dose_ratio/flash_vs_baseline/replicates"] == 3
    assert summary["report/dose_ratio/flash_vs_baseline/window_end"] == 40
    assert summary["report/outcome/flash_vs_baseline/margin"] == 0.01
    assert summary["report/status/flash_vs_baseline"] == "bounded"
    assert "report/dose_ratios" in history_keys(path)
    assert "report" in logged_artifacts(path).values()


def test_offline_the_report_names_the_store_artifacts_it_read(report_run, shadow_pair):
    """wandb refuses use_artifact offline: the inputs' names and digests go into the config,
    and they are those of the artifact the pair run logged (same content, same digest)."""
    out, _ = report_run
    [path] = run_files(out)
    artifact = store_artifact(shadow_pair[0])
    assert run_info(path)["config"]["inputs"] == {artifact.name: artifact.digest}


def test_the_report_group_is_the_study_folder(tmp_path):
    study = tmp_path / "study-x"
    assert report_group([study / "a", study / "b"], tmp_path / "r") == "study-x"
    assert report_group([study / "a"], tmp_path / "r") == "a"
