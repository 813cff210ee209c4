"""Lockstep pairs: the control is exactly zero, a seed pair differs from step 0, flash drifts."""

import json
import math

import pytest
import torch

from divergence.checkpoints import open_checkpoint
from divergence.cli import main
from divergence.errors import TrainingDiverged
from divergence.training.lockstep import train_pair

from .helpers import DIT, PAIR_FAST, PAIRS, pair_recipe, step_records, store_lines, wandb_history


def test_control_pair_is_exactly_zero_at_every_step(tmp_path):
    train_pair(pair_recipe("control", "train.max_steps=4", "tracking.every=1"), tmp_path)
    steps = step_records(tmp_path)
    assert sorted(steps) == [0, 1, 2, 3, 4]
    for step, record in steps.items():
        assert record["tracked"] and record["max_abs_diff"] == 0.0 and record["wasserstein"] == 0.0, step
        if step:
            assert record["loss_a"] == record["loss_b"]
    tensors = [r for r in store_lines(tmp_path) if r["type"] == "tensor"]
    assert len(tensors) == 5 * steps[0]["tensors"] and all(r["max_abs_diff"] == 0.0 for r in tensors)
    info = json.loads((tmp_path / "pair.json").read_text())
    assert info["category"] == "control" and info["finished"] and info["last_step"] == 4


@pytest.fixture(scope="module")
def seed_pair(tmp_path_factory):
    """One seed pair, 2 steps, every step tracked, logged to an offline wandb run with per-layer scalars:
    read by the store's test and the wandb run's test (the same training)."""
    out = tmp_path_factory.mktemp("seed-pair")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("WANDB_MODE", raising=False)
        mp.delenv("WANDB_API_KEY", raising=False)
        mp.setenv("NETRC", str(out / "no-netrc"))  # no credentials: offline
        pair = ("train.max_steps=2", "tracking.every=1", "log.wandb=true", "log.per_layer_scalars=true")
        train_pair(pair_recipe("seed-vs-seed", *pair), out)
    return out


def test_seed_pair_differs_from_step_zero_on_identical_inputs(seed_pair):
    steps = step_records(seed_pair)
    assert steps[0]["wasserstein"] > 0 and steps[0]["max_abs_diff"] > 0
    assert math.isnan(steps[0]["loss_a"])  # no step trained yet
    kinds = steps[2]["kinds"]
    assert {"attn_q", "conv", "norm", "embedding"} <= set(kinds)


def test_flash_vs_baseline_drifts_apart_and_compare_reproduces_it(tmp_path, capsys):
    train_pair(
        pair_recipe(
            "flash-vs-baseline",
            "train.max_steps=4",
            "tracking.every=2",
            "tracking.dense=[]",  # steps 0, 2, 4 compared (the default tracks every one of the first 20)
            "tracking.coherence_every=0",  # its own test: tests/pairs/test_coherence_record.py
            "train.checkpoint_every=4",
        ),
        tmp_path,
    )
    steps = step_records(tmp_path)
    assert steps[0]["max_abs_diff"] == 0.0  # same init, same data: only the kernel differs
    # W grows 2.2x from step 2 to 4 (7.1e-9, 1.6e-8; 3.9e-8 at 8), on a CPU bitwise the same every run
    assert 0 < steps[2]["wasserstein"] and steps[2]["wasserstein"] < steps[4]["wasserstein"]
    # the saved checkpoints of step 4 give exactly the numbers the callback stored
    a, b = (tmp_path / arm / "checkpoints" / "step_000004.safetensors" for arm in "ab")
    assert main(["compare", str(a), str(b), "--json", str(tmp_path / "c.json"), "--quiet"]) == 0
    summary = json.loads((tmp_path / "c.json").read_text())["summary"]
    for metric in ("wasserstein", "max_abs_diff", "mean_abs_diff", "rms_diff", "rel_l2", "cosine"):
        assert summary[metric] == steps[4][metric], metric
    assert set(open_checkpoint(a).names) == set(open_checkpoint(b).names)


def test_export_writes_the_pair_store_flat(tmp_path, capsys):
    pair = pair_recipe("seed-vs-seed", *DIT, "train.max_steps=3", "tracking.every=2", "tracking.dense=[]")
    train_pair(pair, tmp_path)
    assert main(["export", str(tmp_path), "--csv", str(tmp_path / "m.csv")]) == 0
    lines = (tmp_path / "m.csv").read_text().splitlines()
    header = lines[0].split(",")
    assert header[:4] == ["step", "tensor", "module", "kind"] and "wasserstein" in header
    tracked = [s for s, r in step_records(tmp_path).items() if r["tracked"]]
    assert tracked == [0, 2, 3]
    assert len(lines) - 1 == len(tracked) * step_records(tmp_path)[0]["tensors"]


def test_wandb_offline_run_holds_the_per_layer_keys(seed_pair):
    rows = wandb_history(seed_pair)
    keys = set().union(*rows)
    assert {
        "divergence/model/wasserstein",
        "divergence/model/max_abs_diff",
        "train/loss_a",
        "train/loss_b",
        "divergence/wasserstein/unet_conv_in",
        "divergence/max_abs_diff/unet_conv_in",
        "divergence/kind/attn_q/wasserstein",
    } <= keys
    assert any(k.startswith("divergence/layers") for k in keys)
    assert any(k.startswith("divergence/heatmap/") for k in keys)


def test_nonfinite_loss_is_recorded_then_stops_the_run(tmp_path, monkeypatch):
    from divergence.training import arm as arm_module

    original = arm_module.Arm.training_step

    def poisoned(self, inputs, **kwargs):
        out = original(self, inputs, **kwargs)
        if self.name.endswith(".a") and inputs.step == 2:
            out.loss = torch.tensor(float("nan"))
        return out

    monkeypatch.setattr(arm_module.Arm, "training_step", poisoned)
    with pytest.raises(TrainingDiverged, match="arm a: loss is nan at step 3"):
        train_pair(pair_recipe("seed-vs-seed", *DIT, "train.max_steps=6", "tracking.every=1"), tmp_path)
    steps = step_records(tmp_path)
    assert sorted(steps) == [0, 1, 2, 3] and steps[3]["spike_a"] and not steps[3]["spike_b"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["arms.a=[{warp: 1}]"], "unknown variant 'warp'"),
        (["train.max_steps=0"], "train.max_steps"),
    ],
)
def test_bad_pair_input_through_the_cli(tmp_path, capsys, args, message):
    from .helpers import PAIRS

    code = main(["train", "--recipe", str(PAIRS / "seed-vs-seed.yaml"), "--out", str(tmp_path / "run"), *args])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_shadow_attention_logs_per_layer_output_deviation(tmp_path):
    """The paper's in-model comparison: arm a runs sdpa-flash and baseline on identical inputs (on the
    DiT's self- and cross-attention; the UNet's: tests/loggers' shadow_pair)."""
    pair = pair_recipe(
        "dit-flash-vs-baseline",
        "train.max_steps=4",
        "tracking.attention_every=2",
        "tracking.coherence_every=0",
        "arms.a=[{attention: {name: shadow, options: {primary: sdpa-flash, secondary: baseline}}}]",
    )
    train_pair(pair, tmp_path)
    lines = [json.loads(line) for line in (tmp_path / "attention.jsonl").read_text().splitlines()]
    assert {r["step"] for r in lines} == {2, 4} and {r["arm"] for r in lines} == {"a"}
    layers = {r["layer"] for r in lines}
    assert any("attn1" in name for name in layers) and any("attn2" in name for name in layers)
    assert all(0 <= r["mean_abs_diff"] <= r["max_abs_diff"] < 1e-3 and r["calls"] >= 1 for r in lines)


@pytest.mark.parametrize("name", sorted(p.stem for p in PAIRS.glob("*.yaml")))
def test_every_shipped_pair_shares_its_inputs(name):
    """The atlas's first full run died on grad-accumulation (4x4 vs 1x16 compared batch_size, not the
    global batch): every shipped pair passes the check the trainer makes before anything trains."""
    import yaml

    from divergence.training.pair_setup import check_shared_inputs

    own = (yaml.safe_load((PAIRS / f"{name}.yaml").read_text()).get("recipe") or {}).get("train") or {}
    keep = [f"train.batch_size={own['batch_size']}"] if "batch_size" in own else []  # a pair's own per-rank batch
    check_shared_inputs(pair_recipe(name, *keep))


def test_a_pair_whose_global_batches_differ_is_refused(tmp_path, capsys):
    args = ["arms.a=[{grad-accumulation: 2x4}]", "arms.b=[{grad-accumulation: 1x4}]"]
    code = main(["train", "--recipe", str(PAIRS / "grad-accumulation.yaml"), "--out", str(tmp_path / "r"), *args])
    err = capsys.readouterr().err
    assert code == 2 and "global batch (train.accumulate x train.batch_size: arm a 2x4 = 8, arm b 1x4 = 4)" in err, err


def test_grad_accumulation_trains_as_a_pair(tmp_path, capsys):
    """4 micro-batches of 1 against one batch of 4, two steps through divergence train: their batch sizes
    per process differ, so each arm is its own job (``--arm``, here in this process: the arm jobs as children
    are tests/scaleout's, test_parallel_rows and test_separate_resume), then the pair's command finds both arms
    finished and runs the comparator over them. On the DiT (a step ~3x cheaper than the UNet's)."""
    args = [
        *PAIR_FAST,
        *DIT,
        "train.max_steps=2",
        "arms.a=[{grad-accumulation: 4x1}]",
        "arms.b=[{grad-accumulation: 1x4}]",
    ]
    command = ["train", "--recipe", str(PAIRS / "grad-accumulation.yaml"), "--out", str(tmp_path / "r"), *args]
    for arm in "ab":
        assert main([*command, "--arm", arm]) == 0
    assert main(command) == 0
    assert "the arms train as separate jobs (train.batch_size: 1 vs 4)" in capsys.readouterr().out
    steps = step_records(tmp_path / "r")
    assert sorted(steps) == [0, 1, 2] and 0 < steps[2]["wasserstein"]


def test_data_seed_pair_starts_equal_and_trains_on_its_own_batches(tmp_path):
    """A fine-tune's seed reference: same init (E(0) = 0, unlike seed-vs-seed), another data order and
    noise for arm b (its own batches), so the arms differ from step 1 on and their losses differ."""
    pair = pair_recipe("data-seed", *DIT, "train.max_steps=2", "tracking.every=1")
    assert pair.category == "seed" and pair.arm_recipes["a"].data.seed != pair.arm_recipes["b"].data.seed
    train_pair(pair, tmp_path)
    steps = step_records(tmp_path)
    assert steps[0]["max_abs_diff"] == 0.0 and steps[1]["max_abs_diff"] > 0
    assert steps[1]["loss_a"] != steps[1]["loss_b"]
