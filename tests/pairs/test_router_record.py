"""The router's record of a mixture-of-experts pair at the probed steps: zero flips on the control,
flips where the arms' weights differ, each arm's capacity drops (its training forward's, never the
probe's), the wandb keys; training unchanged."""

from functools import partial

from lightning.pytorch.callbacks import Callback

from divergence.loggers.step_logging import step_metrics
from divergence.metrics.router import drop_fraction
from divergence.models.moe import moe_layers
from divergence.pairfolder.settings import ProbeConfig
from divergence.training.lockstep import train_pair
from divergence.training.probe import FunctionProbe
from tests.training.tiny import ready_arm

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


class TrainingDrops(Callback):
    """Each arm's capacity drops in its last training forward at every step, seen by forward hooks on
    its MoE layers (the probe's forwards run in eval mode: not counted)."""

    def __init__(self):
        self.steps: dict[int, dict[str, float]] = {}
        self._kept: dict[str, dict] = {}

    def on_train_start(self, trainer, pl_module):
        for arm, model in pl_module.arms.items():
            for name, layer in moe_layers(model.unet).items():
                layer.register_forward_hook(partial(self._keep, arm, name))

    def _keep(self, arm, name, module, args, output):
        if module.training:
            self._kept.setdefault(arm, {})[name] = module.routing.kept

    def on_train_batch_end(self, trainer, pl_module, *args):
        self.steps[trainer.global_step] = {arm: drop_fraction(kept) for arm, kept in self._kept.items()}


def test_the_control_pair_flips_no_choice_and_drops_alike(tmp_path):
    drops = TrainingDrops()
    train_pair(pair_recipe("control", *MOE, *SMALL), tmp_path, callbacks=[drops])
    steps = step_records(tmp_path)
    for step in (2, 3):  # the last step too: the stored drops are the training forward's
        assert steps[step]["router_drop_a"] == drops.steps[step]["a"], step
        assert steps[step]["router_drop_b"] == drops.steps[step]["b"], step
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


def test_arms_that_did_not_train_here_record_no_drops_whatever_the_probe_ran_before():
    # divergence watch probes arms read back from files, the same two models at every probed step:
    # the second probe read the first probe's last batch as "training" drops
    arm_a, inputs = ready_arm(*MOE)
    arm_b, _ = ready_arm(*MOE)
    probe = FunctionProbe(inputs, ProbeConfig(size=2, batch_size=2), seed=0)
    first, second = probe.record(arm_a, arm_b), probe.record(arm_a, arm_b)
    assert first["router_flip"] == second["router_flip"] == 0.0
    assert not [k for k in (*first, *second) if k.startswith("router_drop")]
    arm_a.training_step(inputs.prepare(inputs.batches.batch(0)))  # arm a trains: its forward's drops
    trained = drop_fraction({name: layer.routing.kept for name, layer in moe_layers(arm_a.unet).items()})
    third, fourth = probe.record(arm_a, arm_b), probe.record(arm_a, arm_b)
    assert third["router_drop_a"] == fourth["router_drop_a"] == trained and "router_drop_b" not in third
