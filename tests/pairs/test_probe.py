"""The function-space probe: its keys at the tracked steps it is due, exactly zero on the control, and no
effect on training."""

import math

import torch

from divergence.checkpoints import open_checkpoint
from divergence.training.lockstep import train_pair

from .helpers import DIT, pair_recipe, step_records

SMALL = (
    "train.max_steps=3",
    "tracking.probe.size=4",
    "tracking.dense=[]",
    "tracking.every=2",
    "tracking.probe.every=1",
    "tracking.coherence_every=0",  # flash-vs-baseline's own 3 would measure it at step 3 (its test: test_coherence_record)
)
PROBE_KEYS = ("probe_rel_diff", "probe_loss_a", "probe_loss_b")


def test_control_pair_probe_is_exactly_zero(tmp_path):
    train_pair(pair_recipe("control", *SMALL), tmp_path)
    steps = step_records(tmp_path)
    assert [s for s, r in steps.items() if r["tracked"]] == [0, 2, 3]
    for step, record in steps.items():
        if record["tracked"]:
            assert record["probe_rel_diff"] == 0.0 and record["rel_l2"] == 0.0, step
            assert record["probe_loss_a"] == record["probe_loss_b"] > 0, step
        else:
            assert not set(PROBE_KEYS) & set(record), step


def test_probe_runs_at_tracked_multiples_of_its_every_and_at_the_last_step(tmp_path):
    train_pair(
        pair_recipe(
            "control", *DIT, "train.max_steps=5", "tracking.dense=[]", "tracking.every=1", "tracking.probe.every=2"
        ),
        tmp_path,
    )
    steps = step_records(tmp_path)
    assert all(steps[s]["tracked"] for s in range(6))
    assert [s for s, r in steps.items() if "probe_rel_diff" in r] == [0, 2, 4, 5]
    assert all(steps[s]["probe_rel_diff"] == 0.0 for s in (0, 2, 4, 5))


def test_probe_does_not_change_training_and_sees_the_flash_kernel(tmp_path):
    """On the DiT (the probe on the UNet: the control's test)."""
    on, off = tmp_path / "on", tmp_path / "off"
    train_pair(pair_recipe("dit-flash-vs-baseline", *SMALL, "train.checkpoint_every=3"), on)
    train_pair(
        pair_recipe("dit-flash-vs-baseline", *SMALL, "train.checkpoint_every=3", "tracking.probe.enabled=false"), off
    )
    with_probe, without = step_records(on), step_records(off)
    for step in (1, 2, 3):
        assert with_probe[step]["loss_a"] == without[step]["loss_a"]
        assert with_probe[step]["loss_b"] == without[step]["loss_b"]
    for arm in "ab":
        a, b = (open_checkpoint(d / arm / "checkpoints" / "step_000003.safetensors") for d in (on, off))
        assert all(torch.equal(a.load(n), b.load(n)) for n in a.names)
    assert with_probe[0]["probe_rel_diff"] == 0.0  # same init: same function in the reference numerics
    assert 0 < with_probe[3]["probe_rel_diff"] < 1 and math.isfinite(with_probe[3]["probe_loss_a"])
    assert "probe_rel_diff" not in without[3] and without[3]["rel_l2"] == with_probe[3]["rel_l2"]
