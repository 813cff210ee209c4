"""What a pair's wandb run holds, read back from the offline run file wandb wrote."""

from divergence.loggers.step_logging import summary_of
from divergence.loggers.wandb_artifacts import store_artifact_name

from .runfile import defined_metrics, history_keys, logged_artifacts, run_files, run_info, summary_values


def test_the_run_is_filed_with_group_job_type_tags_and_the_resolved_recipe(shadow_pair):
    out, _ = shadow_pair
    [path] = run_files(out)
    info = run_info(path)
    assert info["group"] == "flash-vs-baseline" and info["job_type"] == "pair" and info["project"] == "divergence"
    assert {
        "pair:flash-vs-baseline",
        "category:optimization",
        "replicate:0",
        "a:attention=shadow",
        "b:attention=baseline",
        "nightly",
    } <= set(info["tags"]), info["tags"]
    config = info["config"]
    assert config["name"] == "flash-vs-baseline" and config["tracking"]["every"] == 1
    assert config["recipes"]["a"]["train"]["max_steps"] == 2
    assert config["recipes"]["a"]["attention"]["name"] == "shadow"


def test_every_key_family_is_defined_on_the_step_axis_with_its_summary(shadow_pair):
    out, _ = shadow_pair
    [path] = run_files(out)
    defined, keys = defined_metrics(path), history_keys(path)
    media = {"divergence/layers", "divergence/top_layers", "divergence/heatmap"}  # tables and images
    scalars = {k for k in keys - media if not k.startswith(("trainer/", "_"))}
    families = {"divergence/model/", "divergence/kind/", "train/loss_", "train/spike_", "attention/"}
    assert all(any(k.startswith(f) for k in scalars) for f in families), scalars
    for key in scalars:
        spec = defined[key]  # by name, not only a glob
        assert spec["step_metric"] == "trainer/global_step", key
        assert spec["summary"] == {summary_of(key)}, (key, spec)
    assert defined["divergence/model/max_abs_diff"]["summary"] == {"max"}
    assert defined["train/spike_a"]["summary"] == {"max"}
    assert defined["divergence/model/wasserstein"]["summary"] == {"last"}
    assert defined["attention/a/max_abs_diff/all"]["summary"] == {"max"}
    summary = summary_values(path)
    assert set(summary["divergence/model/max_abs_diff"]) == {"max"}


def test_keys_are_sortable_and_per_layer_values_are_compact(shadow_pair):
    out, _ = shadow_pair
    [path] = run_files(out)
    keys = history_keys(path)
    # wandb's run table sorts and filters by [_a-zA-Z][_a-zA-Z0-9]* segments: no dots, no hyphens
    assert all(
        segment and not segment[0].isdigit() and segment.replace("_", "a").isalnum()
        for key in keys
        for segment in key.split("/")
        if key != "_step" and not key.startswith("_")
    )
    assert not any(k.startswith(("divergence/wasserstein/", "divergence/max_abs_diff/")) for k in keys)
    assert {"divergence/top_layers", "divergence/heatmap", "divergence/layers"} <= keys


def test_the_store_and_the_chosen_weights_are_artifacts(shadow_pair):
    out, _ = shadow_pair
    [path] = run_files(out)
    artifacts = logged_artifacts(path)
    assert artifacts[store_artifact_name(out)] == "store"
    assert artifacts["weights-flash-vs-baseline-step2"] == "model"


def test_an_offline_run_says_so_in_one_line_with_the_sync_command(shadow_pair):
    out, printed = shadow_pair
    [path] = run_files(out)
    lines = [line for line in printed.splitlines() if line.startswith("wandb:")]
    assert lines == [
        f"wandb: {path.parent} is an offline run (no WANDB_MODE, WANDB_API_KEY or `wandb login` "
        f"credentials); upload it later with: wandb sync {path.parent}"
    ]
