"""EMA weights in a pair: tracked beside the raw weights, summarized apart, exactly zero in a control (on the
DiT: a step ~3x cheaper; the EMA of the UNet: tests/training/test_ema.py)."""

import json

from divergence.cli import main
from divergence.metrics import METRIC_NAMES
from divergence.tracking.records import SUMMARY_KEYS
from divergence.training.lockstep import train_pair

from .helpers import DIT, pair_recipe, step_records, store_lines

EMA = "train.ema={decay: 0.5}"


def test_control_pair_with_ema_and_accumulation_is_exactly_zero(tmp_path):
    train_pair(
        pair_recipe("control", *DIT, EMA, "train.accumulate=2", "train.max_steps=3", "tracking.every=1"), tmp_path
    )
    steps = step_records(tmp_path)
    assert sorted(steps) == [0, 1, 2, 3]
    for record in steps.values():
        assert record["max_abs_diff"] == 0.0 and record["ema_max_abs_diff"] == 0.0 and record["ema_wasserstein"] == 0.0
    ema = [r for r in store_lines(tmp_path) if r["type"] == "tensor" and r["tensor"].startswith("ema.")]
    assert ema and all(r["max_abs_diff"] == 0.0 for r in ema)


def test_ema_is_summarized_apart_and_compare_says_so(tmp_path, capsys):
    overrides = (*DIT, "train.max_steps=2", "tracking.every=1", "train.checkpoint_every=2")
    train_pair(pair_recipe("seed-vs-seed", EMA, *overrides), tmp_path / "ema")
    train_pair(pair_recipe("seed-vs-seed", *overrides), tmp_path / "raw")
    with_ema, without = step_records(tmp_path / "ema"), step_records(tmp_path / "raw")
    for step in (0, 1, 2):  # the raw weights' numbers are those of the same pair without EMA
        assert {k: with_ema[step][k] for k in SUMMARY_KEYS} == {k: without[step][k] for k in SUMMARY_KEYS}
        assert with_ema[step]["kinds"] == without[step]["kinds"]
        assert with_ema[step]["tensors"] > without[step]["tensors"]
    assert with_ema[0]["ema_rel_l2"] == with_ema[0]["rel_l2"]  # step 0: the EMA is the initial weights
    assert with_ema[2]["ema_rel_l2"] != with_ema[2]["rel_l2"] and with_ema[2]["ema_kinds"]
    assert "ema_rel_l2" not in without[2]
    a, b = (tmp_path / "ema" / arm / "checkpoints" / "step_000002.safetensors" for arm in "ab")
    assert main(["compare", str(a), str(b), "--json", str(tmp_path / "c.json"), "--top", "0"]) == 0
    assert "ema: " in capsys.readouterr().out
    summary = json.loads((tmp_path / "c.json").read_text())["summary"]
    for metric in METRIC_NAMES:  # compare reproduces both families' stored numbers
        assert summary[metric] == with_ema[2][metric] and summary["ema"][metric] == with_ema[2][f"ema_{metric}"]
