"""The router's record of a mixture-of-experts pair at the probed steps: zero flips on the control,
flips where the arms' weights differ, each arm's capacity drops, the wandb keys; training unchanged."""

from divergence.loggers.step_logging import step_metrics
from divergence.training.lockstep import train_pair

from .helpers import pair_recipe, step_records

MOE = ("model.denoiser=transformer", "model.moe={}")
SMALL = (
    "train.max_steps=3",
    "tracking.probe.size=4",
    "tracking.dense=[]",
    "tracking.every=2",
    "tracking.probe.every=1",
)
LAYERS = {"transformer.transformer_blocks.0.ff", "transformer.transformer_blocks.1.ff"}


def test_the_control_pair_flips_no_choice_and_drops_alike(tmp_path):
    train_pair(pair_recipe("control", *MOE, *SMALL), tmp_path)
    steps = step_records(tmp_path)
    for step in (0, 2, 3):
        record = steps[step]
        assert record["router_flip"] == 0.0 and set(record["router_flip_layers"]) == LAYERS, step
        assert all(v == 0.0 for v in record["router_flip_layers"].values())
    assert "router_drop_a" not in steps[0]  # no training forward yet
    for step in (2, 3):  # capacity 1.25 on a freshly initialised router: some choices dropped
        assert 0.0 < steps[step]["router_drop_a"] == steps[step]["router_drop_b"] < 1.0, step
    assert "router_flip" not in steps[1]  # untracked: no probe
    logged = step_metrics(steps[2])
    assert logged["divergence/router/flip"] == 0.0 and logged["divergence/router/drop_a"] > 0
    assert {k for k in logged if k.startswith("divergence/router/flip/")} == {
        "divergence/router/flip/transformer_transformer_blocks_0_ff",
        "divergence/router/flip/transformer_transformer_blocks_1_ff",
    }


def test_arms_with_other_weights_flip_choices_and_the_record_changes_no_training(tmp_path):
    train_pair(pair_recipe("seed-vs-seed", *MOE, *SMALL), tmp_path / "on")
    steps = step_records(tmp_path / "on")
    assert 0.0 < steps[0]["router_flip"] <= 1.0  # other initial routers choose other experts
    assert all(0.0 < v <= 1.0 for v in steps[0]["router_flip_layers"].values())
    train_pair(pair_recipe("seed-vs-seed", *MOE, *SMALL, "tracking.probe.enabled=false"), tmp_path / "off")
    off = step_records(tmp_path / "off")
    for step in (1, 2, 3):
        assert steps[step]["loss_a"] == off[step]["loss_a"] and steps[step]["loss_b"] == off[step]["loss_b"]
